"""Tests of bertjax.data.pipeline: order, epochs, hosts, resume, evaluation.

Document d holds token ids STRIDE*d + 5, +6, ... in order, so every token says
which document and which offset it came from; rows are checked against the
source through their tokens alone.
"""

import json

import numpy as np
import pytest

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax.data import pipeline

bert = config_files.shipped("bert")  # configs/bert.py, loaded by path

STRIDE = 10_000
FIRST = batch_lib.NUM_SPECIAL_TOKENS


def make_docs(count, seed=0, max_sentences=12, max_len=25):
  rng = np.random.default_rng(seed)
  docs = []
  for d in range(count):
    lengths = rng.integers(2, max_len, rng.integers(1, max_sentences)).astype(np.int32)
    n = int(lengths.sum())
    word_starts = rng.random(n) < 0.7
    word_starts[np.cumsum(lengths) - lengths] = True
    word_starts[np.cumsum(lengths) - lengths + 1] = True  # >= 2 words a sentence
    docs.append({"tokens": (STRIDE * d + FIRST + np.arange(n)).astype(np.int32),
                 "word_starts": word_starts, "sentence_lengths": lengths})
  return docs


def make_config(**overrides):
  c = bert.get_config("tiny")
  c.seq_len = 48
  c.shuffle_window = 64
  c.update(overrides)
  return c


def take(it, n):
  return [next(it) for _ in range(n)]


def rows_of(batches):
  """(example_id tuple, epoch, tokens) of every real row."""
  out = []
  for b in batches:
    for i in np.flatnonzero(b["example_mask"]):
      out.append((tuple(b["example_id"][i].tolist()), int(b["epoch"][i]),
                  b["tokens"][i]))
  return out


def check_pair_rows(batch, docs, seq_len):
  """Asserts the layout of every real row and that B continues A in its doc."""
  for i in np.flatnonzero(batch["example_mask"]):
    la, lb = int(batch["a_lengths"][i]), int(batch["b_lengths"][i])
    n = la + lb + 3
    tokens = batch["tokens"][i]
    assert la >= 1 and lb >= 1 and n <= seq_len
    assert tokens[0] == batch_lib.CLS_ID
    assert tokens[la + 1] == batch_lib.SEP_ID and tokens[n - 1] == batch_lib.SEP_ID
    assert (tokens[n:] == batch_lib.PAD_ID).all()
    np.testing.assert_array_equal(batch["segment_ids"][i][:n],
                                  [0] * (la + 2) + [1] * (lb + 1))
    np.testing.assert_array_equal(np.flatnonzero(batch["special"][i]),
                                  [0, la + 1] + list(range(n - 1, seq_len)))
    a, b = tokens[1:la + 1], tokens[la + 2:n - 1]
    doc = int(batch["example_id"][i][0])
    assert ((np.concatenate([a, b]) - FIRST) // STRIDE == doc).all()
    source = docs[doc]["tokens"]
    a_at, b_at = int(a[0] - source[0]), int(b[0] - source[0])
    np.testing.assert_array_equal(a, source[a_at:a_at + la])
    np.testing.assert_array_equal(b, source[b_at:b_at + lb])
    assert b_at >= a_at + la, "B comes after A in the document"
    if n < seq_len:
      assert b_at == a_at + la, "an untruncated B is the very next token run"


def test_train_batches_follow_the_contract_and_the_source():
  docs = make_docs(60)
  config = make_config()
  it = pipeline.make_train_iterator(config, docs, local_batch_size=8)
  for batch in take(it, 12):
    batch_lib.check_batch(batch, 8, config.seq_len)
    assert batch["example_mask"].all()
    check_pair_rows(batch, docs, config.seq_len)


def test_same_seed_same_batches_other_seed_other_order():
  docs = make_docs(60)
  ids = lambda seed: [r[0] for r in rows_of(take(pipeline.make_train_iterator(
      make_config(seed=seed), docs, local_batch_size=8), 6))]
  first, again, other = ids(0), ids(0), ids(1)
  assert first == again
  assert first != other


def test_epochs_reshuffle_documents_and_cycle_dupe_factor_packings():
  docs = make_docs(30)
  # A window of one keeps the document order visible in the row order; two
  # packing copies: epochs 0 and 2 read copy 0, epoch 1 reads copy 1.
  config = make_config(shuffle_window=1, dupe_factor=2)
  rows = rows_of(take(pipeline.make_train_iterator(
      config, docs, local_batch_size=4), 60))
  epochs = [e for _, e, _ in rows]
  assert epochs == sorted(epochs), "epoch never goes back"
  assert max(epochs) >= 3, "epochs 0, 1 and 2 are complete"
  orders, examples, tokens_of = {}, {}, {}
  for example_id, epoch, tokens in rows:
    order = orders.setdefault(epoch, [])
    if not order or order[-1] != example_id[0]:
      order.append(example_id[0])
    examples.setdefault(epoch, []).append(example_id)
    key = (example_id, epoch % 2)
    if key in tokens_of:
      np.testing.assert_array_equal(tokens_of[key], tokens,
                                    err_msg=f"example {key} changed")
    tokens_of[key] = tokens
  for epoch in (0, 1, 2):
    copy = {k[0] for k in tokens_of if k[1] == epoch % 2}
    assert sorted(examples[epoch]) == sorted(copy), "each example once"
    assert len(orders[epoch]) == len(set(orders[epoch])), "a document's pairs are adjacent"
  assert len({tuple(orders[e]) for e in (0, 1, 2)}) == 3, "a new order each epoch"
  # The two copies cut the documents into different pairs (random split
  # points), while each copy covers the same documents.
  def pairs(copy):
    return {d: [tokens_of[(k, c)].tobytes() for (k, c) in sorted(tokens_of)
                if c == copy and k[0] == d] for d in range(len(docs))}
  first, second = pairs(0), pairs(1)
  splittable = [d for d in range(len(docs))
                if len(docs[d]["sentence_lengths"]) > 2]
  changed = sum(first[d] != second[d] for d in splittable)
  assert changed >= 0.5 * len(splittable), (changed, len(splittable))


def test_each_packing_copy_keeps_pairs_adjacent_and_copy_zero_is_the_default():
  docs = make_docs(40)
  config = make_config(dupe_factor=3)
  layout = pipeline.packing.get_layout(config.layout)
  for doc_index in (0, 7, 19):
    by_epoch = [pipeline.pack_document(docs[doc_index], doc_index, layout,
                                       config, 0, epoch) for epoch in range(4)]
    for epoch, rows in enumerate(by_epoch):
      check_pair_rows(pipeline._stack_rows(rows), docs, config.seq_len)
      assert all(r["epoch"] == epoch for r in rows)
    # Epoch 3 reads copy 0 again; a dupe_factor of 1 always packs copy 0.
    for a, b in zip(by_epoch[0], by_epoch[3]):
      np.testing.assert_array_equal(a["tokens"], b["tokens"])
    single = pipeline.pack_document(docs[doc_index], doc_index, layout,
                                    make_config(dupe_factor=1), 0, 1)
    assert [r["tokens"].tobytes() for r in single] == [
        r["tokens"].tobytes() for r in by_epoch[0]]


def test_window_shuffle_spreads_a_document_over_batches():
  docs = make_docs(200, max_sentences=30)

  def same_doc_rate(window):
    batches = take(pipeline.make_train_iterator(
        make_config(shuffle_window=window), docs, local_batch_size=16), 20)
    same = pairs = 0
    for b in batches:
      d = b["example_id"][:, 0]
      same += int((d[:, None] == d[None, :]).sum()) - len(d)
      pairs += len(d) * (len(d) - 1)
    return same / pairs

  # ~4 pairs a document: in order about 3 of 15 neighbours share it; shuffled
  # over 512 rows about 3 of 511.
  assert same_doc_rate(1) > 0.1
  assert same_doc_rate(512) < 0.03


def test_hosts_read_disjoint_shares_that_cover_the_split():
  docs = make_docs(45)
  config = make_config()
  seen = []
  for host in range(3):
    it = pipeline.make_train_iterator(config, docs, local_batch_size=4,
                                      process_index=host, process_count=3)
    batches = take(it, 30)
    for b in batches:
      check_pair_rows(b, docs, config.seq_len)
    seen.append({r[0][0] for r in rows_of(batches)})
    assert all(d % 3 == host for d in seen[-1])
  assert set().union(*seen) == set(range(45))


def test_resume_from_state_gives_identical_batches():
  docs = make_docs(25)
  config = make_config(shuffle_window=16)
  it = pipeline.make_train_iterator(config, docs, local_batch_size=4)
  # Stop at several points: inside a window, across epoch boundaries.
  for k in (3, 7, 25):
    take(it, k)
    state = json.loads(json.dumps(it.get_state()))
    expected = take(it, 10)
    fresh = pipeline.make_train_iterator(config, docs, local_batch_size=4)
    fresh.set_state(state)
    for want, got in zip(expected, take(fresh, 10)):
      for name in batch_lib.FIELDS:
        np.testing.assert_array_equal(want[name], got[name], err_msg=name)
  assert int(expected[-1]["epoch"].max()) >= 1, "the test crossed an epoch"


def _line_docs(count, pairs_per_doc, max_tokens):
  """Documents of one-token sentences, max_tokens * pairs_per_doc long: with
  no short targets every chunk is exactly max_tokens, nothing is cut."""
  docs = []
  for d in range(count):
    n = max_tokens * pairs_per_doc[d]
    docs.append({"tokens": (STRIDE * d + FIRST + np.arange(n)).astype(np.int32),
                 "word_starts": np.ones(n, bool),
                 "sentence_lengths": np.ones(n, np.int32)})
  return docs


def test_eval_pass_covers_every_token_once_and_pads_the_last_batch():
  config = make_config(short_seq_prob=0.0)
  pairs = np.random.default_rng(0).integers(1, 4, 17)
  docs = _line_docs(17, pairs, config.seq_len - 3)
  batches = list(pipeline.make_eval_batches(config, docs, local_batch_size=8))
  total = int(pairs.sum())
  assert len(batches) == -(-total // 8)
  for b in batches:
    batch_lib.check_batch(b, 8, config.seq_len)
    check_pair_rows(b, docs, config.seq_len)
    assert (b["epoch"] == 0).all()
  last = batches[-1]
  real = int(last["example_mask"].sum())
  assert real == total - 8 * (len(batches) - 1)
  assert (last["tokens"][real:] == batch_lib.PAD_ID).all()
  assert last["special"][real:].all() and not last["doc_ids"][real:].any()
  rows = rows_of(batches)
  covered = np.sort(np.concatenate(
      [t[(t != batch_lib.CLS_ID) & (t != batch_lib.SEP_ID) & (t != 0)]
       for _, _, t in rows]))
  np.testing.assert_array_equal(covered, np.sort(np.concatenate(
      [d["tokens"] for d in docs])))
  assert sorted(r[0] for r in rows) == [(d, k) for d in range(17)
                                        for k in range(pairs[d])]
  # The same pass twice, whatever the training seed.
  again = list(pipeline.make_eval_batches(make_config(short_seq_prob=0.0, seed=9),
                                          docs, local_batch_size=8))
  for want, got in zip(batches, again):
    np.testing.assert_array_equal(want["tokens"], got["tokens"])


def test_eval_hosts_split_examples_and_agree_on_batch_count():
  config = make_config()
  docs = make_docs(23, seed=3)
  single = {r[0] for r in rows_of(pipeline.make_eval_batches(
      config, docs, local_batch_size=3))}
  shares, counts = [], []
  for host in range(2):
    batches = list(pipeline.make_eval_batches(
        config, docs, local_batch_size=3, process_index=host, process_count=2))
    counts.append(len(batches))
    shares.append({r[0] for r in rows_of(batches)})
  assert counts[0] == counts[1] == -(-len(single) // 6)
  assert not shares[0] & shares[1]
  assert shares[0] | shares[1] == single
  limited = list(pipeline.make_eval_batches(config, docs, local_batch_size=3,
                                            max_batches=2))
  assert len(limited) == 2 and all(b["example_mask"].all() for b in limited)


def test_unknown_layout_is_rejected_with_the_valid_names():
  config = make_config(layout="doc_sentencez")
  with pytest.raises(ValueError, match="sentence_pairs"):
    pipeline.make_train_iterator(config, make_docs(3), local_batch_size=2)
  with pytest.raises(ValueError, match="sentence_pairs"):
    pipeline.make_eval_batches(config, make_docs(3), local_batch_size=2)


def test_too_few_documents_for_the_hosts_is_rejected():
  with pytest.raises(ValueError, match="hosts"):
    pipeline.make_train_iterator(make_config(), make_docs(2), local_batch_size=2,
                                 process_index=3, process_count=4)


def _pairs_config(demo_config, **overrides):
  config = demo_config.copy_and_resolve_references()
  config.update(seq_len=48, shuffle_window=64, **overrides)
  return config


def test_nsp_over_one_document_is_refused_for_training(demo_config):
  config = _pairs_config(demo_config)
  assert config.layout == "sentence_pairs" and config.nsp_negative_rate > 0
  with pytest.raises(ValueError) as error:
    pipeline.make_train_iterator(config, make_docs(1), local_batch_size=4)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith("Split 'train' has 1 document(s), but NSP draws its negatives")
  assert "add documents" in message and "configs/roberta.py" in message
  # Two documents, SOP (negatives swapped within a pair) or a single-segment
  # layout are fine with one document.
  pipeline.make_train_iterator(config, make_docs(2), local_batch_size=4)
  sop = _pairs_config(demo_config, nsp_negative_rate=0.0)
  next(pipeline.make_train_iterator(sop, make_docs(1), local_batch_size=4))
  single = _pairs_config(demo_config, layout="doc_sentences")
  next(pipeline.make_train_iterator(single, make_docs(1), local_batch_size=4))


def test_nsp_over_one_document_warns_for_evaluation(demo_config, caplog):
  config = _pairs_config(demo_config, eval_split="validation")
  with caplog.at_level("WARNING"):
    batches = list(pipeline.make_eval_batches(config, make_docs(1), local_batch_size=4))
  assert batches  # evaluation still runs: its MLM figures are sound
  warned = [r.getMessage() for r in caplog.records if "NSP" in r.getMessage()]
  assert len(warned) == 1 and warned[0].startswith("Split 'validation' has 1 document(s)")
