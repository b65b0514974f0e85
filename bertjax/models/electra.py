"""ELECTRA: a small generator and a discriminator sharing their embeddings.

Clark et al. (2020). Two BERT encoders (``encoder.Encoder``, post-LayerNorm)
composed in one module, so that one params tree, one optimizer state and one
checkpoint hold both:

* Shared embeddings: word, position and segment tables of width E
  (``embedding_size``) and their LayerNorm (``bert.BertEmbeddings`` at width
  E), as the original code shares its ``embeddings`` scope. Each tower has
  its own E -> H projection when E differs from its hidden size (Hugging
  Face's ``embeddings_project``) and its own embedding dropout, so the two
  towers never draw the same dropout mask.
* Generator (``generate``): a narrower encoder and a masked-LM head tied to
  the shared word table (``albert.AlbertMlmHead``: dense H_g -> E, exact GELU,
  LayerNorm over E, E x V decoder + bias). Outputs ``mlm_logits`` float32
  [batch, predictions, vocab] at ``masked_positions`` only.
* Discriminator (``__call__``): the full-size encoder and a per-token head
  dense(H, H) -> activation -> dense(H, 1). Outputs ``hidden`` [batch, length,
  H] (what ``bertjax.load(...).encode`` and fine-tuning read) and
  ``rtd_logits`` float32 [batch, length] (> 0: "replaced").

The sampling between the two calls is the objective's business
(``bertjax/objectives/electra.py``): models never sample.

Parameter tree::

  embeddings/{word_embeddings [V, E], position_embeddings [P, E],
              type_embeddings [T, E], layer_norm [E]}
  generator/{projection [E, H_g] (if E != H_g), encoder/layer_i/...,
             mlm_head/{dense [H_g, E], layer_norm [E], output_bias [V]}}
  discriminator/{projection [E, H] (if E != H), encoder/layer_i/...,
                 head_dense [H, H], head_prediction [H, 1]}
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax.models import albert
from bertjax.models import bert
from bertjax.models import deberta
from bertjax.models import encoder as encoder_lib
from bertjax.models import layers
from bertjax.models import sizes

Dtype = Any

# The encoder stacks a tower can be built from (``encoder`` config field).
ENCODERS = ("bert", "deberta")


def generator_size(config: Any) -> sizes.Size:
  """The generator's encoder size for a config (mapping or ConfigDict).

  The width: explicit ``generator_hidden_size, generator_num_heads,
  generator_mlp_dim`` (all > 0; what an import from Hugging Face records)
  win, and ``generator_hidden_fraction`` is then unused. Otherwise the
  fraction scales the discriminator's head count, rounded (at least 1),
  keeping its head width, as the original code does (heads = hidden // 64):
  a fraction of 1/3 of a 1024-wide, 16-head encoder gives 5 heads of 64,
  hidden 320, instead of an indivisible 341; the feed-forward size scales
  with the hidden size. The depth: ``generator_num_layers`` when > 0 (set
  alone or with the width; DeBERTa-v3's half depth), else the
  discriminator's.

  Raises:
    ValueError: for a fraction outside (0, 1], a negative size, an explicit
      width given only in part, wider or deeper than the discriminator, or
      a hidden size the heads do not divide.
  """
  disc = sizes.resolve(config)
  explicit = ("generator_num_layers", "generator_hidden_size",
              "generator_num_heads", "generator_mlp_dim")
  width = explicit[1:]
  values = {f: int(config.get(f) or 0) for f in explicit}
  set_ = [f for f in width if values[f]]
  if any(v < 0 for v in values.values()) or 0 < len(set_) < len(width):
    given = ", ".join(f"{f}={v}" for f, v in values.items())
    raise ValueError(
        f"The explicit generator sizes ({given}) must be all positive or all 0 "
        "(generator_num_layers may also be set alone); set "
        f"--config.{' --config.'.join(f'{f}=...' for f in width)} together, or "
        "all to 0 to size the generator's width by "
        "--config.generator_hidden_fraction.")
  # As the fraction's (0, 1]: the generator is at most the discriminator's
  # size. Explicit sizes are fixed when a config is written, so another
  # --config.model_size could leave a generator far larger than the
  # discriminator it trains.
  if set_ and values["generator_hidden_size"] % values["generator_num_heads"]:
    raise ValueError(
        f"generator_hidden_size={values['generator_hidden_size']} is not "
        f"divisible by generator_num_heads={values['generator_num_heads']}; "
        "set --config.generator_num_heads to a divisor of it.")
  for field, disc_field in (("generator_hidden_size", "hidden_size"),
                            ("generator_num_layers", "num_layers")):
    if values[field] > getattr(disc, disc_field):
      raise ValueError(
          f"{field}={values[field]} is larger than the discriminator's "
          f"{disc_field}={getattr(disc, disc_field)}; ELECTRA's generator is "
          f"at most the discriminator's size: set --config.{field} to at "
          f"most {getattr(disc, disc_field)} (or to 0 to size it by the "
          "discriminator and --config.generator_hidden_fraction).")
  depth = values["generator_num_layers"] or disc.num_layers
  if set_:
    return sizes.Size(depth, *(values[f] for f in width))
  fraction = float(config.get("generator_hidden_fraction", 0.25))
  if not 0.0 < fraction <= 1.0:
    raise ValueError(
        f"generator_hidden_fraction={fraction} must lie in (0, 1]; fix "
        f"--config.generator_hidden_fraction (ELECTRA uses 1/4 or 1/3).")
  heads = max(1, round(disc.num_heads * fraction))
  hidden = heads * (disc.hidden_size // disc.num_heads)
  return sizes.Size(num_layers=depth, hidden_size=hidden, num_heads=heads,
                    mlp_dim=disc.mlp_dim * hidden // disc.hidden_size)


class Tower(nn.Module):
  """Embedding dropout, E -> H projection (when E != H) and an encoder stack.

  Attributes:
    embedding_size: E, the width of the shared embeddings.
    size: the encoder's sizes.Size.
    dropout_rate, attention_dropout_rate, dtype, layer_norm_eps, activation,
    scan_layers, remat: as in ``encoder.Encoder``.
    encoder_kind: one of ``ENCODERS``: BERT blocks (``encoder.Encoder``) or
      DeBERTa's (``deberta.DisentangledStack``).
    attention_impl: the BERT blocks' attention kernel (``config.attention_impl``;
      DeBERTa's disentangled attention is always XLA's).
    stack_options: (name, value) pairs for the DeBERTa stack
      (``deberta.stack_options``); empty for BERT.
  """
  embedding_size: int
  size: sizes.Size
  encoder_kind: str = "bert"
  stack_options: tuple[tuple[str, Any], ...] = ()
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"
  scan_layers: bool = False
  remat: str = "none"
  attention_impl: str = "xla"

  def setup(self):
    self.dropout = nn.Dropout(rate=self.dropout_rate)
    if self.embedding_size != self.size.hidden_size:
      self.projection = nn.Dense(
          self.size.hidden_size, dtype=self.dtype, param_dtype=jnp.float32,
          kernel_init=layers.kernel_init(None, "embed"),
          bias_init=layers.zeros_init("embed"))
    self.encoder = self._stack()

  def _stack(self) -> nn.Module:
    """The encoder stack of ``encoder_kind``; both map [batch, length, H]
    to [batch, length, H] given the attention mask."""
    common = dict(dropout_rate=self.dropout_rate,
                  attention_dropout_rate=self.attention_dropout_rate,
                  dtype=self.dtype, layer_norm_eps=self.layer_norm_eps,
                  activation=self.activation, scan_layers=self.scan_layers,
                  remat=self.remat)
    if self.encoder_kind == "deberta":
      return deberta.DisentangledStack(size=self.size, **dict(self.stack_options),
                                       **common)
    return encoder_lib.Encoder(num_layers=self.size.num_layers,
                               num_heads=self.size.num_heads,
                               mlp_dim=self.size.mlp_dim, **common,
                               attention_cls=functools.partial(
                                   layers.MultiHeadAttention, impl=self.attention_impl))

  def __call__(self, embedded: jax.Array, mask: jax.Array,
               deterministic: bool, doc_ids: jax.Array | None = None) -> jax.Array:
    """[batch, length, E] shared embeddings -> [batch, length, H]; ``doc_ids``
    (the documents ``mask`` was made of) go to fused attention kernels."""
    x = self.dropout(embedded, deterministic)
    if self.embedding_size != self.size.hidden_size:
      x = self.projection(x)
    if self.encoder_kind == "deberta" or doc_ids is None:
      return self.encoder(x, mask, deterministic)
    return self.encoder(x, mask, deterministic, {"doc_ids": doc_ids})


class Generator(Tower):
  """The generator tower with its masked-LM head tied to the shared table.

  Attributes:
    vocab_size: size of the head's output bias.
  """
  vocab_size: int = 0

  def setup(self):
    super().setup()
    # Exact GELU whatever hidden_act says: Hugging Face's ELECTRA generator
    # head hard-codes it (and every released ELECTRA uses 'gelu' anyway).
    self.mlm_head = albert.AlbertMlmHead(
        vocab_size=self.vocab_size, embedding_size=self.embedding_size,
        dtype=self.dtype, layer_norm_eps=self.layer_norm_eps,
        activation="gelu")

  def logits(self, picked: jax.Array, decode) -> jax.Array:
    """[batch, predictions, H_g] -> float32 [batch, predictions, vocab]."""
    return self.mlm_head(picked, decode)


class Discriminator(Tower):
  """The discriminator tower with its per-token head: dense(H, H) ->
  activation -> dense(H, 1)."""

  def setup(self):
    super().setup()
    self.head_dense = nn.Dense(
        self.size.hidden_size, dtype=self.dtype, param_dtype=jnp.float32,
        kernel_init=layers.kernel_init("embed", None),
        bias_init=layers.zeros_init(None))
    # One float32 logit: cheap, and the loss reads it exactly.
    self.head_prediction = nn.Dense(
        1, dtype=jnp.float32, param_dtype=jnp.float32,
        kernel_init=layers.kernel_init("embed", None),
        bias_init=layers.zeros_init(None))

  def logits(self, hidden: jax.Array) -> jax.Array:
    """[batch, length, H] -> float32 [batch, length]."""
    x = layers.activation(self.activation)(self.head_dense(hidden))
    return self.head_prediction(x)[..., 0]


class ElectraForPretraining(nn.Module):
  """Generator + discriminator with shared embeddings (module docstring).

  Attributes:
    vocab_size, max_position_embeddings, type_vocab_size: table sizes.
    embedding_size: E.
    discriminator, generator: their encoders' sizes.Size.
    dropout_rate, attention_dropout_rate: as in BERT.
    dtype: compute dtype (parameters are always float32).
    layer_norm_eps, activation, scan_layers, remat: as in BERT.
    encoder: one of ``ENCODERS`` for both towers; stack_options and
      attention_impl as ``Tower``.
    add_positions: add the absolute position table to the shared embeddings
      (BERT's encoder; DeBERTa's has relative positions only).
    gdes: gradient-disentangled embedding sharing (DeBERTa-v3): the
      discriminator reads stop_gradient(word table) + a delta table
      (``discriminator_word_delta`` [V, E], zeros at init), so that its loss
      trains the delta and never the generator's table.
  """
  vocab_size: int
  max_position_embeddings: int
  type_vocab_size: int
  embedding_size: int
  discriminator: sizes.Size
  generator: sizes.Size
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"
  scan_layers: bool = False
  remat: str = "none"
  encoder: str = "bert"
  stack_options: tuple[tuple[str, Any], ...] = ()
  add_positions: bool = True
  gdes: bool = False
  attention_impl: str = "xla"

  def setup(self):
    # Dropout lives in each tower (see the module docstring), not here.
    self.embeddings = bert.BertEmbeddings(
        vocab_size=self.vocab_size, hidden_size=self.embedding_size,
        max_position_embeddings=self.max_position_embeddings,
        type_vocab_size=self.type_vocab_size, dropout_rate=0.0,
        dtype=self.dtype, layer_norm_eps=self.layer_norm_eps,
        add_positions=self.add_positions)
    if self.gdes:
      self.word_delta = self.param(
          "discriminator_word_delta",
          nn.with_logical_partitioning(nn.initializers.zeros, ("vocab", "embed")),
          (self.vocab_size, self.embedding_size), jnp.float32)
    tower = dict(embedding_size=self.embedding_size,
                 encoder_kind=self.encoder, stack_options=self.stack_options,
                 dropout_rate=self.dropout_rate,
                 attention_dropout_rate=self.attention_dropout_rate,
                 dtype=self.dtype, layer_norm_eps=self.layer_norm_eps,
                 activation=self.activation, scan_layers=self.scan_layers,
                 remat=self.remat, attention_impl=self.attention_impl)
    self.generator_tower = Generator(size=self.generator,
                                     vocab_size=self.vocab_size,
                                     name="generator", **tower)
    self.discriminator_tower = Discriminator(size=self.discriminator,
                                             name="discriminator", **tower)

  def _embed(self, inputs: Mapping[str, jax.Array],
             word_delta: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    x = self.embeddings(inputs["tokens"], inputs["segment_ids"],
                        inputs["positions"], True, word_delta=word_delta)
    if self.encoder == "deberta":  # padding rows are zeros, as in DeBERTa
      x = x * (inputs["doc_ids"] != 0)[..., None].astype(x.dtype)
    return x, layers.doc_attention_mask(inputs["doc_ids"])

  def __call__(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """The discriminator on tokens, segment_ids, positions, doc_ids (int32
    [batch, length]): ``hidden`` [batch, length, H] and ``rtd_logits``
    float32 [batch, length]. At init it runs the generator too, so that one
    ``init`` creates both networks."""
    if self.is_initializing():
      self.generate(inputs, deterministic)
    x, mask = self._embed(inputs, self.word_delta if self.gdes else None)
    hidden = self.discriminator_tower(x, mask, deterministic, inputs["doc_ids"])
    return {"hidden": hidden,
            "rtd_logits": self.discriminator_tower.logits(hidden)}

  def generate(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """The generator: ``mlm_logits`` float32 [batch, predictions, vocab] at
    ``masked_positions`` (int32 [batch, predictions]) and ``hidden``
    [batch, length, H_g]."""
    x, mask = self._embed(inputs)
    hidden = self.generator_tower(x, mask, deterministic, inputs["doc_ids"])
    picked = jnp.take_along_axis(
        hidden, inputs["masked_positions"][:, :, None], axis=1)
    return {"mlm_logits": self.generator_tower.logits(
                picked, self.embeddings.attend),
            "hidden": hidden}


def from_config(config: ml_collections.ConfigDict,
                dtype: Dtype) -> ElectraForPretraining:
  """Builds ElectraForPretraining from a config (see configs/electra.py).

  Args:
    config: uses model_size (or explicit sizes), embedding_size, the
      generator fields (``generator_size``), vocab_size,
      max_position_embeddings, type_vocab_size, dropout rates, seq_len,
      layer_norm_eps, hidden_act, scan_layers, remat and attention_impl.
    dtype: the compute dtype, already parsed from config.dtype.
  """
  embedding_size = int(config.get("embedding_size", 0))
  if embedding_size < 1:
    raise ValueError(
        f"embedding_size={embedding_size} must be positive; set "
        f"--config.embedding_size (ELECTRA-small uses 128).")
  fields = encoder_fields(config)
  if (config.get("seq_len", 0) > config.max_position_embeddings
      and fields["add_positions"]):
    raise ValueError(
        f"seq_len {config.seq_len} exceeds max_position_embeddings "
        f"{config.max_position_embeddings}; lower --config.seq_len or raise "
        f"--config.max_position_embeddings.")
  return ElectraForPretraining(
      **fields,
      vocab_size=config.vocab_size,
      max_position_embeddings=config.max_position_embeddings,
      type_vocab_size=config.type_vocab_size,
      embedding_size=embedding_size,
      discriminator=sizes.resolve(config),
      generator=generator_size(config),
      dropout_rate=config.dropout_rate,
      attention_dropout_rate=config.attention_dropout_rate,
      dtype=dtype,
      scan_layers=bool(config.get("scan_layers", False)),
      remat=str(config.get("remat", "none")),
      attention_impl=str(config.get("attention_impl", "auto")),
      **layers.numerics(config))


def encoder_fields(config: Any) -> dict[str, Any]:
  """ElectraForPretraining's encoder attributes of a config (ConfigDict or
  mapping): ``encoder``, DeBERTa's ``stack_options``, ``add_positions`` and
  ``gdes``.

  Raises:
    ValueError: for an unknown encoder, GDES with BERT encoders, or a DeBERTa
      field out of range (``deberta.check_fields``).
  """
  kind = str(config.get("encoder", "bert"))
  if kind not in ENCODERS:
    raise ValueError(f"encoder={kind!r} is not one of {', '.join(ENCODERS)}; "
                     "fix --config.encoder.")
  gdes = bool(config.get("gdes", False))
  deberta_kind = kind == "deberta"
  return dict(
      encoder=kind,
      stack_options=deberta.stack_options(config) if deberta_kind else (),
      add_positions=(bool(config.get("position_biased_input", False))
                     if deberta_kind else True),
      gdes=gdes)
