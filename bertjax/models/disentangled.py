"""DeBERTa's disentangled self-attention and its relative positions.

He et al. (2021), "DeBERTa: Decoding-enhanced BERT with Disentangled
Attention", section 3.1, as DeBERTa v2/v3 compute it (Hugging Face's
``DebertaV2`` family). For query i and key j, with content projections
Q_c, K_c of the hidden states and position projections Q_r, K_r of the
relative position embeddings P (one table shared by every layer):

  A[i, j] = ( Q_c[i]·K_c[j]                 content -> content
            + Q_c[i]·K_r[δ(i, j)]            content -> position  (c2p)
            + K_c[j]·Q_r[δ(i, j)] ) / sqrt(s·d)   position -> content (p2c)

with d the head size and s = 1 + the number of position terms (3 with both,
the paper's 1/sqrt(3d)). δ(i, j) is the row of P for the distance i - j:
``bucket(i - j) + S`` clipped to [0, 2S) where P has 2S rows. The paper
writes the p2c term with δ(j, i); the released code and transformers index
both terms by the same δ(i, j) (the p2c gather uses the negated distance of
the transposed matrix), and this module follows them, since checkpoints were
trained that way.

Distances: without buckets, S = ``max_relative_positions`` and bucket(d) = d
(clipped at ±S). With ``position_buckets`` > 0, S = position_buckets:
distances within (-S/2, S/2) keep their value and longer ones are binned
logarithmically up to ``max_relative_positions`` (``log_bucket``), so the
table has 2·position_buckets rows whatever the sequence length.

The distances are the row offsets i - j, not differences of the ``positions``
input: within one packed document positions run consecutively, so the two
agree wherever attention is allowed (documents never see each other), and a
static [length, length] index keeps the gathers free of batch dimensions.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models import layers

Dtype = Any

POSITION_TERMS = ("c2p", "p2c")


def log_bucket(distance: np.ndarray, position_buckets: int,
               max_position: int) -> np.ndarray:
  """Log-bucketed relative distances (DeBERTa v2's ``make_log_bucket_position``).

  With m = position_buckets // 2: |d| <= m keeps d; a longer distance maps to
  sign(d) · (m + ceil((m - 1) · log(|d| / m) / log((max_position - 1) / m))).
  Computed in float32, as the reference implementation does, so that values
  on bucket edges round the same way.

  Args:
    distance: int array of i - j.
    position_buckets: the bucket count (> 0).
    max_position: the distance that reaches the last bucket.

  Returns:
    int64 array of the same shape.
  """
  d = np.asarray(distance, np.int64)
  mid = position_buckets // 2
  sign = np.sign(d)
  abs_pos = np.where((d < mid) & (d > -mid), mid - 1, np.abs(d))
  ratio = np.log((abs_pos / np.float32(mid)).astype(np.float32))
  scale = np.log(np.float32((max_position - 1) / mid))
  log_pos = np.ceil(ratio / scale * np.float32(mid - 1)).astype(np.float32) + mid
  return np.where(abs_pos <= mid, d, (log_pos * sign).astype(np.int64))


@functools.lru_cache(maxsize=None)
def relative_index(length: int, span: int, position_buckets: int,
                   max_position: int) -> tuple[np.ndarray, int]:
  """Rows of the relative table read by a [length, length] attention.

  Args:
    length: sequence length L.
    span: S, half the table's rows (the table has 2S).
    position_buckets: > 0 to bucket distances (``log_bucket``), else off.
    max_position: ``max_relative_positions``.

  Returns:
    (int32 [L, L] index δ(i, j) - lo into the rows lo..hi of the table, lo).
    Only rows lo..hi are ever read at this length, so the caller projects
    just those (a 2·256-row table for a 128-token row reads 255 rows).
  """
  offsets = np.arange(length)
  distance = offsets[:, None] - offsets[None, :]
  if position_buckets > 0:
    distance = log_bucket(distance, position_buckets, max_position)
  index = np.clip(distance + span, 0, 2 * span - 1)
  lo = int(index.min())
  return (index - lo).astype(np.int32), lo


def table_span(position_buckets: int, max_relative_positions: int) -> int:
  """S: half the number of rows of the relative embedding table."""
  return position_buckets if position_buckets > 0 else max_relative_positions


class RelativeEmbeddings(nn.Module):
  """The relative position table shared by all layers, optionally normalised.

  Attributes:
    span: S; the table has 2S rows (logical axis 'position').
    hidden_size: its width (logical axis 'embed').
    normalize: apply a LayerNorm to the table (DeBERTa v2/v3's
      ``norm_rel_ebd='layer_norm'``).
    dtype, layer_norm_eps: as the encoder's.
  """
  span: int
  hidden_size: int
  normalize: bool = True
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS

  @nn.compact
  def __call__(self, lo: int, hi: int) -> jax.Array:
    """Rows lo..hi-1 of the (normalised) table: [hi - lo, embed] in dtype.

    The LayerNorm is per row, so normalising a slice equals slicing the
    normalised table.
    """
    table = self.param("embedding", layers.kernel_init("position", "embed"),
                       (2 * self.span, self.hidden_size), jnp.float32)
    rows = table[lo:hi].astype(self.dtype)
    if self.normalize:
      rows = layers.layer_norm(self.dtype, "layer_norm", self.layer_norm_eps)(rows)
    return rows


class DisentangledAttention(nn.Module):
  """Self-attention with DeBERTa's content and relative-position terms.

  Called as ``layers.MultiHeadAttention`` (built by ``layers.EncoderBlock``
  with num_heads, dropout_rate and dtype; the other fields are bound with
  ``functools.partial``), with the layer-shared relative inputs as keywords.

  Attributes:
    num_heads: heads; the hidden size must be divisible by it.
    dropout_rate: dropout on the attention probabilities.
    dtype: compute dtype.
    position_terms: which of 'c2p', 'p2c' to add (DeBERTa: both).
    share_att_key: project positions with the content query/key projections
      (v3) instead of their own ``pos_query``/``pos_key``.
    position_dropout_rate: dropout on the relative table (the hidden
      dropout, as transformers applies it).
  """
  num_heads: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  position_terms: Sequence[str] = POSITION_TERMS
  share_att_key: bool = False
  position_dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
               relative: jax.Array | None = None,
               relative_index: jax.Array | None = None,
               query: jax.Array | None = None) -> jax.Array:
    """Attends over ``x``.

    Args:
      x: [batch, length, embed] keys and values (and queries unless ``query``).
      mask: bool [batch, 1, length, length]; True where query may see key.
      deterministic: disables dropout.
      relative: [rows, embed] the rows of the shared relative table this
        length reads (``RelativeEmbeddings``); None with no position terms.
      relative_index: int32 [length, length] δ(i, j) into ``relative``.
      query: [batch, length, embed] states the queries come from (the
        enhanced mask decoder); default ``x``.

    Returns:
      [batch, length, embed] in ``dtype``.
    """
    hidden = x.shape[-1]
    if hidden % self.num_heads:
      raise ValueError(
          f"Hidden size {hidden} is not divisible by num_heads "
          f"{self.num_heads}; pick a size row whose hidden_size is a multiple.")
    head_dim = hidden // self.num_heads
    project = lambda name: layers.head_projection(
        self.num_heads, head_dim, self.dtype, name)
    query_proj, key_proj = project("query"), project("key")
    q = query_proj(x if query is None else query)  # [batch, length, heads, kv]
    k = key_proj(x)
    v = project("value")(x)
    terms = [t for t in POSITION_TERMS if t in self.position_terms]
    scale = np.sqrt(head_dim * (1 + len(terms))).astype(np.float32)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                        preferred_element_type=jnp.float32)
    if terms:
      rel = nn.Dropout(rate=self.position_dropout_rate)(relative, deterministic)
      index = relative_index[None, None]  # [1, 1, length, length]
      if "c2p" in terms:
        pos_key = (key_proj if self.share_att_key else project("pos_key"))(rel)
        # [batch, heads, query, rows]: each query against every distance row,
        # then δ(i, j) picks key j's row.
        c2p = jnp.einsum("bqhd,rhd->bhqr", q, pos_key,
                         preferred_element_type=jnp.float32)
        logits += jnp.take_along_axis(
            c2p, jnp.broadcast_to(index, c2p.shape[:2] + index.shape[2:]), axis=-1)
      if "p2c" in terms:
        pos_query = (query_proj if self.share_att_key else project("pos_query"))(rel)
        # [batch, heads, key, rows]; row δ(i, j) of key j, transposed to [q, k].
        p2c = jnp.einsum("bkhd,rhd->bhkr", k, pos_query,
                         preferred_element_type=jnp.float32)
        index_t = jnp.swapaxes(index, -1, -2)
        p2c = jnp.take_along_axis(
            p2c, jnp.broadcast_to(index_t, p2c.shape[:2] + index_t.shape[2:]), axis=-1)
        logits += jnp.swapaxes(p2c, -1, -2)
    return layers.attend_values(logits / scale, mask, v, self.dropout_rate,
                                deterministic, self.dtype)
