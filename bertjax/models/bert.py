"""BERT for pretraining: embeddings, encoder stack, pooler, MLM and NSP heads.

Inputs (a dict; see ``bertjax/objectives/base.py``):
  tokens, segment_ids, positions, doc_ids   int32 [batch, length]
  masked_positions                          int32 [batch, predictions]
  attention_mask (optional)                 bool [batch, length, length]
      an objective's own mask (UniLM), combined with the documents' mask

Outputs (a dict):
  mlm_logits  float32 [batch, predictions, vocab]  only at masked_positions
  nsp_logits  float32 [batch, 2]
  hidden      [batch, length, embed]  (compute dtype) last encoder layer
  pooled      [batch, embed]          (compute dtype) tanh(dense(hidden[:, 0]))
With ``sentence_head=False`` (RoBERTa: MLM only) the pooler and NSP head are
not built, so no parameter goes untrained, and only mlm_logits and hidden
are returned.

With ``sparse_last_layer`` (pretraining; ``config.sparse_last_layer``) the
last encoder layer computes only the rows the heads read, [CLS] and the
masked positions: its keys and values still come from every row, but its
queries, output projection and feed-forward run at about 1 + 15% of the
rows. The logits are those of the full model (to float rounding), and
``hidden`` is not returned. Fine-tuning, ``bertjax.api`` and the converters
build the model without it.

The MLM decoder is tied to the word embeddings: logits = transform(h) @ E.T + b.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax.models import encoder as encoder_lib
from bertjax.models import layers
from bertjax.models import sizes

Dtype = Any


class BertEmbeddings(nn.Module):
  """Token + learned position + segment embeddings, LayerNorm, dropout.

  Attributes:
    vocab_size: rows of the word table (logical axis 'vocab').
    hidden_size: embedding width (logical axis 'embed').
    max_position_embeddings: rows of the position table ('position').
    type_vocab_size: rows of the segment table ('type').
      0 = no segment table (DeBERTa-v3 has none).
    dropout_rate: dropout on the summed, normalised embeddings.
    dtype: compute dtype.
    layer_norm_eps: epsilon of the LayerNorm.
    add_positions: add the position table to the sum (BERT). DeBERTa's
      encoder has no absolute positions (False); its enhanced mask decoder
      reads the table through ``position_embeddings`` instead, and a table
      nothing reads is never created.
  """
  vocab_size: int
  hidden_size: int
  max_position_embeddings: int
  type_vocab_size: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  add_positions: bool = True

  def setup(self):
    width, width_axis = self._table_width()

    def table(rows: int, row_axis: str, name: str) -> nn.Embed:
      return nn.Embed(
          num_embeddings=rows, features=width, dtype=self.dtype,
          param_dtype=jnp.float32,
          embedding_init=layers.kernel_init(row_axis, width_axis), name=name)

    self.word_embeddings = table(self.vocab_size, "vocab", "word_embeddings")
    self.position_embeddings = table(
        self.max_position_embeddings, "position", "position_embeddings")
    if self.type_vocab_size:
      self.type_embeddings = table(self.type_vocab_size, "type",
                                   "type_embeddings")
    self.layer_norm = self._norm()
    self.dropout = nn.Dropout(rate=self.dropout_rate)

  def _table_width(self) -> tuple[int, str | None]:
    """Width of the three tables and its logical axis (ALBERT overrides)."""
    return self.hidden_size, "embed"

  def _norm(self) -> nn.Module:
    """The LayerNorm over the summed embeddings (ALBERT overrides)."""
    return layers.layer_norm(self.dtype, "layer_norm", self.layer_norm_eps)

  def __call__(self, tokens: jax.Array, segment_ids: jax.Array,
               positions: jax.Array, deterministic: bool,
               word_delta: jax.Array | None = None) -> jax.Array:
    """Embeds int32 [batch, length] ids into [batch, length, embed] (dtype).

    ``word_delta`` (float32 [vocab, width]), when given, is added to the word
    table read through ``stop_gradient``: gradient-disentangled sharing
    (DeBERTa-v3), where this caller's loss trains only the delta.
    """
    x = layers.embed_rows(self.word_embeddings, tokens, self.dtype)
    if word_delta is not None:
      x = jax.lax.stop_gradient(x) + jnp.take(word_delta, tokens, axis=0).astype(x.dtype)
    if self.add_positions:
      x = x + _one_hot_lookup(self.position_embeddings, positions, self.dtype)
    if self.type_vocab_size:
      x = x + _one_hot_lookup(self.type_embeddings, segment_ids, self.dtype)
    x = self.layer_norm(x)
    return self.dropout(x, deterministic)

  def attend(self, x: jax.Array) -> jax.Array:
    """Scores [..., embed] against every word embedding: float32 [..., vocab]."""
    table = self.word_embeddings.embedding.astype(self.dtype)
    return jnp.einsum("...e,ve->...v", x.astype(self.dtype), table,
                      preferred_element_type=jnp.float32)


class MlmHead(nn.Module):
  """Masked-LM head: dense(H) -> GELU -> LayerNorm -> tied decoder + bias.

  Attributes:
    vocab_size: size of the output bias (logical axis 'vocab').
    dtype: compute dtype.
    layer_norm_eps: epsilon of the LayerNorm.
    activation: a key of ``layers.ACTIVATIONS``.
  """
  vocab_size: int
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"

  @nn.compact
  def __call__(self, x: jax.Array,
               decode: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Scores hidden states against the vocabulary.

    Args:
      x: [..., embed] hidden states at the predicted positions.
      decode: the tied decoder, [..., embed] -> float32 [..., vocab]
        (``BertEmbeddings.attend``).

    Returns:
      float32 [..., vocab] logits.
    """
    # A square [embed, embed] kernel: naming both axes 'embed' would map two
    # dimensions to one mesh axis, so the output axis stays unsharded.
    x = nn.Dense(x.shape[-1], dtype=self.dtype, param_dtype=jnp.float32,
                 kernel_init=layers.kernel_init("embed", None),
                 bias_init=layers.zeros_init(None), name="dense")(x)
    x = layers.activation(self.activation)(x)
    x = layers.layer_norm(self.dtype, "layer_norm", self.layer_norm_eps)(x)
    bias = self.param("output_bias", layers.zeros_init("vocab"),
                      (self.vocab_size,), jnp.float32)
    return decode(x) + bias


class BertForPretraining(nn.Module):
  """The BERT encoder with its pooler, tied MLM head and NSP head.

  Attributes:
    vocab_size, max_position_embeddings, type_vocab_size: table sizes.
    num_layers, hidden_size, num_heads, mlp_dim: a row of sizes.SIZES.
    dropout_rate: dropout on embeddings and sublayer outputs.
    attention_dropout_rate: dropout on attention probabilities.
    dtype: compute dtype (parameters are always float32).
    sentence_head: build the pooler and the two-way sentence (NSP) head.
    scan_layers, remat: see ``encoder.Encoder``.
    layer_norm_eps: epsilon of every LayerNorm (BERT 1e-12, RoBERTa 1e-5).
    activation: feed-forward and MLM-head activation, a key of
      ``layers.ACTIVATIONS`` (``config.hidden_act``; BERT: exact 'gelu').
    attention_impl: the attention kernel (``config.attention_impl``), a name
      of ``attention.IMPLS``; 'auto' picks per platform.
    sparse_last_layer: the last layer computes only [CLS] and the masked
      positions (module docstring), scanned or not (``encoder.Encoder``).
  """
  vocab_size: int
  max_position_embeddings: int
  type_vocab_size: int
  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  sentence_head: bool = True
  scan_layers: bool = False
  remat: str = "none"
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"
  attention_impl: str = "auto"
  sparse_last_layer: bool = False

  def setup(self):
    self.embeddings = BertEmbeddings(
        vocab_size=self.vocab_size, hidden_size=self.hidden_size,
        max_position_embeddings=self.max_position_embeddings,
        type_vocab_size=self.type_vocab_size, dropout_rate=self.dropout_rate,
        dtype=self.dtype, layer_norm_eps=self.layer_norm_eps)
    self.encoder = encoder_lib.Encoder(
        num_layers=self.num_layers, num_heads=self.num_heads,
        mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
        layer_norm_eps=self.layer_norm_eps, activation=self.activation,
        scan_layers=self.scan_layers, remat=self.remat,
        attention_cls=functools.partial(layers.MultiHeadAttention,
                                        impl=self.attention_impl))
    self.mlm_head = MlmHead(vocab_size=self.vocab_size, dtype=self.dtype,
                            layer_norm_eps=self.layer_norm_eps,
                            activation=self.activation)
    if not self.sentence_head:
      return
    self.pooler = nn.Dense(
        self.hidden_size, dtype=self.dtype, param_dtype=jnp.float32,
        kernel_init=layers.kernel_init("embed", None),
        bias_init=layers.zeros_init(None))
    # Two logits: a float32 head is cheap and keeps the loss input exact.
    self.nsp = nn.Dense(
        2, dtype=jnp.float32, param_dtype=jnp.float32,
        kernel_init=layers.kernel_init("embed", None),
        bias_init=layers.zeros_init(None))

  def __call__(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """Runs the model; see the module docstring for inputs and outputs.

    Args:
      inputs: dict with tokens, segment_ids, positions, doc_ids (int32
        [batch, length]) and masked_positions (int32 [batch, predictions]).
      deterministic: disables dropout; when False the caller passes
        ``rngs={'dropout': key}`` to ``apply``.
    """
    x = self.embeddings(inputs["tokens"], inputs["segment_ids"],
                        inputs["positions"], deterministic)
    mask = layers.combine_masks(inputs["doc_ids"], inputs.get("attention_mask"))
    # A document-only mask also travels as segment ids, which fused kernels
    # (splash) take instead of the [length, length] mask.
    context = (None if inputs.get("attention_mask") is not None
               else {"doc_ids": inputs["doc_ids"]})
    masked_positions = inputs["masked_positions"]
    if self.sparse_last_layer:
      return self._heads_at_rows(x, mask, deterministic, context, masked_positions)
    hidden = self.encoder(x, mask, deterministic, context)
    outputs = dict(mlm_logits=self.mlm_logits(hidden, masked_positions),
                   hidden=hidden)
    if self.sentence_head:
      outputs.update(self._sentence_logits(hidden[:, 0]))
    return outputs

  def _heads_at_rows(self, x, mask, deterministic, context,
                     masked_positions) -> dict[str, jax.Array]:
    """The heads' outputs with the last layer at [CLS] (row 0, when there is
    a sentence head) and the masked positions only (``sparse_last_layer``)."""
    first = int(self.sentence_head)
    rows = masked_positions
    if first:
      rows = jnp.concatenate([jnp.zeros_like(rows[:, :1]), rows], axis=1)
    hidden = self.encoder(x, mask, deterministic, context, query_rows=rows)
    outputs = dict(mlm_logits=self.mlm_head(hidden[:, first:],
                                            self.embeddings.attend))
    if first:
      outputs.update(self._sentence_logits(hidden[:, 0]))
    return outputs

  def _sentence_logits(self, first_token: jax.Array) -> dict[str, jax.Array]:
    """``pooled`` and ``nsp_logits`` from the [CLS] row [batch, embed]."""
    pooled = jnp.tanh(self.pooler(first_token))
    return dict(pooled=pooled, nsp_logits=self.nsp(pooled))

  def mlm_logits(self, hidden: jax.Array,
                 masked_positions: jax.Array) -> jax.Array:
    """Tied MLM logits at the chosen positions only.

    Gathering first keeps the [.., vocab] product at predictions (about 15%
    of the tokens) instead of the whole sequence.

    Args:
      hidden: [batch, length, embed] encoder output.
      masked_positions: int32 [batch, predictions] indices into length.

    Returns:
      float32 [batch, predictions, vocab].
    """
    x = jnp.take_along_axis(hidden, masked_positions[:, :, None], axis=1)
    return self.mlm_head(x, self.embeddings.attend)


def from_config(config: ml_collections.ConfigDict,
                dtype: Dtype) -> BertForPretraining:
  """Builds BertForPretraining from a config (see configs/bert.py).

  Args:
    config: uses model_size, vocab_size, max_position_embeddings,
      type_vocab_size, dropout_rate, attention_dropout_rate and, when present,
      seq_len (checked against max_position_embeddings), sentence_head
      (default True), layer_norm_eps and hidden_act (``layers.numerics``).
    dtype: the compute dtype, already parsed from config.dtype.
  """
  size = sizes.resolve(config)
  seq_len = config.get("seq_len", 0)
  if seq_len > config.max_position_embeddings:
    raise ValueError(
        f"seq_len {seq_len} exceeds max_position_embeddings "
        f"{config.max_position_embeddings}; lower --config.seq_len or raise "
        f"--config.max_position_embeddings.")
  return BertForPretraining(
      vocab_size=config.vocab_size,
      max_position_embeddings=config.max_position_embeddings,
      type_vocab_size=config.type_vocab_size,
      num_layers=size.num_layers,
      hidden_size=size.hidden_size,
      num_heads=size.num_heads,
      mlp_dim=size.mlp_dim,
      dropout_rate=config.dropout_rate,
      attention_dropout_rate=config.attention_dropout_rate,
      dtype=dtype,
      sentence_head=bool(config.get("sentence_head", True)),
      scan_layers=bool(config.get("scan_layers", False)),
      remat=str(config.get("remat", "none")),
      attention_impl=str(config.get("attention_impl", "auto")),
      sparse_last_layer=bool(config.get("sparse_last_layer", False)),
      **layers.numerics(config))


# Name scope of the small tables' one-hot gradient matmul (_rows_bwd).
TABLE_GRAD_SCOPE = "embedding_table_grad"


def _one_hot_lookup(table: nn.Embed, ids: jax.Array, dtype: Dtype) -> jax.Array:
  """Rows ``ids`` of a small table (positions, segments) in ``dtype``, whose
  gradient is a one-hot matmul instead of a scatter-add.

  Every row of the batch adds into the same few table rows (2 segment rows,
  ``seq_len`` position rows), and XLA's GPU scatter-add serialises those
  colliding adds: on an H100 the two scatters took 75 ms of BERT-base's
  110 ms step (batch 32 x 512, bf16). The forward pass stays a gather (exact,
  no FLOPs); the backward pass is ``one_hot(ids)^T @ g``, accumulated in
  float32 whatever the compute dtype. The word table keeps its scatter, in
  float32 (``layers.embed_rows``): a one-hot over the vocabulary would cost
  real FLOPs.
  """
  return _rows_with_matmul_grad(table.embedding, ids, jnp.dtype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rows_with_matmul_grad(table: jax.Array, ids: jax.Array, dtype) -> jax.Array:
  return jnp.take(table, ids, axis=0).astype(dtype)


def _rows_fwd(table, ids, dtype):
  # An empty [rows, 0] array carries the table's row count and dtype.
  like = jnp.zeros((table.shape[0], 0), table.dtype)
  return _rows_with_matmul_grad(table, ids, dtype), (ids, like)


def _rows_bwd(dtype, residuals, g):
  ids, like = residuals
  # Named: a lookup's gradient, not model FLOPs (bertjax/flops.py leaves it out).
  with jax.named_scope(TABLE_GRAD_SCOPE):
    one_hot = jax.nn.one_hot(ids, like.shape[0], dtype=g.dtype)
    d_table = jnp.einsum("...r,...h->rh", one_hot, g,
                         preferred_element_type=jnp.float32)
  return d_table.astype(like.dtype), None


_rows_with_matmul_grad.defvjp(_rows_fwd, _rows_bwd)
