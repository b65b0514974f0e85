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
Model outputs (a dict) hold at least:
  mlm_logits  float32 [B, P, V]
  nsp_logits  float32 [B, 2]   (sentence-level head: NSP now, SOP later)

Metrics are returned as ``{name: (sum, count)}`` pairs of float32 scalars so
that they add up across micro-batches, steps and devices; the reader divides.
"""

from __future__ import annotations

from typing import Mapping, Protocol

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
