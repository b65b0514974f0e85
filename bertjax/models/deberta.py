"""DeBERTa (v2/v3): disentangled attention, relative positions, enhanced mask decoder.

He et al. (2021); the v2/v3 layout that Hugging Face ships as ``DebertaV2``.
What differs from BERT (everything else is BERT's pieces: ``bert.BertEmbeddings``,
``layers.EncoderBlock`` with its feed-forward and post-LayerNorms, the tied
``bert.MlmHead``):

* Attention: ``disentangled.DisentangledAttention`` in every block, with one
  relative position table shared by all layers (``RelativeEmbeddings``,
  LayerNorm'd when ``norm_rel_ebd``), log-bucketed distances.
* No absolute positions inside the encoder (``position_biased_input=False``,
  as every released v2/v3 model; True adds BERT's position table to the
  embeddings, as DeBERTa v1 did).
* Enhanced mask decoder (EMD, section 3.2): the absolute position embeddings
  enter only just before the MLM prediction. With H_{L-1} the output of the
  second-to-last layer, queries start from H_{L-1} + abs_position, and the
  last layer (its weights shared) runs ``emd_layers`` times, each time with
  keys and values H_{L-1} and queries the previous output; the MLM head reads
  the result. The original uses 2. 0 turns EMD off (the MLM head reads H_L,
  as transformers' DebertaV2ForMaskedLM does).
* Embeddings are multiplied by the padding mask after their LayerNorm, as
  transformers does, so padding rows are zeros.

The stack is ``encoder`` (``encoder.Encoder`` of the first L-1 blocks, scanned
with ``scan_layers``) then ``last_layer`` (a block outside it), so that EMD can
run the last block again on other inputs in any layout.

Inputs (see ``bertjax/objectives/base.py``): tokens, segment_ids, positions,
doc_ids int32 [batch, length], masked_positions int32 [batch, predictions].
Outputs: mlm_logits float32 [batch, predictions, vocab]; hidden [batch,
length, embed] (H_L, what DebertaV2Model returns); with ``sentence_head`` also
pooled [batch, embed] and nsp_logits float32 [batch, 2] (the SOP head).

Parameter tree::

  embeddings/{word_embeddings [V, H], type_embeddings [T, H] (if T > 0),
              position_embeddings [P, H] (if EMD or position_biased_input),
              layer_norm [H]}
  relative/{embedding [2S, H], layer_norm [H]}
  encoder/layer_0..L-2/..., last_layer/...   (BERT blocks; attention adds
              pos_key, pos_query [H, heads, kv] unless share_att_key)
  mlm_head/{dense, layer_norm, output_bias [V]}, pooler, sop (sentence_head)
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax import sharding
from bertjax.models import bert
from bertjax.models import disentangled
from bertjax.models import encoder as encoder_lib
from bertjax.models import layers
from bertjax.models import sizes

Dtype = Any

NORM_REL_EBD = ("layer_norm", "none")


class DebertaForPretraining(nn.Module):
  """The DeBERTa encoder with EMD, tied MLM head and optional SOP head.

  Attributes:
    vocab_size, max_position_embeddings, type_vocab_size: table sizes
      (type_vocab_size 0 = no segment table, as DeBERTa-v3).
    num_layers, hidden_size, num_heads, mlp_dim: a row of sizes.SIZES.
    position_buckets: log buckets of relative distances (<= 0: none).
    max_relative_positions: the longest distance told apart (<= 0:
      max_position_embeddings, as transformers).
    position_terms: 'c2p' and/or 'p2c'.
    share_att_key: position projections reuse the content query/key ones.
    norm_rel_ebd: 'layer_norm' or 'none' on the relative table.
    position_biased_input: add absolute positions to the embeddings.
    emd_layers: passes of the enhanced mask decoder (0 = off).
    sentence_head: build the pooler and SOP head.
    dropout_rate, attention_dropout_rate, dtype, scan_layers, remat,
    layer_norm_eps, activation: as ``bert.BertForPretraining``.
  """
  vocab_size: int
  max_position_embeddings: int
  type_vocab_size: int
  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int
  position_buckets: int = 256
  max_relative_positions: int = -1
  position_terms: tuple[str, ...] = disentangled.POSITION_TERMS
  share_att_key: bool = True
  norm_rel_ebd: str = "layer_norm"
  position_biased_input: bool = False
  emd_layers: int = 2
  sentence_head: bool = False
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  scan_layers: bool = False
  remat: str = "none"
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"

  @property
  def max_distance(self) -> int:
    return _max_distance(self)

  def setup(self):
    self.embeddings = bert.BertEmbeddings(
        vocab_size=self.vocab_size, hidden_size=self.hidden_size,
        max_position_embeddings=self.max_position_embeddings,
        type_vocab_size=self.type_vocab_size, dropout_rate=self.dropout_rate,
        dtype=self.dtype, layer_norm_eps=self.layer_norm_eps,
        add_positions=self.position_biased_input)
    self.relative, encoder, self.last_layer = _stack_modules(
        self, self.hidden_size, self.num_heads, self.mlp_dim, self.num_layers)
    if encoder is not None:
      self.encoder = encoder
    self.mlm_head = bert.MlmHead(vocab_size=self.vocab_size, dtype=self.dtype,
                                 layer_norm_eps=self.layer_norm_eps,
                                 activation=self.activation)
    if self.sentence_head:
      self.pooler = nn.Dense(
          self.hidden_size, dtype=self.dtype, param_dtype=jnp.float32,
          kernel_init=layers.kernel_init("embed", None),
          bias_init=layers.zeros_init(None))
      self.sop = nn.Dense(
          2, dtype=jnp.float32, param_dtype=jnp.float32,
          kernel_init=layers.kernel_init("embed", None),
          bias_init=layers.zeros_init(None))

  def relative_context(self, length: int) -> dict[str, jax.Array]:
    """What every layer's attention shares (``relative_context``)."""
    return relative_context(self.relative, length, self.position_terms,
                            self.position_buckets, self.max_distance)

  def __call__(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """Runs the model; see the module docstring for inputs and outputs."""
    doc_ids = inputs["doc_ids"]
    x = self.embeddings(inputs["tokens"], inputs["segment_ids"],
                        inputs["positions"], deterministic)
    x = x * (doc_ids != 0)[..., None].astype(x.dtype)
    mask = layers.doc_attention_mask(doc_ids)
    context = self.relative_context(x.shape[1])
    before_last = self.encoder(x, mask, deterministic, context) if (
        self.num_layers > 1) else x
    hidden = self.last_layer(before_last, mask, deterministic, context)
    hidden = sharding.constrain(hidden, layers.HIDDEN_AXES)
    decoded = hidden
    if self.emd_layers > 0:
      absolute = self.embeddings.position_embeddings(inputs["positions"])
      decoded = before_last + absolute.astype(before_last.dtype)
      for _ in range(self.emd_layers):
        decoded = self.last_layer(before_last, mask, deterministic,
                                  dict(context, query=decoded))
    picked = jnp.take_along_axis(
        decoded, inputs["masked_positions"][:, :, None], axis=1)
    outputs = dict(mlm_logits=self.mlm_head(picked, self.embeddings.attend),
                   hidden=hidden)
    if self.sentence_head:
      outputs["pooled"] = jnp.tanh(self.pooler(hidden[:, 0]))
      outputs["nsp_logits"] = self.sop(outputs["pooled"])
    return outputs


def relative_context(relative: nn.Module, length: int,
                     terms: tuple[str, ...], buckets: int,
                     max_distance: int) -> dict[str, jax.Array]:
  """The relative table rows a row of ``length`` reads (``relative``: a bound
  ``disentangled.RelativeEmbeddings``) and the [length, length] distance
  index into them; {} without position terms."""
  if not terms:
    return {}
  span = disentangled.table_span(buckets, max_distance)
  index, lo = disentangled.relative_index(length, span, buckets, max_distance)
  hi = lo + int(index.max()) + 1
  return {"relative": relative(lo, hi), "relative_index": jnp.asarray(index)}


def _max_distance(module) -> int:
  """``max_relative_positions``, defaulted as transformers does."""
  if module.max_relative_positions > 0:
    return module.max_relative_positions
  return module.max_position_embeddings


def _stack_modules(module, hidden_size: int, num_heads: int, mlp_dim: int,
                   num_layers: int):
  """The shared relative table, the first L-1 blocks (None for L = 1) and the
  last block of a disentangled stack, from ``module``'s attention fields
  (``DebertaForPretraining`` and ``DisentangledStack`` alike); returned
  unbound, to be assigned in ``module.setup``."""
  relative = disentangled.RelativeEmbeddings(
      span=disentangled.table_span(module.position_buckets, _max_distance(module)),
      hidden_size=hidden_size, normalize=module.norm_rel_ebd == "layer_norm",
      dtype=module.dtype, layer_norm_eps=module.layer_norm_eps)
  attention = functools.partial(
      disentangled.DisentangledAttention, position_terms=module.position_terms,
      share_att_key=module.share_att_key, position_dropout_rate=module.dropout_rate)
  block = dict(num_heads=num_heads, mlp_dim=mlp_dim, dropout_rate=module.dropout_rate,
               attention_dropout_rate=module.attention_dropout_rate,
               dtype=module.dtype, attention_cls=attention,
               layer_norm_eps=module.layer_norm_eps, activation=module.activation)
  encoder = (encoder_lib.Encoder(num_layers=num_layers - 1, scan_layers=module.scan_layers,
                                 remat=module.remat, **block)
             if num_layers > 1 else None)
  return relative, encoder, layers.EncoderBlock(**block)


class DisentangledStack(nn.Module):
  """DeBERTa's encoder alone, for models that bring their own embeddings and
  heads (ELECTRA-style pretraining with DeBERTa encoders, DeBERTa-v3):
  the relative table shared by the layers, then the L blocks with
  disentangled attention. Parameters are laid out as in
  ``DebertaForPretraining`` (``relative``, ``encoder/layer_0..L-2``,
  ``last_layer``), so that its Hugging Face rules apply under a prefix.

  Attributes:
    size: the sizes.Size of the stack.
    max_position_embeddings, position_buckets, max_relative_positions,
    position_terms, share_att_key, norm_rel_ebd, dropout_rate,
    attention_dropout_rate, dtype, layer_norm_eps, activation, scan_layers,
    remat: as ``DebertaForPretraining``.
  """
  size: sizes.Size
  max_position_embeddings: int
  position_buckets: int = 256
  max_relative_positions: int = -1
  position_terms: tuple[str, ...] = disentangled.POSITION_TERMS
  share_att_key: bool = True
  norm_rel_ebd: str = "layer_norm"
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"
  scan_layers: bool = False
  remat: str = "none"

  @property
  def max_distance(self) -> int:
    return _max_distance(self)

  def setup(self):
    self.relative, encoder, self.last_layer = _stack_modules(
        self, self.size.hidden_size, self.size.num_heads, self.size.mlp_dim,
        self.size.num_layers)
    if encoder is not None:
      self.encoder = encoder

  def __call__(self, x: jax.Array, mask: jax.Array,
               deterministic: bool) -> jax.Array:
    """[batch, length, H] embeddings -> [batch, length, H] (``dtype``)."""
    context = relative_context(self.relative, x.shape[1], self.position_terms,
                               self.position_buckets, self.max_distance)
    if self.size.num_layers > 1:
      x = self.encoder(x, mask, deterministic, context)
    return self.last_layer(x, mask, deterministic, context)


def stack_options(config: Any) -> tuple[tuple[str, Any], ...]:
  """``DisentangledStack``'s attention fields of a config (ConfigDict or
  mapping), as hashable (name, value) pairs; checks them first."""
  check_fields(config)
  get = config.get
  return (("max_position_embeddings", int(config["max_position_embeddings"])),
          ("position_buckets", int(get("position_buckets", 256))),
          ("max_relative_positions", int(get("max_relative_positions", -1))),
          ("position_terms", position_terms(get("pos_att_type", "p2c|c2p"))),
          ("share_att_key", bool(get("share_att_key", True))),
          ("norm_rel_ebd", str(get("norm_rel_ebd", "layer_norm"))))


def position_terms(value: Any) -> tuple[str, ...]:
  """'p2c|c2p' (or a list, as transformers' config holds it) -> ('c2p', 'p2c').

  Raises:
    ValueError: for a term other than c2p and p2c.
  """
  if value is None:
    items = []
  elif isinstance(value, str):
    items = [t for t in value.lower().replace(",", "|").split("|") if t.strip()]
  else:
    items = list(value)
  items = [str(t).strip().lower() for t in items]
  bad = [t for t in items if t not in disentangled.POSITION_TERMS]
  if bad:
    raise ValueError(
        f"pos_att_type has {bad}, which bertjax does not compute; use c2p, p2c "
        "or 'p2c|c2p' (--config.pos_att_type).")
  return tuple(t for t in disentangled.POSITION_TERMS if t in items)


def reads_absolute_positions(fields: Mapping[str, Any], emd: bool = True) -> bool:
  """Whether the model reads its absolute position table (and so cannot take
  rows longer than ``max_position_embeddings``): with ``position_biased_input``
  or, where ``emd``, an enhanced mask decoder (``emd_layers`` > 0). Relative
  distances past ``max_relative_positions`` share its bucket, so they bound
  nothing."""
  return (bool(fields.get("position_biased_input", False))
          or (emd and int(fields.get("emd_layers", 2)) > 0))


def check_fields(fields: Mapping[str, Any]) -> None:
  """Checks DeBERTa's own fields (config or mapping dict).

  Raises:
    ValueError: one sentence naming the field and the fix.
  """
  value = fields.get("pos_att_type", "p2c|c2p")
  if not position_terms(value):
    # Without c2p or p2c the relative attention is gone (and with it, unless
    # position_biased_input, every position signal); export has nothing to map.
    raise ValueError(
        f"pos_att_type={value!r} names no position term, which bertjax's DeBERTa "
        "needs for its relative attention; set --config.pos_att_type=c2p, p2c "
        "or 'p2c|c2p'.")
  norm = str(fields.get("norm_rel_ebd", "layer_norm"))
  if norm not in NORM_REL_EBD:
    raise ValueError(f"norm_rel_ebd={norm!r} is not one of {', '.join(NORM_REL_EBD)}; "
                     "fix --config.norm_rel_ebd.")
  emd = int(fields.get("emd_layers", 0))
  if emd < 0:
    raise ValueError(f"emd_layers={emd} must not be negative; fix --config.emd_layers "
                     "(0 turns the enhanced mask decoder off).")
  buckets = int(fields.get("position_buckets", -1))
  max_rel = int(fields.get("max_relative_positions", -1))
  # -1 (transformers' default) and 0 both mean "off" / "the default".
  if buckets < -1:
    raise ValueError(
        f"config.position_buckets={buckets} is invalid: it must be 0 or -1 (no "
        "buckets: one table row per distance up to max_relative_positions) or "
        "at least 4; set --config.position_buckets=0 or e.g. 256.")
  if max_rel < -1:
    raise ValueError(
        f"config.max_relative_positions={max_rel} is invalid: it must be -1 or "
        "0 (max_position_embeddings) or a positive distance; set "
        "--config.max_relative_positions=-1 or e.g. 512.")
  if max_rel <= 0:
    max_rel = int(fields["max_position_embeddings"])
  if buckets > 0 and (buckets < 4 or max_rel - 1 <= buckets // 2):
    raise ValueError(
        f"position_buckets={buckets} needs at least 4 buckets and "
        f"max_relative_positions ({max_rel}) above position_buckets / 2 + 1; "
        "raise --config.max_relative_positions or set --config.position_buckets=0.")


def from_config(config: ml_collections.ConfigDict,
                dtype: Dtype) -> DebertaForPretraining:
  """Builds DebertaForPretraining from a config (see configs/deberta.py).

  Args:
    config: a ConfigDict or a plain mapping (an import's model fields):
      BERT's model fields (``bert.from_config``) plus position_buckets,
      max_relative_positions, pos_att_type, share_att_key, norm_rel_ebd,
      position_biased_input, emd_layers and sentence_head.
    dtype: the compute dtype, already parsed from config.dtype.
  """
  size = sizes.resolve(config)
  check_fields(config)
  get = config.get
  if (get("seq_len", 0) > config["max_position_embeddings"]
      and reads_absolute_positions(config)):
    raise ValueError(
        f"seq_len {config['seq_len']} exceeds max_position_embeddings "
        f"{config['max_position_embeddings']}; lower --config.seq_len or raise "
        f"--config.max_position_embeddings.")
  return DebertaForPretraining(
      vocab_size=int(config["vocab_size"]),
      max_position_embeddings=int(config["max_position_embeddings"]),
      type_vocab_size=int(config["type_vocab_size"]),
      num_layers=size.num_layers,
      hidden_size=size.hidden_size,
      num_heads=size.num_heads,
      mlp_dim=size.mlp_dim,
      position_buckets=int(get("position_buckets", 256)),
      max_relative_positions=int(get("max_relative_positions", -1)),
      position_terms=position_terms(get("pos_att_type", "p2c|c2p")),
      share_att_key=bool(get("share_att_key", True)),
      norm_rel_ebd=str(get("norm_rel_ebd", "layer_norm")),
      position_biased_input=bool(get("position_biased_input", False)),
      emd_layers=int(get("emd_layers", 2)),
      sentence_head=bool(get("sentence_head", False)),
      dropout_rate=float(config["dropout_rate"]),
      attention_dropout_rate=float(config["attention_dropout_rate"]),
      dtype=dtype,
      scan_layers=bool(get("scan_layers", False)),
      remat=str(get("remat", "none")),
      **layers.numerics(config))
