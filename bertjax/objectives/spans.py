"""SpanBERT's span masking: geometric span lengths, budget-filling span choice,
per-span 80/10/10.

Built on the span tiling of ``masking`` (``span_tiles``: candidate runs of
whole words cut into spans of drawn lengths). ``choose_span_slots`` takes
spans in a random order until the 15% budget is filled, cutting the last one
at a word boundary, so the chosen spans keep the drawn length law (the
skip-and-fill rule of ``masking.choose_tiles`` favours short spans);
``replace_spans`` gives a whole span one 80/10/10 decision.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import batch as batch_lib
from bertjax.objectives import masking


def choose_tile_prefix(rng: jax.Array, candidates: jax.Array, tile: jax.Array,
                       unit: jax.Array, *, rate: float,
                       max_predictions: int) -> jax.Array:
  """Takes tiles in a random order until the budget; cuts the one that overflows.

  Spans are added in turn while the token count stays within
  ``prediction_budget``; the span that would overflow is cut to its first
  units that still fit (a unit is never split), and the choice ends there --
  as SpanBERT's data code, which stops inside a span when the budget is met. Unlike ``choose_tiles``, which skips an overflowing
  tile and keeps looking (so fills its last room with short tiles), every
  span but the cut one keeps its drawn length, so the chosen spans follow
  the length law up to that one span per row; the count falls short of the
  budget by less than one unit.

  Args:
    rng: key for this row.
    candidates: bool [L], True where a token may be chosen.
    tile: int32 [L], tile id in [0, L] of every token (L = in no tile); a
      tile is a run of consecutive whole units.
    unit: int32 [L], unit id of every token (``masking.word_units``); units never
      straddle tiles.
    rate: fraction of candidate tokens to choose.
    max_predictions: P, <= L.

  Returns:
    bool [L], the chosen tokens (at most the budget, so at most P).
  """
  seq_len = candidates.shape[-1]
  masking.check_slots(seq_len, max_predictions)
  count = candidates.astype(jnp.int32)
  budget = masking.prediction_budget(jnp.sum(count), seq_len, rate, max_predictions)
  size = jax.ops.segment_sum(count, tile, num_segments=seq_len + 1)
  scores = jnp.where(size[:seq_len] > 0, jax.random.uniform(rng, (seq_len,)),
                     -1.0)
  order = jnp.argsort(-scores)
  size_in_order = size[order]
  before_in_order = jnp.cumsum(size_in_order) - size_in_order
  # Candidate tokens of the tiles ahead of each tile in the order; the
  # no-tile id L never fits.
  before = jnp.full((seq_len + 1,), seq_len + 1, jnp.int32).at[order].set(
      before_in_order.astype(jnp.int32))
  # Candidate tokens of a token's tile up to the end of its unit.
  index = jnp.arange(seq_len, dtype=jnp.int32)
  running = jnp.cumsum(count)
  tile_start = jax.ops.segment_min(index, tile, num_segments=seq_len + 1)
  upto = running - (running - count)[tile_start[tile]]
  upto_unit_end = jax.ops.segment_max(upto, unit, num_segments=seq_len)[unit]
  in_tile = tile < seq_len
  return candidates & in_tile & (upto_unit_end <= budget - before[tile])


def choose_span_slots(
    rng: jax.Array, candidates: jax.Array, word_starts: jax.Array, *,
    rate: float, max_predictions: int, length_probs: np.ndarray,
    whole_word: bool) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Spans of units with lengths from ``length_probs``, and each slot's span.

  The spans are ``span_tiles``' (as in ``choose_spans``: candidate runs cut
  into consecutive spans of drawn lengths, never crossing a special token);
  ``choose_tile_prefix`` takes them in a random order until the budget,
  cutting the last. A span's tokens are consecutive positions ``[start,
  end]``. Two chosen spans may touch: each is still its own span, and the
  token just outside one is the first or last token of the other.

  Args:
    rng, candidates, word_starts, rate, max_predictions, length_probs,
    whole_word: as in ``choose_spans``.

  Returns:
    positions int32 [P] ascending (unused slots 0), weights float32 [P],
    span_starts int32 [P] and span_ends int32 [P]: first and last chosen
    token position of the slot's span (0 in unused slots).
  """
  seq_len = candidates.shape[-1]
  tile_key, choose_key = jax.random.split(rng)
  tile = masking.span_tiles(tile_key, candidates, word_starts,
                    length_probs=length_probs, whole_word=whole_word)
  chosen = choose_tile_prefix(choose_key, candidates, tile,
                              masking.word_units(word_starts, whole_word), rate=rate,
                              max_predictions=max_predictions)
  positions, weights = masking.first_positions(chosen, max_predictions)
  index = jnp.arange(seq_len, dtype=jnp.int32)
  first = jax.ops.segment_min(jnp.where(chosen, index, seq_len), tile,
                              num_segments=seq_len + 1)
  last = jax.ops.segment_max(jnp.where(chosen, index, -1), tile,
                             num_segments=seq_len + 1)
  slot_tile = tile[positions]
  used = weights > 0
  return (positions, weights,
          jnp.where(used, first[slot_tile], 0).astype(jnp.int32),
          jnp.where(used, last[slot_tile], 0).astype(jnp.int32))


def geometric_length_probs(p: float, max_len: int) -> np.ndarray:
  """SpanBERT's span-length law: geometric(p) clipped at ``max_len``.

  ``P(n) = p (1 - p)^(n - 1) / (1 - (1 - p)^max_len)``, n = 1..max_len (the
  tail beyond max_len is dropped and the rest renormalised; p = 0.2 and
  max_len = 10 give a mean of 3.8 units, as in the paper).

  Returns:
    float64 [max_len]; entry n - 1 is P(n).
  """
  if not 0.0 < p <= 1.0:
    raise ValueError(f"span_geometric_p={p} must lie in (0, 1]; fix "
                     "--config.span_geometric_p.")
  if max_len < 1:
    raise ValueError(f"max_span_length={max_len} must be at least 1; fix "
                     "--config.max_span_length.")
  n = np.arange(1, max_len + 1)
  weights = p * (1.0 - p) ** (n - 1)
  return weights / weights.sum()


def replace_spans(rng: jax.Array, tokens: jax.Array, positions: jax.Array,
                  weights: jax.Array, span_starts: jax.Array, *,
                  vocab_size: int, mask_token_rate: float,
                  random_token_rate: float) -> jax.Array:
  """80/10/10 per span (SpanBERT): all tokens of a span get one treatment.

  One uniform draw per span (indexed by its start position) decides whether
  the whole span becomes [MASK]s, random ids or stays as it is; a span
  replaced by random ids draws an independent id per token, in
  ``[NUM_SPECIAL_TOKENS, vocab_size)``.

  Args:
    rng: key for this row.
    tokens: int32 [L].
    positions: int32 [P], weights float32 [P], span_starts int32 [P] from
      ``choose_span_slots``.
    vocab_size: V.
    mask_token_rate, random_token_rate: the two replacement probabilities.

  Returns:
    int32 [L], the corrupted row.
  """
  seq_len = tokens.shape[-1]
  num_slots = positions.shape[-1]
  # As in replace_tokens: 24 bits per uniform, 32-bit modulo for the ids.
  bits = jax.random.bits(rng, (seq_len + num_slots,), jnp.uint32)
  u_per_start = (bits[:seq_len] >> 8).astype(jnp.float32) / float(1 << 24)
  random_ids = batch_lib.NUM_SPECIAL_TOKENS + (
      bits[seq_len:] % jnp.uint32(vocab_size - batch_lib.NUM_SPECIAL_TOKENS)
  ).astype(jnp.int32)
  return masking.write_slots(tokens, positions, weights, u_per_start[span_starts],
                      random_ids, mask_token_rate=mask_token_rate,
                      random_token_rate=random_token_rate)
