"""SpanBERT: the BERT encoder and tied MLM head plus a span boundary head.

Inputs (a dict; see ``bertjax/objectives/spanbert.py``): BERT's (tokens,
segment_ids, positions, doc_ids int32 [batch, length], masked_positions int32
[batch, predictions]) and, per prediction slot,
  sbo_left, sbo_right  int32 [batch, predictions]  positions s - 1 and e + 1
                                                   just outside the slot's span
  sbo_offsets          int32 [batch, predictions]  the slot's place i - s in it
(absent in ``state.dummy_inputs``, which only initialises: zeros then).

Outputs: BERT's without a sentence head (mlm_logits, hidden) plus
  sbo_logits  float32 [batch, predictions, vocab]

The SBO head (Joshi et al., 2020, eq. 1-2) reads the encoder outputs at the
two boundaries and a learned embedding of the offset:
  h0 = [x_{s-1}; x_{e+1}; p_{i-s}]            [.., 3 * embed]
  h1 = LayerNorm(GELU(W1 h0))                 [.., embed]
  y  = LayerNorm(GELU(W2 h1))                 [.., embed]
  logits = y @ E.T + b_sbo
with E the word embeddings (tied, as the MLM decoder) and its own bias. There
is no pooler and no NSP head: SpanBERT trains on single segments only.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax.models import bert
from bertjax.models import layers

Dtype = Any


class SboHead(nn.Module):
  """Span boundary head: 2-layer GELU/LayerNorm net -> tied decoder + bias.

  Attributes:
    vocab_size: size of the output bias (logical axis 'vocab').
    max_offset: largest offset with its own embedding; the table has
      ``max_offset + 1`` rows (larger offsets are clipped by the objective).
    dtype: compute dtype.
  """
  vocab_size: int
  max_offset: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, hidden: jax.Array, left: jax.Array, right: jax.Array,
               offsets: jax.Array,
               decode: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Predicts each slot's token from its span's boundaries.

    Args:
      hidden: [batch, length, embed] encoder output.
      left, right, offsets: int32 [batch, predictions].
      decode: the tied decoder, [..., embed] -> float32 [..., vocab].

    Returns:
      float32 [batch, predictions, vocab] logits.
    """
    width = hidden.shape[-1]
    gather = lambda index: jnp.take_along_axis(hidden, index[:, :, None], axis=1)
    # Every prediction reads one of max_offset + 1 rows: a small table whose
    # gradient is a one-hot matmul, as BERT's position table (no scatter).
    offset_embedding = bert._one_hot_lookup(nn.Embed(
        num_embeddings=self.max_offset + 1, features=width, dtype=self.dtype,
        param_dtype=jnp.float32,
        embedding_init=layers.kernel_init("position", "embed"),
        name="position_embeddings"), offsets, self.dtype)
    x = jnp.concatenate(
        [gather(left), gather(right), offset_embedding.astype(hidden.dtype)],
        axis=-1)
    for i in range(2):
      # Output axis unsharded, as in bert.MlmHead's square kernel.
      x = nn.Dense(width, dtype=self.dtype, param_dtype=jnp.float32,
                   kernel_init=layers.kernel_init("embed", None),
                   bias_init=layers.zeros_init(None), name=f"dense_{i}")(x)
      x = layers.gelu_erf(x)
      x = layers.layer_norm(self.dtype, f"layer_norm_{i}")(x)
    bias = self.param("output_bias", layers.zeros_init("vocab"),
                      (self.vocab_size,), jnp.float32)
    return decode(x) + bias


class SpanBertForPretraining(bert.BertForPretraining):
  """BertForPretraining (no sentence head) with an SBO head.

  Attributes:
    sbo_max_offset: see ``SboHead.max_offset``.
    (the rest: ``bert.BertForPretraining``; build with sentence_head=False.)
  """
  sbo_max_offset: int = 31

  def setup(self):
    super().setup()
    self.sbo_head = SboHead(vocab_size=self.vocab_size,
                            max_offset=self.sbo_max_offset, dtype=self.dtype)

  def __call__(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """Runs the model; see the module docstring for inputs and outputs."""
    outputs = super().__call__(inputs, deterministic)
    zeros = jnp.zeros_like(inputs["masked_positions"])
    outputs["sbo_logits"] = self.sbo_head(
        outputs["hidden"], inputs.get("sbo_left", zeros),
        inputs.get("sbo_right", zeros), inputs.get("sbo_offsets", zeros),
        self.embeddings.attend)
    return outputs


def from_config(config: ml_collections.ConfigDict,
                dtype: Dtype) -> SpanBertForPretraining:
  """Builds SpanBertForPretraining from a config (see configs/spanbert.py).

  Args:
    config: the fields ``bert.from_config`` reads (sentence_head is forced
      off) and sbo_max_offset.
    dtype: the compute dtype, already parsed from config.dtype.
  """
  if int(config.sbo_max_offset) < 0:
    raise ValueError(f"sbo_max_offset={config.sbo_max_offset} must not be "
                     "negative; fix --config.sbo_max_offset.")
  base = bert.from_config(config, dtype)
  fields = {name: getattr(base, name)
            for name in bert.BertForPretraining.__dataclass_fields__
            if name not in ("parent", "name")}
  fields["sentence_head"] = False
  # The span boundary head reads the hidden states at the spans' borders.
  fields["sparse_last_layer"] = False
  return SpanBertForPretraining(sbo_max_offset=int(config.sbo_max_offset),
                                **fields)
