"""BERT pretraining objective: masked LM (80/10/10) + next-sentence prediction.

The negatives are rows whose B is borrowed from another document of the
batch (``nsp.make_negatives``): the per-example decision comes from the
example's key, the partner from the step's key (see
``sentence_pair.SentencePairObjective`` for the streams and the order:
pairs first, then masks). With static masking a negative's mask can still
change between steps, since the borrowed B (hence the candidates) depends on
the batch it meets.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax

from bertjax.objectives import nsp
from bertjax.objectives import sentence_pair


class BertObjective(sentence_pair.SentencePairObjective):
  """Masked LM + NSP over sentence-pair batches (see base.Objective).

  Targets carry ``nsp_labels`` int32 [B] (1 = B is random); metrics add
  nsp_loss and nsp_accuracy.
  """
  task = "nsp"

  def __init__(self, config: Any):
    super().__init__(config)
    self.nsp_negative_rate = float(config.nsp_negative_rate)
    if not 0.0 <= self.nsp_negative_rate <= 1.0:
      raise ValueError(
          f"nsp_negative_rate={self.nsp_negative_rate} must lie in [0, 1]; "
          f"fix --config.nsp_negative_rate.")

  def make_pairs(self, decision_keys: jax.Array, step_key: jax.Array,
                 batch: Mapping[str, jax.Array]
                 ) -> tuple[dict[str, jax.Array], jax.Array]:
    """NSP negatives: B taken from another document's row of the batch."""
    return nsp.make_negatives(decision_keys, step_key, batch,
                              self.nsp_negative_rate)
