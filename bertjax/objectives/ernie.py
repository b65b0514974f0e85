"""ERNIE 1.0 knowledge masking: word-, phrase- and entity-level MLM, plus NSP.

ERNIE 1.0 (Sun et al., 2019) keeps BERT's architecture and changes what is
masked: besides single words (basic level) it masks whole phrases and whole
named entities, so that a unit must be predicted from its context rather than
from its own other words. The phrase and entity units were marked once at
prepare time (``bertjax/data/knowledge.py``) and reach the step as the unit
boundaries ``phrase_starts`` / ``entity_starts`` next to ``word_starts``
(``bertjax/batch.py``).

Per example, a level is drawn with ``config.ernie_level_rates`` (word,
phrase, entity) -- the three levels are mixed within every batch rather than
run as the paper's successive stages, which a single config cannot schedule
without a branch in the loop. The row is then masked with that level's units:

  word    units are words: whole-word masking.
  phrase  units are phrases and the words outside phrases; phrases (units of
          two or more words) are taken first, in random order, then single
          words fill what is left of the budget.
  entity  the same with entities.

Every level spends the same token budget as BERT
(``masking.prediction_budget``: 15% of the candidate tokens, at most P), a
unit that would overflow it being skipped, and applies BERT's 80/10/10
replacement per token (``masking.replace_tokens``).

ERNIE 1.0 trained MLM with a dialogue task (DLM) that is NSP-shaped on
non-dialogue text; here the sentence task is BERT's NSP on sentence pairs
(``sentence_pair.SentencePairObjective``), and the model is BERT's.
Metrics add ``mlm_accuracy_<level>``: accuracy on the rows of each level.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.objectives import bert
from bertjax.objectives import masking
from bertjax.objectives import mlm

LEVELS = ("word", "phrase", "entity")
# Boundary field of each level (bertjax/batch.py).
LEVEL_STARTS = ("word_starts", "phrase_starts", "entity_starts")
# Greedy passes of ``choose_units``; each one skips the units that overflow.
_FILL_PASSES = 4


def parse_level_rates(text: str) -> np.ndarray:
  """'0.4,0.3,0.3' -> float64 [3] probabilities of word, phrase, entity."""
  try:
    rates = np.array([float(x) for x in str(text).split(",")], np.float64)
  except ValueError:
    rates = np.zeros(0)
  # "not (in range)": NaN compares False and must fail.
  if rates.shape != (3,) or not ((rates >= 0).all()
                                 and abs(rates.sum() - 1.0) <= 1e-6):
    raise ValueError(
        f"ernie_level_rates={text!r} must be three non-negative rates of the "
        f"word, phrase and entity levels summing to 1; set e.g. "
        f"--config.ernie_level_rates=0.4,0.3,0.3.")
  return rates


def choose_units(rng: jax.Array, candidates: jax.Array, unit_starts: jax.Array,
                 word_starts: jax.Array, *, rate: float,
                 max_predictions: int) -> tuple[jax.Array, jax.Array]:
  """Chooses whole units of one row, units of several words first.

  A unit is a run of tokens from one ``unit_starts`` True to the next; its
  size is its number of candidate tokens and it is a "long" unit when it
  holds two or more candidate words. Units get uniform random scores, long
  units ranked before all others, and are taken greedily in that order
  within ``prediction_budget`` tokens, a unit that would overflow being
  skipped (done as ``_FILL_PASSES`` parallel passes, each taking the longest
  fitting prefix of what is left, as ``masking.choose_tiles`` does). With
  ``unit_starts = word_starts`` no unit is long: plain whole-word masking.

  Args:
    rng: key for this row.
    candidates: bool [L], True where a token may be chosen.
    unit_starts: bool [L], True at the first token of each unit.
    word_starts: bool [L], True at the first token of each word.
    rate: fraction of candidate tokens to choose.
    max_predictions: P, <= L.

  Returns:
    positions int32 [P] ascending (unused slots 0), weights float32 [P].
  """
  seq_len = candidates.shape[-1]
  budget = masking.prediction_budget(
      jnp.sum(candidates, dtype=jnp.int32), seq_len, rate, max_predictions)
  unit = jnp.maximum(jnp.cumsum(unit_starts.astype(jnp.int32)) - 1, 0)
  size = jax.ops.segment_sum(candidates.astype(jnp.int32), unit,
                             num_segments=seq_len)
  words = jax.ops.segment_sum((candidates & word_starts).astype(jnp.int32),
                              unit, num_segments=seq_len)
  scores = jax.random.uniform(rng, (seq_len,)) + (words >= 2)
  order = jnp.argsort(-jnp.where(size > 0, scores, -1.0))
  size_in_order = size[order]
  taken = jnp.zeros((seq_len,), bool)
  remaining = budget
  for _ in range(_FILL_PASSES):
    fits = (size_in_order > 0) & ~taken & (size_in_order <= remaining)
    running = jnp.cumsum(jnp.where(fits, size_in_order, 0))
    new = fits & (running <= remaining)
    taken = taken | new
    remaining = remaining - jnp.sum(jnp.where(new, size_in_order, 0))
  take = jnp.zeros((seq_len,), bool).at[order].set(taken)
  return masking.first_positions(candidates & take[unit], max_predictions)


def mask_knowledge(keys: jax.Array, batch: Mapping[str, jax.Array],
                   settings: mlm.MlmSettings,
                   level_rates: np.ndarray) -> dict[str, jax.Array]:
  """Draws a level per row and masks whole units of that level.

  Args:
    keys: [B] one key per example.
    batch: tokens int32 [B, L]; special, word_starts, phrase_starts,
      entity_starts bool [B, L]; example_mask bool [B].
    settings: MlmSettings (rate, P, 80/10/10 rates, vocab size).
    level_rates: float [3] probabilities of word, phrase, entity; static.

  Returns:
    what ``mlm.mask_batch`` returns (tokens, masked_positions, mlm_targets,
    mlm_weights) plus ernie_level int32 [B] (index into LEVELS).
  """
  candidates = ~batch["special"] & batch["example_mask"][:, None]
  starts = jnp.stack([batch[name] for name in LEVEL_STARTS], axis=1)  # [B,3,L]
  logits = jnp.log(jnp.asarray(level_rates, jnp.float32))

  def one_row(key, row_tokens, row_candidates, row_starts):
    level_key, choose_key, replace_key = jax.random.split(key, 3)
    level = jax.random.categorical(level_key, logits)
    positions, weights = choose_units(
        choose_key, row_candidates, row_starts[level], row_starts[0],
        rate=settings.mask_rate, max_predictions=settings.max_predictions)
    corrupted = masking.replace_tokens(
        replace_key, row_tokens, positions, weights,
        vocab_size=settings.vocab_size,
        mask_token_rate=settings.mask_token_rate,
        random_token_rate=settings.random_token_rate)
    targets = jnp.where(weights > 0, row_tokens[positions], 0)
    return (corrupted, positions, targets.astype(jnp.int32), weights,
            level.astype(jnp.int32))

  corrupted, positions, targets, weights, level = jax.vmap(one_row)(
      keys, batch["tokens"], candidates, starts)
  return {
      "tokens": corrupted,
      "masked_positions": positions,
      "mlm_targets": targets,
      "mlm_weights": weights,
      "ernie_level": level,
  }


class ErnieObjective(bert.BertObjective):
  """Knowledge-masked LM + NSP over sentence-pair batches (base.Objective).

  Targets add ``ernie_level`` int32 [B]; metrics add mlm_accuracy_word,
  mlm_accuracy_phrase and mlm_accuracy_entity.
  """

  def __init__(self, config: Any):
    super().__init__(config)
    self.level_rates = parse_level_rates(config.ernie_level_rates)
    if not config.get("knowledge_spans", False):
      raise ValueError(
          "The ernie objective masks phrases and entities marked at prepare "
          "time, but config.knowledge_spans is off; set "
          "--config.knowledge_spans=True.")
    if self.mlm.max_ngram > 1 or self.mlm.whole_word:
      raise ValueError(
          "The ernie objective chooses its own units (words, phrases, "
          "entities); set --config.max_ngram=1 and "
          "--config.whole_word_masking=False.")

  def mask(self, keys: jax.Array,
           pairs: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Knowledge masking of the rebuilt rows (``mask_knowledge``); the
    streams and the order (pairs first, then masks) are
    ``sentence_pair.SentencePairObjective.corrupt``'s."""
    return mask_knowledge(keys, pairs, self.mlm, self.level_rates)

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """BERT's loss and metrics plus the MLM accuracy of each level's rows."""
    total, metrics = super().loss(outputs, targets)
    correct = (jnp.argmax(outputs["mlm_logits"], axis=-1)
               == targets["mlm_targets"]).astype(jnp.float32)
    weights = targets["mlm_weights"].astype(jnp.float32)
    for k, name in enumerate(LEVELS):
      w = weights * (targets["ernie_level"] == k)[:, None]
      metrics[f"mlm_accuracy_{name}"] = (jnp.sum(correct * w), jnp.sum(w))
    return total, metrics
