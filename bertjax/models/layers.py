"""Transformer encoder layers shared by the BERT family.

Every parameter carries logical axis names (``nn.with_logical_partitioning``);
``bertjax/sharding.py`` maps them to mesh axes. The names used here:

  embed   the hidden (model) dimension H
  mlp     the feed-forward inner dimension
  heads   attention heads
  kv      the per-head dimension H / heads
  vocab, position, type   rows of the embedding tables (see bert.py)

Activations are ``[batch, length, embed]``; parameters are always float32 and
``dtype`` is the compute dtype. Attention logits and softmax are float32 even
when ``dtype`` is bfloat16, because the softmax of bfloat16 logits loses the
small differences that separate tokens.

Variants plug in here by swapping modules, not by flags: ``EncoderBlock`` takes
the attention class as a field (relative-position kinds bring their own), and a
variant that shares one block across layers (ALBERT) writes its own stack
around ``EncoderBlock``.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from bertjax import sharding
from bertjax.models import attention as attention_lib
from bertjax.models import projection

Dtype = Any

# BERT's initializer: truncated normal with standard deviation 0.02.
KERNEL_STDDEV = 0.02
LAYER_NORM_EPS = 1e-12
# Logical names of the hidden states between blocks.
HIDDEN_AXES = ("batch", "length", "embed")


def gathered(*kernel_axes: str | None) -> Callable[..., jax.Array]:
  """A ``dot_general`` for a kernel whose logical axes are ``kernel_axes``:
  the kernel's FSDP axis ('embed') is gathered before the product. Only a
  kernel of that rank is constrained: the attention's 3-D kernels, named by
  their first two axes here, are left to the partitioner (constrained too,
  BERT-large on ``v5p:2x2x2`` needed 4.28 GiB a chip against 4.03, and 7%
  more compiled FLOPs; 2026-11-27).

  Under FSDP the kernel is split on 'embed' over the same mesh axis as the
  batch's rows. Left to itself, XLA's partitioner may instead move the
  activations onto the kernel's split, and every chip then holds partial
  sums of the whole batch (BERT-mini at 256 chips: 2 GiB a chip of them);
  a kernel whole on 'embed' where it is used makes it gather the weights,
  the FSDP way. A no-op outside a traced step (``sharding.with_rules``).

  When the step compiles for a CPU, a plain projection goes through
  ``projection.project`` (input no wider than its output: the kernel
  gradient as a row-major YNNPACK product) or ``projection.flat``, whose
  backward passes order their two products (module doc there).
  """
  spec = tuple(None if name == "embed" else name for name in kernel_axes)

  def dot_general(lhs, rhs, dimension_numbers, precision=None, **kwargs):
    if rhs.ndim == len(spec):
      rhs = sharding.constrain(rhs, spec)
    count = projection.is_projection(lhs, rhs, dimension_numbers)
    if count and not kwargs and projection.enabled():
      form = projection.form(rhs, count)
      if form == "transposed":
        return projection.project(lhs, rhs, count, precision)
      if form == "flat":
        return projection.flat(lhs, rhs, count, precision)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               **kwargs)
  return dot_general


def kernel_init(*names: str | None) -> Callable[..., Any]:
  """Truncated-normal (std 0.02) initializer boxed with logical axis ``names``."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(stddev=KERNEL_STDDEV), names)


def zeros_init(*names: str | None) -> Callable[..., Any]:
  """Zeros initializer boxed with logical axis ``names`` (biases)."""
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def embed_rows(table: nn.Embed, ids: jax.Array, dtype: Dtype) -> jax.Array:
  """Rows ``ids`` of ``table``'s float32 embedding, cast to ``dtype``.

  ``nn.Embed(dtype=bf16)`` casts the whole table first and gathers bf16 rows,
  so its gradient is a bf16 scatter-add: every use of a frequent id ([MASK]
  alone is ~12% of a batch) is summed in bf16, and on GPUs the colliding bf16
  adds run as compare-and-swap loops. Gathering the float32 rows and casting
  after gives the same forward values and a float32 scatter-add.
  """
  return jnp.take(table.embedding, ids, axis=0).astype(dtype)


_SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)


def gelu_erf(x: jax.Array) -> jax.Array:
  """BERT's exact GELU, x * Phi(x) with the normal CDF Phi(x) = (1 +
  erf(x / sqrt 2)) / 2, as the original BERT and PyTorch compute it.

  ``jax.nn.gelu(approximate=False)`` computes Phi with ``erfc``, whose XLA
  expansion costs about twice ``erf``'s: forward and backward of a BERT-base
  feed-forward activation (1024 x 3072, float32, CPU) take 2.0 ms this way
  against 4.4 ms (issue 17; ``bench/ab_step.py`` variant ``gelu_erfc``). The
  two agree within 2e-6 everywhere: only in the far negative tail, where
  1 + erf cancels, does erf lose relative precision, and there both values
  are below 2e-6 in magnitude.
  """
  return x * (0.5 + 0.5 * lax.erf(x * _SQRT_HALF))


# The feed-forward activations a config may name (``config.hidden_act``, HF's
# names): BERT's exact erf GELU, the tanh approximation of ALBERT v2 / GPT-2
# ('gelu_new', alias 'gelu_pytorch_tanh'), and ReLU.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": gelu_erf,
    "gelu_new": lambda x: nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: nn.gelu(x, approximate=True),
    "relu": nn.relu,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """The function ``name`` (a key of ACTIVATIONS) stands for.

  Raises:
    ValueError: for an unknown name.
  """
  if name not in ACTIVATIONS:
    raise ValueError(
        f"Unknown activation {name!r}; set --config.hidden_act to one of "
        f"{', '.join(ACTIVATIONS)}.")
  return ACTIVATIONS[name]


def remat_activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """``activation(name)`` under ``jax.checkpoint``: only its input is kept
  for the backward pass, which recomputes the rest. The exact GELU's forward
  otherwise stores two more [tokens, mlp] pieces of itself
  (``bench/ab_step.py`` gelu_saved is the plain form)."""
  return jax.checkpoint(activation(name))


def numerics(config: Any) -> dict[str, Any]:
  """``layer_norm_eps`` and ``activation`` module fields from a config.

  ``config.layer_norm_eps`` (default BERT's 1e-12) and ``config.hidden_act``
  (default 'gelu'); imported checkpoints set them from their config.json
  (RoBERTa: 1e-5; ALBERT v2: 'gelu_new').

  Raises:
    ValueError: for an unknown activation or a non-positive epsilon.
  """
  eps = float(config.get("layer_norm_eps", LAYER_NORM_EPS))
  if not 0 < eps < float("inf"):  # inf would scale every activation to 0
    raise ValueError(f"layer_norm_eps={eps} must be a positive number; fix "
                     f"--config.layer_norm_eps.")
  name = str(config.get("hidden_act", "gelu"))
  activation(name)
  return {"layer_norm_eps": eps, "activation": name}


# LayerNorm whose backward pass recomputes its statistics from its input
# instead of keeping normalised activations: the same values, fewer stored
# activations (bench/ab_step.py ln_saved is the plain form).
_RematLayerNorm = nn.remat(nn.LayerNorm)


def remat_pointwise() -> bool:
  """Whether the step being traced rematerialises its LayerNorms and
  feed-forward activation: everywhere but on a GPU. Values are the same
  either way. Measured (docs/performance.md): on a TPU pod the per-chip HBM is a
  little lower and a CPU base step about 2% faster with them; on an H200 a
  bf16 base step is 2.5% slower (bench/ab_step.py pointwise_remat)."""
  return not attention_lib.compiles_for_gpu()


def layer_norm(dtype: Dtype, name: str | None,
               eps: float = LAYER_NORM_EPS) -> nn.Module:
  """BERT's LayerNorm (eps 1e-12 unless given) with ('embed',) scale and
  bias, rematerialised where ``remat_pointwise()``: parameters ``scale`` and
  ``bias`` as ``nn.LayerNorm``'s either way."""
  cls = _RematLayerNorm if remat_pointwise() else nn.LayerNorm
  return cls(
      epsilon=eps, dtype=dtype, param_dtype=jnp.float32,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                              ("embed",)),
      bias_init=zeros_init("embed"), name=name)


def doc_attention_mask(doc_ids: jax.Array) -> jax.Array:
  """Which keys each query may attend to, from packed document ids.

  Args:
    doc_ids: int32 [batch, length]; 1-based document index, 0 on padding.

  Returns:
    bool [batch, 1, length, length] (the 1 broadcasts over heads): True where
    query q and key k are in the same document and k is not padding.
  """
  same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
  real_key = (doc_ids != 0)[:, None, :]
  return (same_doc & real_key)[:, None, :, :]


def combine_masks(doc_ids: jax.Array,
                  attention_mask: jax.Array | None = None) -> jax.Array:
  """``doc_attention_mask`` narrowed by an objective's own mask, if any.

  Objectives that train through attention (UniLM's unified masks) pass a
  per-example mask as the model input ``attention_mask``; documents still
  never see each other, whatever that mask says.

  Args:
    doc_ids: int32 [batch, length].
    attention_mask: None, or bool [batch, length, length] or
      [batch, 1 or heads, length, length]: True where query may attend to key.

  Returns:
    bool [batch, 1 or heads, length, length].
  """
  mask = doc_attention_mask(doc_ids)
  if attention_mask is None:
    return mask
  if attention_mask.ndim == 3:
    attention_mask = attention_mask[:, None, :, :]
  return mask & attention_mask.astype(bool)


class MultiHeadAttention(nn.Module):
  """Self-attention with learned projections and a boolean mask.

  Attributes:
    num_heads: number of heads; the hidden size must be divisible by it.
    dropout_rate: dropout on the attention probabilities.
    dtype: compute dtype of the projections.
    impl: the attention kernel, a name of ``attention.IMPLS``
      (``config.attention_impl``).
  """
  num_heads: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  impl: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
               doc_ids: jax.Array | None = None,
               query: jax.Array | None = None) -> jax.Array:
    """Attends over ``x``.

    Args:
      x: [batch, length, embed] hidden states.
      mask: bool [batch, 1 or heads, queries, length]; True where query may
        attend to key.
      deterministic: disables dropout.
      doc_ids: None, or int32 [batch, length] when ``mask`` is exactly
        ``doc_attention_mask(doc_ids)``: the segment ids splash needs.
      query: None, or [batch, queries, embed]: the queries come from these
        rows and ``x`` gives only keys and values (``Encoder``'s
        ``query_rows``); ``doc_ids`` must then be None.

    Returns:
      [batch, queries, embed] in ``dtype`` (queries = length without
      ``query``).
    """
    hidden = x.shape[-1]
    if hidden % self.num_heads:
      raise ValueError(
          f"Hidden size {hidden} is not divisible by num_heads "
          f"{self.num_heads}; pick a size row whose hidden_size is a multiple.")
    head_dim = hidden // self.num_heads
    q = head_projection(self.num_heads, head_dim, self.dtype, "query")(
        x if query is None else query)
    k = head_projection(self.num_heads, head_dim, self.dtype, "key")(x)
    v = head_projection(self.num_heads, head_dim, self.dtype, "value")(x)
    # Splash tiles square [length, length] problems only; a query subset is
    # small and takes the reference path.
    impl = "xla" if query is not None and self.impl == "splash" else self.impl
    out = attention_lib.attend(
        q, k, v, mask, segment_ids=doc_ids, impl=impl,
        dropout_rate=self.dropout_rate, deterministic=deterministic,
        dtype=self.dtype)
    return out_projection(out, self.dtype)


def head_projection(num_heads: int, head_dim: int, dtype: Dtype,
                    name: str) -> nn.DenseGeneral:
  """[..., embed] -> [..., heads, kv]: a query/key/value projection."""
  return nn.DenseGeneral(
      features=(num_heads, head_dim), dtype=dtype, param_dtype=jnp.float32,
      kernel_init=kernel_init("embed", "heads", "kv"), dot_general=gathered("embed", "heads"),
      bias_init=zeros_init("heads", "kv"), name=name)


def attend_values(logits: jax.Array, mask: jax.Array, v: jax.Array,
                  dropout_rate: float, deterministic: bool,
                  dtype: Dtype) -> jax.Array:
  """Masked softmax of float32 ``logits`` [batch, heads, q, k], dropout, the
  weighted sum of ``v`` [batch, k, heads, kv] and the output projection
  (named 'out', called inside the attention module): [batch, q, embed]."""
  out = attention_lib.softmax_values(logits, mask, v, dropout_rate,
                                     deterministic, dtype)
  return out_projection(out, dtype)


def out_projection(out: jax.Array, dtype: Dtype) -> jax.Array:
  """[batch, q, heads, kv] -> [batch, q, embed]: the attention output
  projection, named 'out' (call inside the attention module)."""
  hidden = out.shape[-2] * out.shape[-1]
  return nn.DenseGeneral(
      features=hidden, axis=(-2, -1), dtype=dtype, param_dtype=jnp.float32,
      kernel_init=kernel_init("heads", "kv", "embed"), dot_general=gathered("heads", "embed"),
      bias_init=zeros_init("embed"), name="out")(out)


class Mlp(nn.Module):
  """Position-wise feed-forward: dense -> exact GELU -> dense.

  Attributes:
    mlp_dim: inner dimension.
    dtype: compute dtype.
    activation: a key of ACTIVATIONS (BERT: exact 'gelu').
  """
  mlp_dim: int
  dtype: Dtype = jnp.float32
  activation: str = "gelu"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Maps [batch, length, embed] to [batch, length, embed]."""
    hidden = x.shape[-1]
    y = nn.Dense(self.mlp_dim, dtype=self.dtype, param_dtype=jnp.float32,
                 kernel_init=kernel_init("embed", "mlp"), dot_general=gathered("embed", "mlp"),
                 bias_init=zeros_init("mlp"), name="wi")(x)
    y = (remat_activation if remat_pointwise() else activation)(self.activation)(y)
    return nn.Dense(hidden, dtype=self.dtype, param_dtype=jnp.float32,
                    kernel_init=kernel_init("mlp", "embed"), dot_general=gathered("mlp", "embed"),
                    bias_init=zeros_init("embed"), name="wo")(y)


class EncoderBlock(nn.Module):
  """Post-LayerNorm Transformer block (BERT).

  x = LN(x + dropout(attention(x))); x = LN(x + dropout(mlp(x))).

  Attributes:
    num_heads: attention heads.
    mlp_dim: feed-forward inner dimension.
    dropout_rate: dropout on the sublayer outputs.
    attention_dropout_rate: dropout on the attention probabilities.
    dtype: compute dtype.
    attention_cls: the attention module; called as
      ``attention_cls(num_heads=, dropout_rate=, dtype=, name='attention')``
      and then ``(x, mask, deterministic)``.
    layer_norm_eps: epsilon of both LayerNorms.
    activation: the feed-forward activation (a key of ACTIVATIONS).
  """
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention_cls: type[nn.Module] = MultiHeadAttention
  layer_norm_eps: float = LAYER_NORM_EPS
  activation: str = "gelu"

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
               context: dict[str, jax.Array] | None = None) -> jax.Array:
    """Maps [batch, length, embed] to [batch, length, embed] (``dtype``).

    ``context`` (optional) is passed to the attention as keyword arguments:
    what a relative-position attention shares across layers (DeBERTa's
    relative embeddings and distance indices). A ``query`` entry
    [batch, length, embed] makes the queries (and the residual) come from it
    instead of ``x``, which then only gives keys and values (DeBERTa's
    enhanced mask decoder).
    """
    context = dict(context or {})
    attention = self.attention_cls(
        num_heads=self.num_heads, dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype, name="attention")
    y = attention(x, mask, deterministic, **context) if context else attention(
        x, mask, deterministic)
    y = nn.Dropout(rate=self.dropout_rate)(y, deterministic)
    x = context.get("query", x)
    x = layer_norm(self.dtype, "attention_norm", self.layer_norm_eps)(x + y)
    y = Mlp(mlp_dim=self.mlp_dim, dtype=self.dtype, activation=self.activation,
            name="mlp")(x)
    y = nn.Dropout(rate=self.dropout_rate)(y, deterministic)
    return layer_norm(self.dtype, "mlp_norm", self.layer_norm_eps)(x + y)
