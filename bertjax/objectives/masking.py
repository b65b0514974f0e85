"""Jittable masking primitives: per-example keys, choosing positions, replacing.

Pure array functions with static shapes, in the spirit of ELECTRA's
``pretrain_helpers``: choose exactly N positions among candidates with random
scores and ``top_k``, then scatter/gather. The choosers work on ONE row
(``[seq]`` arrays) and are ``vmap``-ed by the objectives, so that each row
draws from its own key and the result does not depend on the row's place in
the batch or on the number of devices.

Choosers: ``choose_positions`` (tokens), ``choose_whole_words`` (words), and
the span family ``choose_spans`` = ``tile_units`` (cut candidate runs into
spans of drawn lengths) + ``choose_tiles`` (take whole groups within the
budget), which gives ALBERT's n-grams with ``ngram_length_probs``;
``span_tiles`` is the tiling alone, on which SpanBERT's span choice
(``bertjax/objectives/spans.py``) builds.

Shapes: ``L`` is the sequence length, ``P`` the number of prediction slots
(``config.max_predictions_per_seq``), ``B`` the batch size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import batch as batch_lib

MASKING_MODES = ("static", "dynamic")
# Greedy passes of ``choose_tiles``; each one skips the tiles that overflow.
_FILL_PASSES = 4


def check_masking_mode(masking: str) -> None:
  """Raises a ValueError unless ``masking`` names a known randomness mode."""
  if masking not in MASKING_MODES:
    raise ValueError(
        f"Unknown masking mode {masking!r}; set --config.masking to one of "
        f"{', '.join(MASKING_MODES)}.")


def example_keys(rng: jax.Array, example_id: jax.Array, epoch: jax.Array,
                 step: jax.Array, *, masking: str,
                 dupe_factor: int) -> jax.Array:
  """One key per example, independent of its place in the batch.

  ``static``: ``fold_in(fold_in(fold_in(rng, doc), instance), epoch %
  dupe_factor)`` -- the same example draws the same key in every epoch with
  the same ``epoch % dupe_factor``, so it sees at most ``dupe_factor``
  distinct corruptions over training (BERT's duplicated static masks).
  ``dynamic``: ``fold_in(fold_in(fold_in(rng, step), doc), instance)`` -- a new
  key every step.

  Args:
    rng: a key (typed or raw), kept apart from the caller's other streams
      (e.g. by splitting the root key first).
    example_id: int32 [B, 2] (document index, instance index).
    epoch: int32 [B].
    step: int32 scalar.
    masking: 'static' or 'dynamic' (Python string, static under jit).
    dupe_factor: number of distinct static corruptions per example (>= 1).

  Returns:
    keys [B] (one key per example, same key type as ``rng``).
  """
  check_masking_mode(masking)
  doc, instance = example_id[:, 0], example_id[:, 1]
  fold_one = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
  fold = jax.vmap(jax.random.fold_in)
  if masking == "static":
    return fold(fold(fold_one(rng, doc), instance), jnp.mod(epoch, dupe_factor))
  return fold(fold_one(jax.random.fold_in(rng, step), doc), instance)


def prediction_budget(num_candidates: jax.Array, seq_len: int, rate: float,
                      max_predictions: int) -> jax.Array:
  """BERT's count rule: ``min(P, max(1, round(rate * n)))``, and 0 when n = 0.

  Evaluated through a table built in float64 with Python's ``round`` (half to
  even), so the count is exactly what BERT's reference data script computes;
  float32 arithmetic would round e.g. 0.15 * 30 up to 5 instead of 4.

  Args:
    num_candidates: int32 [...] number of candidate tokens n, in [0, seq_len].
    seq_len: static upper bound of n.
    rate: fraction of candidates to choose.
    max_predictions: P.

  Returns:
    int32 [...] number of tokens to choose.
  """
  table = np.array(
      [0] + [min(max_predictions, max(1, round(rate * n)))
             for n in range(1, seq_len + 1)], np.int32)
  return jnp.asarray(table)[num_candidates]


def check_slots(seq_len: int, max_predictions: int) -> None:
  if max_predictions > seq_len:
    raise ValueError(
        f"max_predictions_per_seq={max_predictions} exceeds seq_len={seq_len}; "
        f"lower --config.max_predictions_per_seq.")


def first_positions(mask: jax.Array,
                    max_predictions: int) -> tuple[jax.Array, jax.Array]:
  """The first P True positions of ``mask``, ascending.

  Args:
    mask: bool [L] with at most P True entries (more are cut off).
    max_predictions: P.

  Returns:
    positions int32 [P] (unused slots 0), weights float32 [P] (1 if used).
  """
  seq_len = mask.shape[-1]
  check_slots(seq_len, max_predictions)
  # Earlier positions get larger keys, so top_k returns them in order.
  keys = jnp.where(mask, seq_len - jnp.arange(seq_len, dtype=jnp.int32), 0)
  values, index = jax.lax.top_k(keys, max_predictions)
  used = values > 0
  return (jnp.where(used, index, 0).astype(jnp.int32),
          used.astype(jnp.float32))


def choose_positions(rng: jax.Array, candidates: jax.Array, *, rate: float,
                     max_predictions: int) -> tuple[jax.Array, jax.Array]:
  """Chooses ``prediction_budget`` candidates of one row uniformly at random.

  Every subset of the right size is equally likely: candidates get i.i.d.
  uniform scores and the ``budget`` highest are taken.

  Args:
    rng: key for this row.
    candidates: bool [L], True where a token may be chosen.
    rate: fraction of candidates to choose (``config.mask_rate``).
    max_predictions: P (``config.max_predictions_per_seq``), <= L.

  Returns:
    positions int32 [P] ascending (unused slots 0), weights float32 [P].
  """
  seq_len = candidates.shape[-1]
  check_slots(seq_len, max_predictions)
  budget = prediction_budget(
      jnp.sum(candidates, dtype=jnp.int32), seq_len, rate, max_predictions)
  scores = jnp.where(candidates, jax.random.uniform(rng, (seq_len,)), -1.0)
  _, ranked = jax.lax.top_k(scores, max_predictions)
  taken = jnp.arange(max_predictions) < budget
  chosen = jnp.zeros((seq_len,), bool).at[ranked].set(taken)
  return first_positions(chosen, max_predictions)


def choose_whole_words(rng: jax.Array, candidates: jax.Array,
                       word_starts: jax.Array, *, rate: float,
                       max_predictions: int) -> tuple[jax.Array, jax.Array]:
  """Chooses whole words of one row; all sub-tokens of a word share its fate.

  The rule: a word is a run of tokens from one ``word_starts`` True to the
  next; its size is its number of candidate tokens (words of special tokens
  have size 0 and are never taken). The token budget is
  ``prediction_budget(number of candidate tokens)``, as in token masking.
  Words are visited in a uniformly random order and taken while the running
  token count stays within the budget; the first word that would overflow
  ends the choice. So the chosen count is at most the budget and at least
  ``budget - (size of that word) + 1`` -- slightly fewer tokens than token
  masking on average, in exchange for a fully parallel rule (BERT's script
  instead skips an overflowing word and keeps looking, which is sequential).

  Args:
    rng: key for this row.
    candidates: bool [L], True where a token may be chosen.
    word_starts: bool [L], True at the first sub-token of each word.
    rate: fraction of candidate tokens to choose.
    max_predictions: P, <= L.

  Returns:
    positions int32 [P] ascending (unused slots 0), weights float32 [P].
  """
  seq_len = candidates.shape[-1]
  check_slots(seq_len, max_predictions)
  budget = prediction_budget(
      jnp.sum(candidates, dtype=jnp.int32), seq_len, rate, max_predictions)
  # Word index of every token; tokens before the first start join word 0.
  word = jnp.maximum(jnp.cumsum(word_starts.astype(jnp.int32)) - 1, 0)
  size = jax.ops.segment_sum(
      candidates.astype(jnp.int32), word, num_segments=seq_len)
  scores = jnp.where(size > 0, jax.random.uniform(rng, (seq_len,)), -1.0)
  order = jnp.argsort(-scores)
  running = jnp.cumsum(size[order])
  take_in_order = (running <= budget) & (size[order] > 0)
  take_word = jnp.zeros((seq_len,), bool).at[order].set(take_in_order)
  return first_positions(candidates & take_word[word], max_predictions)


def replace_tokens(rng: jax.Array, tokens: jax.Array, positions: jax.Array,
                   weights: jax.Array, *, vocab_size: int,
                   mask_token_rate: float,
                   random_token_rate: float) -> jax.Array:
  """BERT's 80/10/10 replacement at the chosen positions of one row.

  Each used slot independently becomes [MASK] with probability
  ``mask_token_rate``, a uniformly random non-special id (in
  ``[NUM_SPECIAL_TOKENS, vocab_size)``) with probability ``random_token_rate``,
  and keeps its token otherwise.

  Args:
    rng: key for this row.
    tokens: int32 [L].
    positions: int32 [P], weights float32 [P] from a chooser.
    vocab_size: V.
    mask_token_rate, random_token_rate: the two replacement probabilities.

  Returns:
    int32 [L], the corrupted row.
  """
  num_slots = positions.shape[-1]
  # One draw of random bits serves both decisions (fewer threefry calls to
  # compile than split + uniform + randint): 24 bits give the uniform, the
  # modulo of 32 bits the random id (bias < V / 2**32, negligible).
  bits = jax.random.bits(rng, (2, num_slots), jnp.uint32)
  u = (bits[0] >> 8).astype(jnp.float32) / float(1 << 24)
  random_ids = batch_lib.NUM_SPECIAL_TOKENS + (
      bits[1] % jnp.uint32(vocab_size - batch_lib.NUM_SPECIAL_TOKENS)
  ).astype(jnp.int32)
  return write_slots(tokens, positions, weights, u, random_ids,
                      mask_token_rate=mask_token_rate,
                      random_token_rate=random_token_rate)


def write_slots(tokens: jax.Array, positions: jax.Array, weights: jax.Array,
                 u: jax.Array, random_ids: jax.Array, *, mask_token_rate: float,
                 random_token_rate: float) -> jax.Array:
  """Writes [MASK] (u < mask rate), the random id (next random rate) or the
  original token at every used slot; u, random_ids are [P]."""
  seq_len = tokens.shape[-1]
  original = tokens[positions]
  new = jnp.where(
      u < mask_token_rate, batch_lib.MASK_ID,
      jnp.where(u < mask_token_rate + random_token_rate, random_ids, original))
  # Unused slots point at 0; send them out of range so they cannot race a
  # real write to position 0.
  target = jnp.where(weights > 0, positions, seq_len)
  return tokens.at[target].set(new.astype(tokens.dtype), mode="drop")


def ngram_length_probs(max_n: int) -> np.ndarray:
  """ALBERT's n-gram length law: ``P(n) = (1/n) / sum_k (1/k)``, n = 1..max_n.

  Returns:
    float64 [max_n]; entry n - 1 is P(n).
  """
  if max_n < 1:
    raise ValueError(f"max_ngram={max_n} must be at least 1; fix --config.max_ngram.")
  weights = 1.0 / np.arange(1, max_n + 1)
  return weights / weights.sum()


def tile_units(rng: jax.Array, unit_candidates: jax.Array,
               length_probs: np.ndarray) -> jax.Array:
  """Cuts every run of consecutive candidate units of one row into spans.

  One sequence of span lengths ``n_1, n_2, ...`` is drawn i.i.d. from
  ``length_probs`` per row, and every maximal run of candidate units is tiled
  from its start with it (so runs of one row share the sequence). The spans
  never cross a non-candidate unit (special token, padding); the last span of
  a run is cut at the run's end, so only it can be shorter than its draw.
  Fully parallel: a cumulative sum and a ``searchsorted``, no scan.

  Args:
    rng: key for this row.
    unit_candidates: bool [U], True for units (tokens or words) that may be
      chosen.
    length_probs: float [K], entry n - 1 = probability of a span of n units
      (e.g. ``ngram_length_probs``); static.

  Returns:
    int32 [U]: index of the first unit of the span each unit belongs to, U for
    non-candidate units.
  """
  num_units = unit_candidates.shape[-1]
  # Inverse-CDF draw: one uniform and a searchsorted per span, which compiles
  # in a fraction of the time of categorical's Gumbel trick on CPU.
  cdf = np.cumsum(np.asarray(length_probs, np.float64))
  cdf = jnp.asarray(cdf[:-1] / cdf[-1], jnp.float32)
  lengths = 1 + jnp.searchsorted(
      cdf, jax.random.uniform(rng, (num_units,)), side="right").astype(jnp.int32)
  ends = jnp.cumsum(lengths)  # span j covers run offsets [ends[j-1], ends[j])
  index = jnp.arange(num_units, dtype=jnp.int32)
  run_start = jax.lax.cummax(jnp.where(unit_candidates, -1, index)) + 1
  offset = index - run_start
  span = jnp.searchsorted(ends, offset, side="right")
  span_offset = jnp.where(span > 0, ends[jnp.maximum(span - 1, 0)], 0)
  return jnp.where(unit_candidates, run_start + span_offset,
                   num_units).astype(jnp.int32)


def choose_tiles(rng: jax.Array, candidates: jax.Array, tile: jax.Array, *,
                 rate: float, max_predictions: int) -> tuple[jax.Array, jax.Array]:
  """Chooses whole tiles of one row: the tokens of a tile share its fate.

  The token budget is ``prediction_budget(number of candidate tokens)``, as in
  token masking. Tiles (groups with at least one candidate token) are put in
  a uniformly random order and taken greedily in that order, a tile that
  would overflow the budget being skipped -- the rule of BERT's and ALBERT's
  data scripts -- except that the greedy scan is done as ``_FILL_PASSES``
  parallel passes: each pass takes the longest prefix (in that order) of the
  not-yet-taken tiles that still fit individually. The chosen count is at
  most the budget; it falls short only when more than ``_FILL_PASSES``
  overflowing tiles are met, which multi-token tiles make rare enough that
  the rate stays within a percent of BERT's (``choose_whole_words`` stops at
  the first overflow instead).

  Args:
    rng: key for this row.
    candidates: bool [L], True where a token may be chosen.
    tile: int32 [L], group id in [0, L] of every token; L = in no tile.
    rate: fraction of candidate tokens to choose.
    max_predictions: P, <= L.

  Returns:
    positions int32 [P] ascending (unused slots 0), weights float32 [P].
  """
  seq_len = candidates.shape[-1]
  check_slots(seq_len, max_predictions)
  budget = prediction_budget(
      jnp.sum(candidates, dtype=jnp.int32), seq_len, rate, max_predictions)
  size = jax.ops.segment_sum(candidates.astype(jnp.int32), tile,
                             num_segments=seq_len + 1)[:seq_len]
  scores = jnp.where(size > 0, jax.random.uniform(rng, (seq_len,)), -1.0)
  order = jnp.argsort(-scores)
  size_in_order = size[order]
  taken = jnp.zeros((seq_len,), bool)
  remaining = budget
  for _ in range(_FILL_PASSES):
    fits = (size_in_order > 0) & ~taken & (size_in_order <= remaining)
    running = jnp.cumsum(jnp.where(fits, size_in_order, 0))
    new = fits & (running <= remaining)
    taken = taken | new
    remaining = remaining - jnp.sum(jnp.where(new, size_in_order, 0))
  take = jnp.zeros((seq_len + 1,), bool).at[order].set(taken)
  return first_positions(candidates & take[tile], max_predictions)


def choose_spans(rng: jax.Array, candidates: jax.Array, word_starts: jax.Array,
                 *, rate: float, max_predictions: int,
                 length_probs: np.ndarray,
                 whole_word: bool) -> tuple[jax.Array, jax.Array]:
  """Chooses spans of consecutive units (tokens or whole words) of one row.

  Units are tokens, or words when ``whole_word`` (a word as in
  ``choose_whole_words``); a unit is a candidate when it holds a candidate
  token. ``tile_units`` cuts the candidate runs into spans with lengths drawn
  from ``length_probs`` and ``choose_tiles`` takes whole spans within the
  budget. With ``ngram_length_probs(3)`` this is ALBERT's n-gram masking; a
  span never crosses a special token, so never crosses segments or packed
  documents.

  Args:
    rng: key for this row.
    candidates: bool [L], True where a token may be chosen.
    word_starts: bool [L], True at the first sub-token of each word.
    rate: fraction of candidate tokens to choose.
    max_predictions: P, <= L.
    length_probs: float [K], probability of a span of n units at n - 1.
    whole_word: spans count words instead of tokens.

  Returns:
    positions int32 [P] ascending (unused slots 0), weights float32 [P].
  """
  tile_key, choose_key = jax.random.split(rng)
  tile = span_tiles(tile_key, candidates, word_starts,
                    length_probs=length_probs, whole_word=whole_word)
  return choose_tiles(choose_key, candidates, tile, rate=rate,
                      max_predictions=max_predictions)


def word_units(word_starts: jax.Array, whole_word: bool) -> jax.Array:
  """int32 [L]: the unit (word or token) index of every token of one row."""
  if whole_word:
    # Tokens before the first word start join word 0.
    return jnp.maximum(jnp.cumsum(word_starts.astype(jnp.int32)) - 1, 0)
  return jnp.arange(word_starts.shape[-1], dtype=jnp.int32)


def span_tiles(rng: jax.Array, candidates: jax.Array, word_starts: jax.Array,
               *, length_probs: np.ndarray, whole_word: bool) -> jax.Array:
  """The spans ``choose_spans`` chooses among, as a tile id per token.

  Args:
    rng: key for the tiling (``choose_spans`` passes its first split).
    candidates: bool [L]; word_starts: bool [L]; length_probs, whole_word: as
      in ``choose_spans``.

  Returns:
    int32 [L]: the span's id (a unit index) for every token of a candidate
    unit, L elsewhere.
  """
  seq_len = candidates.shape[-1]
  unit = word_units(word_starts, whole_word)
  unit_size = jax.ops.segment_sum(candidates.astype(jnp.int32), unit,
                                  num_segments=seq_len)
  unit_tile = tile_units(rng, unit_size > 0, length_probs)
  return unit_tile[unit]
