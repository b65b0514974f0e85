"""Tests of the single-segment layouts: DOC-SENTENCES and FULL-SENTENCES.

Document d holds token ids STRIDE*d + 5, +6, ... in order, so every token says
which document and which offset it came from; rows are checked against the
source through their tokens alone, not against the packer's bookkeeping.
"""

import numpy as np
import pytest

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax.data import packing
from bertjax.data import pipeline
from bertjax.data import single_segment

roberta = config_files.shipped("roberta")  # configs/roberta.py, loaded by path

STRIDE = 10_000
FIRST = batch_lib.NUM_SPECIAL_TOKENS
CLS, SEP, PAD = batch_lib.CLS_ID, batch_lib.SEP_ID, batch_lib.PAD_ID


def make_docs(count, seed=0, max_sentences=10, max_len=30):
  rng = np.random.default_rng(seed)
  docs = []
  for d in range(count):
    lengths = rng.integers(1, max_len, rng.integers(1, max_sentences))
    lengths = lengths.astype(np.int32)
    n = int(lengths.sum())
    word_starts = rng.random(n) < 0.6
    word_starts[np.cumsum(lengths) - lengths] = True
    docs.append({"tokens": (STRIDE * d + FIRST + np.arange(n)).astype(np.int32),
                 "word_starts": word_starts, "sentence_lengths": lengths})
  return docs


def make_config(layout, seq_len=40):
  c = roberta.get_config("tiny")
  c.layout = layout
  c.seq_len = seq_len
  c.shuffle_window = 16
  return c


def parts_of(row):
  """The row's document parts as (doc id, token array, positions) triples,
  checking the frame [CLS] part [SEP] part [SEP] ... PAD on the way."""
  tokens, doc_ids = row["tokens"], row["doc_ids"]
  n = int(np.sum(doc_ids > 0))
  assert tokens[0] == CLS and tokens[n - 1] == SEP
  assert np.all(tokens[n:] == PAD) and np.all(row["special"][n:])
  assert np.all(row["positions"][n:] == 0) and not row["word_starts"][n:].any()
  assert np.all(row["segment_ids"] == 0) and int(row["b_lengths"]) == 0
  np.testing.assert_array_equal(row["special"][:n],
                                np.isin(tokens[:n], [CLS, SEP]))
  assert int(row["a_lengths"]) == int(np.sum(~row["special"]))
  parts, start = [], 1
  for sep in np.flatnonzero(tokens[:n] == SEP):
    ids = doc_ids[start:sep + 1]
    assert len(set(ids.tolist())) == 1  # the part and its [SEP] share an id
    # Positions restart at every part: its first token sits at 1, as after
    # [CLS], and its [SEP] right after its last token.
    np.testing.assert_array_equal(row["positions"][start:sep + 1],
                                  np.arange(1, sep + 2 - start))
    parts.append((int(ids[0]), tokens[start:sep], row["word_starts"][start:sep]))
    start = sep + 1
  assert doc_ids[0] == 1 and row["positions"][0] == 0
  assert [p[0] for p in parts] == list(range(1, len(parts) + 1))
  return parts


def sentence_bounds(doc):
  return set(np.cumsum(doc["sentence_lengths"]).tolist()) | {0}


def test_doc_sentences_never_mixes_documents_and_fills_rows():
  docs = make_docs(30, seed=1)
  config = make_config("doc_sentences")
  for d, doc in enumerate(docs):
    rows = packing.get_layout("doc_sentences")(doc, config, None)
    pieces = []
    for k, row in enumerate(rows):
      (doc_id, part, _), = parts_of(row)  # exactly one part per row
      assert np.all(part // STRIDE == d)
      offsets = part % STRIDE - FIRST
      np.testing.assert_array_equal(offsets, np.arange(offsets[0], offsets[-1] + 1))
      # Rows start and end on sentence boundaries (no sentence is longer
      # than a row here).
      assert {int(offsets[0]), int(offsets[-1]) + 1} <= sentence_bounds(doc)
      if k + 1 < len(rows):
        # A row closes only when the next sentence would not fit.
        nxt = parts_of(rows[k + 1])[0][1]
        ends = sorted(sentence_bounds(doc))
        first_next = int(nxt[0] % STRIDE - FIRST)
        next_len = ends[ends.index(first_next) + 1] - first_next
        assert len(part) + 2 + next_len > config.seq_len
      pieces.append(part)
    np.testing.assert_array_equal(np.concatenate(pieces), doc["tokens"])


def test_long_sentences_are_cut_at_word_starts_to_fit():
  rng = np.random.default_rng(3)
  n = 200
  word_starts = rng.random(n) < 0.3
  word_starts[0] = True
  doc = {"tokens": FIRST + np.arange(n, dtype=np.int32),
         "word_starts": word_starts, "sentence_lengths": np.array([n], np.int32)}
  bounds = single_segment.sentence_chunks(doc, 38)
  assert bounds[0] == 0 and bounds[-1] == n
  assert np.all(np.diff(bounds) <= 38) and np.all(np.diff(bounds) >= 1)
  # Every cut is a word start unless the word itself was longer than a row.
  for cut in bounds[1:-1]:
    assert word_starts[cut] or not word_starts[cut - 38 + 1:cut].any()


def test_full_sentences_cross_documents_with_separate_ids_and_positions():
  docs = make_docs(40, seed=2)
  seq_len = 40
  rows = list(single_segment.full_sentence_rows(
      (single_segment.document_chunks(doc, d, 0, seq_len)
       for d, doc in enumerate(docs)), seq_len))
  stream, crossed = [], 0
  for row in rows:
    assert row["tokens"].shape == (seq_len,)
    parts = parts_of(row)
    crossed += len(parts) > 1
    owners = [np.unique(part // STRIDE) for _, part, _ in parts]
    assert all(len(o) == 1 for o in owners)  # a part is one document
    # Consecutive parts are consecutive documents of the stream.
    assert all(b[0] == a[0] + 1 for a, b in zip(owners, owners[1:]))
    stream.extend(part for _, part, _ in parts)
    assert all(ws[0] for _, _, ws in parts)
  # Every token of every document exactly once, in stream order.
  np.testing.assert_array_equal(np.concatenate(stream),
                                np.concatenate([d["tokens"] for d in docs]))
  assert crossed > 5
  # Whole sentences, greedily: a row is closed only when the next sentence
  # (plus a [SEP] if it opens another document) would not fit.
  for row, nxt in zip(rows, rows[1:]):
    last_doc = int(parts_of(row)[-1][1][0] // STRIDE)
    first = int(parts_of(nxt)[0][1][0])
    doc = docs[first // STRIDE]
    ends = sorted(sentence_bounds(doc))
    offset = first % STRIDE - FIRST
    length = ends[ends.index(offset) + 1] - offset
    used = int(np.sum(row["doc_ids"] > 0))
    assert used + length + int(first // STRIDE != last_doc) > seq_len


def test_full_sentences_iterator_resumes_exactly_and_eval_covers_all():
  docs = make_docs(25, seed=4)
  config = make_config("full_sentences")
  it = pipeline.make_train_iterator(config, docs, local_batch_size=4)
  for _ in range(7):
    next(it)
  state = it.get_state()
  want = [next(it) for _ in range(6)]
  again = pipeline.make_train_iterator(config, docs, local_batch_size=4)
  again.set_state(state)
  for a, b in zip(want, (next(again) for _ in range(6))):
    for name in batch_lib.FIELDS:
      np.testing.assert_array_equal(a[name], b[name])
  batch_lib.check_batch(want[0], 4, config.seq_len)
  # Rows of one pass have distinct identities (dynamic masks differ).
  ids = [tuple(e) for b in want for e in b["example_id"].tolist()]
  assert len(set(ids)) == len(ids)
  tokens = np.concatenate([
      b["tokens"][i][~b["special"][i]]
      for b in pipeline.make_eval_batches(config, docs, local_batch_size=4)
      for i in np.flatnonzero(b["example_mask"])])
  np.testing.assert_array_equal(tokens,
                                np.concatenate([d["tokens"] for d in docs]))


def test_unknown_layout_names_the_new_ones():
  with pytest.raises(ValueError, match="full_sentences"):
    packing.is_cross_document("full_sentence")
  with pytest.raises(ValueError, match="doc_sentences"):
    packing.get_layout("doc_sentence")
