"""The sparse last layer (``config.sparse_last_layer``): the last encoder layer
computes only [CLS] and the masked positions, and the heads' outputs and the
parameters' gradients stay those of the full model, to float rounding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_files
from bertjax import models
from bertjax.models import encoder as encoder_lib

bert_config = config_files.shipped("bert")

B, L, P, V = 3, 16, 4, 64
# float32 rounding of a different matmul blocking, through 2 small layers.
TOL = 2e-5


def _config(**fields):
  c = bert_config.get_config("tiny")
  c.model_size = "custom"
  c.num_layers, c.hidden_size, c.num_heads, c.mlp_dim = 2, 32, 2, 48
  c.vocab_size, c.seq_len = V, L
  for k, v in fields.items():
    setattr(c, k, v)
  return c


def _inputs(seed=0):
  """Row 0: two documents and padding; row 1: one document filling the row;
  row 2: one short document. Unused prediction slots point at 0 (as the
  objectives leave them), and row 1 predicts position 0 itself."""
  rng = np.random.default_rng(seed)
  doc_ids = np.zeros((B, L), np.int32)
  doc_ids[0, :7], doc_ids[0, 7:13], doc_ids[1, :], doc_ids[2, :5] = 1, 2, 1, 1
  positions = np.where(doc_ids > 0, np.arange(L), 0).astype(np.int32)
  positions[0, 7:13] = np.arange(6)
  segment_ids = np.zeros((B, L), np.int32)
  segment_ids[1, 9:] = 1
  tokens = np.where(doc_ids > 0, rng.integers(5, V, (B, L)), 0).astype(np.int32)
  masked = np.array([[2, 9, 12, 0], [0, 5, 15, 3], [1, 4, 0, 0]], np.int32)
  return dict(tokens=tokens, segment_ids=segment_ids, positions=positions,
              doc_ids=doc_ids, masked_positions=masked)


def _pair(**fields):
  """(full model, sparse model, params): the same parameters serve both."""
  full = models.get_model(_config(sparse_last_layer=False, **fields))
  sparse = models.get_model(_config(sparse_last_layer=True, **fields))
  params = nn.unbox(jax.jit(full.init)(jax.random.key(1), _inputs())["params"])
  return full, sparse, params


def _heads(out):
  return {k: out[k] for k in ("mlm_logits", "nsp_logits", "pooled") if k in out}


@pytest.mark.parametrize("fields", [
    {},
    {"remat": "full"},
    {"sentence_head": False},
    {"attention_impl": "dot_product"},
], ids=["default", "remat", "no_sentence_head", "dot_product"])
def test_heads_and_gradients_equal_the_full_model(fields):
  full, sparse, params = _pair(**fields)
  inputs = _inputs()
  # A loss reading every head output with random weights, so that its
  # gradient reaches every parameter; one compiled step per model.
  shapes = jax.eval_shape(lambda p: _heads(full.apply({"params": p}, inputs)), params)
  weights = {k: jax.random.normal(jax.random.key(i), v.shape)
             for i, (k, v) in enumerate(sorted(shapes.items()))}

  def run(m):
    def f(p):
      out = m.apply({"params": p}, inputs)
      return sum(jnp.sum(out[k] * w) for k, w in weights.items()), out
    return jax.jit(jax.grad(f, has_aux=True))(params)

  (g_want, want), (g_got, got) = run(full), run(sparse)
  assert "hidden" in want and "hidden" not in got
  assert set(_heads(want)) == set(_heads(got)) == set(weights)
  for k in _heads(want):
    assert got[k].shape == want[k].shape, k
    np.testing.assert_allclose(got[k], want[k], atol=TOL, rtol=TOL, err_msg=k)
  flat_want = dict(jax.tree_util.tree_leaves_with_path(g_want))
  flat_got = dict(jax.tree_util.tree_leaves_with_path(g_got))
  assert flat_want.keys() == flat_got.keys()
  # Against the largest gradient of the tree: some are rounding noise around
  # an exact zero (the key bias's: softmax ignores a shift shared by all keys).
  scale = max(float(jnp.max(jnp.abs(w))) for w in flat_want.values())
  for path, w in flat_want.items():
    np.testing.assert_allclose(flat_got[path] / scale, w / scale, atol=TOL,
                               err_msg=jax.tree_util.keystr(path))
  # The last layer is trained, not cut off: its feed-forward has gradients.
  last = g_got["encoder"]["layer_1"]["mlp"]["wo"]["kernel"]
  assert float(jnp.max(jnp.abs(last))) > 0


def test_an_objectives_own_attention_mask_is_narrowed_to_the_rows():
  # UniLM passes a [batch, length, length] mask; row i of the sparse layer
  # must use row masked_positions[i] of it.
  full, sparse, params = _pair()
  inputs = _inputs()
  causal = np.tril(np.ones((L, L), bool))
  inputs["attention_mask"] = np.stack([causal, np.ones((L, L), bool), causal.T])
  want = full.apply({"params": params}, inputs)
  got = sparse.apply({"params": params}, inputs)
  np.testing.assert_allclose(got["mlm_logits"], want["mlm_logits"], atol=TOL, rtol=TOL)
  # And the mask matters here: without it the logits differ.
  del inputs["attention_mask"]
  other = sparse.apply({"params": params}, inputs)
  assert float(jnp.max(jnp.abs(other["mlm_logits"] - got["mlm_logits"]))) > 1e-3


@pytest.mark.parametrize("fields", [{}, {"remat": "full"}], ids=["default", "remat"])
def test_a_scanned_stack_narrows_its_last_step_too(fields):
  # It used to ignore the flag and compute every row. The same parameters,
  # stacked, give the full unscanned model's heads and gradients.
  full = models.get_model(_config(sparse_last_layer=False))
  scanned = models.get_model(_config(sparse_last_layer=True, scan_layers=True,
                                     **fields))
  inputs = _inputs()
  params = nn.unbox(jax.jit(full.init)(jax.random.key(1), inputs)["params"])
  stacked = {**params, "encoder": encoder_lib.stack_layers(params["encoder"], 2)}
  layout = nn.unbox(jax.eval_shape(scanned.init, jax.random.key(1), inputs)["params"])
  assert (jax.tree.map(lambda a: a.shape, layout)
          == jax.tree.map(lambda a: a.shape, stacked))
  shapes = jax.eval_shape(lambda p: _heads(full.apply({"params": p}, inputs)), params)
  weights = {k: jax.random.normal(jax.random.key(i), v.shape)
             for i, (k, v) in enumerate(sorted(shapes.items()))}

  def run(m, p):
    def f(p):
      out = m.apply({"params": p}, inputs)
      return sum(jnp.sum(out[k] * w) for k, w in weights.items()), out
    return jax.jit(jax.grad(f, has_aux=True))(p)

  (g_want, want), (g_got, got) = run(full, params), run(scanned, stacked)
  assert "hidden" in want and "hidden" not in got
  for k in weights:
    np.testing.assert_allclose(got[k], want[k], atol=TOL, rtol=TOL, err_msg=k)
  g_want = {**g_want, "encoder": encoder_lib.stack_layers(g_want["encoder"], 2)}
  scale = max(float(jnp.max(jnp.abs(w))) for w in jax.tree.leaves(g_want))
  for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(g_want),
                          jax.tree.leaves(g_got)):
    np.testing.assert_allclose(g / scale, w / scale, atol=TOL,
                               err_msg=jax.tree_util.keystr(path))


def test_spanbert_keeps_every_row():
  # SpanBERT's boundary head reads rows that are not predicted.
  span = config_files.shipped("spanbert").get_config("tiny")
  span.sparse_last_layer = True
  assert models.get_model(span).sparse_last_layer is False
