"""The attention core, q k v -> weighted values, by one of several kernels.

``attend`` computes softmax(q k^T / sqrt(d), masked) v for q, k, v
[batch, length, heads, head_dim]; the projections around it stay in
``layers.MultiHeadAttention``. ``config.attention_impl`` picks the kernel:

  xla          the reference: einsum, ``jnp.where`` on the boolean mask, float32
               softmax, attention dropout, einsum. Any mask, any platform.
  dot_product  ``jax.nn.dot_product_attention`` with the same boolean mask:
               cuDNN flash attention on a GPU in bfloat16/float16, XLA's own
               lowering elsewhere (cuDNN has no float32 kernel).
  splash       Pallas splash attention (TPU): the documents of a packed row are
               passed as segment ids (``doc_ids``), so the [length, length] mask
               is never built; needs length a multiple of 128 and a mask that is
               exactly the documents' (``layers.doc_attention_mask``).
  auto         per platform: TPU -> splash where it applies, GPU -> dot_product
               (cuDNN) in bfloat16/float16, else xla.

Neither fused kernel has attention dropout. Asking for one by name with
``attention_dropout_rate > 0`` is refused by config validation
(``check_config``); ``auto`` uses xla whenever dropout is active (training with
a nonzero rate) and the fused kernel otherwise (evaluation, or rate 0).

Masks that are not documents (UniLM's ``attention_mask``) reach ``attend``
without ``segment_ids``: splash cannot take them and ``auto`` picks xla or
cuDNN's dense mask. XLNet's two-stream and DeBERTa's disentangled attention
compute their own logits and always run the xla softmax (``softmax_values``).

Padding follows the reference exactly: a padding key is never attended; a
padding query, which sees no key, gets the uniform average over all keys
(finite, never read by real tokens). For splash the padding keys get segment
id -1 and padding queries 0, so that row is fully masked there too. cuDNN's
padding queries get zeros (finite too; whatever the kernel computes for a
row with no key is not relied on).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax import sharding

Dtype = Any

IMPLS = ("auto", "xla", "dot_product", "splash")
# Splash's kernel tiles; its segment-id masking needs key blocks of 128 lanes.
SPLASH_BLOCK = 128
# Mesh axes the batch and the heads are split over (bertjax/sharding.py).
_BATCH_AXES = ("data", "fsdp")
_HEAD_AXIS = "tensor"


def check_config(config: Any) -> None:
  """Refuses an ``attention_impl`` that is unknown or cannot run this config.

  Raises:
    ValueError: one sentence naming the field and the fix.
  """
  impl = str(config.get("attention_impl", "auto"))
  if impl not in IMPLS:
    raise ValueError(
        f"config.attention_impl={impl!r} is unknown; set "
        f"--config.attention_impl to one of {', '.join(IMPLS)}.")
  if impl in ("auto", "xla"):
    return
  model = str(config.get("model", "bert"))
  if model not in ("bert", "spanbert", "albert", "electra") or (
      model == "electra" and str(config.get("encoder", "bert")) != "bert"):
    raise ValueError(
        f"config.attention_impl={impl!r} is only used by BERT's attention "
        f"(models bert, spanbert, albert and electra with BERT towers), not by "
        f"model {model!r}"
        + (" with DeBERTa towers" if model == "electra" else "")
        + "; set --config.attention_impl=auto.")
  if float(config.get("attention_dropout_rate", 0.0)) > 0:
    raise ValueError(
        f"config.attention_impl={impl!r} has no attention dropout but "
        f"attention_dropout_rate={config.attention_dropout_rate}; set "
        "--config.attention_dropout_rate=0 or --config.attention_impl=xla.")
  if impl == "splash" and str(config.get("objective", "")) == "unilm":
    raise ValueError(
        "config.attention_impl='splash' takes only document masks, not "
        "UniLM's attention masks; set --config.attention_impl=dot_product or xla.")
  if impl == "splash" and int(config.get("seq_len", 0)) % SPLASH_BLOCK:
    raise ValueError(
        f"config.attention_impl='splash' needs seq_len a multiple of "
        f"{SPLASH_BLOCK}, not {config.seq_len}; change --config.seq_len or "
        "use --config.attention_impl=xla.")


def _context_mesh() -> jax.sharding.Mesh | None:
  """The mesh the step is traced on: bertjax's (``sharding.use_mesh``), else
  one the caller bound with ``jax.set_mesh`` or jax's older ``with mesh:``,
  else None."""
  mesh = sharding.context_mesh()
  if mesh is not None:
    return mesh
  abstract = jax.sharding.get_abstract_mesh()
  if not abstract.empty:
    return abstract
  try:  # a caller's ``with mesh:`` (deprecated by jax; read while it exists)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)
      from jax.interpreters import pxla
      mesh = pxla.thread_resources.env.physical_mesh
  except (ImportError, AttributeError):
    return None
  return None if mesh.empty else mesh


def compile_platform() -> str:
  """The platform the step compiles for: the mesh's devices (a TPU topology
  when ``bertjax.aot`` compiles on a CPU host), else the default backend."""
  mesh = _context_mesh()
  devices = getattr(mesh, "devices", None)
  if devices is not None and devices.size:
    return devices.flat[0].platform
  return jax.default_backend()


def compiles_for_gpu() -> bool:
  """Whether the step being traced compiles for a GPU (``compile_platform``)."""
  return compile_platform() in ("gpu", "cuda")


def _half(dtype: Dtype) -> bool:
  return jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def dot_product_kernel(dtype: Dtype) -> str:
  """``jax.nn.dot_product_attention``'s implementation for ``dtype``: cuDNN
  when compiling for a GPU in half precision, else XLA."""
  return "cudnn" if _half(dtype) and compiles_for_gpu() else "xla"


def resolve(impl: str, *, platform: str, has_segments: bool, length: int,
            dropout: bool, dtype: Dtype) -> str:
  """The kernel ``auto`` stands for (other names come back unchanged).

  Args:
    impl: a name of IMPLS.
    platform: 'tpu', 'gpu' (or 'cuda'), 'cpu'.
    has_segments: the mask is exactly the documents' (segment ids given).
    length: sequence length.
    dropout: attention dropout is active in this call.
    dtype: compute dtype.
  """
  if impl != "auto":
    return impl
  if dropout:
    return "xla"
  if platform == "tpu" and has_segments and length % SPLASH_BLOCK == 0:
    return "splash"
  if platform in ("gpu", "cuda") and _half(dtype):
    return "dot_product"
  return "xla"


def softmax_values(logits: jax.Array, mask: jax.Array, v: jax.Array,
                   dropout_rate: float, deterministic: bool,
                   dtype: Dtype) -> jax.Array:
  """The reference core: masked float32 softmax of ``logits`` [batch, heads,
  q, k], dropout, weighted sum of ``v`` [batch, k, heads, kv] in ``dtype``:
  [batch, q, heads, kv]. With dropout active, call inside a flax module
  (the dropout is one)."""
  # jnp.where (not an additive -inf) keeps a fully masked query row finite:
  # it becomes a uniform average instead of NaN, and padding queries are
  # never read by real tokens.
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if dropout_rate > 0 and not deterministic:
    probs = nn.Dropout(rate=dropout_rate)(probs, deterministic)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(dtype), v)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *,
           segment_ids: jax.Array | None = None, impl: str = "xla",
           dropout_rate: float = 0.0, deterministic: bool = True,
           dtype: Dtype = jnp.float32) -> jax.Array:
  """Scaled dot-product attention by the kernel ``impl`` names.

  Args:
    q, k, v: [batch, length, heads, head_dim] in ``dtype`` (q unscaled).
    mask: bool [batch, 1 or heads, length, length]; True where query may
      attend to key.
    segment_ids: None, or int32 [batch, length] document ids (0 = padding)
      when ``mask`` is exactly ``layers.doc_attention_mask(segment_ids)``;
      splash needs them.
    impl: a name of IMPLS.
    dropout_rate, deterministic: attention dropout (xla only).
    dtype: compute dtype.

  Returns:
    [batch, length, heads, head_dim] in ``dtype``.

  Raises:
    ValueError: an unknown impl, a fused kernel with active dropout, or
      splash without segment ids or with a length it cannot tile.
  """
  if impl not in IMPLS:
    raise ValueError(f"attention_impl={impl!r} is unknown; use one of "
                     f"{', '.join(IMPLS)}.")
  dropout = dropout_rate > 0 and not deterministic
  impl = resolve(impl, platform=compile_platform(), has_segments=segment_ids is not None,
                 length=q.shape[1], dropout=dropout, dtype=dtype)
  if impl != "xla" and dropout:
    raise ValueError(
        f"attention_impl={impl!r} has no attention dropout; set "
        "--config.attention_dropout_rate=0 or --config.attention_impl=xla.")
  if impl == "xla":
    # The 1/sqrt(d) scale on the float32 scores, where XLA fuses it into the
    # masked softmax (scaling q instead is a pass over q, and one over its
    # gradient, of their own: one layer of BERT-base 1.4% slower on a CPU,
    # bench/layer_bench.py). For d a power of two, as BERT's 64, both orders
    # give the same bits.
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                        preferred_element_type=jnp.float32)
    logits = logits * (1.0 / float(q.shape[-1]) ** 0.5)
    return softmax_values(logits, mask, v, dropout_rate, deterministic, dtype)
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  if impl == "dot_product":
    return _dot_product(q, k, v, mask, dtype)
  if segment_ids is None:
    raise ValueError(
        "attention_impl='splash' needs the documents' segment ids, but this "
        "mask is not a document mask (UniLM); use dot_product or xla.")
  return _splash(q, k, v, segment_ids, dtype)


def _dot_product(q, k, v, mask, dtype):
  """``jax.nn.dot_product_attention``: cuDNN on a GPU in half precision."""
  kernel = dot_product_kernel(dtype)
  mask = jnp.broadcast_to(mask, (q.shape[0], mask.shape[1]) + mask.shape[2:])
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0,
                                     implementation=kernel)
  if kernel == "cudnn":
    # A query that may see no key (padding) is never read by real tokens, but
    # its output becomes a padding key's value in the next layer, where a
    # NaN would survive its zero weight (0 * NaN). Whatever the kernel gives
    # such rows, they get zeros here (the reference gives a finite average).
    sees_a_key = jnp.swapaxes(jnp.any(mask, axis=-1), 1, 2)[..., None]
    out = jnp.where(sees_a_key, out, jnp.zeros((), out.dtype))
  return out.astype(dtype)


def _splash(q, k, v, segment_ids, dtype):
  """Pallas splash attention with the documents as segment ids.

  Splash is a Pallas kernel that the SPMD partitioner cannot split, so under
  a mesh it runs in ``shard_map``: each device attends over its own rows
  (batch over data and fsdp) and heads (over tensor, when they divide).
  """
  batch, length, heads, _ = q.shape
  if length % SPLASH_BLOCK:
    raise ValueError(
        f"attention_impl='splash' needs length a multiple of {SPLASH_BLOCK}, "
        f"not {length}; change --config.seq_len or use attention_impl=xla.")
  q_seg = segment_ids.astype(jnp.int32)
  # Padding keys (-1) match no query, so a padding query's row is fully
  # masked: the uniform average of the reference.
  kv_seg = jnp.where(q_seg == 0, -1, q_seg)
  interpret = compile_platform() != "tpu"
  qkv = [jnp.swapaxes(x, 1, 2) for x in (q, k, v)]  # [batch, heads, len, d]
  body = functools.partial(_splash_local, interpret=interpret)
  mesh = _context_mesh()
  if mesh is not None and mesh.size > 1:
    shape = dict(mesh.shape)
    rows = tuple(a for a in _BATCH_AXES if a in shape)
    row_ways = 1
    for a in rows:
      row_ways *= shape[a]
    head_axis = _HEAD_AXIS if (_HEAD_AXIS in shape and
                               heads % shape[_HEAD_AXIS] == 0) else None
    if batch % row_ways == 0:
      P = jax.sharding.PartitionSpec
      x_spec = P(rows, head_axis)
      body = jax.shard_map(body, mesh=mesh,
                           in_specs=(x_spec, x_spec, x_spec, P(rows), P(rows)),
                           out_specs=x_spec, check_vma=False)
  out = body(*qkv, q_seg, kv_seg)
  return jnp.swapaxes(out, 1, 2).astype(dtype)


def _splash_local(q, k, v, q_seg, kv_seg, *, interpret: bool):
  """Splash over local q, k, v [batch, heads, length, d] and segment ids."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as splash, splash_attention_mask as splash_mask)
  _, heads, length, _ = q.shape
  mask = splash_mask.MultiHeadMask(
      [splash_mask.FullMask((length, length))] * heads)
  # The largest of 512, 256, 128 that tiles the length (fewer grid steps).
  block = next(b for b in (4 * SPLASH_BLOCK, 2 * SPLASH_BLOCK, SPLASH_BLOCK)
               if length % b == 0)
  sizes = splash.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=SPLASH_BLOCK,
      block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=SPLASH_BLOCK,
      block_q_dq=block, block_kv_dq=block)
  kernel = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                  block_sizes=sizes, interpret=interpret)
  segments = splash.SegmentIds(q=q_seg, kv=kv_seg)
  return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=s))(
      q, k, v, segments)
