"""ALBERT: factorized embedding, layer sharing, SOP swaps, n-gram masking."""

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
from bertjax.data import packing
from bertjax.models import albert
from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import sop
import variant_steps

albert_config = config_files.shipped("albert")  # configs/albert.py, loaded by path


def shapes(params):
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


def abstract_params(config):
  model = models.get_model(config)
  return jax.eval_shape(
      lambda r: model.init({"params": r}, state_lib.dummy_inputs(config),
                           deterministic=True), jax.random.key(0))["params"]


def small_model(sharing, num_layers=3):
  return albert.AlbertForPretraining(
      vocab_size=100, max_position_embeddings=64, type_vocab_size=2,
      embedding_size=16, num_layers=num_layers, hidden_size=32, num_heads=2,
      mlp_dim=64, layer_sharing=sharing)


def inputs(seq_len=16, batch=2, seed=0):
  rng = np.random.default_rng(seed)
  return {
      "tokens": jnp.asarray(rng.integers(5, 100, (batch, seq_len)), jnp.int32),
      "segment_ids": jnp.zeros((batch, seq_len), jnp.int32),
      "positions": jnp.broadcast_to(jnp.arange(seq_len), (batch, seq_len)),
      "doc_ids": jnp.ones((batch, seq_len), jnp.int32),
      "masked_positions": jnp.asarray([[1, 2, 3]] * batch, jnp.int32),
  }


@pytest.mark.parametrize("sharing", ["all", "attention", "ffn", "none"])
def test_parameter_counts_match_the_closed_form(sharing):
  V, P, T, E, H, F, L = 100, 64, 2, 16, 32, 64, 3
  params = jax.eval_shape(
      lambda r: small_model(sharing).init({"params": r}, inputs()),
      jax.random.key(0))["params"]
  attention = 4 * (H * H + H) + 2 * H  # q, k, v, out + its LayerNorm
  ffn = (H * F + F) + (F * H + H) + 2 * H  # wi, wo + its LayerNorm
  copies_att = 1 if sharing in ("all", "attention") else L
  copies_ffn = 1 if sharing in ("all", "ffn") else L
  embedding = V * E + P * E + T * E + 2 * E + E * H + H
  heads = (H * H + H) + (H * E + E) + 2 * E + V + (H * 2 + 2)
  emb = params["embeddings"]
  factorized = (models.count_params(emb["word_embeddings"]) +
                models.count_params(emb["projection"]["kernel"]))
  assert factorized == V * E + E * H
  assert models.count_params(emb) == embedding
  assert models.count_params(params["encoder"]) == (
      copies_att * attention + copies_ffn * ffn)
  assert models.count_params(params) == (
      embedding + copies_att * attention + copies_ffn * ffn + heads)


def test_all_sharing_is_one_layer_applied_l_times():
  shared = small_model("all", num_layers=3)
  x = inputs()
  p_shared = jax.jit(shared.init)({"params": jax.random.key(1)}, x)["params"]
  one_layer = jax.eval_shape(small_model("none", num_layers=1).init,
                             {"params": jax.random.key(2)}, x)["params"]
  assert (models.count_params(p_shared["encoder"]) ==
          models.count_params(one_layer["encoder"]))
  # An unshared 3-layer model given the shared weights in every layer
  # computes the same function.
  p_none = dict(p_shared)
  p_none["encoder"] = {f"{name}_{i}": p_shared["encoder"][f"{name}_0"]
                       for name in ("attention", "attention_norm", "mlp",
                                    "mlp_norm") for i in range(3)}
  def hidden(model, params):
    return np.asarray(jax.jit(model.apply)({"params": params}, x)["hidden"])

  np.testing.assert_allclose(hidden(shared, p_shared),
                             hidden(small_model("none", 3), p_none),
                             rtol=1e-5, atol=1e-5)


def test_unknown_sharing_mode_is_rejected():
  config = albert_config.get_config("tiny")
  config.layer_sharing = "everything"
  with pytest.raises(ValueError, match="attention, ffn, none"):
    models.get_model(config)


def test_tiny_golden_parameter_shapes():
  config = albert_config.get_config("tiny")
  V, E, H, F, P = 8000, 128, 128, 512, 512
  want = {
      "embeddings/word_embeddings/embedding": (V, E),
      "embeddings/position_embeddings/embedding": (P, E),
      "embeddings/type_embeddings/embedding": (2, E),
      "embeddings/layer_norm/scale": (E,),
      "embeddings/layer_norm/bias": (E,),
      "embeddings/projection/kernel": (E, H),
      "embeddings/projection/bias": (H,),
      "pooler/kernel": (H, H),
      "pooler/bias": (H,),
      "mlm_head/dense/kernel": (H, E),
      "mlm_head/dense/bias": (E,),
      "mlm_head/layer_norm/scale": (E,),
      "mlm_head/layer_norm/bias": (E,),
      "mlm_head/output_bias": (V,),
      "sop/kernel": (H, 2),
      "sop/bias": (2,),
  }
  for proj in ("query", "key", "value"):
    want[f"encoder/attention_0/{proj}/kernel"] = (H, 2, 64)
    want[f"encoder/attention_0/{proj}/bias"] = (2, 64)
  want["encoder/attention_0/out/kernel"] = (2, 64, H)
  want["encoder/attention_0/out/bias"] = (H,)
  want["encoder/mlp_0/wi/kernel"] = (H, F)
  want["encoder/mlp_0/wi/bias"] = (F,)
  want["encoder/mlp_0/wo/kernel"] = (F, H)
  want["encoder/mlp_0/wo/bias"] = (H,)
  for norm in ("attention_norm_0", "mlp_norm_0"):
    want[f"encoder/{norm}/scale"] = (H,)
    want[f"encoder/{norm}/bias"] = (H,)
  assert shapes(abstract_params(config)) == want


def pair_batch(rng, n, seq_len):
  rows = []
  for _ in range(n):
    la = int(rng.integers(1, seq_len - 5))
    lb = int(rng.integers(1, seq_len - 2 - la))
    a = packing.Segment(rng.integers(5, 50, la).astype(np.int32), rng.random(la) < .5)
    b = packing.Segment(rng.integers(50, 99, lb).astype(np.int32), rng.random(lb) < .5)
    rows.append((a, b, packing.pair_row(a, b, seq_len)))
  return rows


def test_sop_negatives_are_exactly_the_swapped_pair():
  rng = np.random.default_rng(0)
  seq_len = 24
  rows = pair_batch(rng, 12, seq_len)
  batch = {k: jnp.asarray(np.stack([r[2][k] for r in rows]))
           for k in rows[0][2]}
  swap = np.arange(12) % 3 == 0
  out = jax.jit(sop.swap_segments)(batch, jnp.asarray(swap))
  for i, (a, b, row) in enumerate(rows):
    want = packing.pair_row(b, a, seq_len) if swap[i] else row
    for name, value in want.items():
      np.testing.assert_array_equal(np.asarray(out[name][i]), value, err_msg=name)


def test_sop_swap_rate_and_labels():
  rng = np.random.default_rng(1)
  rows = pair_batch(rng, 64, 20)
  batch = {k: jnp.asarray(np.stack([r[2][k] for r in rows])) for k in rows[0][2]}
  batch["example_mask"] = jnp.asarray(np.arange(64) < 60)
  labels = []
  make_swaps = jax.jit(lambda keys: sop.make_swaps(keys, batch, 0.5))
  for seed in range(40):
    out, lab = make_swaps(jax.random.split(jax.random.key(seed), 64))
    lab = np.asarray(lab)
    assert not lab[60:].any()  # padding examples are never swapped
    swapped = np.asarray(out["a_lengths"]) != np.asarray(batch["a_lengths"])
    assert not (swapped & (lab == 0)).any()
    labels.append(lab[:60])
  # 2400 Bernoulli(0.5) draws: sd 0.0102; 4 sd tolerance.
  assert abs(np.mean(labels) - 0.5) < 0.041


def test_ngram_lengths_follow_one_over_n():
  probs = masking.ngram_length_probs(3)
  np.testing.assert_allclose(probs, np.array([6, 3, 2]) / 11)
  num_units = 256
  candidates = np.ones(num_units, bool)
  candidates[[0, 100, 101, 255]] = False  # specials split the row into runs
  tiles = jax.jit(jax.vmap(lambda k: masking.tile_units(
      k, jnp.asarray(candidates), probs)))(
          jax.random.split(jax.random.key(0), 200))
  tiles = np.asarray(tiles)
  assert np.all(tiles[:, ~candidates] == num_units)
  counts = np.zeros(4)
  for row in tiles:
    starts, sizes = np.unique(row[candidates], return_counts=True)
    # A span never crosses a special token: its units are consecutive.
    assert np.all(sizes <= 3)
    for s, n in zip(starts, sizes):
      assert candidates[s:s + n].all() and np.all(row[s:s + n] == s)
    # The last span of each run may be cut by the run's end; leave them out.
    complete = [n for s, n in zip(starts, sizes) if candidates[s + n]]
    counts += np.bincount(complete, minlength=4)
  freq = counts[1:] / counts.sum()
  # About 27K spans: sd <= 0.003 per frequency; tolerance 0.012 (4 sd).
  np.testing.assert_allclose(freq, probs, atol=0.012)


def test_ngram_masking_takes_whole_words_within_budget():
  rng = np.random.default_rng(5)
  seq_len, slots = 128, 20
  special = np.zeros(seq_len, bool)
  special[[0, 60, 127]] = True
  word_starts = (rng.random(seq_len) < 0.5) | special
  word_starts[1] = word_starts[61] = True
  word = np.cumsum(word_starts) - 1
  choose = jax.jit(jax.vmap(lambda k: masking.choose_spans(
      k, jnp.asarray(~special), jnp.asarray(word_starts), rate=0.15,
      max_predictions=slots, length_probs=masking.ngram_length_probs(3),
      whole_word=True)))
  positions, weights = choose(jax.random.split(jax.random.key(0), 300))
  budget = round(0.15 * 125)
  chosen_counts, adjacent = [], []
  for pos, w in zip(np.asarray(positions), np.asarray(weights)):
    chosen = np.zeros(seq_len, bool)
    chosen[pos[w > 0]] = True
    assert not (chosen & special).any()
    # Whole words: every token of a chosen word is chosen.
    for wd in np.unique(word[chosen]):
      assert chosen[(word == wd) & ~special].all()
    chosen_counts.append(chosen.sum())
    adjacent.append(np.mean(chosen[1:][chosen[:-1]]))
  assert max(chosen_counts) <= budget
  assert np.mean(chosen_counts) > 0.97 * budget
  # n-grams of ~1.6 words of ~2 tokens: a chosen token's right neighbour is
  # chosen far more often than the 15% of independent choices.
  assert np.mean(adjacent) > 0.5


@pytest.fixture(scope="module")
def albert_small(demo_data):
  c = albert_config.get_config("tiny")
  c.data_dir = demo_data.data_dir
  c.batch_size, c.seq_len, c.max_predictions_per_seq = 8, 48, 8
  c.shuffle_window = 32
  return c


def test_tiny_config_runs_a_real_train_step(albert_small, demo_data):
  config = albert_small
  state, metrics = variant_steps.one_train_step(config, demo_data.source("train"))
  for name in ("loss", "mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"):
    total, count = (float(x) for x in metrics[name])
    assert np.isfinite(total) and count > 0, name
  assert int(state.step) == 1


def test_sop_objective_rejects_single_segment_layouts():
  config = albert_config.get_config("tiny")
  config.layout = "full_sentences"
  with pytest.raises(ValueError, match="sentence_pairs"):
    objectives.get_objective(config)


@pytest.mark.parametrize("name", ["bert", "mlm_only", "albert"])
def test_every_mlm_objective_takes_the_masking_options(name, demo_config):
  config = demo_config.copy_and_resolve_references()
  config.objective = name
  config.sop_swap_rate = 0.5
  config.max_ngram, config.whole_word_masking = 3, True
  settings = objectives.get_objective(config).mlm
  assert settings.max_ngram == 3 and settings.whole_word
  config.max_ngram = 0
  with pytest.raises(ValueError, match="max_ngram"):
    objectives.get_objective(config)


def test_ngram_option_of_mask_batch_masks_neighbours_together(demo_config):
  seq_len, n = 64, 64
  special = np.zeros((n, seq_len), bool)
  special[:, [0, 31, 63]] = True
  tokens = np.where(special, batch_lib.SEP_ID,
                    np.random.default_rng(2).integers(5, 900, (n, seq_len)))
  config = demo_config.copy_and_resolve_references()
  config.max_ngram, config.max_predictions_per_seq = 3, 12
  settings = mlm.MlmSettings.from_config(config)
  out = jax.jit(lambda *args: mlm.mask_batch(*args, settings))(
      jax.random.split(jax.random.key(0), n), jnp.asarray(tokens, jnp.int32),
      jnp.asarray(special), jnp.ones((n, seq_len), bool), jnp.ones((n,), bool))
  chosen = np.zeros((n, seq_len), bool)
  pos, w = np.asarray(out["masked_positions"]), np.asarray(out["mlm_weights"])
  for i in range(n):
    chosen[i, pos[i][w[i] > 0]] = True
  assert not (chosen & special).any()
  assert np.all(chosen.sum(1) == round(0.15 * 61))
  # Words are single tokens here. Independent choices of 9 of 61 tokens make
  # a chosen token's right neighbour chosen with probability 8/60 = 0.13;
  # n-grams (E[n] = 18/11) make it about (E[n] - 1) / E[n] = 0.39.
  assert np.mean(chosen[:, 1:][chosen[:, :-1]]) > 0.3
