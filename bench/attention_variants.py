"""The attention variants of ``bench/ab_step.py`` (and ``bench/layer_bench.py``):
an attention module of their own with the tree's parameter tree, and the
pieces the mask variants swap in. Not a script; what each feature changes is
listed in bench/README.md.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import attention as attention_lib
from bertjax.models import layers

# The features that replace ``layers.MultiHeadAttention`` with VariantAttention.
ATTENTION_FEATURES = ("flat2d", "qkv_fused", "qkv_tree", "heads_major", "mask_bias",
                      "dpa", "dpa_lengths", "batch_split")


class Weights(nn.Module):
  """Declares a projection's kernel and bias under the usual names."""
  kernel_shape: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_shape: tuple[int, ...]
  bias_axes: tuple[str, ...]

  @nn.compact
  def __call__(self):
    kernel = self.param("kernel", layers.kernel_init(*self.kernel_axes),
                        self.kernel_shape, jnp.float32)
    bias = self.param("bias", layers.zeros_init(*self.bias_axes),
                      self.bias_shape, jnp.float32)
    return kernel, bias


class VariantAttention(layers.MultiHeadAttention):
  """MultiHeadAttention with the class-level features switched on; same
  parameter tree (query/key/value/out kernels and biases)."""
  features = frozenset()

  @nn.compact
  def __call__(self, x, mask, deterministic, doc_ids=None, query=None):
    f, dt = self.features, self.dtype
    e = x.shape[-1]
    h = self.num_heads
    d = e // h
    if query is not None and "qkv_fused" in f:
      # The sparse last layer's queries are other rows than its keys and
      # values: that layer keeps three products.
      f = f - {"qkv_fused"}
    # Queries from the sparse last layer's rows, keys and values from all.
    sources = (x.astype(dt) if query is None else query.astype(dt),
               x.astype(dt), x.astype(dt))
    qkv = [Weights((e, h, d), ("embed", "heads", "kv"), (h, d),
                    ("heads", "kv"), name=n)() for n in ("query", "key", "value")]
    wo, bo = Weights((h, d, e), ("heads", "kv", "embed"), (e,), ("embed",),
                      name="out")()
    x = x.astype(dt)
    heads_major = "heads_major" in f
    if "qkv_tree" in f:
      # One product for query, key and value through the tree's own
      # projection (on a CPU ``projection``'s form and ordered backward):
      # the kernels joined on the heads axis, [embed, 3 * heads, kv]. The
      # sparse last layer's queries are other rows: three products there,
      # each as the tree makes it.
      project = layers.gathered("embed", "heads")
      numbers = (((x.ndim - 1,), (0,)), ((), ()))
      if query is None:
        kernel = jnp.concatenate([w for w, _ in qkv], axis=1).astype(dt)
        y = project(x, kernel, numbers)
        y = y + jnp.concatenate([b for _, b in qkv], axis=0).astype(dt)
        q, k, v = jnp.split(y, 3, axis=-2)
      else:
        q, k, v = (project(src, w.astype(dt), numbers) + b.astype(dt)
                   for src, (w, b) in zip(sources, qkv))
      out = attention_lib.attend(q, k, v, mask, segment_ids=doc_ids, impl=self.impl,
                                 dropout_rate=self.dropout_rate,
                                 deterministic=deterministic, dtype=dt)
      return layers.gathered("heads", "embed")(
          out, wo.astype(dt), (((2, 3), (0, 1)), ((), ()))) + bo.astype(dt)
    if "flat2d" in f:
      # 2-D kernels are bitcasts of the stored [e, h, d] / [h, d, e] ones.
      w2 = [w.reshape(e, h * d).astype(dt) for w, _ in qkv]
      b2 = [b.reshape(h * d).astype(dt) for _, b in qkv]
      if "qkv_fused" in f:
        y = x @ jnp.concatenate(w2, axis=1) + jnp.concatenate(b2)
        q, k, v = (t.reshape(x.shape[:2] + (h, d))
                   for t in jnp.split(y, 3, axis=-1))
      else:
        q, k, v = ((src @ w + b).reshape(src.shape[:2] + (h, d))
                   for src, w, b in zip(sources, w2, b2))
    elif "qkv_fused" in f:
      w = jnp.stack([k for k, _ in qkv]).astype(dt)  # [3, e, h, d]
      b = jnp.stack([b for _, b in qkv]).astype(dt)  # [3, h, d]
      if heads_major:
        y = jnp.einsum("ble,tehd->tbhld", x, w) + b[:, None, :, None, :]
      else:
        y = jnp.einsum("ble,tehd->tblhd", x, w) + b[:, None, None]
      q, k, v = y[0], y[1], y[2]
    elif heads_major:
      q, k, v = (jnp.einsum("ble,ehd->bhld", src, w.astype(dt))
                 + b.astype(dt)[:, None, :] for src, (w, b) in zip(sources, qkv))
    else:
      q, k, v = (jnp.einsum("ble,ehd->blhd", src, w.astype(dt)) + b.astype(dt)
                 for src, (w, b) in zip(sources, qkv))
    if "dpa_lengths" in f:
      out = attend_by_lengths(q, k, v, mask, doc_ids, dt)
      return jnp.einsum("blhd,hde->ble", out, wo.astype(dt)) + bo.astype(dt)
    if "dpa" in f:
      if "mask_bias" in f:
        out = jax.nn.dot_product_attention(q, k, v, bias=mask,
                                           implementation="xla")
      else:
        out = jax.nn.dot_product_attention(q, k, v, mask=mask,
                                           implementation="xla")
      return jnp.einsum("blhd,hde->ble", out, wo.astype(dt)) + bo.astype(dt)
    if "batch_split" in f:
      # Two independent halves of the batch: chains the runtime can run
      # side by side, each batched product on its own core.
      half = q.shape[0] // 2
      outs = [attention_lib.attend(q[s], k[s], v[s], mask[s] if mask.shape[0] > 1 else mask,
                                   dtype=dt)
              for s in (slice(0, half), slice(half, None))]
      out = jnp.concatenate(outs, axis=0)
      return jnp.einsum("bqhd,hde->bqe", out, wo.astype(dt)) + bo.astype(dt)
    spec = "bhqd,bhkd->bhqk" if heads_major else "bqhd,bkhd->bhqk"
    logits = jnp.einsum(spec, q, k, preferred_element_type=jnp.float32)
    logits = logits * (1.0 / float(d) ** 0.5)
    if "mask_bias" in f:
      logits = logits + mask
    else:
      logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(dt)
    if heads_major:
      out = jnp.einsum("bhqk,bhkd->bhqd", probs, v)
      return jnp.einsum("bhqd,hde->bqe", out, wo.astype(dt)) + bo.astype(dt)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    if "flat2d" in f:
      return (out.reshape(out.shape[:2] + (h * d,)) @ wo.reshape(h * d, e).astype(dt)
              + bo.astype(dt))
    return jnp.einsum("bqhd,hde->bqe", out, wo.astype(dt)) + bo.astype(dt)


def attend_by_lengths(q, k, v, mask, doc_ids, dtype):
  """``jax.nn.dot_product_attention`` told each row's length instead of given
  the [length, length] mask, the scale passed to the kernel: cuDNN's padding
  mask on a GPU in half precision (no bias tensor read per head), XLA
  elsewhere. Right only for rows of one document followed by padding (the
  sentence-pair batches of BERT's NSP); ``ab_step.compare`` checks the
  first step against the reference. The sparse last layer (no
  ``doc_ids``) keeps the tree's masked path."""
  if doc_ids is None:
    return attention_lib.attend(q, k, v, mask, impl="dot_product", dtype=dtype)
  kernel = attention_lib.dot_product_kernel(dtype)
  lengths = jnp.sum(doc_ids != 0, axis=1).astype(jnp.int32)
  out = jax.nn.dot_product_attention(
      q, k, v, scale=float(q.shape[-1]) ** -0.5, query_seq_lengths=lengths,
      key_value_seq_lengths=lengths, implementation=kernel)
  return out.astype(dtype)


# The tree's own, kept before ab_step patches ``layers.combine_masks``.
_COMBINE_MASKS = layers.combine_masks


def bias_masks(doc_ids, attention_mask=None):
  """``layers.combine_masks`` as an additive float32 bias (0 or float32 min),
  which VariantAttention adds under ``mask_bias``."""
  mask = _COMBINE_MASKS(doc_ids, attention_mask)
  return jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)


_SOFTMAX_VALUES = attention_lib.softmax_values  # before ab_step patches it


def softmax_values_by_bias(logits, mask, v, dropout_rate, deterministic, dtype):
  """``attention.softmax_values`` with the mask added to the scores as a
  float32 bias (0 or float32 min) made from the boolean mask in the layer,
  on its [batch, 1, q, k] shape, instead of a select on the [batch, heads,
  q, k] scores (variant bias_core); the tree's function does the rest, its
  select on a constant True folded away by XLA."""
  bias = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min).astype(jnp.float32)
  return _SOFTMAX_VALUES(logits + bias, True, v, dropout_rate, deterministic, dtype)
