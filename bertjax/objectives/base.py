"""The interface every pretraining objective implements.

An objective is chosen by name (``config.objective``) from the registry in
``bertjax/objectives/__init__.py``. It owns everything that differs between
BERT-family variants on the device side: how a Batch is corrupted into model
inputs and targets, and how the model's outputs are scored. The train loop
never branches on the variant.

Both methods run inside the jitted train step: they must be pure functions of
their arguments with static shapes (no host state, no Python randomness).

Model inputs (a dict) always hold:
  tokens            int32 [B, L]  corrupted token ids
  segment_ids       int32 [B, L]
  positions         int32 [B, L]
  doc_ids           int32 [B, L]  attention allowed only between equal, non-zero ids
  masked_positions  int32 [B, P]  positions whose MLM logits are wanted
                                  (P = config.max_predictions_per_seq; unused
                                  slots point at 0 and have weight 0)
and may hold
  attention_mask    bool [B, L, L]  an objective's own attention mask (UniLM),
                                  which the model ANDs with the doc_ids mask
Model outputs (a dict) hold at least:
  mlm_logits  float32 [B, P, V]
  nsp_logits  float32 [B, 2]   (sentence-level head: NSP now, SOP later)

Metrics are returned as ``{name: (sum, count)}`` pairs of float32 scalars so
that they add up across micro-batches, steps and devices; the reader divides.

Steps with two networks and a sampling key (ELECTRA). ``corrupt -> apply ->
loss`` cannot say "run the generator, sample from it, run the discriminator
on the samples": the discriminator's input exists only after a forward pass.
So the interface grew once, for every objective, by one optional method,
``forward(apply, inputs, targets) -> outputs``, which replaces the single
``model.apply`` between ``corrupt`` and ``loss``. ``apply(inputs,
method=None)`` is the model bound to the step's params, dropout key and
determinism, so an objective may call it several times and pick a model
method (``method='generate'``). The loop calls the module function
``forward`` below, whose default is the one ``apply(inputs)`` of before: no
existing objective changed, and train.py and evaluation.py have no variant
branch. Why this and not the alternatives:
  * The model stays one flax module holding both networks (one params tree,
    optimizer state and checkpoint; shared embeddings are just shared
    submodules), and models still never sample.
  * Randomness stays in ``corrupt``: it puts per-example sampling keys into
    ``targets`` (raw uint32 key data, so gradient accumulation slices them
    like any array); ``forward`` takes no key and is a pure function of its
    arguments, so a resumed or re-sharded run samples the same tokens.
  * ``loss`` keeps its signature. What a forward pass produces beyond the
    model's outputs (ELECTRA's replaced/original labels, known only after
    sampling) travels in ``outputs``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import jax

Metrics = dict[str, tuple[jax.Array, jax.Array]]


class Objective(Protocol):
  """Corrupts a batch on device and scores the model's outputs."""

  def corrupt(self, rng: jax.Array, batch: Mapping[str, jax.Array],
              step: jax.Array) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
    """Returns (model_inputs, targets).

    Args:
      rng: the run's root key (``jax.random.key(config.seed)``, or the eval
        seed's key in evaluation). The objective derives every key it needs
        from it: ``fold_in(rng, step)`` for per-step (dynamic) decisions and
        ``fold_in`` of ``batch['example_id']`` (and ``batch['epoch']``) for
        per-example (static) ones, so results do not depend on device count.
      batch: a Batch (bertjax/batch.py) of device arrays.
      step: int32 scalar, the optimizer step being computed.
    """
    ...

  def loss(self, outputs: Mapping[str, jax.Array],
           targets: Mapping[str, jax.Array]) -> tuple[jax.Array, Metrics]:
    """Returns (scalar float32 loss to minimise, metrics as (sum, count))."""
    ...


# ``apply(inputs, method=None) -> outputs``: the model bound to its params.
Apply = Callable[..., dict[str, jax.Array]]


def bind(model, params, *, deterministic: bool, dropout_rng=None):
  """``apply(inputs, method=None)``: ``model`` bound to ``params``, as
  ``forward`` calls it (one or several times per step)."""
  rngs = None if dropout_rng is None else {"dropout": dropout_rng}

  def apply(inputs, method=None):
    return model.apply({"params": params}, inputs, deterministic=deterministic,
                       rngs=rngs, method=method)

  return apply


def forward(objective: Any, apply: Apply, inputs: Mapping[str, jax.Array],
            targets: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """The model outputs ``objective.loss`` scores.

  ``objective.forward(apply, inputs, targets)`` where the objective defines
  it (several model calls, e.g. ELECTRA's generator then discriminator);
  otherwise the one call ``apply(inputs)``.
  """
  custom = getattr(objective, "forward", None)
  if custom is None:
    return apply(inputs)
  return custom(apply, inputs, targets)


def eval_views(objective: Any) -> tuple[Any, ...]:
  """The objectives evaluation scores every held-out batch with.

  ``objective.eval_views()`` where the objective defines it (UniLM: itself
  under each of its four attention masks, so per-mask figures are
  deterministic and over the same examples; their metrics add up); otherwise
  the objective alone.
  """
  views = getattr(objective, "eval_views", None)
  return (objective,) if views is None else tuple(views())


def loss_terms(objective: Any, metrics: Mapping[str, Any]) -> tuple[str, ...]:
  """Names of the metrics whose sum/count ratios add up to the objective's loss.

  An objective may declare ``loss_terms``; otherwise every ``*_loss`` metric
  counts (the convention of bertjax/objectives: mlm_loss, nsp_loss, ...). The
  train step's accumulation and the held-out loss both add them so.
  """
  terms = getattr(objective, "loss_terms", None)
  if terms is None:
    terms = tuple(k for k in sorted(metrics) if k.endswith("_loss"))
  return tuple(terms)
