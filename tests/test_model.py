"""Tests of the BERT model: parameter shapes and names, masking, heads, dtypes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_files
from bertjax import models
from bertjax.models import layers

bert_config = config_files.shipped("bert")  # configs/bert.py, loaded by path

# Tiny size by definition (sizes.py / the BERT miniatures): 2 layers, H=128,
# 2 heads of 64, MLP 512; vocab 8000, 512 positions, 2 segment types.
N, H, HEADS, KV, MLP, V, POS, TYPES = 2, 128, 2, 64, 512, 8000, 512, 2
B, L, P = 2, 24, 5
LOGICAL_NAMES = {"vocab", "embed", "mlp", "heads", "kv", "position", "type",
                 None}


def _golden_shapes():
  """Parameter shapes written down from the architecture, not from the code."""
  shapes = {
      "embeddings/word_embeddings/embedding": (V, H),
      "embeddings/position_embeddings/embedding": (POS, H),
      "embeddings/type_embeddings/embedding": (TYPES, H),
      "embeddings/layer_norm/scale": (H,),
      "embeddings/layer_norm/bias": (H,),
      "pooler/kernel": (H, H),
      "pooler/bias": (H,),
      "mlm_head/dense/kernel": (H, H),
      "mlm_head/dense/bias": (H,),
      "mlm_head/layer_norm/scale": (H,),
      "mlm_head/layer_norm/bias": (H,),
      "mlm_head/output_bias": (V,),
      "nsp/kernel": (H, 2),
      "nsp/bias": (2,),
  }
  for i in range(N):
    pre = f"encoder/layer_{i}/"
    for proj in ("query", "key", "value"):
      shapes[pre + f"attention/{proj}/kernel"] = (H, HEADS, KV)
      shapes[pre + f"attention/{proj}/bias"] = (HEADS, KV)
    shapes[pre + "attention/out/kernel"] = (HEADS, KV, H)
    shapes[pre + "attention/out/bias"] = (H,)
    shapes[pre + "mlp/wi/kernel"] = (H, MLP)
    shapes[pre + "mlp/wi/bias"] = (MLP,)
    shapes[pre + "mlp/wo/kernel"] = (MLP, H)
    shapes[pre + "mlp/wo/bias"] = (H,)
    for norm in ("attention_norm", "mlp_norm"):
      shapes[pre + f"{norm}/scale"] = (H,)
      shapes[pre + f"{norm}/bias"] = (H,)
  return shapes


def _flat(tree, is_leaf=None):
  return {
      "/".join(k.key for k in path): leaf
      for path, leaf in jax.tree_util.tree_leaves_with_path(
          tree, is_leaf=is_leaf)
  }


def _inputs():
  """Row 0 packs doc 1 (10 tokens) + doc 2 (8 tokens) + 6 pads; row 1 is one
  20-token doc + 4 pads."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, V, size=(B, L)).astype(np.int32)
  doc_ids = np.zeros((B, L), np.int32)
  positions = np.zeros((B, L), np.int32)
  segment_ids = np.zeros((B, L), np.int32)
  doc_ids[0, :10], doc_ids[0, 10:18], doc_ids[1, :20] = 1, 2, 1
  positions[0, :10], positions[0, 10:18] = np.arange(10), np.arange(8)
  positions[1, :20] = np.arange(20)
  segment_ids[0, 5:10], segment_ids[1, 12:20] = 1, 1
  tokens[doc_ids == 0] = 0
  masked = np.array([[1, 4, 12, 16, 0], [3, 7, 11, 19, 0]], np.int32)
  return dict(tokens=tokens, segment_ids=segment_ids, positions=positions,
              doc_ids=doc_ids, masked_positions=masked)


@pytest.fixture(scope="module")
def setup():
  config = bert_config.get_config("tiny")
  # Every row of the last layer, so that ``hidden`` is returned (the sparse
  # last layer has its own tests: test_sparse_last_layer.py).
  config.sparse_last_layer = False
  model = models.get_model(config)
  variables = jax.jit(model.init)(jax.random.key(0), _inputs())

  @jax.jit
  def run(params, inputs):
    return model.apply({"params": params}, inputs, deterministic=True)

  return config, model, variables["params"], run


def test_param_shapes_match_architecture(setup):
  _, _, params, _ = setup
  got = {k: v.shape for k, v in _flat(nn.unbox(params)).items()}
  assert got == _golden_shapes()
  for leaf in jax.tree.leaves(nn.unbox(params)):
    assert leaf.dtype == jnp.float32


def test_param_count_closed_form(setup):
  _, _, params, _ = setup
  embeddings = (V + POS + TYPES) * H + 2 * H
  attention = 4 * (H * H + H)
  mlp = H * MLP + MLP + MLP * H + H
  layer = attention + mlp + 2 * (2 * H)
  pooler = H * H + H
  mlm = H * H + H + 2 * H + V
  nsp = H * 2 + 2
  assert models.count_params(params) == (
      embeddings + N * layer + pooler + mlm + nsp)


def test_every_param_has_logical_names_of_its_rank(setup):
  _, _, params, _ = setup
  boxes = _flat(params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert len(boxes) == len(_golden_shapes())
  specs = _flat(nn.get_partition_spec(params),
                is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  for path, box in boxes.items():
    assert isinstance(box, nn.Partitioned), path
    assert len(box.names) == box.value.ndim, path
    assert set(box.names) <= LOGICAL_NAMES, path
    assert len(specs[path]) == box.value.ndim, path
  assert boxes["embeddings/word_embeddings/embedding"].names == ("vocab",
                                                                 "embed")
  assert boxes["encoder/layer_1/attention/query/kernel"].names == (
      "embed", "heads", "kv")
  assert boxes["encoder/layer_0/mlp/wo/kernel"].names == ("mlp", "embed")


def test_output_shapes_and_dtypes(setup):
  _, _, params, run = setup
  out = run(params, _inputs())
  assert out["mlm_logits"].shape == (B, P, V)
  assert out["mlm_logits"].dtype == jnp.float32
  assert out["nsp_logits"].shape == (B, 2)
  assert out["nsp_logits"].dtype == jnp.float32
  assert out["hidden"].shape == (B, L, H)
  assert out["pooled"].shape == (B, H)
  # The pooler ends in tanh.
  assert float(jnp.max(jnp.abs(out["pooled"]))) <= 1.0


def test_doc_attention_mask_by_hand():
  doc_ids = jnp.array([[1, 1, 2, 0]], jnp.int32)
  want = np.array([[1, 1, 0, 0],
                   [1, 1, 0, 0],
                   [0, 0, 1, 0],
                   [0, 0, 0, 0]], bool)
  got = layers.doc_attention_mask(doc_ids)
  assert got.shape == (1, 1, 4, 4)
  np.testing.assert_array_equal(np.asarray(got[0, 0]), want)


def test_documents_do_not_see_each_other(setup):
  _, _, params, run = setup
  inputs = _inputs()
  base = run(params, inputs)["hidden"]

  changed = {k: v.copy() for k, v in inputs.items()}
  changed["tokens"][0, 10:18] = np.arange(100, 108)  # doc 2 of row 0
  other = run(params, changed)["hidden"]
  np.testing.assert_allclose(other[0, :10], base[0, :10], atol=1e-6)
  np.testing.assert_allclose(other[1], base[1], atol=1e-6)
  # doc 2's own states did change, so the comparison above is not vacuous.
  assert float(jnp.max(jnp.abs(other[0, 10:18] - base[0, 10:18]))) > 1e-3

  # Attention does connect tokens of one document: changing token 0 of doc 1
  # moves the states of doc 1's other tokens.
  changed = {k: v.copy() for k, v in inputs.items()}
  changed["tokens"][0, 0] = 7 if inputs["tokens"][0, 0] != 7 else 8
  other = run(params, changed)["hidden"]
  assert float(jnp.max(jnp.abs(other[0, 1:10] - base[0, 1:10]))) > 1e-3
  np.testing.assert_allclose(other[0, 10:18], base[0, 10:18], atol=1e-6)


def test_padding_values_do_not_change_real_outputs(setup):
  _, _, params, run = setup
  inputs = _inputs()
  base = run(params, inputs)
  noisy = {k: v.copy() for k, v in inputs.items()}
  pad = inputs["doc_ids"] == 0
  rng = np.random.default_rng(1)
  noisy["tokens"][pad] = rng.integers(5, V, size=pad.sum())
  noisy["segment_ids"][pad] = 1
  noisy["positions"][pad] = rng.integers(0, POS, size=pad.sum())
  other = run(params, noisy)
  real = ~pad
  np.testing.assert_allclose(np.asarray(other["hidden"])[real],
                             np.asarray(base["hidden"])[real], atol=1e-6)
  for name in ("mlm_logits", "nsp_logits", "pooled"):
    np.testing.assert_allclose(other[name], base[name], atol=1e-5)


def test_gathered_mlm_logits_equal_full_logits(setup):
  _, _, params, run = setup
  inputs = _inputs()
  gathered = run(params, inputs)["mlm_logits"]
  full_inputs = dict(inputs, masked_positions=np.tile(
      np.arange(L, dtype=np.int32), (B, 1)))
  full = run(params, full_inputs)["mlm_logits"]  # [B, L, V]
  want = np.take_along_axis(np.asarray(full),
                            inputs["masked_positions"][:, :, None], axis=1)
  np.testing.assert_allclose(gathered, want, atol=1e-5)


def test_dropout_only_when_not_deterministic(setup):
  config, _, params, run = setup
  # The tiny demo config trains without dropout; BERT's paper sizes use 0.1.
  config = config.copy_and_resolve_references()
  config.dropout_rate = config.attention_dropout_rate = 0.1
  model = models.get_model(config)
  inputs = _inputs()
  a, b = run(params, inputs), run(params, inputs)
  np.testing.assert_array_equal(a["mlm_logits"], b["mlm_logits"])

  @jax.jit
  def train(key):
    return model.apply({"params": params}, inputs, deterministic=False,
                       rngs={"dropout": key})

  c, d = train(jax.random.key(1)), train(jax.random.key(2))
  assert float(jnp.max(jnp.abs(c["hidden"] - d["hidden"]))) > 1e-2
  assert float(jnp.max(jnp.abs(c["hidden"] - a["hidden"]))) > 1e-2
  # Same key, same dropout masks.
  np.testing.assert_array_equal(train(jax.random.key(1))["hidden"],
                                c["hidden"])


def test_bfloat16_close_to_float32(setup):
  config, _, params, run = setup
  bf16_config = config.copy_and_resolve_references()
  bf16_config.dtype = "bfloat16"
  model = models.get_model(bf16_config)
  inputs = _inputs()
  out = jax.jit(lambda p, x: model.apply({"params": p}, x))(params, inputs)
  ref = run(params, inputs)
  assert out["mlm_logits"].dtype == jnp.float32
  assert out["nsp_logits"].dtype == jnp.float32
  assert out["hidden"].dtype == jnp.bfloat16
  # bfloat16 keeps 8 mantissa bits (relative step 2**-8 ~ 0.4%); through two
  # layers and the heads the error stays at a few such steps of the logits'
  # scale, so 5% of the largest logit is a bound that a wrong computation
  # (e.g. a bfloat16 softmax that lets masked keys leak in) would exceed.
  for name in ("mlm_logits", "nsp_logits"):
    scale = float(jnp.max(jnp.abs(ref[name])))
    assert scale > 1e-3, name  # the relative bound is not vacuous
    err = float(jnp.max(jnp.abs(out[name] - ref[name])))
    assert err <= 0.05 * scale, (name, err, scale)


class _Table(nn.Module):
  """One [50, 64] float32 table read in bfloat16, by embed_rows or nn.Embed."""
  through_embed: bool = False

  @nn.compact
  def __call__(self, ids):
    table = nn.Embed(50, 64, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    if self.through_embed:
      return table(ids)
    return layers.embed_rows(table, ids, jnp.bfloat16)


def test_bf16_word_rows_have_float32_gradient(setup, monkeypatch):
  # 4096 uses of one id (as [MASK] is used ~2000 times in a 32 x 512 batch):
  # its table gradient is the sum of 4096 bfloat16 cotangent rows. Summed in
  # float32 it is exact to ~1e-7 relative; a bfloat16 accumulation (nn.Embed
  # with dtype=bfloat16 transposes to a bfloat16 scatter-add) is off by ~7%.
  ids = jnp.full((8, 512), 7, jnp.int32)
  cot = jax.random.normal(jax.random.key(1), (8, 512, 64)).astype(jnp.bfloat16)
  params = _Table().init(jax.random.key(0), ids)
  rows = _Table().apply(params, ids)
  assert rows.dtype == jnp.bfloat16
  np.testing.assert_array_equal(
      np.asarray(rows, np.float32),
      np.asarray(_Table(through_embed=True).apply(params, ids), np.float32))
  grad = jax.grad(lambda p: jnp.sum(
      _Table().apply(p, ids).astype(jnp.float32) * cot.astype(jnp.float32)))(
          params)["params"]["Embed_0"]["embedding"]
  assert grad.dtype == jnp.float32
  want = cot.astype(jnp.float32).sum((0, 1))
  err = float(jnp.max(jnp.abs(grad[7] - want)) / jnp.max(jnp.abs(want)))
  assert err < 1e-4, err
  assert float(jnp.max(jnp.abs(grad.at[7].set(0)))) == 0.0
  # BERT's embeddings read the word table through it.
  config, _, params, _ = setup
  read = []
  real = layers.embed_rows
  monkeypatch.setattr(layers, "embed_rows",
                      lambda table, ids, dtype: read.append(table.name) or real(table, ids, dtype))
  models.get_model(config).apply({"params": params}, _inputs())
  assert read == ["word_embeddings"]


def test_all_padding_row_is_finite(setup):
  _, _, params, run = setup
  inputs = _inputs()
  for name in ("tokens", "doc_ids", "segment_ids", "positions"):
    inputs[name][1] = 0
  out = run(params, inputs)
  for name, value in out.items():
    assert bool(jnp.all(jnp.isfinite(value))), name


def test_config_errors_name_the_fix():
  config = bert_config.get_config("tiny")
  config.model = "gpt"
  with pytest.raises(ValueError, match="config.model"):
    models.get_model(config)
  config = bert_config.get_config("tiny")
  config.dtype = "float16"
  with pytest.raises(ValueError, match="config.dtype"):
    models.get_model(config)
  config = bert_config.get_config("tiny")
  config.seq_len = 1024
  with pytest.raises(ValueError, match="max_position_embeddings"):
    models.get_model(config)
