"""DeBERTa: disentangled attention against the paper's formula, log buckets,
golden shapes, EMD, and the tiny config on the real train step (mesh
invariance, exact resume)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from bertjax import config_files
from bertjax import models
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import pipeline
from bertjax.models import deberta
from bertjax.models import disentangled
from bertjax.models import encoder as encoder_lib
from bertjax.models import layers
import variant_steps

deberta_config = config_files.shipped("deberta")  # configs/deberta.py, by path


def closed_form_bucket(d, buckets, max_position):
  """The paper's v2 log bucket of one distance, in float64 Python math."""
  mid = buckets // 2
  if abs(d) <= mid:
    return d
  steps = math.ceil((mid - 1) * math.log(abs(d) / mid) / math.log((max_position - 1) / mid))
  return int(math.copysign(mid + steps, d))


@pytest.mark.parametrize("buckets,max_position", [(8, 16), (32, 512), (256, 512), (6, 40)])
def test_log_buckets_equal_the_closed_form(buckets, max_position):
  grid = np.arange(-3 * max_position, 3 * max_position + 1)
  ours = disentangled.log_bucket(grid, buckets, max_position)
  want = np.array([closed_form_bucket(int(d), buckets, max_position) for d in grid])
  np.testing.assert_array_equal(ours, want)
  # Monotone, odd, and the identity inside (-mid, mid).
  assert np.all(np.diff(ours) >= 0)
  np.testing.assert_array_equal(ours, -ours[::-1])
  inside = np.abs(grid) <= buckets // 2
  np.testing.assert_array_equal(ours[inside], grid[inside])


def reference_attention(x, query, table, params, mask, heads, terms, share,
                        buckets, max_position):
  """Straight from the paper (He et al. 2021, eq. 4), loops over b, h, i, j.

  A[i,j] = (Qc_i·Kc_j + Qc_i·Kr_δ(i,j) + Kc_j·Qr_δ(i,j)) / sqrt(s·d), with
  δ(i,j) the table row of the (bucketed) distance i - j; the p2c term indexed
  by δ(i, j) as the released implementation trains it (module docstring).
  """
  def proj(name, h):
    w, b = params[name]["kernel"], params[name]["bias"]
    return np.einsum("...e,ehd->...hd", h, w) + b

  batch, length, hidden = x.shape
  head_dim = hidden // heads
  span = buckets if buckets > 0 else max_position
  qc, kc, v = proj("query", query), proj("key", x), proj("value", x)
  if "c2p" in terms:
    kr = proj("key" if share else "pos_key", table)
  if "p2c" in terms:
    qr = proj("query" if share else "pos_query", table)
  scale = math.sqrt(head_dim * (1 + len(terms)))
  out = np.zeros((batch, length, heads, head_dim))
  for b in range(batch):
    for h in range(heads):
      for i in range(length):
        logits = np.empty(length)
        for j in range(length):
          d = i - j
          if buckets > 0:
            d = closed_form_bucket(d, buckets, max_position)
          r = min(max(d + span, 0), 2 * span - 1)
          a = qc[b, i, h] @ kc[b, j, h]
          if "c2p" in terms:
            a += qc[b, i, h] @ kr[r, h]
          if "p2c" in terms:
            a += kc[b, j, h] @ qr[r, h]
          logits[j] = a / scale if mask[b, i, j] else -np.inf
        if not np.isfinite(logits).any():
          logits[:] = 0.0  # a padding query: uniform, as the model's jnp.where
        p = np.exp(logits - logits.max())
        p /= p.sum()
        out[b, i, h] = p @ v[b, :, h]
  w, bias = params["out"]["kernel"], params["out"]["bias"]
  return np.einsum("bqhd,hde->bqe", out, w) + bias


@pytest.mark.parametrize("terms,share,buckets,max_position,heads,emd", [
    (("c2p", "p2c"), True, 8, 16, 3, False),
    (("c2p", "p2c"), False, -1, 6, 1, True),
    (("c2p",), False, 6, 12, 3, False),
    (("p2c",), True, -1, 24, 2, True),
])
def test_disentangled_attention_equals_the_paper_formula(
    terms, share, buckets, max_position, heads, emd):
  rng = np.random.default_rng(len(terms) + heads)
  batch, length, hidden = 2, 13, 6 * heads
  span = disentangled.table_span(buckets, max_position)
  x = rng.normal(size=(batch, length, hidden)).astype(np.float32)
  query = rng.normal(size=x.shape).astype(np.float32) if emd else x
  table = rng.normal(size=(2 * span, hidden)).astype(np.float32)
  doc_ids = np.ones((batch, length), np.int32)
  doc_ids[0, 7:] = 2  # two documents in row 0
  doc_ids[1, 10:] = 0  # padding in row 1
  mask = np.asarray(layers.doc_attention_mask(jnp.asarray(doc_ids)))
  index, lo = disentangled.relative_index(length, span, buckets, max_position)
  hi = lo + int(index.max()) + 1
  module = disentangled.DisentangledAttention(num_heads=heads, position_terms=terms,
                                              share_att_key=share)
  args = (jnp.asarray(x), jnp.asarray(mask), True)
  kwargs = dict(relative=jnp.asarray(table[lo:hi]), relative_index=jnp.asarray(index))
  if emd:
    kwargs["query"] = jnp.asarray(query)
  params = nn.meta.unbox(jax.jit(module.init, static_argnums=3)(
      jax.random.key(0), *args, **kwargs))["params"]
  # Non-zero biases so that a misplaced one shows.
  params = jax.tree.map(
      lambda p: p + 0.3 * jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  ours = np.asarray(jax.jit(module.apply, static_argnums=3)(
      {"params": params}, *args, **kwargs))
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
  want = reference_attention(x.astype(np.float64), query.astype(np.float64),
                             table.astype(np.float64), params, mask[:, 0], heads,
                             terms, share, buckets, max_position)
  real = doc_ids != 0
  np.testing.assert_allclose(ours[real], want[real], rtol=1e-5, atol=1e-5)
  assert ("pos_key" in params) == (not share and "c2p" in terms)
  assert ("pos_query" in params) == (not share and "p2c" in terms)


def abstract_params(config):
  model = models.get_model(config)
  return jax.eval_shape(
      lambda r: model.init({"params": r}, state_lib.dummy_inputs(config),
                           deterministic=True), jax.random.key(0))["params"]


def shapes(params):
  flat = traverse_util.flatten_dict(nn.meta.unbox(params), sep="/")
  return {k: tuple(v.shape) for k, v in flat.items()}


def test_tiny_golden_parameter_shapes():
  config = deberta_config.get_config("tiny")
  V, H, F, P, S = 8000, 128, 512, 512, 32
  want = {
      "embeddings/word_embeddings/embedding": (V, H),
      # Read only by the enhanced mask decoder; no segment table (v3).
      "embeddings/position_embeddings/embedding": (P, H),
      "embeddings/layer_norm/scale": (H,),
      "embeddings/layer_norm/bias": (H,),
      # One relative table of 2 * position_buckets rows for all layers.
      "relative/embedding": (2 * S, H),
      "relative/layer_norm/scale": (H,),
      "relative/layer_norm/bias": (H,),
      "mlm_head/dense/kernel": (H, H),
      "mlm_head/dense/bias": (H,),
      "mlm_head/layer_norm/scale": (H,),
      "mlm_head/layer_norm/bias": (H,),
      "mlm_head/output_bias": (V,),
  }
  # 2 layers: the first in the stack, the last outside it (EMD re-runs it);
  # share_att_key: no position projections of their own.
  want.update(variant_steps.encoder_layer_shapes(1, H, 2, F))
  for name, shape in variant_steps.encoder_layer_shapes(2, H, 2, F).items():
    if name.startswith("encoder/layer_1/"):
      want[name.replace("encoder/layer_1/", "last_layer/")] = shape
  assert shapes(abstract_params(config)) == want
  sop = deberta_config.get_config("tiny+sop")
  extra = set(shapes(abstract_params(sop))) - set(want)
  assert extra == {"pooler/kernel", "pooler/bias", "sop/kernel", "sop/bias"}
  assert sop.objective == "albert" and sop.layout == "sentence_pairs"


def small_model(**overrides):
  fields = dict(vocab_size=50, max_position_embeddings=32, type_vocab_size=0,
                num_layers=3, hidden_size=24, num_heads=3, mlp_dim=40,
                position_buckets=8, max_relative_positions=16)
  fields.update(overrides)
  return deberta.DebertaForPretraining(**fields)


def small_inputs(length=20, seed=0):
  rng = np.random.default_rng(seed)
  doc_ids = np.ones((2, length), np.int32)
  doc_ids[0, 12:] = 2
  doc_ids[1, 15:] = 0
  positions = np.where(doc_ids[0] == 2, np.arange(length) - 12, np.arange(length))
  return {
      "tokens": jnp.asarray(rng.integers(5, 50, (2, length)), jnp.int32),
      "segment_ids": jnp.zeros((2, length), jnp.int32),
      "positions": jnp.asarray(np.stack([positions, np.arange(length)]), jnp.int32),
      "doc_ids": jnp.asarray(doc_ids),
      "masked_positions": jnp.asarray(np.tile(np.arange(length), (2, 1)), jnp.int32),
  }


def test_emd_alone_sees_absolute_positions_and_documents_stay_apart():
  x = small_inputs()
  other = np.asarray(x["tokens"]).copy()
  other[0, 12:] = (other[0, 12:] + 7) % 45 + 5  # document 2 of row 0 changed
  with_emd, without = small_model(emd_layers=2), small_model(emd_layers=0)
  params = jax.jit(with_emd.init)(jax.random.key(3), x)["params"]

  @jax.jit
  def run(params):
    out = with_emd.apply({"params": params}, x)
    plain = without.apply({"params": params}, x)
    head = with_emd.bind({"params": params})
    return dict(
        out=out, plain=plain,
        # Other absolute positions.
        moved=with_emd.apply({"params": params}, dict(x, positions=x["positions"] + 3)),
        other=with_emd.apply({"params": params}, dict(x, tokens=jnp.asarray(other))),
        head=head.mlm_head(plain["hidden"], head.embeddings.attend))

  r = jax.tree.map(np.asarray, run(params))
  out = r["out"]
  # The encoder output does not see absolute positions; the EMD's predictions do.
  np.testing.assert_array_equal(out["hidden"], r["moved"]["hidden"])
  assert np.abs(out["mlm_logits"] - r["moved"]["mlm_logits"]).max() > 1e-3
  # Without EMD the MLM head reads the last hidden state: same hidden, other logits.
  np.testing.assert_array_equal(r["plain"]["hidden"], out["hidden"])
  np.testing.assert_allclose(r["plain"]["mlm_logits"], r["head"], rtol=1e-5, atol=1e-5)
  assert np.abs(r["plain"]["mlm_logits"] - out["mlm_logits"]).max() > 1e-3
  # Changing document 2 of row 0 leaves document 1 untouched, with EMD too.
  for key in ("hidden", "mlm_logits"):
    a, b = out[key], r["other"][key]
    np.testing.assert_array_equal(a[0, :12], b[0, :12])
    assert np.abs(a[0, 12:] - b[0, 12:]).max() > 1e-3


def test_scanned_and_rematerialised_stack_computes_the_same():
  x = small_inputs()
  model = small_model(num_layers=3)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), x)["params"])
  scanned = small_model(num_layers=3, scan_layers=True, remat="full")
  stacked = dict(params, encoder=encoder_lib.stack_layers(params["encoder"], 2))
  a = jax.jit(model.apply)({"params": params}, x)
  b = jax.jit(scanned.apply)({"params": stacked}, x)
  for key in ("hidden", "mlm_logits"):
    np.testing.assert_allclose(np.asarray(b[key]), np.asarray(a[key]), rtol=1e-5, atol=1e-5)


def test_bad_fields_are_named_before_any_device_work():
  for field, value, message in (
      ("pos_att_type", "c2p|p2p", "pos_att_type"),
      ("norm_rel_ebd", "rms", "norm_rel_ebd"),
      ("emd_layers", -1, "emd_layers"),
      ("position_buckets", 1100, "max_relative_positions"),
  ):
    config = deberta_config.get_config("tiny")
    config[field] = value
    with pytest.raises(ValueError, match=message):
      models.get_model(config)
  with pytest.raises(ValueError, match="base\\+sop"):
    deberta_config.get_config("base+nsp")


@pytest.fixture(scope="module")
def small_config(demo_data):
  c = deberta_config.get_config("tiny")
  c.data_dir = demo_data.data_dir
  c.batch_size, c.seq_len, c.max_predictions_per_seq = 8, 32, 5
  c.shuffle_window = 32
  c.num_train_steps, c.warmup_steps = 6, 2
  c.log_every_steps, c.checkpoint_every_steps = 1, 3
  c.eval_max_batches = 1
  # The mesh of the reference run: data, fsdp and tensor axes of 2 each.
  c.mesh_shape = "2,2,2"
  return c


@pytest.fixture(scope="module")
def reference_run(small_config, tmp_path_factory):
  """(evaluation record, per-step log) of the real loop's 6 steps of
  ``small_config`` on the 2x2x2 mesh: the mesh test's 8-device side and the
  resume test's uninterrupted run, compiled once for both."""
  workdir = tmp_path_factory.mktemp("deberta_reference")
  record = train.train_and_evaluate(small_config, str(workdir))
  with open(workdir / "metrics.jsonl") as f:
    logged = {r["step"]: r for r in map(json.loads, f) if "loss" in r}
  return record, logged


def test_same_losses_on_one_device_and_on_a_data_fsdp_tensor_mesh(
    small_config, demo_data, reference_run):
  _, logged = reference_run
  it = pipeline.make_train_iterator(small_config, demo_data.source("train"),
                                    local_batch_size=small_config.batch_size)
  batches = [next(it) for _ in range(2)]
  mesh, state, step_fn = variant_steps.setup(small_config, "1,1,1", jax.devices()[:1])
  one = []
  with sharding.use_mesh(mesh):
    for b in batches:
      state, m = step_fn(state, train.to_global(b, mesh),
                         jax.random.key(small_config.seed))
      one.append(float(m["loss"][0] / m["loss"][1]))
      for name in ("mlm_loss", "mlm_accuracy"):
        assert np.isfinite(float(m[name][0])) and float(m[name][1]) > 0
  # The reference run's first two steps saw the same batches on the mesh.
  assert [logged[s]["batch_hash"] for s in (1, 2)] == [
      train._batch_hash(b) for b in batches]
  np.testing.assert_allclose([logged[s]["loss"] for s in (1, 2)], one, rtol=1e-5)
  assert one[0] > 0.8 * np.log(small_config.vocab_size)


def test_killed_run_resumes_to_identical_result(small_config, reference_run, tmp_path):
  record, _ = reference_run
  parts = str(tmp_path / "parts")
  assert train.train_and_evaluate(small_config, parts, stop_at_step=3) is None
  assert train.train_and_evaluate(small_config, parts) == record
  assert record["step"] == 6 and 0 < record["baseline_mlm_accuracy"] < 1


def test_step_flops_count_the_disentangled_terms_and_emd():
  from bertjax import flops
  config = deberta_config.get_config("tiny")
  config.seq_len, config.batch_size = 32, 4
  bert_like = config.copy_and_resolve_references()
  bert_like.model = "bert"
  bert_like.sparse_last_layer = False  # DeBERTa's every pass has every row
  H, L, S, T = 128, 2, 32, 4 * 32
  # Distances up to 31 with 32 buckets (mid 16) and max 512 reach rows
  # span - bucket(31) .. span + bucket(31) of the table.
  rows = 2 * closed_form_bucket(S - 1, 32, 512) + 1
  passes = L + 2  # two EMD passes of the last layer
  per_pass = 2 * (6 * T * rows * H + 6 * rows * H * H)  # c2p and p2c
  extra_layers = 2 * (6 * T * (4 * H * H + 2 * H * 512) + 12 * H * S * T)
  assert flops.step_flops(config) == pytest.approx(
      flops.step_flops(bert_like) + extra_layers + passes * per_pass)
  config.pos_att_type, config.emd_layers = "c2p", 0
  assert flops.step_flops(config) == pytest.approx(
      flops.step_flops(bert_like) + L * per_pass / 2)


def test_seq_len_is_bounded_only_where_absolute_positions_are_read(
    small_config, demo_data):
  # Relative distances past max_relative_positions share its bucket; only
  # the enhanced mask decoder and position_biased_input read the absolute
  # table. Without either, rows longer than max_position_embeddings were
  # refused as reading past it.
  from bertjax import config_validation
  c = small_config.copy_and_resolve_references()
  c.max_position_embeddings = 16  # half the 32-token rows
  c.max_relative_positions = 64  # its own range (the default is the table's)
  with pytest.raises(ValueError, match=r"^config\.seq_len=32 is invalid: .* "
                     r"max_position_embeddings \(16\), the size of the position table"):
    config_validation.validate(c)  # EMD reads the table at every position
  c.emd_layers = 0
  c.position_biased_input = True
  with pytest.raises(ValueError, match=r"the size of the position table"):
    config_validation.validate(c)
  c.position_biased_input = False
  config_validation.validate(c)
  state, metrics = variant_steps.one_train_step(c, demo_data.source("train"))
  assert "position_embeddings" not in state.params["embeddings"]
  total, count = (float(x) for x in metrics["mlm_loss"])
  assert np.isfinite(total) and count > 0
  # ELECTRA's DeBERTa towers (configs/deberta_v3.py) have no decoder.
  v3 = config_files.load("deberta_v3:tiny")
  v3.max_position_embeddings, v3.seq_len = 64, 128
  config_validation.validate(v3)
  v3.position_biased_input = True
  with pytest.raises(ValueError, match=r"the size of the position table"):
    config_validation.validate(v3)
