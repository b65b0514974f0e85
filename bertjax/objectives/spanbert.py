"""SpanBERT pretraining objective: span masking + span boundary objective.

``corrupt`` chooses spans of whole words in every row (Joshi et al., 2020):
span lengths follow a geometric law (``config.span_geometric_p``, 0.2)
clipped at ``config.max_span_length`` (10) words, and spans are added until
``config.mask_rate`` (15%) of the candidate tokens are chosen
(``spans.choose_span_slots``). 80/10/10 applies per span
(``spans.replace_spans``). For every chosen token at position i of a span
``[s, e]`` the model also gets the two boundary positions just outside the
span, ``s - 1`` and ``e + 1``, and the offset ``i - s``, from which its SBO
head predicts the token (bertjax/models/spanbert.py).

How the spans are drawn differs from the paper's loop (draw a length, draw a
uniform start, repeat until the budget is met), which is sequential: here
every run of candidate words is cut into consecutive spans with lengths drawn
from the law (``masking.span_tiles``), and spans are taken in a random order
until the budget, the one that would overflow being cut to the words that
still fit (``spans.choose_tile_prefix``; the paper's code also stops
inside its last span). So spans keep their drawn lengths except that cut one and the
last span of a run of words, cut at the run's end; at 512 tokens (about 15
spans a row) the mean chosen length is about 3.6 words against the law's
3.8, at the demo's 128 tokens (about 4 spans) about 3.2. Spans never cross a
special token ([CLS], [SEP], padding), so never cross documents.

Boundaries may be special tokens ([CLS] before a span at the start of a row,
[SEP] after one at the end), or a token of a neighbouring chosen span; they
never fall outside the row.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bertjax.objectives import masking
from bertjax.objectives import spans
from bertjax.objectives import mlm


def span_boundaries(positions: jax.Array, weights: jax.Array,
                    span_starts: jax.Array, span_ends: jax.Array, *,
                    seq_len: int, max_offset: int
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """SBO inputs of every prediction slot.

  Args:
    positions, weights, span_starts, span_ends: [..., P] from
      ``spans.choose_span_slots``.
    seq_len: L; boundaries are clipped into ``[0, L - 1]`` (only a span
      touching the row's edge, impossible when the row starts with [CLS] and
      ends with [SEP] or padding, would need it).
    max_offset: offsets above it share its embedding
      (``config.sbo_max_offset``).

  Returns:
    left, right, offsets int32 [..., P]: ``s - 1``, ``e + 1`` and
    ``min(i - s, max_offset)``; 0 in unused slots.
  """
  used = weights > 0
  left = jnp.clip(span_starts - 1, 0, seq_len - 1)
  right = jnp.clip(span_ends + 1, 0, seq_len - 1)
  offsets = jnp.clip(positions - span_starts, 0, max_offset)
  zero = jnp.zeros_like(positions)
  return (jnp.where(used, left, zero).astype(jnp.int32),
          jnp.where(used, right, zero).astype(jnp.int32),
          jnp.where(used, offsets, zero).astype(jnp.int32))


class SpanBertObjective:
  """Span-masked LM + SBO over single-segment batches (see base.Objective).

  Model inputs add sbo_left, sbo_right, sbo_offsets int32 [B, P] to the
  usual ones; the MLM and SBO heads predict the same slots, so the targets
  are the MLM ones. Metrics: mlm_loss, mlm_accuracy, sbo_loss, sbo_accuracy
  and loss = mean MLM loss + mean SBO loss.
  """
  models = ("spanbert",)  # reads sbo_logits
  needs_sentence_head = False

  def __init__(self, config: Any):
    self.mlm = mlm.MlmSettings.from_config(config)
    self.masking, self.dupe_factor = mlm.masking_schedule(config)
    self.length_probs = spans.geometric_length_probs(
        float(config.span_geometric_p), int(config.max_span_length))
    self.max_offset = int(config.sbo_max_offset)
    # Offset 0 only would give every slot of a span the same SBO input, and
    # a row of seq_len tokens holds offsets up to seq_len - 1: larger values
    # add embedding rows no example reads.
    longest = int(config.seq_len) - 1
    if not 1 <= self.max_offset <= longest:
      raise ValueError(
          f"config.sbo_max_offset={self.max_offset} is invalid: it must be "
          f"between 1 and seq_len - 1 ({longest}), the largest offset in a "
          f"span of a {config.seq_len}-token row; set --config.sbo_max_offset="
          f"{min(31, longest)} (SpanBERT's 31, or less for shorter rows).")

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model inputs, targets); see base.Objective.

    Model inputs: tokens, segment_ids, positions, doc_ids int32 [B, L];
    masked_positions, sbo_left, sbo_right, sbo_offsets int32 [B, P].
    Targets: mlm_targets int32 [B, P], mlm_weights float32 [B, P],
    example_mask bool [B].
    """
    keys = masking.example_keys(
        rng, batch["example_id"], batch["epoch"], step, masking=self.masking,
        dupe_factor=self.dupe_factor)
    candidates = ~batch["special"] & batch["example_mask"][:, None]
    settings = self.mlm

    def one_row(key, tokens, row_candidates, word_starts):
      choose_key, replace_key = jax.random.split(key)
      positions, weights, starts, ends = spans.choose_span_slots(
          choose_key, row_candidates, word_starts, rate=settings.mask_rate,
          max_predictions=settings.max_predictions,
          length_probs=self.length_probs, whole_word=settings.whole_word)
      corrupted = spans.replace_spans(
          replace_key, tokens, positions, weights, starts,
          vocab_size=settings.vocab_size,
          mask_token_rate=settings.mask_token_rate,
          random_token_rate=settings.random_token_rate)
      targets = jnp.where(weights > 0, tokens[positions], 0)
      return (corrupted, positions, weights, starts, ends,
              targets.astype(jnp.int32))

    corrupted, positions, weights, starts, ends, targets = jax.vmap(one_row)(
        keys, batch["tokens"], candidates, batch["word_starts"])
    left, right, offsets = span_boundaries(
        positions, weights, starts, ends, seq_len=batch["tokens"].shape[1],
        max_offset=self.max_offset)
    inputs = {
        "tokens": corrupted,
        "segment_ids": batch["segment_ids"],
        "positions": batch["positions"],
        "doc_ids": batch["doc_ids"],
        "masked_positions": positions,
        "sbo_left": left,
        "sbo_right": right,
        "sbo_offsets": offsets,
    }
    targets = {
        "mlm_targets": targets,
        "mlm_weights": weights,
        "example_mask": batch["example_mask"],
    }
    return inputs, targets

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """MLM loss + SBO loss, each a mean over the used slots."""
    mlm_value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    sbo_value, sbo_metrics = mlm.mlm_loss(
        outputs["sbo_logits"], targets["mlm_targets"], targets["mlm_weights"])
    metrics["sbo_loss"] = sbo_metrics["mlm_loss"]
    metrics["sbo_accuracy"] = sbo_metrics["mlm_accuracy"]
    value = mlm_value + sbo_value
    metrics["loss"] = (value, jnp.ones((), jnp.float32))
    return value, metrics
