"""The encoder stack: ``EncoderBlock``s one after another, unrolled or under
``nn.scan``, optionally rematerialised.

The blocks themselves, their attention and their feed-forward are in
``layers.py``; this module only stacks them, converts parameters between the
unrolled (``layer_i``) and scanned (``layers/block``) layouts, and narrows the
last block to the rows a loss reads (``query_rows``).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import sharding
from bertjax.models import layers


# Which intermediate values a rematerialised layer keeps for the backward pass.
# 'full' keeps only the layer's input; 'dots' also keeps matmul outputs
# (without a batch dimension), so only the cheap elementwise work is redone.
REMAT_POLICIES: dict[str, Callable[..., Any] | None] = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# Name of the stacked-layer parameter axis under nn.scan.
LAYERS_AXIS = "layers"


class _ScannedBlock(nn.Module):
  """One scan step: a block whose output is both the carry and no output.

  With ``last`` set (``query_rows`` of a scanned stack) the carry is (x,
  layer index) and the step of index ``last`` computes only ``rows`` of its
  output, as the unscanned last block does (``_at_rows``), and writes them
  back into x [batch, length, embed]; ``nn.cond`` runs that narrow branch at
  that step only, with the same block parameters (the layout is unchanged).
  """
  block_cls: Any
  block_kwargs: dict[str, Any]
  deterministic: bool
  last: int = -1

  def setup(self):
    self.block = self.block_cls(**self.block_kwargs)

  def __call__(self, carry, mask: jax.Array, context: dict[str, jax.Array],
               rows: jax.Array | None = None):
    if self.last < 0:
      x = self.block(carry, mask, self.deterministic, context)
      return sharding.constrain(x, layers.HIDDEN_AXES), None
    x, index = carry
    x = nn.cond(index == self.last, _ScannedBlock._narrow, _ScannedBlock._full,
                self, x, mask, context, rows)
    return (sharding.constrain(x, layers.HIDDEN_AXES), index + 1), None

  def _full(self, x, mask, context, rows):
    del rows
    return self.block(x, mask, self.deterministic, context)

  def _narrow(self, x, mask, context, rows):
    narrow_mask, narrow_context = _at_rows(x, mask, context, rows)
    y = self.block(x, narrow_mask, self.deterministic, narrow_context)
    # A row listed twice (unused slots point at 0) got the same value twice.
    batch = jnp.arange(x.shape[0])[:, None]
    return x.at[batch, rows].set(y.astype(x.dtype))


class Encoder(nn.Module):
  """A stack of independent ``EncoderBlock``s.

  Unscanned, the blocks are named ``layer_0 .. layer_{n-1}``. With
  ``scan_layers`` they are one ``nn.scan`` over a block named ``layers/block``
  whose parameters carry a leading ``[num_layers]`` axis (logical name
  'layers'), so compile time does not grow with depth; ``stack_layers`` and
  ``unstack_layers`` convert between the two layouts.

  Attributes:
    num_layers: number of blocks.
    num_heads, mlp_dim, dropout_rate, attention_dropout_rate, dtype,
    attention_cls, layer_norm_eps, activation: passed to every block.
    scan_layers: stack the blocks with ``nn.scan``.
    remat: 'none' | 'full' | 'dots' (``REMAT_POLICIES``): recompute each block
      in the backward pass, trading compute for activation memory.
  """
  num_layers: int
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: layers.Dtype = jnp.float32
  attention_cls: type[nn.Module] = layers.MultiHeadAttention
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"
  scan_layers: bool = False
  remat: str = "none"

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
               context: dict[str, jax.Array] | None = None,
               query_rows: jax.Array | None = None) -> jax.Array:
    """Maps [batch, length, embed] to [batch, length, embed] (``dtype``).

    ``mask`` is bool [batch, 1 or heads, length, length], see
    ``layers.doc_attention_mask``; ``context`` goes to every block unchanged (see
    ``EncoderBlock``).

    ``query_rows`` (optional, int32 [batch, rows]): the last block computes
    only these rows of its output, [batch, rows, embed], when the caller
    reads no other (a pretraining loss reads the predicted slots and [CLS]).
    Its keys and values still come from every row; its queries, output
    projection and feed-forward skip the rest. A scanned stack runs that
    narrow block as its last scan step (``_ScannedBlock``).
    """
    context = dict(context or {})
    if self.remat != "none" and self.remat not in REMAT_POLICIES:
      raise ValueError(
          f"Unknown remat policy {self.remat!r}; set --config.remat to one of "
          f"none, {', '.join(REMAT_POLICIES)}.")
    block_cls = layers.EncoderBlock
    if self.remat != "none":
      # deterministic (argument 3, counting self) picks dropout on or off.
      block_cls = nn.remat(layers.EncoderBlock, policy=REMAT_POLICIES[self.remat],
                           static_argnums=(3,))
    kwargs = dict(
        num_heads=self.num_heads, mlp_dim=self.mlp_dim,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype, attention_cls=self.attention_cls,
        layer_norm_eps=self.layer_norm_eps, activation=self.activation)
    x = sharding.constrain(x, layers.HIDDEN_AXES)
    if self.scan_layers:
      narrow = query_rows is not None
      stack = nn.scan(
          _ScannedBlock, variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast,) * (3 if narrow else 2), length=self.num_layers,
          metadata_params={nn.PARTITION_NAME: LAYERS_AXIS})
      stack = stack(block_cls=block_cls, block_kwargs=kwargs,
                    deterministic=deterministic,
                    last=self.num_layers - 1 if narrow else -1, name=LAYERS_AXIS)
      if not narrow:
        return stack(x, mask, context)[0]
      (x, _), _ = stack((x, jnp.int32(0)), mask, context, query_rows)
      return jnp.take_along_axis(x, query_rows[:, :, None], axis=1)
    for i in range(self.num_layers):
      if i == self.num_layers - 1 and query_rows is not None:
        mask, context = _at_rows(x, mask, context, query_rows)
      x = block_cls(**kwargs, name=f"layer_{i}")(x, mask, deterministic, context)
      x = sharding.constrain(x, layers.HIDDEN_AXES)
    return x


def _at_rows(x: jax.Array, mask: jax.Array, context: dict[str, jax.Array],
             rows: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """A block's (mask, context) such that, given ``x``, it computes only
  ``rows`` (int32 [batch, rows]) of its output: the queries (and the
  residual) are those rows of ``x``, the mask keeps their rows, and the
  document ids, which describe a square mask, are dropped."""
  context = {k: v for k, v in context.items() if k != "doc_ids"}
  context["query"] = jnp.take_along_axis(x, rows[:, :, None], axis=1)
  mask = jnp.take_along_axis(mask, rows[:, None, :, None], axis=2)
  return mask, context


def stack_layers(encoder_params: dict[str, Any], num_layers: int) -> dict[str, Any]:
  """Unscanned Encoder params (``layer_i/...``) -> scanned (``layers/block/...``).

  Every leaf gains a leading [num_layers] axis. Unboxed arrays only.
  """
  blocks = [encoder_params[f"layer_{i}"] for i in range(num_layers)]
  return {LAYERS_AXIS: {"block": jax.tree.map(lambda *a: jnp.stack(a), *blocks)}}


def unstack_layers(encoder_params: dict[str, Any]) -> dict[str, Any]:
  """Scanned Encoder params (``layers/block/...``) -> ``layer_i/...``."""
  block = encoder_params[LAYERS_AXIS]["block"]
  n = jax.tree.leaves(block)[0].shape[0]
  return {f"layer_{i}": jax.tree.map(lambda a, i=i: a[i], block) for i in range(n)}
