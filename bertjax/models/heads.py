"""Fine-tuning heads, written once for every bertjax encoder.

Every pretraining module of ``bertjax/models`` (BERT, RoBERTa, ALBERT,
SpanBERT, ERNIE, ELECTRA's discriminator, DeBERTa) returns ``hidden``
[batch, length, embed] and, where it has a pooler, ``pooled`` [batch, embed].
A head reads only those, so ``FineTuneModel(encoder, head)`` works for any of
them and the encoder's parameters keep the names of its pretraining
checkpoint (``params['encoder']``), which is what lets ``--init`` load them
unchanged.

Heads (``head.kind``):
  sequence  [batch, num_outputs] logits (classification) or scores
            (regression, num_outputs = 1) from the first token's hidden state
            (dense -> tanh -> dropout -> dense, as RoBERTa/ELECTRA fine-tune)
            or the mean over real tokens (``pooling='mean'``, what
            sentence-transformers models such as all-MiniLM-L6-v2 are trained
            for), or the encoder's pooler (``pooling='pooler'``, BERT's).
  token     [batch, length, num_outputs] logits (tagging).
  span      [batch, length, 2] start/end logits (extractive QA).
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.models import layers

KINDS = ("sequence", "token", "span")
POOLINGS = ("first", "mean", "pooler")
# The activation after the sequence head's own dense layer: BERT's pooler
# and RoBERTa's head use tanh, ELECTRA's classification head exact GELU.
HEAD_ACTIVATIONS = ("tanh", "gelu")
# Fine-tuning task kinds -> head kinds.
TASK_HEADS = {"classification": "sequence", "regression": "sequence",
              "tagging": "token", "qa": "span"}


def _dense(features: int, name: str, out_axis: str | None = None) -> nn.Dense:
  # float32 heads: they are small and keep the loss input exact.
  return nn.Dense(features, dtype=jnp.float32, param_dtype=jnp.float32,
                  kernel_init=layers.kernel_init("embed", out_axis),
                  bias_init=layers.zeros_init(out_axis), name=name)


class TaskHead(nn.Module):
  """One of the three heads of the module docstring.

  Attributes:
    kind: 'sequence', 'token' or 'span'.
    num_outputs: classes (1 for regression); ignored by 'span' (always 2).
    pooling: for 'sequence': 'first' (own dense+tanh over the first token)
      or 'pooler' (the encoder's pretrained pooler output).
    dropout_rate: dropout on the head's input.
    activation: after the 'first'/'mean' head's dense layer: 'tanh' or
      'gelu' (exact, ELECTRA's head).
  """
  kind: str
  num_outputs: int
  pooling: str = "first"
  dropout_rate: float = 0.1
  activation: str = "tanh"

  @nn.compact
  def __call__(self, encoded: Mapping[str, jax.Array], real: jax.Array,
               deterministic: bool) -> jax.Array:
    """float32 logits (module docstring); ``real`` bool [batch, length] marks
    the non-padding tokens."""
    hidden = encoded["hidden"].astype(jnp.float32)
    drop = nn.Dropout(self.dropout_rate)
    if self.kind == "sequence":
      if self.pooling == "pooler":
        if "pooled" not in encoded:
          raise ValueError(
              "This encoder has no pooler; set --config.pooling=first.")
        x = encoded["pooled"].astype(jnp.float32)
      else:
        if self.pooling == "mean":
          w = real[..., None].astype(jnp.float32)
          x = jnp.sum(hidden * w, 1) / jnp.maximum(jnp.sum(w, 1), 1.0)
        else:
          x = hidden[:, 0]
        x = drop(x, deterministic)
        x = _dense(hidden.shape[-1], "dense")(x)
        x = layers.gelu_erf(x) if self.activation == "gelu" else jnp.tanh(x)
      return _dense(self.num_outputs, "out")(drop(x, deterministic))
    if self.kind == "token":
      return _dense(self.num_outputs, "out")(drop(hidden, deterministic))
    if self.kind == "span":
      return _dense(2, "out")(drop(hidden, deterministic))
    raise ValueError(f"Unknown head kind {self.kind!r}; use one of {', '.join(KINDS)}.")


class FineTuneModel(nn.Module):
  """A pretraining encoder plus a task head.

  Inputs are the pretraining model's (tokens, segment_ids, positions,
  doc_ids int32 [batch, length], masked_positions int32 [batch, 1]: the MLM
  head, if any, is evaluated at one position and left untrained).

  Outputs: ``logits`` (the head's) and ``hidden``.
  """
  encoder: nn.Module
  head: TaskHead

  def __call__(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, Any]:
    encoded = self.encoder(inputs, deterministic)
    real = inputs["doc_ids"] != 0
    return {"logits": self.head(encoded, real, deterministic),
            "hidden": encoded["hidden"]}


def build(encoder: nn.Module, kind: str, num_outputs: int, pooling: str = "first",
          dropout_rate: float = 0.1, activation: str = "tanh") -> FineTuneModel:
  """``FineTuneModel`` with the submodule names ``encoder`` and ``head``."""
  if kind not in KINDS:
    raise ValueError(f"Unknown head kind {kind!r}; use one of {', '.join(KINDS)}.")
  if pooling not in POOLINGS:
    raise ValueError(f"Unknown pooling {pooling!r}; set --config.pooling to one of "
                     f"{', '.join(POOLINGS)}.")
  if activation not in HEAD_ACTIVATIONS:
    raise ValueError(f"Unknown head_activation {activation!r}; set "
                     f"--config.head_activation to one of {', '.join(HEAD_ACTIVATIONS)}.")
  if getattr(encoder, "sparse_last_layer", False):
    # A head reads every row of the last layer (``BertForPretraining``).
    encoder = encoder.clone(sparse_last_layer=False)
  # Flax names module-valued fields after the field: params['encoder'], ['head'].
  return FineTuneModel(encoder=encoder,
                       head=TaskHead(kind=kind, num_outputs=num_outputs,
                                     pooling=pooling, dropout_rate=dropout_rate,
                                     activation=activation))


def for_task(encoder: nn.Module, task_kind: str, num_outputs: int, config) -> FineTuneModel:
  """``build`` for a fine-tuning task kind and its config's head fields."""
  return build(encoder, TASK_HEADS[task_kind], num_outputs, config.pooling,
               config.head_dropout, config.get("head_activation", "tanh"))
