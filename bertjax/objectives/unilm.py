"""UniLM pretraining: one BERT encoder, four self-attention masks, cloze + NSP.

Every example of ``[CLS] A [SEP] B [SEP]`` rows is given one of UniLM's four
masks (``unilm_masks``: bidirectional, seq2seq, left-to-right,
right-to-left) with the paper's probabilities 1/3, 1/3, 1/6, 1/6
(``config.unilm_mask_rates``), drawn from the example's key, so static or
dynamic like its cloze mask (``config.masking``). The mask goes to the model
as ``attention_mask`` [B, L, L], which the model combines with ``doc_ids``.

Cloze under every mask: 15% of the tokens, 80/10/10 replacement, chosen as
spans of 1 token (80%) or 2 or 3 tokens (20%): the MLM n-gram option with
``config.ngram_probs`` = (0.8, 0.1, 0.1). Next-sentence prediction is scored
on bidirectional rows only, and only they ever get a borrowed B: a seq2seq or
unidirectional row always reads its own document's continuation.

Randomness (as ``sentence_pair``): each example's key splits into a cloze
key, an NSP decision key and a mask-type key; NSP partners come from the
step's key.

Evaluation reads every held-out batch under each of the four masks in turn
(``eval_views``), so per-type accuracies are deterministic and over the same
examples; metrics: ``mlm_accuracy_<type>`` and ``mlm_loss_<type>`` for each
type besides the overall ``mlm_*`` and ``nsp_*``.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from bertjax.objectives import bert
from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import nsp
from bertjax.objectives import segments
from bertjax.objectives import unilm_masks


class UnilmObjective(bert.BertObjective):
  """Cloze under UniLM's mixed masks + NSP on bidirectional rows.

  Targets add ``unilm_mask_type`` int32 [B] (index into
  ``unilm_masks.MASK_TYPES``).

  Attributes:
    mask_type: None to draw each example's mask type (training); an index
      into ``MASK_TYPES`` to give every example that mask (evaluation views).
  """
  task = "nsp"
  # The per-type MLM losses are views of mlm_loss, not terms of the loss.
  loss_terms = ("mlm_loss", "nsp_loss")
  models = ("bert",)  # the one model that reads an attention_mask input

  def __init__(self, config: Any, mask_type: int | None = None):
    super().__init__(config)
    self.config = config
    self.rates = unilm_masks.check_rates(config.unilm_mask_rates)
    self.mask_type = mask_type

  def eval_views(self) -> tuple["UnilmObjective", ...]:
    """The same objective with each fixed mask type, for evaluation."""
    return tuple(UnilmObjective(self.config, t)
                 for t in range(len(unilm_masks.MASK_TYPES)))

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model inputs, targets); see base.Objective.

    Model inputs: those of BERT plus ``attention_mask`` bool [B, L, L].
    Targets: mlm_targets, mlm_weights [B, P], nsp_labels int32 [B],
    example_mask bool [B], unilm_mask_type int32 [B].
    """
    example_root, step_root = jax.random.split(rng)
    keys = masking.example_keys(
        example_root, batch["example_id"], batch["epoch"], step,
        masking=self.masking, dupe_factor=self.dupe_factor)
    streams = jax.vmap(lambda k: jax.random.split(k, 3))(keys)  # [B, 3]
    if self.mask_type is None:
      types = unilm_masks.draw_mask_types(streams[:, 2], self.rates)
    else:
      types = jnp.full(keys.shape, self.mask_type, jnp.int32)
    bidirectional = types == unilm_masks.BIDIRECTIONAL
    pairs, labels = nsp.make_negatives(
        streams[:, 1], jax.random.fold_in(step_root, step), batch,
        self.nsp_negative_rate, eligible=bidirectional)
    masked = self.mask(streams[:, 0], pairs)
    inputs = {
        "tokens": masked["tokens"],
        # The model's segments; the mask reads the layout's A/B mark.
        "segment_ids": segments.model_segment_ids(pairs["segment_ids"],
                                                  self.single_segment),
        "positions": pairs["positions"],
        "doc_ids": pairs["doc_ids"],
        "masked_positions": masked["masked_positions"],
        "attention_mask": unilm_masks.attention_masks(
            types, pairs["segment_ids"]),
    }
    targets = {k: v for k, v in masked.items()
               if k not in ("tokens", "masked_positions")}
    targets["nsp_labels"] = labels
    targets["example_mask"] = pairs["example_mask"]
    targets["unilm_mask_type"] = types
    return inputs, targets

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """Mean cloze loss + mean NSP loss over bidirectional rows.

    Metrics: mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy (counted over
    bidirectional rows), mlm_loss_<type> and mlm_accuracy_<type> for each
    mask type, and 'loss' as (this batch's total loss, 1).
    """
    types = targets["unilm_mask_type"]
    mlm_value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    for index, name in enumerate(unilm_masks.MASK_TYPES):
      weights = targets["mlm_weights"] * (types == index)[:, None]
      _, per_type = mlm.mlm_loss(outputs["mlm_logits"], targets["mlm_targets"],
                                 weights)
      metrics[f"mlm_loss_{name}"] = per_type["mlm_loss"]
      metrics[f"mlm_accuracy_{name}"] = per_type["mlm_accuracy"]
    scored = targets["example_mask"] & (types == unilm_masks.BIDIRECTIONAL)
    nsp_value, nsp_metrics = nsp.nsp_loss(
        outputs["nsp_logits"], targets["nsp_labels"], scored)
    metrics.update(nsp_metrics)
    total = mlm_value + nsp_value
    metrics["loss"] = (total, jnp.ones((), jnp.float32))
    return total, metrics
