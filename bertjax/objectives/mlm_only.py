"""Masked LM alone (RoBERTa): no sentence-level task, single-segment rows.

``corrupt`` masks every row with the shared MLM machinery (``mlm.mask_batch``:
token, whole-word or n-gram choice, 80/10/10 replacement). RoBERTa's dynamic
masking is ``config.masking='dynamic'``: a new mask every step from
``fold_in(rng, step)``; ``'static'`` works too.

Rows of the single-segment layouts may pack several documents, each with its
own ``doc_ids`` value and restarted positions, so attention stays inside a
document. With ``config.attend_across_documents`` the objective reads a row
as one text instead, as RoBERTa's FULL-SENTENCES does: every real token gets
doc id 1 and positions count 0..L-1 through the row. Masking is unaffected:
the [SEP] between documents is special and never chosen.

Segment ids pass through from the Batch, except for a model with a single
segment: ``config.single_segment`` (an imported RoBERTa, whose tokenizer and
pretraining give every token segment id 0 even where its checkpoint has a
second, unused segment row) or ``type_vocab_size`` 1 (which has no row for
segment 1). Its rows read segment 0 everywhere, also in a pair layout, where
the packer gives sentence B segment 1.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import segments


class MlmOnlyObjective:
  """Masked LM over any layout, no sentence head (see base.Objective)."""
  # The models returning mlm_logits from the usual inputs (SpanBERT's SBO
  # head then goes untrained).
  models = ("bert", "albert", "deberta", "spanbert")
  needs_sentence_head = False

  def __init__(self, config: Any):
    self.mlm = mlm.MlmSettings.from_config(config)
    self.masking, self.dupe_factor = mlm.masking_schedule(config)
    self.attend_across_documents = bool(
        config.get("attend_across_documents", False))
    self.single_segment = segments.single_segment(config)

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model inputs, targets); see base.Objective.

    Model inputs: tokens, segment_ids, positions, doc_ids int32 [B, L] and
    masked_positions int32 [B, P]. Targets: mlm_targets int32 [B, P],
    mlm_weights float32 [B, P] and example_mask bool [B].
    """
    keys = masking.example_keys(
        rng, batch["example_id"], batch["epoch"], step, masking=self.masking,
        dupe_factor=self.dupe_factor)
    masked = mlm.mask_batch(keys, batch["tokens"], batch["special"],
                            batch["word_starts"], batch["example_mask"],
                            self.mlm)
    doc_ids, positions = batch["doc_ids"], batch["positions"]
    segment_ids = segments.model_segment_ids(batch["segment_ids"],
                                             self.single_segment)
    if self.attend_across_documents:
      doc_ids = (doc_ids > 0).astype(jnp.int32)
      positions = jnp.broadcast_to(
          jnp.arange(positions.shape[1], dtype=jnp.int32), positions.shape)
    inputs = {
        "tokens": masked["tokens"],
        "segment_ids": segment_ids,
        "positions": positions,
        "doc_ids": doc_ids,
        "masked_positions": masked["masked_positions"],
    }
    targets = {
        "mlm_targets": masked["mlm_targets"],
        "mlm_weights": masked["mlm_weights"],
        "example_mask": batch["example_mask"],
    }
    return inputs, targets

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """Mean MLM loss; metrics mlm_loss, mlm_accuracy and 'loss' as (loss, 1)."""
    value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    metrics["loss"] = (value, jnp.ones((), jnp.float32))
    return value, metrics
