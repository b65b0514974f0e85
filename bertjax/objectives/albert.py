"""ALBERT pretraining objective: masked LM (n-grams) + sentence-order prediction.

The negatives are the same two segments swapped (``sop.make_swaps``),
decided by the example's key (static or dynamic per ``config.masking``);
pairs are rebuilt first and masked after (``sentence_pair``). The n-gram
choice is the MLM option ``config.max_ngram`` (3 in ALBERT), shared with
every MLM objective.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax

from bertjax.objectives import sentence_pair
from bertjax.objectives import sop


class AlbertObjective(sentence_pair.SentencePairObjective):
  """Masked LM + SOP over sentence-pair batches (see base.Objective).

  Targets carry ``sop_labels`` int32 [B] (1 = swapped); metrics add sop_loss
  and sop_accuracy.
  """
  task = "sop"

  def __init__(self, config: Any):
    super().__init__(config)
    self.swap_rate = float(config.sop_swap_rate)
    if not 0.0 <= self.swap_rate <= 1.0:
      raise ValueError(
          f"sop_swap_rate={self.swap_rate} must lie in [0, 1]; fix "
          f"--config.sop_swap_rate.")

  def make_pairs(self, decision_keys: jax.Array, step_key: jax.Array,
                 batch: Mapping[str, jax.Array]
                 ) -> tuple[dict[str, jax.Array], jax.Array]:
    """SOP negatives: A and B of the row itself, swapped."""
    del step_key  # every decision is per example
    return sop.make_swaps(decision_keys, batch, self.swap_rate)
