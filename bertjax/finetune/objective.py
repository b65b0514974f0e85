"""Fine-tuning as an objective of the pretraining step (``train.train_step``).

``corrupt`` corrupts nothing: it turns a feature batch (``features.DEVICE_KEYS``
plus ``weight`` float32 [batch], 0 on padding rows) into the encoder's model
inputs and the targets; ``loss`` scores the head's ``logits``. So fine-tuning
runs in the same jitted, sharded, donated step as pretraining.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax

_NEG = -1e9


def model_inputs(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Encoder inputs of right-padded rows: positions from 0, doc 1 on real tokens."""
  tokens = batch["tokens"]
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32),
                               tokens.shape)
  return {"tokens": tokens, "segment_ids": batch["segment_ids"],
          "positions": positions, "doc_ids": (tokens != 0).astype(jnp.int32),
          # The MLM head, which fine-tuning does not use, is read at one slot.
          "masked_positions": jnp.zeros((tokens.shape[0], 1), jnp.int32)}


def span_logits(logits: jax.Array, context_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """QA start/end logits [batch, length] with everything but the context and
  [CLS] (the 'not in this window' target) ruled out."""
  allowed = context_mask.at[:, 0].set(True)
  return (jnp.where(allowed, logits[..., 0], _NEG),
          jnp.where(allowed, logits[..., 1], _NEG))


class FineTuneObjective:
  """The objective of ``config.task_kind`` (set by ``loop`` from the task)."""

  loss_terms = ("task_loss",)

  def __init__(self, kind: str):
    self.kind = kind

  def corrupt(self, rng, batch, step):
    del rng, step
    targets = {k: v for k, v in batch.items()
               if k not in ("tokens", "segment_ids")}
    return model_inputs(batch), targets

  def loss(self, outputs, targets):
    logits = outputs["logits"]
    w = targets["weight"].astype(jnp.float32)
    if self.kind == "classification":
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets["label"])
      right = (jnp.argmax(logits, -1) == targets["label"]).astype(jnp.float32)
      total, count = jnp.sum(ce * w), jnp.sum(w)
      metrics = {"task_loss": (total, count), "task_accuracy": (jnp.sum(right * w), count)}
    elif self.kind == "regression":
      se = jnp.square(logits[:, 0] - targets["label"])
      total, count = jnp.sum(se * w), jnp.sum(w)
      metrics = {"task_loss": (total, count)}
    elif self.kind == "tagging":
      m = targets["tag_mask"].astype(jnp.float32) * w[:, None]
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets["tags"])
      right = (jnp.argmax(logits, -1) == targets["tags"]).astype(jnp.float32)
      total, count = jnp.sum(ce * m), jnp.sum(m)
      metrics = {"task_loss": (total, count), "task_accuracy": (jnp.sum(right * m), count)}
    else:  # qa
      start, end = span_logits(logits, targets["context_mask"])
      ce = 0.5 * (optax.softmax_cross_entropy_with_integer_labels(start, targets["start"])
                  + optax.softmax_cross_entropy_with_integer_labels(end, targets["end"]))
      right = ((jnp.argmax(start, -1) == targets["start"])
               & (jnp.argmax(end, -1) == targets["end"])).astype(jnp.float32)
      total, count = jnp.sum(ce * w), jnp.sum(w)
      metrics = {"task_loss": (total, count), "task_accuracy": (jnp.sum(right * w), count)}
    return total / jnp.maximum(count, 1.0), metrics
