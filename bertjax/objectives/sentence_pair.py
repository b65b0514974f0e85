"""Masked LM plus a two-way sentence task over ``[CLS] A [SEP] B [SEP]`` rows.

BERT (next-sentence prediction) and ALBERT (sentence-order prediction) share
everything but the way a pair is turned into a negative: both first rebuild
some rows (``make_pairs``), then mask the rebuilt rows, so predictions land
on the tokens the model actually sees, and both add the two losses.

Randomness: the root key is split once into an example root and a step root.
  per example  ``masking.example_keys(example root, ...)`` (static or dynamic,
               ``config.masking``), split into a mask key and a decision key:
               an example's mask and its negative/positive decision repeat
               exactly when its key does.
  per step     ``fold_in(step root, step)``, for choices that involve the
               whole batch (NSP's partner from another document).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import nsp
from bertjax.objectives import segments


class SentencePairObjective:
  """MLM + a sentence-level task; subclasses define ``make_pairs``.

  Attributes:
    task: the task's name: prefix of its metrics (``<task>_loss``,
      ``<task>_accuracy``) and of its labels in the targets
      (``<task>_labels``). The model's two-way head output is ``nsp_logits``
      whatever the task (bertjax/objectives/base.py).
    models, needs_sentence_head: what it needs of config.model
      (bertjax/objectives/__init__.py): a model with a sentence head.
  """
  task = ""
  models = ("bert", "albert", "deberta")
  needs_sentence_head = True

  def __init__(self, config: Any):
    self.mlm = mlm.MlmSettings.from_config(config)
    self.masking, self.dupe_factor = mlm.masking_schedule(config)
    # A single-segment model (an imported RoBERTa) reads B as segment 0.
    self.single_segment = segments.single_segment(config)
    if config.layout != "sentence_pairs":
      raise ValueError(
          f"The {self.task.upper()} objective needs sentence pairs but "
          f"config.layout is {config.layout!r}; set "
          f"--config.layout=sentence_pairs.")

  def make_pairs(self, decision_keys: jax.Array, step_key: jax.Array,
                 batch: Mapping[str, jax.Array]
                 ) -> tuple[dict[str, jax.Array], jax.Array]:
    """Rebuilds some rows as negatives: (new Batch, labels int32 [B]).

    Args:
      decision_keys: [B] one key per example.
      step_key: a key of this step for batch-wide choices.
      batch: a Batch of the sentence-pair layout.
    """
    raise NotImplementedError

  def mask(self, keys: jax.Array,
           pairs: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Masks the rebuilt rows: ``mlm.mask_batch`` (a variant may override).

    Returns tokens and masked_positions (model inputs); every other entry
    (mlm_targets, mlm_weights, ...) goes to the targets.
    """
    return mlm.mask_batch(keys, pairs["tokens"], pairs["special"],
                          pairs["word_starts"], pairs["example_mask"], self.mlm)

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model inputs, targets); see base.Objective.

    Model inputs: tokens, segment_ids (all 0 for a single-segment model:
    ``segments``), positions, doc_ids int32 [B, L] and
    masked_positions int32 [B, P]. Targets: mlm_targets int32 [B, P],
    mlm_weights float32 [B, P], ``<task>_labels`` int32 [B] (1 = negative)
    and example_mask bool [B].
    """
    example_root, step_root = jax.random.split(rng)
    keys = masking.example_keys(
        example_root, batch["example_id"], batch["epoch"], step,
        masking=self.masking, dupe_factor=self.dupe_factor)
    streams = jax.vmap(jax.random.split)(keys)  # [B, 2]
    pairs, labels = self.make_pairs(
        streams[:, 1], jax.random.fold_in(step_root, step), batch)
    masked = self.mask(streams[:, 0], pairs)
    inputs = {
        "tokens": masked["tokens"],
        "segment_ids": segments.model_segment_ids(pairs["segment_ids"],
                                                  self.single_segment),
        "positions": pairs["positions"],
        "doc_ids": pairs["doc_ids"],
        "masked_positions": masked["masked_positions"],
    }
    targets = {k: v for k, v in masked.items()
               if k not in ("tokens", "masked_positions")}
    targets[f"{self.task}_labels"] = labels
    targets["example_mask"] = pairs["example_mask"]
    return inputs, targets

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """Mean MLM loss + mean sentence-task loss, and their (sum, count) metrics.

    Metrics: mlm_loss, mlm_accuracy, ``<task>_loss``, ``<task>_accuracy``,
    and 'loss' as (this batch's total loss, 1).
    """
    mlm_value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    task_value, task_metrics = nsp.nsp_loss(
        outputs["nsp_logits"], targets[f"{self.task}_labels"],
        targets["example_mask"])
    total = mlm_value + task_value
    metrics[f"{self.task}_loss"] = task_metrics["nsp_loss"]
    metrics[f"{self.task}_accuracy"] = task_metrics["nsp_accuracy"]
    metrics["loss"] = (total, jnp.ones((), jnp.float32))
    return total, metrics
