"""ALBERT pretraining objective: masked LM (n-grams) + sentence-order prediction.

``corrupt`` first swaps a random half of the pairs (``sop.make_swaps``), then
masks the rebuilt rows, so predictions land on the tokens the model sees.
Every random decision comes from the example's key
(``masking.example_keys``, static or dynamic per ``config.masking``), split
into a mask key and a swap-decision key. The n-gram choice is the MLM option
``config.max_ngram`` (3 in ALBERT), shared with every MLM objective.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import sop


class AlbertObjective:
  """Masked LM + SOP over sentence-pair batches (see base.Objective)."""

  def __init__(self, config: Any):
    self.mlm = mlm.MlmSettings.from_config(config)
    self.masking, self.dupe_factor = mlm.masking_schedule(config)
    self.swap_rate = float(config.sop_swap_rate)
    if not 0.0 <= self.swap_rate <= 1.0:
      raise ValueError(
          f"sop_swap_rate={self.swap_rate} must lie in [0, 1]; fix "
          f"--config.sop_swap_rate.")
    if config.layout != "sentence_pairs":
      raise ValueError(
          f"Sentence-order prediction needs sentence pairs but config.layout "
          f"is {config.layout!r}; set --config.layout=sentence_pairs.")

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model inputs, targets); see base.Objective.

    Model inputs: tokens, segment_ids, positions, doc_ids int32 [B, L] and
    masked_positions int32 [B, P]. Targets: mlm_targets int32 [B, P],
    mlm_weights float32 [B, P], sop_labels int32 [B] (1 = swapped) and
    example_mask bool [B].
    """
    keys = masking.example_keys(
        rng, batch["example_id"], batch["epoch"], step, masking=self.masking,
        dupe_factor=self.dupe_factor)
    streams = jax.vmap(jax.random.split)(keys)  # [B, 2]
    pairs, sop_labels = sop.make_swaps(streams[:, 1], batch, self.swap_rate)
    masked = mlm.mask_batch(
        streams[:, 0], pairs["tokens"], pairs["special"], pairs["word_starts"],
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
        "sop_labels": sop_labels,
        "example_mask": pairs["example_mask"],
    }
    return inputs, targets

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """Mean MLM loss + mean SOP loss, and their (sum, count) metrics.

    Metrics: mlm_loss, mlm_accuracy, sop_loss, sop_accuracy, and 'loss' as
    (this batch's total loss, 1).
    """
    mlm_value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    sop_value, sop_metrics = sop.sop_loss(
        outputs["nsp_logits"], targets["sop_labels"], targets["example_mask"])
    total = mlm_value + sop_value
    metrics.update(sop_metrics)
    metrics["loss"] = (total, jnp.ones((), jnp.float32))
    return total, metrics
