"""SpanBERT: geometric whole-word spans, 80/10/10 per span, the span boundary
objective's targets and head, golden shapes, and a real train step."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax import models
from bertjax import objectives
from bertjax import state as state_lib
from bertjax.models import spanbert as spanbert_model
from bertjax.objectives import spans
import variant_steps

spanbert = config_files.shipped("spanbert")  # configs/spanbert.py, loaded by path

# The paper's setting: rows of 512 tokens, 15% of them (at most 76) masked.
SEQ_LEN, SLOTS, ROWS, VOCAB = 512, 76, 192, 30_000


def law(p=0.2, max_len=10):
  """The clipped geometric law written out: P(n) ∝ p (1 - p)^(n - 1)."""
  n = np.arange(1, max_len + 1)
  weights = np.array([p * (1 - p) ** (k - 1) for k in n])
  return n, weights / (1 - (1 - p) ** max_len)


def bert_count(n, rate, max_predictions):
  return 0 if n == 0 else min(max_predictions, max(1, round(rate * n)))


def packed_rows(rows=ROWS, seq_len=SEQ_LEN, seed=0):
  """Full-sentences-style rows: [CLS] doc [SEP] doc [SEP] ... PAD, with 1 to 3
  documents per row, words of 1-3 tokens and 0-40 padding tokens."""
  rs = np.random.RandomState(seed)
  b = batch_lib.empty_batch(rows, seq_len)
  for r in range(rows):
    end = seq_len - rs.randint(0, 41)
    cuts = np.sort(rs.choice(np.arange(20, end - 20), rs.randint(0, 3),
                             replace=False))
    seps = list(cuts) + [end - 1]
    tokens = rs.randint(batch_lib.NUM_SPECIAL_TOKENS, VOCAB, seq_len)
    tokens[0] = batch_lib.CLS_ID
    tokens[seps] = batch_lib.SEP_ID
    tokens[end:] = batch_lib.PAD_ID
    special = np.isin(tokens, [batch_lib.CLS_ID, batch_lib.SEP_ID,
                               batch_lib.PAD_ID])
    starts = rs.rand(seq_len) < 0.7
    starts[special] = True
    starts[1:] |= special[:-1]  # a word begins after every special token
    starts[end:] = False  # padding joins no word, as the packers leave it
    doc = np.zeros(seq_len, np.int32)
    previous = 0
    for k, sep in enumerate(seps):
      doc[previous:sep + 1] = k + 1
      previous = sep + 1
    b["tokens"][r], b["special"][r], b["word_starts"][r] = tokens, special, starts
    b["doc_ids"][r] = doc
    b["positions"][r, :end] = np.arange(end)
  b["example_mask"][:] = True
  b["example_id"][:, 0] = np.arange(rows)
  return b


def span_config(**overrides):
  config = spanbert.get_config("tiny")
  config.seq_len, config.max_predictions_per_seq = SEQ_LEN, SLOTS
  config.vocab_size = VOCAB
  for k, v in overrides.items():
    config[k] = v
  return config


@pytest.fixture(scope="module")
def corrupted():
  """One jitted corrupt of ROWS packed rows (host numpy results)."""
  batch = packed_rows()
  objective = objectives.get_objective(span_config())
  inputs, targets = jax.jit(objective.corrupt)(
      jax.random.key(0), {k: jnp.asarray(v) for k, v in batch.items()},
      jnp.int32(7))
  return batch, jax.device_get(inputs), jax.device_get(targets)


def spans_of(inputs, targets, r):
  """{(left, right): sorted positions} of row r's used slots."""
  used = targets["mlm_weights"][r] > 0
  groups = {}
  for pos, left, right in zip(inputs["masked_positions"][r][used],
                              inputs["sbo_left"][r][used],
                              inputs["sbo_right"][r][used]):
    groups.setdefault((int(left), int(right)), []).append(int(pos))
  return groups


def test_geometric_length_probs_is_the_clipped_law():
  n, want = law()
  np.testing.assert_allclose(spans.geometric_length_probs(0.2, 10), want,
                             rtol=1e-12)
  # The paper's mean span length: 3.8 words.
  assert abs(float(np.sum(n * want)) - 3.8) < 0.01
  for p, max_len, field in ((0.0, 10, "span_geometric_p"),
                            (0.2, 0, "max_span_length")):
    with pytest.raises(ValueError, match=field):
      spans.geometric_length_probs(p, max_len)


def test_span_lengths_follow_clipped_geometric_law(corrupted):
  batch, inputs, targets = corrupted
  lengths = []
  for r in range(ROWS):
    for (left, right) in spans_of(inputs, targets, r):
      lengths.append(int(batch["word_starts"][r, left + 1:right].sum()))
  lengths = np.asarray(lengths)
  n, want = law()
  assert lengths.min() >= 1 and lengths.max() <= 10
  hist = np.bincount(lengths, minlength=11)[1:] / len(lengths)
  mean_want = float(np.sum(n * want))
  # ~2800 spans: the standard error of the mean is sqrt(6.5 / 2800) ~ 0.05.
  # Spans keep their drawn length except the one per row (of ~15) that the
  # budget cuts, which lowers the mean by ~0.2; 0.35 allows that plus 3 se.
  assert abs(lengths.mean() - mean_want) < 0.35, (lengths.mean(), mean_want)
  # Histogram: total variation distance to the law (cut spans + noise ~0.04).
  assert 0.5 * np.abs(hist - want).sum() < 0.06, np.round(hist, 3)
  # Long spans do occur in their share: P(n >= 6) = 0.245 under the law.
  assert abs(hist[5:].sum() - want[5:].sum()) < 0.05


def test_masking_budget_is_fifteen_percent(corrupted):
  batch, _, targets = corrupted
  chosen = targets["mlm_weights"].sum(axis=1)
  candidates = (~batch["special"]).sum(axis=1)
  for r in range(ROWS):
    budget = bert_count(int(candidates[r]), 0.15, SLOTS)
    word = np.cumsum(batch["word_starts"][r])
    longest_word = np.bincount(word, weights=(~batch["special"][r]).astype(float)).max()
    # The cut span loses less than one word; the budget is never exceeded.
    assert budget - longest_word < chosen[r] <= budget
  rate = chosen.sum() / candidates.sum()
  assert 0.14 < rate <= 0.15 + 1e-9, rate


def test_spans_are_whole_words_inside_one_document(corrupted):
  batch, inputs, targets = corrupted
  for r in range(ROWS):
    special, doc = batch["special"][r], batch["doc_ids"][r]
    starts = batch["word_starts"][r]
    for (left, right), positions in spans_of(inputs, targets, r).items():
      inside = np.arange(left + 1, right)
      assert not special[inside].any()
      assert len(set(doc[inside])) == 1
      assert starts[left + 1] and starts[right]  # whole words only


def test_sbo_targets_point_just_outside_each_span(corrupted):
  batch, inputs, targets = corrupted
  for r in range(ROWS):
    used = targets["mlm_weights"][r] > 0
    chosen = set(inputs["masked_positions"][r][used].tolist())
    groups = spans_of(inputs, targets, r)
    covered = []
    for (left, right), positions in groups.items():
      assert 0 <= left < right < SEQ_LEN
      # The slots sharing a boundary pair are exactly the tokens between.
      assert positions == list(range(left + 1, right))
      covered += positions
      # Each boundary is outside the span: unchosen, or a neighbouring span.
      if left in chosen:
        assert any(other_right - 1 == left for _, other_right in groups)
      if right in chosen:
        assert any(other_left + 1 == right for other_left, _ in groups)
    assert len(covered) == len(set(covered)) == used.sum()  # disjoint spans
    offsets = inputs["sbo_offsets"][r][used]
    np.testing.assert_array_equal(
        offsets, inputs["masked_positions"][r][used] - inputs["sbo_left"][r][used] - 1)
    np.testing.assert_array_equal(inputs["sbo_offsets"][r][~used], 0)


def test_80_10_10_is_decided_per_span(corrupted):
  batch, inputs, targets = corrupted
  kinds = []
  for r in range(ROWS):
    new = inputs["tokens"][r]
    old = batch["tokens"][r]
    for positions in spans_of(inputs, targets, r).values():
      is_mask = new[positions] == batch_lib.MASK_ID
      assert is_mask.all() or not is_mask.any(), "a span was split"
      if is_mask.all():
        kinds.append("mask")
      elif (new[positions] == old[positions]).all():
        kinds.append("keep")
      else:
        # A random span: every token redrawn (equal to the old one with
        # chance 1/V only), ids outside the specials.
        assert (new[positions] != old[positions]).mean() > 0.5
        assert new[positions].min() >= batch_lib.NUM_SPECIAL_TOKENS
        kinds.append("random")
  kinds = np.asarray(kinds)
  # ~2800 spans: sd of a 0.1 share ~0.006, of 0.8 ~0.008; tolerance ~4 sd.
  assert abs((kinds == "mask").mean() - 0.8) < 0.035
  assert abs((kinds == "random").mean() - 0.1) < 0.025
  assert abs((kinds == "keep").mean() - 0.1) < 0.025
  untouched = np.ones_like(batch["tokens"], bool)
  for r in range(ROWS):
    untouched[r, inputs["masked_positions"][r][targets["mlm_weights"][r] > 0]] = False
  np.testing.assert_array_equal(inputs["tokens"][untouched],
                                batch["tokens"][untouched])


def test_sbo_head_reads_only_the_two_boundaries_and_the_offset():
  vocab, width, length = 11, 8, 16
  head = spanbert_model.SboHead(vocab_size=vocab, max_offset=5)
  rs = np.random.RandomState(0)
  table = jnp.asarray(rs.randn(vocab, width), jnp.float32)
  decode = lambda x: x @ table.T
  hidden = jnp.asarray(rs.randn(1, length, width), jnp.float32)
  left, right, offsets = (jnp.array([[3, 9]]), jnp.array([[7, 12]]),
                          jnp.array([[2, 0]]))
  # Random values of the right shapes (faster than compiling the init).
  shapes = jax.eval_shape(lambda k: head.init(k, hidden, left, right, offsets,
                                              decode), jax.random.key(3))
  params = jax.tree.map(
      lambda s: jnp.asarray(rs.randn(*s.shape), jnp.float32),
      nn.meta.unbox(shapes))
  apply = jax.jit(lambda h, l, r, o: head.apply(params, h, l, r, o, decode))
  run = lambda h, l=left, r=right, o=offsets: np.asarray(apply(h, l, r, o))
  base = run(hidden)
  assert base.shape == (1, 2, vocab)
  # Slot 0 reads positions 3 and 7 only: others leave its logits unchanged.
  elsewhere = hidden.at[0, jnp.array([0, 4, 5, 6, 8, 9, 12, 15])].add(1.0)
  np.testing.assert_allclose(run(elsewhere)[0, 0], base[0, 0], atol=1e-6)
  for pos in (3, 7):
    assert np.abs(run(hidden.at[0, pos].add(1.0))[0, 0] - base[0, 0]).max() > 1e-3
  # Left and right play different roles; the offset matters.
  assert np.abs(run(hidden, l=right, r=left)[0, 0] - base[0, 0]).max() > 1e-3
  assert np.abs(run(hidden, o=offsets + 1)[0, 0] - base[0, 0]).max() > 1e-3


def test_tiny_golden_parameter_shapes():
  config = spanbert.get_config("tiny")
  model = models.get_model(config)
  params = jax.eval_shape(
      lambda r: model.init({"params": r}, state_lib.dummy_inputs(config),
                           deterministic=True), jax.random.key(0))["params"]
  # tiny: 2 layers, H 128, 2 heads of 64, MLP 512; V 8000; 512 positions;
  # one token type; 32 SBO offsets (0..31).
  V, H, F, P, O = 8000, 128, 512, 512, 32
  want = {
      "embeddings/word_embeddings/embedding": (V, H),
      "embeddings/position_embeddings/embedding": (P, H),
      "embeddings/type_embeddings/embedding": (1, H),
      "embeddings/layer_norm/scale": (H,),
      "embeddings/layer_norm/bias": (H,),
      "mlm_head/dense/kernel": (H, H),
      "mlm_head/dense/bias": (H,),
      "mlm_head/layer_norm/scale": (H,),
      "mlm_head/layer_norm/bias": (H,),
      "mlm_head/output_bias": (V,),
      # SBO: [x_{s-1}; x_{e+1}; p] (3H) -> H -> H, decoder tied to the words.
      "sbo_head/position_embeddings/embedding": (O, H),
      "sbo_head/dense_0/kernel": (3 * H, H),
      "sbo_head/dense_0/bias": (H,),
      "sbo_head/layer_norm_0/scale": (H,),
      "sbo_head/layer_norm_0/bias": (H,),
      "sbo_head/dense_1/kernel": (H, H),
      "sbo_head/dense_1/bias": (H,),
      "sbo_head/layer_norm_1/scale": (H,),
      "sbo_head/layer_norm_1/bias": (H,),
      "sbo_head/output_bias": (V,),
  }
  want.update(variant_steps.encoder_layer_shapes(2, H, 2, F))
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  # No pooler and no NSP head.
  assert {k: tuple(v.shape) for k, v in flat.items()} == want


def test_bad_span_fields_are_named():
  for field, value in (("span_geometric_p", 1.5), ("max_span_length", 0),
                       ("sbo_max_offset", -1)):
    with pytest.raises(ValueError, match=f"--config.{field}"):
      objectives.get_objective(span_config(**{field: value}))
  with pytest.raises(ValueError, match="--config.sbo_max_offset"):
    models.get_model(span_config(sbo_max_offset=-1))


def test_tiny_config_runs_a_real_train_step(demo_data):
  config = spanbert.get_config("tiny")
  config.data_dir = demo_data.data_dir
  config.batch_size, config.seq_len, config.max_predictions_per_seq = 8, 64, 10
  config.shuffle_window = 32
  state, metrics = variant_steps.one_train_step(config, demo_data.source("train"))
  metrics = jax.device_get(metrics)
  assert not any(name.startswith("nsp") for name in metrics)
  means = {k: float(s) / max(float(c), 1e-9) for k, (s, c) in metrics.items()}
  for name in ("mlm_loss", "sbo_loss", "mlm_accuracy", "sbo_accuracy"):
    assert np.isfinite(means[name]) and metrics[name][1] > 0, name
  # At initialisation both heads are near uniform over the vocabulary, and
  # the loss is their sum.
  for name in ("mlm_loss", "sbo_loss"):
    assert abs(means[name] - np.log(config.vocab_size)) < 1.0, means
  np.testing.assert_allclose(means["loss"], means["mlm_loss"] + means["sbo_loss"],
                             rtol=1e-5)
