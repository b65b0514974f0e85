"""Scale features: gradient accumulation, scan + remat, FLOP counting, AOT TPU compile."""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax import batch as batch_lib
from bertjax import config_validation
from bertjax import flops
from bertjax import models
from bertjax import objectives
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.models import encoder as encoder_lib
from bertjax.models import layers

from test_optim import _norm


def _config(demo_config, **overrides):
  c = demo_config.copy_and_resolve_references()
  c.vocab_size = 512
  c.seq_len = 32
  c.max_predictions_per_seq = 5
  c.batch_size = 32
  c.dropout_rate = 0.0
  c.attention_dropout_rate = 0.0
  for k, v in overrides.items():
    c[k] = v
  return c


def _pair_batch(config, seed=0):
  """A full [CLS] A [SEP] B [SEP] batch whose examples come from distinct docs."""
  b, s = config.batch_size, config.seq_len
  rng = np.random.default_rng(seed)
  out = batch_lib.empty_batch(b, s)
  a_len = rng.integers(3, s - 6, b)
  for i in range(b):
    b_len = s - 3 - a_len[i]
    out["tokens"][i] = rng.integers(batch_lib.NUM_SPECIAL_TOKENS, config.vocab_size, s)
    out["tokens"][i, [0, 1 + a_len[i], s - 1]] = [
        batch_lib.CLS_ID, batch_lib.SEP_ID, batch_lib.SEP_ID]
    out["special"][i] = False
    out["special"][i, [0, 1 + a_len[i], s - 1]] = True
    out["segment_ids"][i, 2 + a_len[i]:] = 1
    out["a_lengths"][i], out["b_lengths"][i] = a_len[i], b_len
  out["positions"][:] = np.arange(s)
  out["doc_ids"][:] = 1
  out["word_starts"][:] = True
  out["example_id"][:, 0] = np.arange(b)
  out["example_mask"][:] = True
  return out


def _sgd_step(config, microbatches, mesh):
  """One SGD(lr=1) step: new params = params - grads, so grads are exposed."""
  model = models.get_model(config)
  tx = optax.sgd(1.0)
  state, shardings = state_lib.create_train_state(model, tx, config, mesh)
  params = jax.device_get(state.params)
  step_fn = train.make_train_step(model, objectives.get_objective(config), tx,
                                  shardings, mesh, microbatches=microbatches)
  batch = train.to_global(_pair_batch(config), mesh)
  with sharding.use_mesh(mesh):
    compiled = step_fn.lower(state, batch, jax.random.key(3)).compile()
    new, metrics = compiled(state, batch, jax.random.key(3))
  grads = jax.tree.map(lambda a, b: a - b, params, jax.device_get(new.params))
  return grads, jax.device_get(metrics), compiled


def test_four_microbatches_of_eight_equal_one_batch_of_32(demo_config):
  config = _config(demo_config)
  mesh = sharding.Mesh(np.asarray(jax.devices()[:2]).reshape(2, 1, 1),
                       sharding.MESH_AXES)
  g1, m1, compiled = _sgd_step(config, 1, mesh)
  g4, m4, _ = _sgd_step(config, 4, mesh)
  for name in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy"):
    np.testing.assert_allclose(m4[name][0] / m4[name][1], m1[name][0] / m1[name][1],
                               rtol=1e-5, err_msg=name)
  # Counts add up exactly over the micro-batches.
  assert m4["mlm_loss"][1] == m1["mlm_loss"][1]
  assert m4["nsp_loss"][1] == m1["nsp_loss"][1] == config.batch_size
  # In numpy, as the gradients are (jnp here compiled a program per leaf shape).
  norm1 = _norm(g1)
  assert norm1 > 0
  diff = _norm(jax.tree.map(lambda a, b: np.subtract(b, a, dtype=np.float64), g1, g4))
  assert diff <= 1e-5 * norm1

  # The useful-FLOP formula against XLA's own count of the compiled step: XLA
  # also counts softmax, GELU, LayerNorm, masking and Adam, so it is a little
  # higher, never lower. Its count is per device of the 2-device mesh.
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  ratio = 2 * cost["flops"] / flops.step_flops(config)
  assert 1.0 <= ratio < 1.5, ratio


def test_microbatch_validation_names_the_fix(demo_config):
  config = _config(demo_config, microbatches=3)
  mesh = sharding.make_mesh("2,1,1", jax.devices()[:2])
  with pytest.raises(ValueError, match="microbatches"):
    config_validation.check_mesh(config, mesh)
  config_validation.check_mesh(_config(demo_config, microbatches=4), mesh)
  with pytest.raises(ValueError, match="remat"):
    config_validation.validate(_config(demo_config, remat="some"))


@pytest.fixture(scope="module")
def encoder_setup():
  kw = dict(num_layers=3, num_heads=2, mlp_dim=64)
  x = jax.random.normal(jax.random.key(1), (2, 8, 32))
  doc_ids = jnp.array([[1] * 6 + [0] * 2, [1] * 4 + [2] * 4], jnp.int32)
  mask = layers.doc_attention_mask(doc_ids)
  params = jax.jit(lambda k: encoder_lib.Encoder(**kw).init(k, x, mask, True))(
      jax.random.key(0))["params"]
  return kw, x, mask, params


def _loss_and_grads(module, params, x, mask):
  f = lambda p: jnp.sum(jnp.sin(module.apply({"params": p}, x, mask, True)))
  # Jitted: eagerly, every op of the forward and backward compiles on its own.
  return jax.jit(jax.value_and_grad(f))(params)


def test_scanned_encoder_matches_unscanned_with_stacked_params(encoder_setup):
  kw, x, mask, boxed = encoder_setup
  scanned = encoder_lib.Encoder(**kw, scan_layers=True)
  scanned_boxed = jax.jit(lambda k: scanned.init(k, x, mask, True))(
      jax.random.key(0))["params"]
  # The stacked axis is logical 'layers', in front of the block's own names.
  specs = nn.get_partition_spec(scanned_boxed)
  assert specs["layers"]["block"]["mlp"]["wi"]["kernel"] == jax.sharding.PartitionSpec(
      "layers", "embed", "mlp")
  assert jax.tree.leaves(nn.meta.unbox(scanned_boxed))[0].shape[0] == 3
  params = nn.meta.unbox(boxed)
  stacked = encoder_lib.stack_layers(params, 3)
  assert jax.tree.structure(stacked) == jax.tree.structure(
      nn.meta.unbox(scanned_boxed))
  loss_u, grads_u = _loss_and_grads(encoder_lib.Encoder(**kw), params, x, mask)
  loss_s, grads_s = _loss_and_grads(scanned, stacked, x, mask)
  np.testing.assert_allclose(loss_s, loss_u, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(encoder_lib.unstack_layers(grads_s)),
                  jax.tree.leaves(grads_u)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)  # float32 rounding


@pytest.mark.parametrize("scan,policy", [(False, "full"), (True, "dots")])
def test_remat_does_not_change_gradients(encoder_setup, scan, policy):
  kw, x, mask, boxed = encoder_setup
  params = nn.meta.unbox(boxed)
  if scan:
    params = encoder_lib.stack_layers(params, 3)
  plain = encoder_lib.Encoder(**kw, scan_layers=scan)
  remat = encoder_lib.Encoder(**kw, scan_layers=scan, remat=policy)
  loss_p, grads_p = _loss_and_grads(plain, params, x, mask)
  loss_r, grads_r = _loss_and_grads(remat, params, x, mask)
  np.testing.assert_allclose(loss_r, loss_p, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_r), jax.tree.leaves(grads_p)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # float32 rounding
  # Remat really is in the program: the backward pass recomputes the forward.
  jaxpr = str(jax.make_jaxpr(jax.grad(
      lambda p: jnp.sum(remat.apply({"params": p}, x, mask, True))))(params))
  assert "remat" in jaxpr or "checkpoint" in jaxpr


def test_step_flops_by_hand(demo_config):
  # tiny: L=2, H=128, F=512; V=8000, B=32, S=128, P=20 slots per row.
  config = demo_config
  n = 2 * (4 * 128 * 128 + 2 * 128 * 512)
  tokens = 32 * 128
  want = (6 * n * tokens + 12 * 2 * 128 * 128 * tokens
          + 6 * (128 * 128 + 128 * 8000) * 32 * 20 + 6 * (128 * 128 + 256) * 32)
  # The sparse last layer (default) runs its queries, output projection,
  # feed-forward and attention at 32 x (20 slots + [CLS]) rows, not 4096.
  skipped = (6 * (2 * 128 * 128 + 2 * 128 * 512) + 12 * 128 * 128) * (tokens - 32 * 21)
  assert config.sparse_last_layer
  assert flops.step_flops(config) == want - skipped
  full = config.copy_and_resolve_references()
  full.sparse_last_layer = False
  assert flops.step_flops(full) == want


def test_peaks():
  # "TPU v5 lite" (v5e) must not be read as "TPU v5" (v5p).
  assert flops._datasheet_peak("TPU v5 lite") == 197e12
  assert flops._datasheet_peak("TPU v5") == 459e12
  assert flops._datasheet_peak("TPU v4") == 275e12
  assert flops._datasheet_peak("a new chip") is None
  peak = flops.peak_flops_per_second()
  # Any CPU core of the last decade does 1e9..1e13 float32 FLOP/s per host.
  assert 1e9 < peak < 1e13
  assert flops.mfu(_FakeConfig, 2.0, 4.0) == pytest.approx(
      flops.step_flops(_FakeConfig) / 2.0)


class _FakeConfig(dict):
  """A minimal config: the fields step_flops reads."""

  def __init__(self):
    super().__init__(model_size="tiny", batch_size=2, seq_len=16,
                     max_predictions_per_seq=3, vocab_size=100)

  def __getattr__(self, name):
    return self[name]


_FakeConfig = _FakeConfig()


def _libtpu_missing_reason():
  try:
    import libtpu  # noqa: F401
  except ImportError:
    return "libtpu is not installed (pip install -e '.[tpu]'); AOT TPU compile needs it"
  return None


@pytest.mark.parametrize("topology,shape", [
    ("v5e", "v5e:NxN"), ("v5e:", "v5e:NxN"), ("v5e:2x2x2", "v5e:NxN"),
    ("v5e:ax2", "v5e:NxN"), ("v5e:0x2", "v5e:NxN"), ("v5p:8", "v5p:NxNxN")])
def test_a_topology_without_a_chip_grid_of_its_shape_is_one_sentence(topology, shape):
  # v5e:2x2x2 used to be taken as 8 chips, v5e alone to end in libtpu's traceback.
  from bertjax import aot
  with pytest.raises(ValueError, match=(
      rf"^--topology='{topology}' gives no chip grid of {topology.split(':')[0]}'s "
      rf"shape; write it as {shape}, e.g. ")):
    aot.get_topology_devices(topology)


@pytest.mark.skipif(_libtpu_missing_reason() is not None,
                    reason=str(_libtpu_missing_reason()))
def test_a_grid_libtpu_has_no_slice_of_is_one_sentence():
  from bertjax import aot
  with pytest.raises(ValueError, match=(
      r"^libtpu has no v5e slice of --topology='v5e:3x3' \(INVALID_ARGUMENT: .*\); "
      r"give a grid a v5e slice has, e\.g\. v5e:4x4\.$")):
    aot.get_topology_devices("v5e:3x3")


@pytest.mark.skipif(_libtpu_missing_reason() is not None,
                    reason=str(_libtpu_missing_reason()))
def test_aot_compiles_for_small_tpu_topology_with_fsdp(demo_config):
  from bertjax import aot
  config = _config(demo_config, batch_size=8, mesh_shape="2,2,1",
                   max_predictions_per_seq=4)
  record = aot.compile_for_topology(config, "v5e:2x2")
  assert record["num_chips"] == 4
  assert record["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1}
  assert record["fits"] and record["hbm_bytes_per_chip"] == 16 * 1024 ** 3
  # FSDP over 2: each chip holds about half of params + Adam moments (3 copies).
  model = models.get_model(config)
  abstract, _ = state_lib.state_shardings(
      model, optax.adam(1e-3), config, sharding.make_mesh("1,1,1", jax.devices()[:1]))
  full = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
  assert record["bytes_per_chip"]["argument"] < 0.7 * full
  assert record["compiled_flops_per_chip"] > 0
  too_big = dict(record, fits=False,
                 bytes_per_chip=dict(record["bytes_per_chip"], total=40 * 1024 ** 3))
  assert "NOT fit" in aot.describe(too_big) and "40.00 GiB" in aot.describe(too_big)


@pytest.mark.skipif(_libtpu_missing_reason() is not None,
                    reason=str(_libtpu_missing_reason()))
def test_aot_reports_a_plan_the_tpu_compiler_refuses(demo_config):
  from bertjax import aot
  # 131072 x 128 tokens in one step over 4 v5e chips: the activations alone
  # are tens of GiB per chip, so libtpu refuses to compile the program.
  config = _config(demo_config, batch_size=131072, seq_len=128,
                   max_predictions_per_seq=20, mesh_shape="1,-1,1")
  record = aot.compile_for_topology(config, "v5e:2x2")
  assert record["fits"] is False
  need = record["bytes_per_chip"]["temp"]
  assert need > record["usable_hbm_bytes_per_chip"]
  assert record["usable_hbm_bytes_per_chip"] <= record["hbm_bytes_per_chip"]
  # Activations scale with the batch: at least the MLP input of one layer,
  # 32768 rows x 128 x 512 float32 per chip, must be live at some point.
  assert need > 32768 * 128 * 512 * 4
  verdict = aot.describe(record)
  assert "NOT fit" in verdict and f"{need / aot.GIB:.2f} GiB" in verdict
  assert "microbatches" in verdict


@pytest.mark.skipif(_libtpu_missing_reason() is not None,
                    reason=str(_libtpu_missing_reason()))
def test_aot_refuses_a_tensor_axis_that_cannot_split_the_heads(demo_config):
  from bertjax import aot
  # Tiny BERT has 2 heads; a tensor axis of 4 cannot split them.
  config = _config(demo_config, batch_size=8, mesh_shape="1,1,4")
  with pytest.raises(ValueError, match=r"num_heads=2.*tensor"):
    aot.compile_for_topology(config, "v5e:2x2")
  # A mesh of other size than the topology names the topology, not "present".
  with pytest.raises(ValueError, match=(
      r"uses 8 devices but 4 devices are in --topology=v5e:2x2; make the product")):
    aot.compile_for_topology(_config(demo_config, batch_size=8, mesh_shape="2,4,1"),
                             "v5e:2x2")


@pytest.mark.skipif(_libtpu_missing_reason() is not None,
                    reason=str(_libtpu_missing_reason()))
@pytest.mark.parametrize("topology,chips", [("v4:2x2x1", 4), ("v4:2x2x2", 8),
                                            ("v5p:2x2x1", 4), ("v5e:2x2", 4)])
def test_a_topology_has_one_device_per_chip(topology, chips):
  # libtpu's default chip config gave v4's two TensorCores as two devices.
  from bertjax import aot
  assert len(aot.get_topology_devices(topology)) == chips
