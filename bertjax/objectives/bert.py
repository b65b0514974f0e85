"""BERT pretraining objective: masked LM (80/10/10) + next-sentence prediction.

``corrupt`` first makes the NSP negatives (rows whose B is borrowed from
another document), then masks the rebuilt rows, so predictions land on the
tokens the model actually sees. Randomness: the root key is split once into
an example root and a partner root, so the two streams are independent.
  per example  ``masking.example_keys(example root, ...)`` (static or dynamic,
               ``config.masking``), split into a mask key and an NSP-decision
               key: an example's mask and its negative/positive decision
               repeat exactly when its key does.
  per step     the NSP partner choice, from ``fold_in(partner root, step)``.
With static masking a negative's mask can still change between steps, since
the borrowed B (hence the candidates) depends on the batch it meets.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import nsp


class BertObjective:
  """Masked LM + NSP over sentence-pair batches (see base.Objective)."""

  def __init__(self, config: Any):
    self.mlm = mlm.MlmSettings.from_config(config)
    self.masking, self.dupe_factor = mlm.masking_schedule(config)
    self.nsp_negative_rate = float(config.nsp_negative_rate)
    if not 0.0 <= self.nsp_negative_rate <= 1.0:
      raise ValueError(
          f"nsp_negative_rate={self.nsp_negative_rate} must lie in [0, 1]; "
          f"fix --config.nsp_negative_rate.")

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model inputs, targets); see base.Objective.

    Model inputs: tokens, segment_ids, positions, doc_ids int32 [B, L] and
    masked_positions int32 [B, P]. Targets: mlm_targets int32 [B, P],
    mlm_weights float32 [B, P], nsp_labels int32 [B] (1 = B is random) and
    example_mask bool [B].
    """
    example_root, partner_root = jax.random.split(rng)
    keys = masking.example_keys(
        example_root, batch["example_id"], batch["epoch"], step,
        masking=self.masking, dupe_factor=self.dupe_factor)
    streams = jax.vmap(jax.random.split)(keys)  # [B, 2]
    mask_keys, decision_keys = streams[:, 0], streams[:, 1]
    pairs, nsp_labels = nsp.make_negatives(
        decision_keys, jax.random.fold_in(partner_root, step), batch,
        self.nsp_negative_rate)
    masked = mlm.mask_batch(
        mask_keys, pairs["tokens"], pairs["special"], pairs["word_starts"],
        pairs["example_mask"], self.mlm)
    inputs = {
        "tokens": masked["tokens"],
        "segment_ids": pairs["segment_ids"],
        "positions": pairs["positions"],
        "doc_ids": pairs["doc_ids"],
        "masked_positions": masked["masked_positions"],
    }
    targets = {
        "mlm_targets": masked["mlm_targets"],
        "mlm_weights": masked["mlm_weights"],
        "nsp_labels": nsp_labels,
        "example_mask": pairs["example_mask"],
    }
    return inputs, targets

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """Mean MLM loss + mean NSP loss, and their (sum, count) metrics.

    Metrics: mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy, and 'loss' as
    (this batch's total loss, 1).
    """
    mlm_value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    nsp_value, nsp_metrics = nsp.nsp_loss(
        outputs["nsp_logits"], targets["nsp_labels"], targets["example_mask"])
    total = mlm_value + nsp_value
    metrics.update(nsp_metrics)
    metrics["loss"] = (total, jnp.ones((), jnp.float32))
    return total, metrics
