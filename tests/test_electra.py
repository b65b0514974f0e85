"""ELECTRA: Gumbel-max sampling, the stop-gradient, labels, shapes, mesh, resume."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from bertjax import batch as batch_lib
from bertjax import checkpointing
from bertjax import config_files
from bertjax import config_validation
from bertjax import flops
from bertjax import models
from bertjax import objectives
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import pipeline
from bertjax.models import electra as electra_model
from bertjax.objectives import electra
import variant_steps

electra_config = config_files.shipped("electra")  # configs/electra.py


def shapes(params):
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


@pytest.fixture(scope="module")
def small(demo_data):
  """The tiny config on short rows, with a two-head generator so that a
  tensor axis of 2 can split both networks' heads."""
  c = electra_config.get_config("tiny")
  c.data_dir = demo_data.data_dir
  c.batch_size, c.seq_len, c.max_predictions_per_seq = 8, 32, 5
  c.shuffle_window = 32
  c.generator_num_layers, c.generator_hidden_size = 2, 64
  c.generator_num_heads, c.generator_mlp_dim = 2, 128
  c.num_train_steps, c.warmup_steps = 6, 2
  c.log_every_steps, c.checkpoint_every_steps = 1, 3
  c.eval_every_steps, c.eval_max_batches = 0, 1
  # The mesh of the reference run: data, fsdp and tensor axes of 2 each.
  c.mesh_shape = "2,2,2"
  return c


@pytest.fixture(scope="module")
def reference_run(small, tmp_path_factory):
  """(evaluation record, per-step log, workdir) of the real loop's 6 steps of
  ``small`` on the 2x2x2 mesh: the mesh test's 8-device side, the resume
  test's uninterrupted run and the gradient test's parameters, compiled once
  for all three."""
  workdir = tmp_path_factory.mktemp("electra_reference")
  record = train.train_and_evaluate(small, str(workdir))
  with open(workdir / "metrics.jsonl") as f:
    logged = {r["step"]: r for r in map(json.loads, f) if "loss" in r}
  return record, logged, str(workdir)


def test_gumbel_max_samples_follow_the_softmax():
  logits = jnp.asarray([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
  n = 40_000
  keys = jax.random.split(jax.random.key(0), n)
  for temperature in (1.0, 0.5):
    draws = jax.jit(jax.vmap(
        lambda k: electra.gumbel_max_sample(k, logits, temperature)))(keys)
    observed = np.bincount(np.asarray(draws), minlength=6)
    expected = n * np.asarray(jax.nn.softmax(logits / temperature))
    # Pearson chi-square with 5 degrees of freedom: its 99.9% quantile is
    # 20.5; a wrong temperature or off-by-one id gives thousands.
    chi2 = np.sum((observed - expected) ** 2 / expected)
    assert chi2 < 20.5, (temperature, observed, expected)


def _stub_apply(vocab, pick):
  """A stand-in model: the generator puts all its mass on ``pick`` [B, P];
  the discriminator returns zeros."""
  def apply(inputs, method=None):
    if method == "generate":
      logits = 1e4 * jax.nn.one_hot(pick, vocab)
      return {"mlm_logits": logits}
    b, length = inputs["tokens"].shape
    return {"rtd_logits": jnp.zeros((b, length)), "hidden": jnp.zeros((b, length, 4))}
  return apply


def test_a_sample_equal_to_the_original_is_labelled_original(demo_config):
  config = electra_config.get_config("tiny")
  objective = objectives.get_objective(config)
  rng = np.random.default_rng(0)
  b, length = 4, 32
  tokens = rng.integers(batch_lib.NUM_SPECIAL_TOKENS, 50, (b, length))
  tokens[:, 0], tokens[:, -1] = batch_lib.CLS_ID, batch_lib.SEP_ID
  special = np.zeros((b, length), bool)
  special[:, [0, -1]] = True
  batch = {
      "tokens": jnp.asarray(tokens, jnp.int32),
      "special": jnp.asarray(special),
      "word_starts": jnp.ones((b, length), bool),
      "example_mask": jnp.asarray([True, True, True, False]),
      "example_id": jnp.asarray(np.stack([np.arange(b), np.zeros(b)], 1), jnp.int32),
      "epoch": jnp.zeros((b,), jnp.int32),
      "segment_ids": jnp.zeros((b, length), jnp.int32),
      "positions": jnp.broadcast_to(jnp.arange(length), (b, length)),
      "doc_ids": jnp.ones((b, length), jnp.int32),
  }
  inputs, targets = jax.jit(objective.corrupt)(jax.random.key(3), batch,
                                               jnp.int32(0))
  # Even slots sample the original token, odd slots the fixed id 7.
  slots = np.arange(inputs["masked_positions"].shape[1])
  pick = np.where(slots % 2 == 0, np.asarray(targets["mlm_targets"]), 7)
  out = jax.jit(lambda x, y: objective.forward(
      _stub_apply(config.vocab_size, jnp.asarray(pick)), x, y))(inputs, targets)
  labels = np.asarray(out["rtd_labels"])
  positions = np.asarray(inputs["masked_positions"])
  weights = np.asarray(targets["mlm_weights"])
  want = np.zeros((b, length), int)
  for i in range(b):
    for j in np.nonzero(weights[i])[0]:
      want[i, positions[i, j]] = int(pick[i, j] != tokens[i, positions[i, j]])
  np.testing.assert_array_equal(labels, want)
  assert weights[:3].sum() > 0 and want.sum() > 0  # both kinds occur
  assert not labels[special].any() and not labels[3].any()
  # Equal samples are labelled original even where the input was [MASK].
  masked = np.asarray(inputs["tokens"]) == batch_lib.MASK_ID
  assert (masked & (want == 0)).any()


def test_discriminator_loss_sends_no_gradient_into_the_generator(
    small, reference_run, demo_data):
  # The trained parameters of the reference run: no zero-initialised tensor
  # can hide a gradient.
  config = small
  model, objective = models.get_model(config), objectives.get_objective(config)
  params = jax.device_get(nn.meta.unbox(_restore(config, reference_run[2], 6).params))
  it = pipeline.make_train_iterator(config, demo_data.source("train"),
                                    local_batch_size=config.batch_size)
  batch = {k: jnp.asarray(v) for k, v in next(it).items()}
  # Jitted: eagerly, each of the masking's random ops compiled on its own.
  inputs, targets = jax.jit(objective.corrupt)(jax.random.key(0), batch,
                                               jnp.int32(0))

  disc, gen = variant_steps.loss_term_gradients(model, objective, params,
                                                  inputs, targets)

  def norms(grads, part):
    return [float(np.abs(np.asarray(g)).max()) for g in jax.tree.leaves(grads[part])]

  assert max(norms(disc, "generator")) == 0.0  # not through the samples
  assert min(norms(disc, "discriminator")) > 0.0
  assert max(norms(disc, "embeddings")) > 0.0  # shared with the discriminator
  assert max(norms(gen, "discriminator")) == 0.0
  assert max(norms(gen, "generator")) > 0.0


def test_tiny_golden_parameter_shapes():
  config = electra_config.get_config("tiny")
  V, E, P, H, F, Hg, Fg = 8000, 128, 512, 128, 512, 64, 256
  want = {
      "embeddings/word_embeddings/embedding": (V, E),
      "embeddings/position_embeddings/embedding": (P, E),
      "embeddings/type_embeddings/embedding": (2, E),
      "embeddings/layer_norm/scale": (E,),
      "embeddings/layer_norm/bias": (E,),
      # E = H: no discriminator projection; the 64-wide generator has one.
      "generator/projection/kernel": (E, Hg),
      "generator/projection/bias": (Hg,),
      "generator/mlm_head/dense/kernel": (Hg, E),
      "generator/mlm_head/dense/bias": (E,),
      "generator/mlm_head/layer_norm/scale": (E,),
      "generator/mlm_head/layer_norm/bias": (E,),
      "generator/mlm_head/output_bias": (V,),
      "discriminator/head_dense/kernel": (H, H),
      "discriminator/head_dense/bias": (H,),
      "discriminator/head_prediction/kernel": (H, 1),
      "discriminator/head_prediction/bias": (1,),
  }
  for tower, (h, heads, f) in (("discriminator", (H, 2, F)),
                               ("generator", (Hg, 1, Fg))):
    for k, v in variant_steps.encoder_layer_shapes(2, h, heads, f).items():
      want[f"{tower}/{k}"] = v
  model = models.get_model(config)
  params = jax.eval_shape(lambda r: model.init(
      {"params": r}, state_lib.dummy_inputs(config), deterministic=True),
      jax.random.key(0))["params"]
  assert shapes(params) == want


@pytest.mark.parametrize("size,want", [
    ("small", (12, 64, 1, 256)), ("base", (12, 192, 3, 768)),
    ("large", (24, 320, 5, 1280))])
def test_paper_generator_sizes(size, want):
  config = electra_config.get_config(size)
  got = electra_model.generator_size(config)
  assert (got.num_layers, got.hidden_size, got.num_heads, got.mlp_dim) == want


def test_bad_electra_fields_are_named():
  config = electra_config.get_config("tiny")
  config.generator_temperature = 0.0
  with pytest.raises(ValueError, match="generator_temperature"):
    objectives.get_objective(config)
  config = electra_config.get_config("tiny")
  config.generator_hidden_fraction = 1.5
  with pytest.raises(ValueError, match="generator_hidden_fraction"):
    models.get_model(config)


@pytest.mark.parametrize("field", ["disc_loss_weight", "generator_temperature"])
def test_an_infinite_loss_weight_or_temperature_is_refused(field):
  # Both used to be accepted: λ = inf made every loss NaN, and T = inf made
  # the never-sampled ids' logits NaN, so [PAD] was sampled everywhere.
  config = electra_config.get_config("tiny")
  config[field] = float("inf")
  with pytest.raises(ValueError, match=f"{field}=inf must be a positive number"):
    config_validation.validate(config)


@pytest.mark.parametrize("fields, words", [
    # One explicit size alone used to be ignored without a word (the
    # fraction sized the generator), a negative one likewise.
    (dict(generator_hidden_size=100), "must be all positive or all 0"),
    (dict(generator_num_layers=-1), "must be all positive or all 0"),
    # ... and heads that do not divide the width named the size table.
    (dict(generator_num_layers=1, generator_hidden_size=64,
          generator_num_heads=3, generator_mlp_dim=128),
     r"generator_hidden_size=64 is not divisible by generator_num_heads=3"),
    # A generator wider or deeper than the 2 x 128 discriminator was built
    # (the fraction is bounded by 1, explicit sizes were not).
    (dict(generator_num_layers=2, generator_hidden_size=256,
          generator_num_heads=4, generator_mlp_dim=1024),
     r"generator_hidden_size=256 is larger than the discriminator's hidden_size=128"),
    (dict(generator_num_layers=3, generator_hidden_size=64,
          generator_num_heads=1, generator_mlp_dim=256),
     r"generator_num_layers=3 is larger than the discriminator's num_layers=2"),
])
def test_explicit_generator_sizes_are_all_or_nothing(fields, words):
  config = electra_config.get_config("tiny")
  config.update(fields)
  with pytest.raises(ValueError, match=words):
    models.get_model(config)
  config.update(generator_num_layers=1, generator_hidden_size=64,
                generator_num_heads=2, generator_mlp_dim=128)
  got = electra_model.generator_size(config)
  assert (got.num_layers, got.hidden_size, got.num_heads, got.mlp_dim) == (1, 64, 2, 128)


def test_the_generator_depth_may_be_set_alone():
  # DeBERTa-v3's generator (half the depth, the width by the fraction) is
  # sized this way; it used to need all four sizes, which hid the fraction.
  config = electra_config.get_config("tiny")
  config.generator_num_layers = 1
  got = electra_model.generator_size(config)
  assert (got.num_layers, got.hidden_size, got.num_heads, got.mlp_dim) == (1, 64, 1, 256)


def _restore(config, workdir, step):
  """The train state of ``workdir``'s checkpoint at ``step``."""
  model, tx = models.get_model(config), optim.make_optimizer(config)
  mesh = sharding.make_mesh(config.mesh_shape)
  abstract, shardings = state_lib.state_shardings(model, tx, config, mesh)
  state, _ = checkpointing.Checkpointer(workdir).restore(step, abstract, shardings)
  return state


def test_same_losses_on_one_device_and_on_a_2x2x2_mesh(small, demo_data, reference_run):
  _, logged, _ = reference_run
  names = ("loss", "mlm_loss", "disc_loss", "replaced_fraction")
  it = pipeline.make_train_iterator(small, demo_data.source("train"),
                                    local_batch_size=small.batch_size)
  batches = [next(it) for _ in range(2)]
  mesh, state, step_fn = variant_steps.setup(small, "1,1,1", jax.devices()[:1])
  rows = []
  with sharding.use_mesh(mesh):
    for b in batches:
      state, m = step_fn(state, train.to_global(b, mesh), jax.random.key(small.seed))
      rows.append([float(m[k][0] / m[k][1]) for k in names])
    # The useful-FLOP count (generator included) against XLA's count of
    # the lowered step (no second compile), which adds softmax, GELU,
    # LayerNorm, sampling and Adam: a little higher, never lower.
    cost = step_fn.lower(state, train.to_global(b, mesh),
                         jax.random.key(small.seed)).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    ratio = cost["flops"] / flops.step_flops(small)
    assert 1.0 <= ratio < 1.5, ratio
  one = np.asarray(rows)
  assert np.all(np.isfinite(one)) and np.all(one[:, 3] > 0)
  # The reference run's first two steps saw the same batches on the mesh.
  assert [logged[s]["batch_hash"] for s in (1, 2)] == [
      train._batch_hash(b) for b in batches]
  on_mesh = np.asarray([[logged[s][k] for k in names] for s in (1, 2)])
  np.testing.assert_allclose(on_mesh, one, rtol=1e-5)


def test_killed_run_resumes_to_identical_result(small, reference_run, tmp_path):
  ref, ref_logged, ref_dir = reference_run
  workdir = str(tmp_path / "resumed")
  for key in ("mlm_accuracy", "disc_accuracy", "disc_all_original_accuracy",
              "disc_precision", "disc_recall", "replaced_fraction",
              "baseline_mlm_accuracy"):
    assert np.isfinite(ref[key]), key
  assert train.train_and_evaluate(small, workdir, stop_at_step=3) is None
  assert train.train_and_evaluate(small, workdir) == ref

  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    losses = {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}
  assert losses[6] == ref_logged[6]["loss"]
  a, b = _restore(small, ref_dir, 6), _restore(small, workdir, 6)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
