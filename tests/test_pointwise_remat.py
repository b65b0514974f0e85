"""LayerNorms and the feed-forward activation rematerialised or kept
(``layers.remat_pointwise``): the platform picks, values and parameters do not
change."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import config_files
from bertjax import models
from bertjax.models import attention
from bertjax.models import layers

bert_config = config_files.shipped("bert")  # configs/bert.py, loaded by path


def _inputs(batch=2, length=16, vocab=512):
  """Row 0 packs two documents and padding; row 1 is one document, full."""
  rng = np.random.default_rng(3)
  doc_ids = np.ones((batch, length), np.int32)
  doc_ids[0, 9:14], doc_ids[0, 14:] = 2, 0
  positions = np.tile(np.arange(length, dtype=np.int32), (batch, 1))
  positions[0, 9:14] = np.arange(5)
  tokens = rng.integers(5, vocab, (batch, length)).astype(np.int32)
  tokens[doc_ids == 0] = 0
  segment_ids = np.zeros((batch, length), np.int32)
  segment_ids[:, 5:9] = 1
  masked = np.array([[1, 4, 10, 0], [2, 7, 11, 15]], np.int32)
  return dict(tokens=tokens, segment_ids=segment_ids, positions=positions,
              doc_ids=doc_ids, masked_positions=masked)


@pytest.mark.parametrize("platform,want", [("cpu", True), ("tpu", True),
                                           ("gpu", False), ("cuda", False)])
def test_platform_picks_the_form(monkeypatch, platform, want):
  monkeypatch.setattr(attention, "compile_platform", lambda: platform)
  assert layers.remat_pointwise() is want


def _loss_grads_and_jaxpr(monkeypatch, remat: bool):
  monkeypatch.setattr(layers, "remat_pointwise", lambda: remat)
  config = bert_config.get_config("tiny")
  config.vocab_size = 512
  model = models.get_model(config)
  inputs = _inputs()
  params = jax.jit(model.init)(jax.random.key(0), inputs)["params"]
  weights = jax.random.normal(jax.random.key(1), (2, 4, config.vocab_size))

  def loss(p):
    out = model.apply({"params": p}, inputs, deterministic=True)
    return jnp.sum(out["mlm_logits"] * weights) + jnp.sum(out["nsp_logits"])

  jaxpr = str(jax.make_jaxpr(jax.grad(loss))(params))
  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  return params, value, grads, jaxpr


def test_remat_and_plain_forms_have_one_tree_and_the_same_values(monkeypatch):
  p_remat, v_remat, g_remat, jaxpr_remat = _loss_grads_and_jaxpr(monkeypatch, True)
  p_plain, v_plain, g_plain, jaxpr_plain = _loss_grads_and_jaxpr(monkeypatch, False)
  # The choice is real: only the rematerialised form traces checkpoints (two
  # LayerNorms and one activation per layer, the embeddings' and the MLM
  # head's LayerNorms).
  # (The primitive is ``remat2`` in JAX 0.10, ``checkpoint`` in others.)
  checkpoints = re.compile(r"\b(remat2|checkpoint)\[")
  assert len(checkpoints.findall(jaxpr_remat)) >= 2 * 3 + 2
  assert not checkpoints.findall(jaxpr_plain)
  # Same parameter names, shapes and initial values (checkpoints convert
  # between the forms unchanged).
  assert jax.tree.structure(p_remat) == jax.tree.structure(p_plain)
  jax.tree.map(np.testing.assert_array_equal, p_remat, p_plain)
  # Same loss and gradients: recomputation repeats the forward's float32
  # arithmetic, so only XLA's fusion choices may move the last bits.
  np.testing.assert_allclose(float(v_remat), float(v_plain), rtol=1e-6)
  # Relative per leaf, against at least 1e-4 of the largest gradient: the key
  # biases' gradients are zero but for rounding (softmax ignores them).
  # (In numpy: eagerly in jax, each leaf's shape compiles its own programs.)
  g_remat, g_plain = jax.device_get((g_remat, g_plain))
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(g_plain))
  worst = max(jax.tree.leaves(jax.tree.map(
      lambda a, b: float(np.max(np.abs(a - b))
                         / max(float(np.max(np.abs(b))), 1e-4 * scale)),
      g_remat, g_plain)))
  assert worst < 1e-5, worst


def test_exact_gelu_and_its_derivative_match_the_normal_cdf_in_float64():
  # layers.gelu_erf is x * Phi(x) through erf (cheaper than jax.nn.gelu's
  # erfc); the reference is scipy's normal CDF and density in float64, and
  # the derivative is d/dx x Phi(x) = Phi(x) + x phi(x).
  from scipy import stats
  x64 = np.concatenate([np.linspace(-12.0, 12.0, 4001),
                        np.random.default_rng(0).normal(0.0, 3.0, 4000)])
  x = jnp.asarray(x64, jnp.float32)
  ref = x64 * stats.norm.cdf(x64)
  ref_grad = stats.norm.cdf(x64) + x64 * stats.norm.pdf(x64)
  got = np.asarray(layers.gelu_erf(x), np.float64)
  got_grad = np.asarray(jax.vmap(jax.grad(layers.gelu_erf))(x), np.float64)
  # float32 inputs: a few ulps of |x| at most (|x| <= 12 here), and no more
  # than float32 rounding of the value itself.
  np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)
  np.testing.assert_allclose(got_grad, ref_grad, rtol=2e-6, atol=2e-6)
  # The config's 'gelu' is this function, also under jax.checkpoint.
  assert layers.activation("gelu") is layers.gelu_erf
  remat_grad = jax.vmap(jax.grad(layers.remat_activation("gelu")))(x)
  np.testing.assert_allclose(np.asarray(remat_grad, np.float64), ref_grad,
                             rtol=2e-6, atol=2e-6)
