"""BERT's exact GELU and LayerNorm with hand-written backward passes that
keep only their inputs (and a LayerNorm's per-row statistics): the
``bench/ab_step.py`` variants ``gelu_vjp`` and ``ln_vjp``.

Autodiff of the plain forms stores what the backward pass reuses: for the
GELU in bfloat16 two more [tokens, mlp] tensors beside its input and output
(the normal CDF and the exponential in erf's derivative); for a LayerNorm of
a bfloat16 input three float32 [tokens, embed] tensors (the centred input,
its square and the scaled normalised values). On a GPU, where these layers
are memory-bound, each stored tensor is a write in the forward pass and a
read in the backward pass. ``jax.checkpoint`` (``layers.remat_pointwise``)
keeps only the input too, but recomputes the LayerNorm's statistics, a
reduction over every row, in the backward pass.

Here the forward values are the plain forms' computed in float32 with one
cast to the compute dtype at the end, and the backward passes compute the
analytic gradients in float32 from the kept inputs: equal to autodiff's up
to float rounding (the A/B compares each variant's first update with the
reference's). Neither made a step faster (docs/performance.md, 2026-11-27:
within 1% on an H200 in bf16 and on a CPU in float32), so the tree keeps
``layers.layer_norm`` and ``layers.activation``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

Dtype = Any

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _normal_cdf(x: jax.Array) -> jax.Array:
  return 0.5 + 0.5 * lax.erf(x * _SQRT_HALF)


@jax.custom_vjp
def gelu(x: jax.Array) -> jax.Array:
  """x * Phi(x), Phi the normal CDF, computed in float32 and returned in
  x's dtype; its gradient g * (Phi(x) + x * phi(x)) is recomputed from x."""
  x32 = x.astype(jnp.float32)
  return (x32 * _normal_cdf(x32)).astype(x.dtype)


def _gelu_fwd(x):
  return gelu(x), x


def _gelu_bwd(x, g):
  x32 = x.astype(jnp.float32)
  slope = _normal_cdf(x32) + x32 * jnp.exp(-0.5 * x32 * x32) * _INV_SQRT_2PI
  return ((g.astype(jnp.float32) * slope).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def _statistics(x32: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
  """Per-row mean and 1 / sqrt(variance + eps) over the last axis, the
  variance as E[x^2] - E[x]^2 clipped at 0 (as flax's LayerNorm)."""
  mean = x32.mean(-1, keepdims=True)
  var = jnp.maximum(0.0, (x32 * x32).mean(-1, keepdims=True) - mean * mean)
  return mean, lax.rsqrt(var + eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float,
               dtype: Dtype) -> jax.Array:
  """LayerNorm over the last axis, statistics in float32, result in dtype:
  (x - mean) * (rsqrt(var + eps) * scale) + bias, as ``nn.LayerNorm``."""
  return _layer_norm_fwd(x, scale, bias, eps, dtype)[0]


def _layer_norm_fwd(x, scale, bias, eps, dtype):
  x32 = x.astype(jnp.float32)
  mean, rstd = _statistics(x32, eps)
  y = (x32 - mean) * (rstd * scale) + bias
  return y.astype(dtype), (x, mean, rstd, scale)


def _layer_norm_bwd(eps, dtype, residuals, g):
  del eps, dtype
  x, mean, rstd, scale = residuals
  normed = (x.astype(jnp.float32) - mean) * rstd
  g32 = g.astype(jnp.float32)
  rows = tuple(range(x.ndim - 1))
  d_bias = g32.sum(rows)
  d_scale = (g32 * normed).sum(rows)
  d_normed = g32 * scale
  d_x = rstd * (d_normed - d_normed.mean(-1, keepdims=True)
                - normed * (d_normed * normed).mean(-1, keepdims=True))
  return (d_x.astype(x.dtype), d_scale.astype(scale.dtype),
          d_bias.astype(scale.dtype))


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nn.Module):
  """``nn.LayerNorm`` over the last axis with ``layer_norm``'s backward pass:
  the same parameters (``scale``, ``bias``, [features], param_dtype) and
  the same forward values.

  Attributes:
    epsilon: added to the variance.
    dtype: the result's dtype (None: the input's).
    param_dtype: the parameters' dtype.
    scale_init: initializer of ``scale``.
    bias_init: initializer of ``bias``.
  """
  epsilon: float = 1e-6
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  scale_init: Callable[..., Any] = nn.initializers.ones_init()
  bias_init: Callable[..., Any] = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    features = (x.shape[-1],)
    scale = self.param("scale", self.scale_init, features, self.param_dtype)
    bias = self.param("bias", self.bias_init, features, self.param_dtype)
    dtype = self.dtype if self.dtype is not None else x.dtype
    return layer_norm(x, scale, bias, float(self.epsilon), jnp.dtype(dtype))
