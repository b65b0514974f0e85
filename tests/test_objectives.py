"""BERT objective: MLM + NSP corruption statistics, randomness, loss, traces."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax.objectives import bert
from bertjax.objectives import get_objective
from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import nsp

bert_config = config_files.shipped("bert")  # configs/bert.py, loaded by path

B, L, V, P = 256, 128, 8000, 20


def make_config(**overrides):
  config = bert_config.get_config("tiny")
  config.seq_len, config.vocab_size, config.max_predictions_per_seq = L, V, P
  for name, value in overrides.items():
    setattr(config, name, value)
  return config


def make_pair_batch(seed=0, batch_size=B, seq_len=L, num_padding=0,
                    docs_per=3, epoch=0):
  """Synthetic ``[CLS] A [SEP] B [SEP] PAD...`` rows as data/packing.py makes.

  Examples come in groups of ``docs_per`` from one document; the last
  ``num_padding`` rows are padding examples.
  """
  rs = np.random.RandomState(seed)
  out = batch_lib.empty_batch(batch_size, seq_len)
  out["epoch"][:] = epoch
  out["positions"][:] = np.arange(seq_len)
  for i in range(batch_size - num_padding):
    total = rs.randint(2, seq_len - 3 + 1)
    a = rs.randint(1, total)
    b = total - a
    n = total + 3
    body = rs.randint(batch_lib.NUM_SPECIAL_TOKENS, V, total)
    out["tokens"][i, :n] = np.concatenate(
        [[batch_lib.CLS_ID], body[:a], [batch_lib.SEP_ID], body[a:],
         [batch_lib.SEP_ID]])
    out["segment_ids"][i, a + 2:n] = 1
    out["doc_ids"][i, :n] = 1
    starts = rs.rand(n) < 0.7
    starts[[0, 1, a + 1, a + 2, n - 1]] = True
    out["word_starts"][i, :n] = starts
    out["special"][i, :n] = False
    out["special"][i, [0, a + 1, n - 1]] = True
    out["a_lengths"][i], out["b_lengths"][i] = a, b
    out["example_id"][i] = (i // docs_per + 100 * seed, i % docs_per)
    out["example_mask"][i] = True
  batch_lib.check_batch(out, batch_size, seq_len)
  return out


def check_pair_layout(batch):
  """Asserts every real row is exactly [CLS] A [SEP] B [SEP] PAD..."""
  for i in np.flatnonzero(batch["example_mask"]):
    a, b = int(batch["a_lengths"][i]), int(batch["b_lengths"][i])
    n = a + b + 3
    assert a >= 1 and b >= 1 and n <= L
    tokens = batch["tokens"][i]
    assert tokens[0] == batch_lib.CLS_ID
    assert tokens[a + 1] == batch_lib.SEP_ID
    assert tokens[n - 1] == batch_lib.SEP_ID
    assert (tokens[n:] == batch_lib.PAD_ID).all()
    body = np.r_[1:a + 1, a + 2:n - 1]
    assert (tokens[body] >= batch_lib.NUM_SPECIAL_TOKENS).all()
    special = np.ones(L, bool)
    special[body] = False
    np.testing.assert_array_equal(batch["special"][i], special)
    segments = np.zeros(L, np.int32)
    segments[a + 2:n] = 1
    np.testing.assert_array_equal(batch["segment_ids"][i], segments)
    np.testing.assert_array_equal(batch["positions"][i], np.arange(L))
    np.testing.assert_array_equal(batch["doc_ids"][i], np.arange(L) < n)
    assert batch["word_starts"][i, [0, 1, a + 1, a + 2, n - 1]].all()
    assert not batch["word_starts"][i, n:].any()


def to_numpy(tree):
  return jax.tree.map(np.asarray, tree)


# The corrupt configurations under test, each compiled once for the module.
SETUPS = {
    "static": dict(masking="static", dupe_factor=3),
    "dynamic": dict(masking="dynamic"),
    "whole_word": dict(masking="static", dupe_factor=3,
                       whole_word_masking=True),
}
TRACES = collections.Counter()


@functools.lru_cache(maxsize=None)
def jitted_corrupt(setup):
  objective = bert.BertObjective(make_config(**SETUPS[setup]))

  def counted(rng, batch, step):
    TRACES[setup] += 1  # runs only while tracing
    return objective.corrupt(rng, batch, step)

  return jax.jit(counted)


def corrupt(batch, step=0, setup="static", seed=0):
  inputs, targets = jitted_corrupt(setup)(
      jax.random.key(seed), batch, jnp.int32(step))
  return to_numpy(inputs), to_numpy(targets)


@functools.lru_cache(maxsize=None)
def jitted_negatives():
  return jax.jit(functools.partial(nsp.make_negatives, negative_rate=0.5))


def negatives(batch):
  decide = masking.example_keys(jax.random.key(1), batch["example_id"],
                                batch["epoch"], 0, masking="dynamic",
                                dupe_factor=1)
  rebuilt, labels = jitted_negatives()(decide, jax.random.key(2), batch)
  return to_numpy(rebuilt), np.asarray(labels)


def mask_sets(inputs, targets):
  """Per row, the chosen positions and their corrupted tokens, as bytes."""
  rows = len(targets["nsp_labels"])
  return [inputs["masked_positions"][i].tobytes()
          + inputs["tokens"][i].tobytes() for i in range(rows)]


def test_registry_and_validation():
  assert isinstance(get_objective(make_config()), bert.BertObjective)
  with pytest.raises(ValueError, match="bert"):
    get_objective(make_config(objective="electra_typo"))


@pytest.mark.parametrize("field,value", [
    ("mask_rate", 0.0), ("mask_rate", 1.0), ("random_token_rate", 0.3),
    ("max_predictions_per_seq", L + 1), ("dupe_factor", 0),
    ("masking", "sometimes"), ("nsp_negative_rate", 1.5), ("vocab_size", 5)])
def test_bad_config_names_the_field(field, value):
  with pytest.raises(ValueError, match=f"--config.{field}"):
    bert.BertObjective(make_config(**{field: value}))


def test_mlm_count_rule_specials_and_padding_examples():
  batch = make_pair_batch(num_padding=16)
  settings = mlm.MlmSettings.from_config(make_config())
  keys = jax.random.split(jax.random.key(0), B)
  out = to_numpy(jax.jit(mlm.mask_batch, static_argnums=5)(
      keys, batch["tokens"], batch["special"], batch["word_starts"],
      batch["example_mask"], settings))
  candidates = ~batch["special"] & batch["example_mask"][:, None]
  chosen_total = 0
  for i in range(B):
    used = out["mlm_weights"][i] > 0
    count, n = used.sum(), candidates[i].sum()
    want = 0 if n == 0 else min(P, max(1, round(0.15 * n)))
    assert count == want
    positions = out["masked_positions"][i, used]
    assert not batch["special"][i, positions].any()
    np.testing.assert_array_equal(out["mlm_targets"][i, used],
                                  batch["tokens"][i, positions])
    unmasked = np.ones(L, bool)
    unmasked[positions] = False
    np.testing.assert_array_equal(out["tokens"][i, unmasked],
                                  batch["tokens"][i, unmasked])
    chosen_total += count
  assert (out["mlm_weights"][-16:] == 0).all()  # padding examples
  # Rows have 1..125 candidates, mostly under the P=20 cap: the rate is 15%
  # up to rounding, which averages out (tolerance 1 point).
  assert abs(chosen_total / candidates.sum() - 0.15) < 0.01


def test_bert_corrupt_masks_only_real_tokens_and_keeps_ids_in_vocab():
  batch = make_pair_batch(seed=1, num_padding=8)
  for setup in ("static", "whole_word"):
    whole_word = setup == "whole_word"
    inputs, targets = corrupt(batch, setup=setup)
    for i in range(B):
      used = targets["mlm_weights"][i] > 0
      positions = inputs["masked_positions"][i, used]
      assert (targets["mlm_targets"][i, used]
              >= batch_lib.NUM_SPECIAL_TOKENS).all()
      tokens = inputs["tokens"][i]
      assert ((tokens[positions] >= batch_lib.NUM_SPECIAL_TOKENS)
              | (tokens[positions] == batch_lib.MASK_ID)).all()
      assert tokens.max() < V
      if whole_word and i < B - 8:
        # Positives keep their word starts: chosen words are whole.
        if targets["nsp_labels"][i] == 0:
          word = np.cumsum(batch["word_starts"][i]) - 1
          chosen = np.zeros(L, bool)
          chosen[positions] = True
          for w in np.unique(word[chosen]):
            assert chosen[word == w].all()
    assert (targets["mlm_weights"][-8:] == 0).all()
    assert (inputs["tokens"][-8:] == batch_lib.PAD_ID).all()


def test_static_masks_cycle_with_dupe_factor():
  dupe = SETUPS["static"]["dupe_factor"]
  per_epoch = [
      mask_sets(*corrupt(make_pair_batch(seed=2, epoch=e), step=7))
      for e in range(2 * dupe)]
  for e in range(dupe):
    assert per_epoch[e] == per_epoch[e + dupe]
  distinct = np.array([len({per_epoch[e][i] for e in range(2 * dupe)})
                       for i in range(B)])
  assert (distinct <= dupe).all()
  # Three draws of a mask over ~125 tokens essentially never coincide; short
  # rows (a handful of candidates) may, so demand it of 90% of rows.
  assert (distinct == dupe).mean() > 0.9


def test_static_masks_do_not_change_with_step_for_positives():
  batch = make_pair_batch(seed=3)
  first = corrupt(batch, step=0)
  later = corrupt(batch, step=1000)
  np.testing.assert_array_equal(first[1]["nsp_labels"], later[1]["nsp_labels"])
  positive = first[1]["nsp_labels"] == 0
  np.testing.assert_array_equal(first[0]["tokens"][positive],
                                later[0]["tokens"][positive])
  np.testing.assert_array_equal(first[0]["masked_positions"][positive],
                                later[0]["masked_positions"][positive])


def test_dynamic_masks_change_every_step():
  batch = make_pair_batch(seed=4)
  steps = [mask_sets(*corrupt(batch, step=s, setup="dynamic"))
           for s in range(2)]
  differ = np.mean([x != y for x, y in zip(*steps)])
  assert differ > 0.9  # only rows with very few candidates may repeat


@pytest.mark.parametrize("setup", ["static", "dynamic"])
def test_corrupt_is_independent_of_batch_position(setup):
  batch = make_pair_batch(seed=5)
  perm = np.random.RandomState(0).permutation(B)
  permuted = {name: value[perm] for name, value in batch.items()}
  base = corrupt(batch, step=3, setup=setup)
  moved = corrupt(permuted, step=3, setup=setup)
  for got, want in zip(moved, base):
    for name in want:
      np.testing.assert_array_equal(got[name], want[name][perm], err_msg=name)


def test_nsp_negative_rate():
  labels = []
  for step in range(8):
    _, targets = corrupt(make_pair_batch(seed=6), step=step, setup="dynamic")
    labels.append(targets["nsp_labels"])
  rate = np.mean(labels)
  # 2048 decisions: sd = 0.011; tolerance ~4.5 sd.
  assert abs(rate - 0.5) < 0.05


def test_nsp_negatives_borrow_b_from_another_document():
  batch = make_pair_batch(seed=7, num_padding=4)
  check_pair_layout(batch)  # the checker accepts the packer's layout
  rebuilt, labels = negatives(batch)
  check_pair_layout(rebuilt)
  assert (labels[-4:] == 0).all()
  # A row's passage: its A then its B, without the [SEP] between them.
  passage = {}
  for j in range(B - 4):
    a, b = batch["a_lengths"][j], batch["b_lengths"][j]
    passage[j] = np.concatenate([batch["tokens"][j, 1:a + 1],
                                 batch["tokens"][j, a + 2:a + 2 + b]])
  kept_length = 0
  for i in range(B):
    if labels[i] == 0:
      for name in batch:
        np.testing.assert_array_equal(rebuilt[name][i], batch[name][i])
      continue
    a, b = rebuilt["a_lengths"][i], rebuilt["b_lengths"][i]
    assert a == batch["a_lengths"][i]
    np.testing.assert_array_equal(rebuilt["tokens"][i, :a + 2],
                                  batch["tokens"][i, :a + 2])
    borrowed = rebuilt["tokens"][i, a + 2:a + 2 + b]
    # Some example of another document whose passage starts with this B,
    # as long as this row's own B or as the whole passage.
    sources = [j for j, full in passage.items()
               if batch["example_id"][j, 0] != batch["example_id"][i, 0]
               and b == min(batch["b_lengths"][i], len(full))
               and np.array_equal(full[:b], borrowed)]
    assert sources, f"row {i}: its B starts no other document's passage"
    kept_length += b == batch["b_lengths"][i]
  assert 0.4 < labels.mean() < 0.6
  # Partners long enough are preferred: rows keep their length (so their
  # padding) unless no other document in the batch has that much text.
  assert kept_length == labels.sum()


def test_nsp_negatives_carry_no_length_cue():
  # Rows of many lengths, as the packer makes them. Whatever the label, the
  # lengths of A and B and the padding stay the row's: no length feature
  # can predict the label (before this, padding alone predicted 71% of the
  # labels on the demo corpus).
  batch = make_pair_batch(seed=12)
  a_len, b_len = batch["a_lengths"], batch["b_lengths"]
  rebuilt, labels = negatives(batch)
  assert 0.4 < labels.mean() < 0.6
  np.testing.assert_array_equal(rebuilt["a_lengths"], a_len)
  np.testing.assert_array_equal(rebuilt["b_lengths"], b_len)
  np.testing.assert_array_equal(rebuilt["doc_ids"], batch["doc_ids"])
  np.testing.assert_array_equal(rebuilt["tokens"] == batch_lib.PAD_ID,
                                batch["tokens"] == batch_lib.PAD_ID)


def test_nsp_without_other_documents_stays_positive():
  batch = make_pair_batch(seed=8, docs_per=B)
  rebuilt, labels = negatives(batch)
  assert (labels == 0).all()
  for name in batch:
    np.testing.assert_array_equal(rebuilt[name], batch[name])


def test_loss_perfect_and_uniform_predictions():
  objective = bert.BertObjective(make_config())
  rs = np.random.RandomState(9)
  mlm_targets = rs.randint(5, V, (8, P)).astype(np.int32)
  mlm_weights = (rs.rand(8, P) < 0.6).astype(np.float32)
  nsp_labels = rs.randint(0, 2, 8).astype(np.int32)
  example_mask = np.arange(8) < 6
  targets = dict(mlm_targets=mlm_targets, mlm_weights=mlm_weights,
                 nsp_labels=nsp_labels, example_mask=example_mask)
  perfect_mlm = 30.0 * jax.nn.one_hot(mlm_targets, V)
  # Unused slots and padding examples predict wrongly; they must not count.
  perfect_mlm = jnp.where(mlm_weights[..., None] > 0, perfect_mlm,
                          30.0 * jax.nn.one_hot(mlm_targets + 1, V))
  perfect_nsp = 30.0 * jax.nn.one_hot(
      np.where(example_mask, nsp_labels, 1 - nsp_labels), 2)
  loss, metrics = objective.loss(
      {"mlm_logits": perfect_mlm, "nsp_logits": perfect_nsp}, targets)
  assert float(loss) < 1e-6
  for name in ("mlm_accuracy", "nsp_accuracy"):
    total, count = metrics[name]
    assert float(total) == float(count)
  assert float(metrics["mlm_loss"][1]) == mlm_weights.sum()
  assert float(metrics["nsp_loss"][1]) == 6.0

  loss, metrics = objective.loss(
      {"mlm_logits": jnp.zeros((8, P, V)), "nsp_logits": jnp.zeros((8, 2))},
      targets)
  np.testing.assert_allclose(float(loss), np.log(V) + np.log(2), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["loss"][0]), float(loss))
  total, count = metrics["mlm_loss"]
  np.testing.assert_allclose(float(total / count), np.log(V), rtol=1e-5)


def test_corrupt_traces_once_across_steps():
  batch = make_pair_batch(seed=10)
  outputs = [corrupt(batch, step=s, setup="dynamic")[0]["tokens"]
             for s in range(3)]
  # Every batch of this module has the same shapes, so one trace serves all
  # steps (and all the other tests using this setup).
  assert TRACES["dynamic"] == 1
  assert not np.array_equal(outputs[0], outputs[1])


def test_mlm_loss_and_gradient_match_a_reference_cross_entropy():
  # Random logits: the fused formulation must agree with optax's
  # log-softmax cross-entropy (value and gradient) and with argmax accuracy.
  import optax
  rs = np.random.RandomState(11)
  logits = jnp.asarray(rs.randn(4, P, V).astype(np.float32) * 3)
  # About half the targets are the argmax, so accuracy is far from 0 and 1.
  targets = np.where(rs.rand(4, P) < 0.5, np.argmax(np.asarray(logits), -1),
                     rs.randint(0, V, (4, P))).astype(np.int32)
  weights = (rs.rand(4, P) < 0.7).astype(np.float32)

  def reference(x):
    nll = optax.softmax_cross_entropy_with_integer_labels(x, targets)
    return jnp.sum(nll * weights) / weights.sum()

  value, grad = jax.value_and_grad(
      lambda x: mlm.mlm_loss(x, targets, weights)[0])(logits)
  want_value, want_grad = jax.value_and_grad(reference)(logits)
  np.testing.assert_allclose(float(value), float(want_value), rtol=1e-6)
  np.testing.assert_allclose(grad, want_grad, atol=1e-7)
  _, metrics = mlm.mlm_loss(logits, targets, weights)
  correct = (np.argmax(np.asarray(logits), -1) == targets) * weights
  assert 0 < correct.sum() < weights.sum()
  assert float(metrics["mlm_accuracy"][0]) == correct.sum()


@pytest.mark.parametrize("separators", [1, 2])
def test_nsp_and_sop_rebuild_rows_as_the_packer_writes_them(separators):
  # A RoBERTa-style tokenizer's rows have two [SEP] after A (<s> A </s></s>
  # B </s>); negatives and swaps must keep that layout exactly, every field.
  from bertjax.data import packing
  from bertjax.objectives import sop
  rng = np.random.default_rng(5)
  seq_len, n = 20, 8
  rows = []
  for _ in range(n):
    la = int(rng.integers(1, seq_len - 6))
    lb = int(rng.integers(1, seq_len - 2 - separators - la + 1))
    a, b = (packing.Segment(rng.integers(low, low + 40, m).astype(np.int32),
                            rng.random(m) < .5) for low, m in ((5, la), (50, lb)))
    rows.append((a, b, packing.pair_row(a, b, seq_len, separators)))
  batch = {k: jnp.asarray(np.stack([r[2][k] for r in rows])) for k in rows[0][2]}
  np.testing.assert_array_equal(nsp.separators(batch), [separators] * n)
  partner = np.roll(np.arange(n), 3)
  use = np.arange(n) % 2 == 0
  negatives = jax.jit(nsp.pair_with_b_from)(batch, jnp.asarray(partner), jnp.asarray(use))
  swapped = jax.jit(sop.swap_segments)(batch, jnp.asarray(use))
  for i, (a, b, row) in enumerate(rows):
    pa, pb = rows[partner[i]][:2]
    keep = min(len(b.tokens), len(pa.tokens) + len(pb.tokens))
    cut = packing.Segment(*(np.concatenate([x, y])[:keep] for x, y in zip(pa[:2], pb[:2])))
    want_nsp = packing.pair_row(a, cut, seq_len, separators) if use[i] else row
    want_sop = packing.pair_row(b, a, seq_len, separators) if use[i] else row
    for name in batch:
      np.testing.assert_array_equal(np.asarray(negatives[name][i]), want_nsp[name],
                                    err_msg=f"nsp {name} row {i}")
      np.testing.assert_array_equal(np.asarray(swapped[name][i]), want_sop[name],
                                    err_msg=f"sop {name} row {i}")


@pytest.mark.parametrize("objective", ["bert", "albert", "unilm"])
def test_a_single_segment_model_reads_segment_zero_in_pairs(objective, demo_data,
                                                            demo_config):
  # The sentence-pair layout marks B with segment 1. A model with one segment
  # row (type_vocab_size 1, an imported RoBERTa's single_segment) must read 0
  # there: the lookup of a missing row gives NaN (a clamping gather, row 0
  # silently). The layout's mark stays for NSP negatives, SOP swaps and
  # UniLM's masks.
  from bertjax.data import pipeline
  config = demo_config.copy_and_resolve_references()
  config.objective, config.sop_swap_rate = objective, 0.5
  config.unilm_mask_rates = (0.25, 0.25, 0.25, 0.25)
  config.seq_len, config.max_predictions_per_seq, config.pair_separators = 32, 5, 2
  batch = next(pipeline.make_train_iterator(config, demo_data.source("train"),
                                            local_batch_size=8))
  assert batch["segment_ids"].max() == 1
  batch = jax.tree.map(jnp.asarray, batch)
  masks = []
  for fields, most in [({"type_vocab_size": 1}, 0),
                       ({"type_vocab_size": 2, "single_segment": True}, 0),
                       ({"type_vocab_size": 2}, 1)]:
    c = config.copy_and_resolve_references()
    c.update(fields)
    inputs, _ = jax.jit(get_objective(c).corrupt)(jax.random.key(0), batch,
                                                  jnp.int32(0))
    assert int(inputs["segment_ids"].max()) == most, fields
    masks.append(np.asarray(inputs.get("attention_mask", 0)))
  # UniLM's seq2seq mask still reads the layout's A and B.
  assert all(np.array_equal(m, masks[-1]) for m in masks)
