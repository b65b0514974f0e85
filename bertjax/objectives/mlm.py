"""Masked language modelling: in-step corruption of a batch and its loss.

``mask_batch`` chooses and replaces tokens of every row (``vmap`` over rows,
one key per example, see ``masking.example_keys``); ``mlm_loss`` scores the
model's logits at the chosen positions. Both are pure and jittable with
static shapes, and meant to be reused by every MLM-based objective.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import batch as batch_lib
from bertjax.objectives import masking

Metrics = dict[str, tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class MlmSettings:
  """The MLM fields of a config, validated.

  Attributes:
    vocab_size: V, ids in [0, V).
    mask_rate: fraction of candidate tokens chosen for prediction.
    max_predictions: P, static number of prediction slots per row.
    mask_token_rate: of the chosen, fraction replaced by [MASK].
    random_token_rate: of the chosen, fraction replaced by a random token.
    whole_word: choose whole words (``masking.choose_whole_words``).
    max_ngram: above 1, choose n-grams of n <= max_ngram units (tokens, or
      words with ``whole_word``), P(n) ∝ 1/n, as ALBERT does
      (``masking.choose_spans``); 1 = single units.
    ngram_probs: empty for the 1/n law, else P(n) for n = 1..max_ngram
      written out (UniLM: 0.8, 0.1, 0.1).
  """
  vocab_size: int
  mask_rate: float
  max_predictions: int
  mask_token_rate: float
  random_token_rate: float
  whole_word: bool
  max_ngram: int = 1
  ngram_probs: tuple[float, ...] = ()

  def span_length_probs(self) -> np.ndarray:
    """float64 [max_ngram]: P(n) at n - 1, the law ``choose_spans`` draws from."""
    if self.ngram_probs:
      return np.asarray(self.ngram_probs, np.float64)
    return masking.ngram_length_probs(self.max_ngram)

  @classmethod
  def from_config(cls, config: Any) -> "MlmSettings":
    """Reads and checks the MLM fields; raises ValueError naming the field."""
    settings = cls(
        vocab_size=int(config.vocab_size),
        mask_rate=float(config.mask_rate),
        max_predictions=int(config.max_predictions_per_seq),
        mask_token_rate=float(config.mask_token_rate),
        random_token_rate=float(config.random_token_rate),
        whole_word=bool(config.whole_word_masking),
        # Configs written before n-gram masking existed mean single units.
        max_ngram=int(config.get("max_ngram", 1)),
        ngram_probs=tuple(float(p) for p in config.get("ngram_probs", ())))
    masking.ngram_length_probs(settings.max_ngram)  # checks max_ngram >= 1
    probs = settings.ngram_probs
    # Written as "not (in range)" so that NaN, which compares False, fails.
    if probs and (len(probs) != settings.max_ngram
                  or not (min(probs) >= 0 and abs(sum(probs) - 1.0) <= 1e-6)):
      raise ValueError(
          f"ngram_probs={probs} must hold max_ngram={settings.max_ngram} "
          f"non-negative probabilities summing to 1 (P(n) for n = 1, 2, ...); "
          f"fix --config.ngram_probs or --config.max_ngram.")
    if settings.max_ngram > settings.max_predictions:
      # Such n-grams never fit a row's budget, so drawing them masks fewer
      # tokens than mask_rate asks: ALBERT's demo at max_ngram=200 had 2,016
      # held-out predictions instead of 4,206.
      raise ValueError(
          f"max_ngram={settings.max_ngram} is longer than the "
          f"max_predictions_per_seq={settings.max_predictions} tokens a row "
          f"masks at most, so the longer n-grams can never be chosen; set "
          f"--config.max_ngram to at most {settings.max_predictions} "
          f"(ALBERT's is 3).")
    if settings.vocab_size <= batch_lib.NUM_SPECIAL_TOKENS:
      raise ValueError(
          f"vocab_size={settings.vocab_size} leaves no ordinary tokens after "
          f"the {batch_lib.NUM_SPECIAL_TOKENS} special ids; raise "
          f"--config.vocab_size.")
    if not 0.0 < settings.mask_rate < 1.0:
      raise ValueError(
          f"mask_rate={settings.mask_rate} must lie strictly between 0 and 1; "
          f"fix --config.mask_rate.")
    if not 1 <= settings.max_predictions <= int(config.seq_len):
      raise ValueError(
          f"max_predictions_per_seq={settings.max_predictions} must be in "
          f"[1, seq_len={config.seq_len}]; fix "
          f"--config.max_predictions_per_seq.")
    rates = (settings.mask_token_rate, settings.random_token_rate)
    if not (min(rates) >= 0.0 and sum(rates) <= 1.0):  # NaN fails too
      raise ValueError(
          f"mask_token_rate={rates[0]} and random_token_rate={rates[1]} must "
          f"be non-negative and sum to at most 1; fix --config.mask_token_rate "
          f"or --config.random_token_rate.")
    return settings


def mask_batch(keys: jax.Array, tokens: jax.Array, special: jax.Array,
               word_starts: jax.Array, example_mask: jax.Array,
               settings: MlmSettings) -> dict[str, jax.Array]:
  """Chooses and corrupts MLM positions in every row.

  Candidates are the non-special tokens of real examples (``example_mask``
  True); padding examples get no predictions.

  Args:
    keys: [B] one key per example (``masking.example_keys``).
    tokens: int32 [B, L].
    special: bool [B, L], True where a token must never be chosen.
    word_starts: bool [B, L], used when ``settings.whole_word``.
    example_mask: bool [B].
    settings: MlmSettings.

  Returns:
    dict with tokens int32 [B, L] (corrupted), masked_positions int32 [B, P],
    mlm_targets int32 [B, P] (original ids, 0 in unused slots) and
    mlm_weights float32 [B, P] (1 for used slots).
  """
  candidates = ~special & example_mask[:, None]

  def one_row(key, row_tokens, row_candidates, row_starts):
    choose_key, replace_key = jax.random.split(key)
    if settings.max_ngram > 1:
      positions, weights = masking.choose_spans(
          choose_key, row_candidates, row_starts, rate=settings.mask_rate,
          max_predictions=settings.max_predictions,
          length_probs=settings.span_length_probs(),
          whole_word=settings.whole_word)
    elif settings.whole_word:
      positions, weights = masking.choose_whole_words(
          choose_key, row_candidates, row_starts, rate=settings.mask_rate,
          max_predictions=settings.max_predictions)
    else:
      positions, weights = masking.choose_positions(
          choose_key, row_candidates, rate=settings.mask_rate,
          max_predictions=settings.max_predictions)
    corrupted = masking.replace_tokens(
        replace_key, row_tokens, positions, weights,
        vocab_size=settings.vocab_size,
        mask_token_rate=settings.mask_token_rate,
        random_token_rate=settings.random_token_rate)
    targets = jnp.where(weights > 0, row_tokens[positions], 0)
    return corrupted, positions, targets.astype(jnp.int32), weights

  corrupted, positions, targets, weights = jax.vmap(one_row)(
      keys, tokens, candidates, word_starts)
  return {
      "tokens": corrupted,
      "masked_positions": positions,
      "mlm_targets": targets,
      "mlm_weights": weights,
  }


def slot_scores(mlm_logits: jax.Array,
                mlm_targets: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per prediction slot: (cross-entropy, 1.0 where the target has the
  largest logit), float32 [B, P] each, whatever the slot's weight."""
  # Written out rather than log_softmax + take_along_axis + argmax: the
  # gather's gradient would scatter into a zero-filled [B, P, V] array and
  # argmax is a second pass over the vocabulary; here every [B, P, V] term is
  # elementwise or a reduction XLA fuses, which is most of the head's cost.
  logits = mlm_logits.astype(jnp.float32)
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
  log_total = jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1)) + top
  is_target = jnp.arange(logits.shape[-1]) == mlm_targets[..., None]
  target_logit = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)
  # Correct when the target has the largest logit (a tie counts as correct;
  # float logits of a trained or randomly initialised head do not tie).
  return log_total - target_logit, (target_logit >= top).astype(jnp.float32)


def mlm_loss(mlm_logits: jax.Array, mlm_targets: jax.Array,
             mlm_weights: jax.Array) -> tuple[jax.Array, Metrics]:
  """Weighted mean cross-entropy over the used prediction slots.

  Args:
    mlm_logits: float [B, P, V] (any float dtype; scored in float32).
    mlm_targets: int32 [B, P].
    mlm_weights: float32 [B, P].

  Returns:
    (scalar float32 loss, {'mlm_loss': (sum, count), 'mlm_accuracy':
    (sum, count)}), count being the number of used slots.
  """
  nll, correct = slot_scores(mlm_logits, mlm_targets)
  weights = mlm_weights.astype(jnp.float32)
  count = jnp.sum(weights)
  loss_sum = jnp.sum(nll * weights)
  metrics = {
      "mlm_loss": (loss_sum, count),
      "mlm_accuracy": (jnp.sum(correct * weights), count),
  }
  return loss_sum / jnp.maximum(count, 1.0), metrics



def masking_schedule(config: Any) -> tuple[str, int]:
  """(config.masking, config.dupe_factor), checked: 'static' or 'dynamic' masks
  (bertjax/objectives/masking.py ``example_keys``) and at least one static
  mask per example."""
  mode = str(config.masking)
  masking.check_masking_mode(mode)
  dupe_factor = int(config.dupe_factor)
  if dupe_factor < 1:
    raise ValueError(f"dupe_factor={dupe_factor} must be at least 1; fix "
                     "--config.dupe_factor.")
  return mode, dupe_factor
