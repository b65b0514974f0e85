"""ELECTRA: replaced-token detection with a jointly trained generator.

In one jitted step (Clark et al., 2020):

1. ``corrupt`` chooses 15% of the real tokens with the MLM machinery
   (``mlm.mask_batch``: static or dynamic masks, whole-word and n-gram
   options; ELECTRA replaces 85% of the chosen by [MASK] and keeps 15%).
2. ``forward`` runs the generator on that input (``model.generate``); a
   replacement for every chosen position is drawn from the generator's
   softmax with the Gumbel-max trick, ``argmax(logits / T + g)``, g ~
   Gumbel(0, 1), at temperature T (``generator_temperature``), over the
   whole vocabulary but [PAD], [CLS], [SEP] and [MASK]. The logits
   pass through ``stop_gradient`` first: the discriminator's loss never
   reaches the generator through the samples (argmax has no gradient either;
   the stop makes the intent explicit and survives a soft relaxation).
3. The discriminator (``model.__call__``) reads the input with the samples in
   place and classifies every real token (not special, not padding, in a
   real example) as original (0) or replaced (1). A sample equal to the
   original token is labelled original.
4. ``loss`` = generator MLM loss + λ · discriminator loss (λ =
   ``disc_loss_weight``, 50 in the paper), both means over their positions.

The Gumbel noise comes from one key per example and step,
``fold_in(fold_in(rng, _SAMPLE_STREAM), step)`` folded with the example's id
(``masking.example_keys``), so the samples, like the masks, do not depend on
how the batch is split over devices. The keys travel in ``targets`` as raw
uint32 key data, which gradient accumulation can slice like any array.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from bertjax import batch as batch_lib
from bertjax.objectives import masking
from bertjax.objectives import mlm
from bertjax.objectives import mlm_only

# fold_in constant separating the sampling keys from the masking keys.
_SAMPLE_STREAM = 0xE1EC

# Ids the generator may never put in the text: they are never an MLM target,
# and a sampled [SEP] or [PAD] would be a replacement a discriminator spots
# without reading the context. [UNK] stays: it is a token of the text.
_NEVER_SAMPLED = (batch_lib.PAD_ID, batch_lib.CLS_ID, batch_lib.SEP_ID,
                  batch_lib.MASK_ID)


def gumbel_max_sample(key: jax.Array, logits: jax.Array,
                      temperature: float) -> jax.Array:
  """One draw per row of ``softmax(logits / temperature)``, by Gumbel-max.

  Args:
    key: a PRNG key.
    logits: float [..., V].
    temperature: T > 0.

  Returns:
    int32 [...] sampled ids.
  """
  noise = jax.random.gumbel(key, logits.shape, jnp.float32)
  return jnp.argmax(logits.astype(jnp.float32) / temperature + noise,
                    axis=-1).astype(jnp.int32)


def sampling_logits(logits: jax.Array) -> jax.Array:
  """float32 ``logits`` [..., V] with the never-sampled ids at -inf."""
  never = jnp.zeros(logits.shape[-1], bool).at[jnp.array(_NEVER_SAMPLED)].set(True)
  return jnp.where(never, -jnp.inf, logits.astype(jnp.float32))


def replace_at(tokens: jax.Array, positions: jax.Array, weights: jax.Array,
               values: jax.Array) -> jax.Array:
  """``tokens`` with ``values`` written at the used slots' positions.

  Args:
    tokens: int32 [B, L].
    positions: int32 [B, P]; unused slots (weight 0) are left out.
    weights: float [B, P].
    values: int32 [B, P].
  """
  length = tokens.shape[1]
  # Unused slots point at position 0; send them out of range and drop them,
  # so that they can never overwrite a used slot's write.
  positions = jnp.where(weights > 0, positions, length)
  return jax.vmap(lambda row, pos, val: row.at[pos].set(val, mode="drop"))(
      tokens, positions, values)


class ElectraObjective(mlm_only.MlmOnlyObjective):
  """Generator MLM + discriminator replaced-token detection (base.Objective
  with ``forward``).

  Targets add to the MLM ones: ``original_tokens`` int32 [B, L],
  ``rtd_weights`` float32 [B, L] (1 on the tokens the discriminator is
  scored on) and ``sample_keys`` uint32 [B, key data] (the Gumbel keys).
  Outputs of ``forward``: the generator's ``mlm_logits``, the
  discriminator's ``rtd_logits`` float32 [B, L] and ``hidden``, and the
  labels ``rtd_labels`` int32 [B, L] (1 = replaced), which exist only once
  the generator has sampled.
  """
  # The loss is mlm_loss + λ · disc_loss: the λ-weighted sum is its own
  # metric so that gradient accumulation (train._accumulate) adds the terms
  # with the right weight.
  loss_terms = ("mlm_loss", "disc_weighted_loss")
  models = ("electra",)  # calls model.generate, reads rtd_logits

  def __init__(self, config: Any):
    super().__init__(config)
    self.disc_loss_weight = float(config.disc_loss_weight)
    self.temperature = float(config.generator_temperature)
    # Finite too: λ = inf makes every loss NaN, and T = inf turns the
    # never-sampled ids' -inf logits into NaN, which argmax picks: [PAD]
    # would replace every chosen token.
    if not 0 < self.disc_loss_weight < math.inf:
      raise ValueError(
          f"disc_loss_weight={self.disc_loss_weight} must be a positive "
          f"number; fix --config.disc_loss_weight (ELECTRA uses 50).")
    if not 0 < self.temperature < math.inf:
      raise ValueError(
          f"generator_temperature={self.temperature} must be a positive "
          f"number; fix --config.generator_temperature (1 samples the softmax "
          f"itself).")

  def corrupt(
      self, rng: jax.Array, batch: Mapping[str, jax.Array], step: jax.Array
  ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """The MLM corruption (``MlmOnlyObjective.corrupt``) plus the targets the
    discriminator needs; see the class docstring."""
    inputs, targets = super().corrupt(rng, batch, step)
    sample_keys = masking.example_keys(
        jax.random.fold_in(rng, _SAMPLE_STREAM), batch["example_id"],
        batch["epoch"], step, masking="dynamic", dupe_factor=1)
    real = ~batch["special"] & batch["example_mask"][:, None]
    targets.update(
        original_tokens=batch["tokens"],
        rtd_weights=real.astype(jnp.float32),
        sample_keys=jax.random.key_data(sample_keys))
    return inputs, targets

  def forward(self, apply: Callable[..., dict[str, jax.Array]],
              inputs: Mapping[str, jax.Array],
              targets: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Generator -> Gumbel-max samples -> discriminator (module docstring).

    Args:
      apply: ``apply(inputs, method=None)`` runs the model with its params
        (``method='generate'`` for the generator).
      inputs: the model inputs of ``corrupt``.
      targets: the targets of ``corrupt``.
    """
    generated = apply(inputs, method="generate")
    logits = sampling_logits(jax.lax.stop_gradient(generated["mlm_logits"]))
    keys = jax.random.wrap_key_data(targets["sample_keys"])
    sampled = jax.vmap(
        lambda k, row: gumbel_max_sample(k, row, self.temperature))(keys, logits)
    tokens = replace_at(inputs["tokens"], inputs["masked_positions"],
                        targets["mlm_weights"], sampled)
    labels = ((tokens != targets["original_tokens"]) &
              (targets["rtd_weights"] > 0)).astype(jnp.int32)
    judged = apply({**inputs, "tokens": tokens})
    return {"mlm_logits": generated["mlm_logits"],
            "rtd_logits": judged["rtd_logits"], "hidden": judged["hidden"],
            "rtd_labels": labels}

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, mlm.Metrics]:
    """Generator MLM loss + λ · mean sigmoid cross-entropy of the
    discriminator; metrics as the module docstring lists, (sum, count)."""
    mlm_value, metrics = mlm.mlm_loss(
        outputs["mlm_logits"], targets["mlm_targets"], targets["mlm_weights"])
    disc_value, disc_metrics = rtd_loss(
        outputs["rtd_logits"], outputs["rtd_labels"], targets["rtd_weights"])
    metrics.update(disc_metrics)
    total, count = metrics["disc_loss"]
    metrics["disc_weighted_loss"] = (self.disc_loss_weight * total, count)
    value = mlm_value + self.disc_loss_weight * disc_value
    metrics["loss"] = (value, jnp.ones((), jnp.float32))
    return value, metrics


def rtd_loss(logits: jax.Array, labels: jax.Array,
             weights: jax.Array) -> tuple[jax.Array, mlm.Metrics]:
  """Replaced-token detection: weighted mean sigmoid cross-entropy.

  Args:
    logits: float [B, L], > 0 predicts "replaced".
    labels: int [B, L], 1 = replaced.
    weights: float [B, L], 1 on the scored tokens.

  Returns:
    (scalar float32 loss, metrics): disc_loss and disc_accuracy over the
    scored tokens; disc_precision and disc_recall of "replaced";
    replaced_fraction; disc_all_original_accuracy, the accuracy of always
    answering "original", the floor the discriminator must beat; disc_auc,
    threshold-free: the fraction of (replaced, original) pairs of scored
    tokens of the batch that the logits rank the right way round (ties
    counted half), as (right pairs, pairs), so that sums over batches give
    the AUC over all within-batch pairs (within-micro-batch pairs when the
    train step accumulates micro-batches: the one metric that then differs
    from the big batch's).
  """
  logits = logits.astype(jnp.float32)
  y = labels.astype(jnp.float32)
  w = weights.astype(jnp.float32)
  # log(1 + exp(-|x|)) form of the sigmoid cross-entropy: no overflow.
  nll = jnp.maximum(logits, 0.0) - logits * y + jnp.log1p(jnp.exp(-jnp.abs(logits)))
  count = jnp.sum(w)
  predicted = (logits > 0).astype(jnp.float32) * w
  true_positive = jnp.sum(predicted * y)
  metrics = {
      "disc_loss": (jnp.sum(nll * w), count),
      "disc_accuracy": (jnp.sum((predicted == y * w).astype(jnp.float32) * w), count),
      "disc_precision": (true_positive, jnp.sum(predicted)),
      "disc_recall": (true_positive, jnp.sum(y * w)),
      "replaced_fraction": (jnp.sum(y * w), count),
      "disc_all_original_accuracy": (jnp.sum((1.0 - y) * w), count),
      "disc_auc": ranked_pairs(logits, y, w),
  }
  return metrics["disc_loss"][0] / jnp.maximum(count, 1.0), metrics


def ranked_pairs(scores: jax.Array, labels: jax.Array,
                 weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(pairs ranked right, pairs) over all (positive, negative) pairs.

  The Mann-Whitney count behind the AUC, by one sort: a positive outranks
  every negative sorted below it; equal scores count half.

  Args:
    scores: float [...]; labels: float [...] 1 = positive; weights: float
      [...] 1 on the scored entries, 0 elsewhere.

  Returns:
    float32 scalars (right, total); right / total is the AUC.
  """
  s = scores.reshape(-1).astype(jnp.float32)
  pos = (labels.reshape(-1) * weights.reshape(-1)).astype(jnp.float32)
  neg = ((1.0 - labels.reshape(-1)) * weights.reshape(-1)).astype(jnp.float32)
  order = jnp.argsort(s)
  s, pos, neg = s[order], pos[order], neg[order]
  # Negatives strictly below each entry, and those tied with it.
  first = jnp.searchsorted(s, s, side="left")
  last = jnp.searchsorted(s, s, side="right")
  cum = jnp.concatenate([jnp.zeros(1, jnp.float32), jnp.cumsum(neg)])
  strictly_below = cum[first]
  tied = cum[last] - cum[first]
  right = jnp.sum(pos * (strictly_below + 0.5 * tied))
  return right, jnp.sum(pos) * jnp.sum(neg)
