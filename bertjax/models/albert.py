"""ALBERT: factorized embeddings and cross-layer parameter sharing.

The two architectural differences from BERT (Lan et al., 2019):

* Factorized embedding: tokens are embedded in a small space of size E
  (``config.embedding_size``, 128 in the paper) and projected to the hidden
  size H, so the embedding costs V·E + E·H parameters instead of V·H. The MLM
  head maps back to E and is tied to the same V × E table.
* Cross-layer sharing (``config.layer_sharing``): the L layers reuse one set
  of weights for their attention sublayers (``attention``), their
  feed-forward sublayers (``ffn``), both (``all``: one layer's weights applied
  L times, the paper's default) or nothing (``none``: BERT's stack). A
  sublayer's LayerNorm is shared with it.

The sublayers are the BERT ones of ``layers.py`` (``MultiHeadAttention``,
``Mlp``, post-LayerNorm residuals), so ``layer_sharing='none'`` with E = H
computes exactly a BERT encoder.

Inputs and outputs follow ``bertjax/objectives/base.py``: mlm_logits float32
[batch, predictions, vocab], nsp_logits float32 [batch, 2] (the SOP head),
hidden [batch, length, embed] and pooled [batch, embed].

Parameter tree (``n`` = 1 for a shared sublayer, L otherwise)::

  embeddings/{word_embeddings [V, E], position_embeddings [P, E],
              type_embeddings [T, E], layer_norm [E], projection [E, H]}
  encoder/{attention_0..n-1, attention_norm_0..n-1, mlp_0..n-1,
           mlp_norm_0..n-1}
  pooler [H, H], mlm_head/{dense [H, E], layer_norm [E], output_bias [V]},
  sop [H, 2]
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax import sharding
from bertjax.models import bert
from bertjax.models import layers
from bertjax.models import sizes

Dtype = Any

SHARING_MODES = ("all", "attention", "ffn", "none")


def _small_norm(dtype: Dtype, name: str | None = None,
                eps: float = layers.LAYER_NORM_EPS) -> nn.LayerNorm:
  """LayerNorm over the E-sized embedding space (left unsharded: E is small)."""
  return nn.LayerNorm(
      epsilon=eps, dtype=dtype, param_dtype=jnp.float32,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                              (None,)),
      bias_init=layers.zeros_init(None), name=name)


class FactorizedEmbeddings(bert.BertEmbeddings):
  """Word + position + segment embeddings of size E, LayerNorm, then E -> H.

  BERT's embeddings (``bert.BertEmbeddings``: same tables, names and tied
  ``attend``) at width E instead of H, with a LayerNorm over E and a final
  E -> H projection.

  Attributes:
    vocab_size, max_position_embeddings, type_vocab_size: table rows.
    hidden_size: H.
    dropout_rate: dropout on the normalised embeddings.
    dtype: compute dtype.
    embedding_size: E.
  """
  embedding_size: int = 128

  def setup(self):
    super().setup()
    self.projection = nn.Dense(
        self.hidden_size, dtype=self.dtype, param_dtype=jnp.float32,
        kernel_init=layers.kernel_init(None, "embed"),
        bias_init=layers.zeros_init("embed"), name="projection")

  def _table_width(self) -> tuple[int, str | None]:
    # E is small: the tables are split along the vocabulary only.
    return self.embedding_size, None

  def _norm(self) -> nn.Module:
    return _small_norm(self.dtype, "layer_norm", self.layer_norm_eps)

  def __call__(self, tokens: jax.Array, segment_ids: jax.Array,
               positions: jax.Array, deterministic: bool) -> jax.Array:
    """Embeds int32 [batch, length] ids into [batch, length, H] (dtype)."""
    return self.projection(
        super().__call__(tokens, segment_ids, positions, deterministic))


class SharedEncoder(nn.Module):
  """L post-LayerNorm BERT layers whose sublayers may share weights.

  Attributes:
    num_layers: L, the number of layer applications.
    num_heads, mlp_dim: sublayer sizes.
    layer_sharing: one of SHARING_MODES.
    dropout_rate: dropout on sublayer outputs.
    attention_dropout_rate: dropout on attention probabilities.
    dtype: compute dtype.
    layer_norm_eps, activation: see ``layers.EncoderBlock``.
    attention_impl: the attention kernel (``config.attention_impl``).
  """
  num_layers: int
  num_heads: int
  mlp_dim: int
  layer_sharing: str = "all"
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"
  attention_impl: str = "xla"

  def setup(self):
    # layer_sharing is checked by ``from_config``.
    shared_attention = self.layer_sharing in ("all", "attention")
    shared_mlp = self.layer_sharing in ("all", "ffn")
    num_attention = 1 if shared_attention else self.num_layers
    num_mlp = 1 if shared_mlp else self.num_layers
    # Lists in setup are named attention_0, attention_1, ... by flax.
    self.attention = [
        layers.MultiHeadAttention(
            num_heads=self.num_heads, dropout_rate=self.attention_dropout_rate,
            dtype=self.dtype, impl=self.attention_impl) for _ in range(num_attention)]
    self.attention_norm = [layers.layer_norm(self.dtype, None, self.layer_norm_eps)
                           for _ in range(num_attention)]
    self.mlp = [layers.Mlp(mlp_dim=self.mlp_dim, dtype=self.dtype,
                           activation=self.activation) for _ in range(num_mlp)]
    self.mlp_norm = [layers.layer_norm(self.dtype, None, self.layer_norm_eps)
                     for _ in range(num_mlp)]
    self.dropout = nn.Dropout(rate=self.dropout_rate)

  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool,
               doc_ids: jax.Array | None = None) -> jax.Array:
    """Maps [batch, length, embed] to [batch, length, embed] (``dtype``).

    ``mask`` is bool [batch, 1, length, length] (``layers.doc_attention_mask``
    of ``doc_ids``, which fused attention kernels take instead).
    """
    x = sharding.constrain(x, layers.HIDDEN_AXES)
    for i in range(self.num_layers):
      a = min(i, len(self.attention) - 1)
      m = min(i, len(self.mlp) - 1)
      y = self.attention[a](x, mask, deterministic, doc_ids=doc_ids)
      x = self.attention_norm[a](x + self.dropout(y, deterministic))
      y = self.mlp[m](x)
      x = self.mlp_norm[m](x + self.dropout(y, deterministic))
      x = sharding.constrain(x, layers.HIDDEN_AXES)
    return x


class AlbertMlmHead(nn.Module):
  """dense(H -> E) -> GELU -> LayerNorm(E) -> tied V × E decoder + bias.

  Attributes:
    vocab_size: size of the output bias.
    embedding_size: E.
    dtype: compute dtype.
    layer_norm_eps, activation: as in the encoder.
  """
  vocab_size: int
  embedding_size: int
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"

  @nn.compact
  def __call__(self, x: jax.Array, decode) -> jax.Array:
    """Maps [..., H] to float32 [..., vocab] through ``decode`` ([..., E])."""
    x = nn.Dense(self.embedding_size, dtype=self.dtype, param_dtype=jnp.float32,
                 kernel_init=layers.kernel_init("embed", None),
                 bias_init=layers.zeros_init(None), name="dense")(x)
    x = _small_norm(self.dtype, "layer_norm", self.layer_norm_eps)(
        layers.activation(self.activation)(x))
    bias = self.param("output_bias", layers.zeros_init("vocab"),
                      (self.vocab_size,), jnp.float32)
    return decode(x) + bias


class AlbertForPretraining(nn.Module):
  """ALBERT with its pooler, tied MLM head and sentence-order (SOP) head.

  Attributes:
    vocab_size, max_position_embeddings, type_vocab_size: table sizes.
    embedding_size: E.
    num_layers, hidden_size, num_heads, mlp_dim: a row of sizes.SIZES.
    layer_sharing: one of SHARING_MODES.
    dropout_rate, attention_dropout_rate: as in BERT (ALBERT uses 0).
    dtype: compute dtype (parameters are always float32).
    layer_norm_eps, activation: ``config.layer_norm_eps`` and
      ``config.hidden_act`` (ALBERT v2 checkpoints use 'gelu_new').
    attention_impl: the attention kernel (``config.attention_impl``).
  """
  vocab_size: int
  max_position_embeddings: int
  type_vocab_size: int
  embedding_size: int
  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int
  layer_sharing: str = "all"
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"
  attention_impl: str = "xla"
  # Always built (``models.has_sentence_head``); not a field.
  sentence_head: ClassVar[bool] = True

  def setup(self):
    self.embeddings = FactorizedEmbeddings(
        vocab_size=self.vocab_size, embedding_size=self.embedding_size,
        hidden_size=self.hidden_size,
        max_position_embeddings=self.max_position_embeddings,
        type_vocab_size=self.type_vocab_size, dropout_rate=self.dropout_rate,
        dtype=self.dtype, layer_norm_eps=self.layer_norm_eps)
    self.encoder = SharedEncoder(
        num_layers=self.num_layers, num_heads=self.num_heads,
        mlp_dim=self.mlp_dim, layer_sharing=self.layer_sharing,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
        layer_norm_eps=self.layer_norm_eps, activation=self.activation,
        attention_impl=self.attention_impl)
    self.pooler = nn.Dense(
        self.hidden_size, dtype=self.dtype, param_dtype=jnp.float32,
        kernel_init=layers.kernel_init("embed", None),
        bias_init=layers.zeros_init(None))
    self.mlm_head = AlbertMlmHead(vocab_size=self.vocab_size,
                                  embedding_size=self.embedding_size,
                                  dtype=self.dtype,
                                  layer_norm_eps=self.layer_norm_eps,
                                  activation=self.activation)
    self.sop = nn.Dense(
        2, dtype=jnp.float32, param_dtype=jnp.float32,
        kernel_init=layers.kernel_init("embed", None),
        bias_init=layers.zeros_init(None))

  def __call__(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """Runs the model on tokens, segment_ids, positions, doc_ids (int32
    [batch, length]) and masked_positions (int32 [batch, predictions])."""
    x = self.embeddings(inputs["tokens"], inputs["segment_ids"],
                        inputs["positions"], deterministic)
    mask = layers.doc_attention_mask(inputs["doc_ids"])
    hidden = self.encoder(x, mask, deterministic, inputs["doc_ids"])
    pooled = jnp.tanh(self.pooler(hidden[:, 0]))
    picked = jnp.take_along_axis(
        hidden, inputs["masked_positions"][:, :, None], axis=1)
    return dict(
        mlm_logits=self.mlm_head(picked, self.embeddings.attend),
        nsp_logits=self.sop(pooled),
        hidden=hidden,
        pooled=pooled)


def from_config(config: ml_collections.ConfigDict,
                dtype: Dtype) -> AlbertForPretraining:
  """Builds AlbertForPretraining from a config (see configs/albert.py).

  Args:
    config: uses model_size, vocab_size, embedding_size, layer_sharing,
      max_position_embeddings, type_vocab_size, dropout_rate,
      attention_dropout_rate and seq_len.
    dtype: the compute dtype, already parsed from config.dtype.
  """
  size = sizes.resolve(config)
  if config.layer_sharing not in SHARING_MODES:
    raise ValueError(
        f"Unknown layer_sharing {config.layer_sharing!r}; set "
        f"--config.layer_sharing to one of {', '.join(SHARING_MODES)}.")
  if config.embedding_size < 1:
    raise ValueError(
        f"embedding_size={config.embedding_size} must be positive; set "
        f"--config.embedding_size (ALBERT uses 128).")
  if config.get("seq_len", 0) > config.max_position_embeddings:
    raise ValueError(
        f"seq_len {config.seq_len} exceeds max_position_embeddings "
        f"{config.max_position_embeddings}; lower --config.seq_len or raise "
        f"--config.max_position_embeddings.")
  return AlbertForPretraining(
      vocab_size=config.vocab_size,
      max_position_embeddings=config.max_position_embeddings,
      type_vocab_size=config.type_vocab_size,
      embedding_size=config.embedding_size,
      num_layers=size.num_layers,
      hidden_size=size.hidden_size,
      num_heads=size.num_heads,
      mlp_dim=size.mlp_dim,
      layer_sharing=config.layer_sharing,
      dropout_rate=config.dropout_rate,
      attention_dropout_rate=config.attention_dropout_rate,
      dtype=dtype,
      attention_impl=str(config.get("attention_impl", "auto")),
      **layers.numerics(config))
