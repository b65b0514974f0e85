"""XLNet: two-stream self-attention over Transformer-XL relative positions.

Yang et al. (2019), the architecture Hugging Face ships as ``XLNetModel`` /
``XLNetLMHeadModel`` (bidirectional attention, ``attn_type='bi'``). What
differs from BERT (the feed-forward, post-LayerNorms and word table are
BERT's pieces from ``layers``):

* No absolute positions and no segment table. Every layer scores a query i
  against a key j by content, by relative position and by relative segment:
  ``(q_i + r_w)·k_j + (q_i + r_r)·R(i - j) W_r + (q_i + r_s)·s_ij``, scaled
  by 1/sqrt(head_dim), where R(d) is the sinusoid of the distance
  d = i - j (``relative_table``), W_r the layer's position projection and
  s_ij the layer's ``seg_embed`` row 0 (same segment) or 1 (different).
  The biases r_w, r_r, r_s [heads, kv] are per layer. Projections have no
  bias, as the original.
* Two streams (section 2.3). The content stream h starts from the word
  embeddings and sees itself and the tokens earlier in the factorization
  order; the query stream g starts, at every predicted slot, from one learned
  vector ``mask_emb`` and sees only the earlier tokens, never its own. Both
  streams use every layer's weights; g reads keys and values of h. The
  order arrives as the model input ``perm_visible``: bool [batch, length,
  length], True where token i may read token j (j precedes i in the order).
  The objective builds it (bertjax/objectives/xlnet.py); the model ANDs it
  with the document mask of ``doc_ids``, so packed documents never see each
  other.
* Predictions come from g at the slots ``masked_positions`` (XLNet's target
  mapping as indices: one row per slot, int32 [batch, P]) through the output
  embedding tied to the input one, plus a bias (no transform, unlike BERT's
  MLM head).

Without ``perm_visible`` only the content stream runs, bidirectionally within
each document: fine-tuning and ``bertjax.load(...).encode``; ``mlm_logits``
are then read from h at ``masked_positions``.

* Segment memory (Transformer-XL recurrence, ``mem_len`` = M > 0). With the
  inputs ``memory`` [batch, layers, M, embed] and ``memory_mask`` bool
  [batch, M], layer l's keys and values are (memory[:, l], h): its own input
  over the last M positions of the row's previous segment, then the row.
  Relative distances run over both (key j of M + length, query i at M + i);
  memory positions count as segment 0 and are stop-gradient. Every query of
  both streams may read every memory position whose mask is True (XLNet
  does not reset the memory at a document boundary; the mask is False only
  before the first segment and on padding). The output ``memory`` is the next
  segment's: per layer the last M of (memory, this segment's input to the
  layer), as transformers' ``cache_mem``. Without ``memory`` in the inputs
  the model runs without memory. The train step carries it
  (``carry_shapes``, state.TrainState.carry).

Inputs: tokens, segment_ids, positions (unused: positions are relative),
doc_ids int32 [batch, length]; optional masked_positions int32 [batch, P];
optional perm_visible bool [batch, length, length]; optional memory float32
[batch, layers, M, embed] with memory_mask bool [batch, M].
Outputs: hidden [batch, length, embed] (content stream of the last layer,
what XLNetModel returns without target mapping); mlm_logits float32
[batch, P, vocab] when masked_positions is given; with memory, the next
memory and memory_mask.

Parameter tree::

  word_embeddings/embedding [V, H]     mask_emb [H]     lm_bias [V]
  layer_i/attention/{query,key,value,relative}/kernel [H, heads, kv]
  layer_i/attention/out [H, heads, kv]
  layer_i/attention/{r_w_bias, r_r_bias, r_s_bias} [heads, kv], seg_embed [2, heads, kv]
  layer_i/{attention_norm, mlp/{wi, wo}, mlp_norm}

Not built: ``bi_data`` and ``reuse_len``; see the README's XLNet section.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bertjax import sharding
from bertjax.models import encoder as encoder_lib
from bertjax.models import layers
from bertjax.models import sizes

Dtype = Any


def relative_table(length: int, hidden_size: int, clamp_len: int = -1,
                   memory_len: int = 0) -> jax.Array:
  """Sinusoids of the relative distances a row of ``length`` tokens needs,
  after ``memory_len`` positions of memory (keys: K = memory_len + length).

  Row r holds distance d = (K - 1) - r, so rows 0 .. K+length-2 run from
  K-1 (the last token reading the oldest memory slot) down to -(length-1);
  ``relative_index`` points into it. A distance beyond ``clamp_len`` (> 0)
  reads as ``clamp_len``.

  Returns:
    float32 [K + length - 1, hidden_size]: [sin(d f), cos(d f)] with
    f_k = 1 / 10000^(2k / hidden_size).
  """
  distance = jnp.arange(memory_len + length - 1, -length, -1, dtype=jnp.float32)
  if clamp_len > 0:
    distance = jnp.clip(distance, -clamp_len, clamp_len)
  inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, hidden_size, 2, dtype=jnp.float32)
                                / hidden_size))
  angle = distance[:, None] * inv_freq[None, :]
  return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


def relative_index(query_positions: jax.Array, length: int,
                   memory_len: int = 0) -> jax.Array:
  """Row of ``relative_table`` for each (query, key) pair.

  Args:
    query_positions: int32 [batch, Q], the query's index i in the row.
    length: tokens in the row (without memory).
    memory_len: M; key j = 0 .. M + length - 1 counts the memory first, so
      query i sits at key index M + i.

  Returns:
    int32 [batch, Q, M + length]: (K - 1) - (M + i - j) = (length - 1) - i + j.
  """
  keys = jnp.arange(memory_len + length, dtype=jnp.int32)
  return (length - 1) - query_positions[:, :, None] + keys[None, None, :]


def stream_masks(doc_ids: jax.Array,
                 perm_visible: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
  """Which keys each stream's queries may read.

  Args:
    doc_ids: int32 [batch, length]; 0 on padding.
    perm_visible: bool [batch, length, length] or None; True where token j
      precedes token i in the factorization order.

  Returns:
    (content bool [batch, length, length]: same document, a real key, and
    with an order, j before i or j == i; query bool [batch, length, length]
    or None: same document, real key, j before i).
  """
  visible = layers.doc_attention_mask(doc_ids)[:, 0]
  if perm_visible is None:
    return visible, None
  query = visible & perm_visible
  itself = visible & jnp.eye(doc_ids.shape[1], dtype=bool)[None]
  return query | itself, query


class TwoStreamAttention(nn.Module):
  """XLNet's relative multi-head attention, for one or both streams.

  Attributes:
    num_heads: heads; the hidden size must be divisible by it.
    dropout_rate: dropout on the attention probabilities.
    dtype: compute dtype.
  """
  num_heads: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, h: jax.Array, streams: list[dict[str, jax.Array]],
               table: jax.Array, segment_ids: jax.Array,
               deterministic: bool) -> list[jax.Array]:
    """Attends each stream's queries over the content stream ``h``.

    Args:
      h: [batch, K, embed] keys and values: the memory (M positions, the
        layer's input in the previous segment) then the content stream of
        the row's ``length`` tokens; K = M + length (M = 0 without memory).
      streams: per stream a dict: ``x`` [batch, Q, embed] the queries' hidden
        states, ``positions`` int32 [batch, Q] their index in the row
        (0 .. length-1), ``mask`` bool [batch, Q, K] (True = may attend).
      table: float32 [K + length - 1, embed] (``relative_table``).
      segment_ids: int32 [batch, length] of the row's tokens; memory
        positions count as segment 0 (as transformers' XLNetModel).
      deterministic: disables dropout.

    Returns:
      per stream [batch, Q, embed]: the attention output after the output
      projection (no residual, no LayerNorm).
    """
    hidden = h.shape[-1]
    if hidden % self.num_heads:
      raise ValueError(
          f"Hidden size {hidden} is not divisible by num_heads "
          f"{self.num_heads}; pick a size row whose hidden_size is a multiple.")
    head_dim = hidden // self.num_heads

    def projection(name: str) -> nn.DenseGeneral:
      return nn.DenseGeneral(
          features=(self.num_heads, head_dim), use_bias=False, dtype=self.dtype,
          param_dtype=jnp.float32,
          kernel_init=layers.kernel_init("embed", "heads", "kv"),
          dot_general=layers.gathered("embed", "heads"), name=name)

    def bias(name: str, *shape: int) -> jax.Array:
      axes = (None,) * (len(shape) - 2) + ("heads", "kv")
      return self.param(name, layers.kernel_init(*axes),
                        (*shape, self.num_heads, head_dim), jnp.float32)

    query = projection("query")
    k = projection("key")(h)
    v = projection("value")(h)
    k_rel = projection("relative")(table.astype(self.dtype))
    r_w, r_r, r_s = bias("r_w_bias"), bias("r_r_bias"), bias("r_s_bias")
    seg_embed = bias("seg_embed", 2)
    # [embed, heads, kv], the layout of the original (and of transformers'
    # ``o``), read transposed.
    out = self.param("out", layers.kernel_init("embed", "heads", "kv"),
                     (hidden, self.num_heads, head_dim), jnp.float32)
    length = segment_ids.shape[1]
    memory_len = h.shape[1] - length
    key_segments = jnp.pad(segment_ids, ((0, 0), (memory_len, 0)))
    results = []
    for stream in streams:
      q = query(stream["x"])

      def score(bias_vec, keys, spec):
        return jnp.einsum(spec, q + bias_vec.astype(q.dtype), keys,
                          preferred_element_type=jnp.float32)

      content = score(r_w, k, "bqnd,bknd->bnqk")
      by_distance = score(r_r, k_rel, "bqnd,rnd->bnqr")
      index = relative_index(stream["positions"], length, memory_len)
      position = jnp.take_along_axis(
          by_distance, jnp.broadcast_to(index[:, None], content.shape), axis=-1)
      by_segment = score(r_s, seg_embed, "bqnd,snd->bnqs")
      query_segments = jnp.take_along_axis(segment_ids, stream["positions"], axis=1)
      differ = (query_segments[:, :, None] != key_segments[:, None, :])[:, None]
      segment = jnp.where(differ, by_segment[..., 1:2], by_segment[..., 0:1])
      logits = (content + position + segment) / jnp.sqrt(jnp.float32(head_dim))
      # jnp.where keeps a query with no visible key finite (a uniform
      # average), as layers.attend_values does.
      logits = jnp.where(stream["mask"][:, None], logits,
                         jnp.finfo(jnp.float32).min)
      probs = jax.nn.softmax(logits, axis=-1)
      probs = nn.Dropout(rate=self.dropout_rate)(probs, deterministic)
      mixed = jnp.einsum("bnqk,bknd->bqnd", probs.astype(self.dtype), v)
      results.append(jnp.einsum("bqnd,end->bqe", mixed, out.astype(self.dtype)))
    return results


class TwoStreamBlock(nn.Module):
  """One XLNet layer: relative attention and feed-forward, post-LayerNorm,
  applied with the same weights to the content stream and, when given, the
  query stream.

  Attributes: as ``layers.EncoderBlock`` (num_heads, mlp_dim, dropout_rate,
  attention_dropout_rate, dtype, layer_norm_eps, activation).
  """
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"

  @nn.compact
  def __call__(self, h: jax.Array, g: jax.Array | None,
               context: dict[str, jax.Array],
               deterministic: bool) -> tuple[jax.Array, jax.Array | None]:
    """Maps h [batch, length, embed] and g [batch, P, embed] (or None) to
    their next layer; ``context`` holds table, segment_ids, content_mask,
    with g query_positions and query_mask, and with memory ``memory``
    [batch, M, embed], this layer's (see XLNetForPretraining)."""
    length = h.shape[1]
    streams = [dict(x=h, mask=context["content_mask"], positions=jnp.broadcast_to(
        jnp.arange(length, dtype=jnp.int32), h.shape[:2]))]
    if g is not None:
      streams.append(dict(x=g, mask=context["query_mask"],
                          positions=context["query_positions"]))
    keys = h
    if "memory" in context:
      keys = jnp.concatenate([context["memory"].astype(h.dtype), h], axis=1)
    attended = TwoStreamAttention(
        num_heads=self.num_heads, dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype, name="attention")(
            keys, streams, context["table"], context["segment_ids"], deterministic)
    attention_norm = layers.layer_norm(self.dtype, "attention_norm",
                                       self.layer_norm_eps)
    mlp = layers.Mlp(mlp_dim=self.mlp_dim, dtype=self.dtype,
                     activation=self.activation, name="mlp")
    mlp_norm = layers.layer_norm(self.dtype, "mlp_norm", self.layer_norm_eps)
    dropout = nn.Dropout(rate=self.dropout_rate)
    outputs = []
    for stream, y in zip(streams, attended):
      x = attention_norm(stream["x"] + dropout(y, deterministic))
      x = mlp_norm(x + dropout(mlp(x), deterministic))
      outputs.append(sharding.constrain(x, layers.HIDDEN_AXES))
    return outputs[0], (outputs[1] if g is not None else None)


class XLNetForPretraining(nn.Module):
  """The XLNet encoder with its tied LM head (see the module docstring).

  Attributes:
    vocab_size: rows of the word table.
    num_layers, hidden_size, num_heads, mlp_dim: a row of sizes.SIZES.
    clamp_len: relative distances beyond it read as it (<= 0: no clamp).
    mem_len: M > 0 gives the model a segment memory (``carry_shapes``); 0:
      none.
    dropout_rate: dropout on embeddings, relative table, sublayer outputs
      and the final hidden states.
    attention_dropout_rate: dropout on attention probabilities.
    dtype: compute dtype (parameters are float32).
    remat: 'none' | 'full' | 'dots' (``encoder.REMAT_POLICIES``).
    layer_norm_eps, activation: as ``bert.BertForPretraining``.
  """
  vocab_size: int
  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int
  clamp_len: int = -1
  mem_len: int = 0
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  remat: str = "none"
  layer_norm_eps: float = layers.LAYER_NORM_EPS
  activation: str = "gelu"

  def setup(self):
    self.word_embeddings = nn.Embed(
        num_embeddings=self.vocab_size, features=self.hidden_size,
        dtype=self.dtype, param_dtype=jnp.float32,
        embedding_init=layers.kernel_init("vocab", "embed"),
        name="word_embeddings")
    self.mask_emb = self.param("mask_emb", layers.kernel_init("embed"),
                               (self.hidden_size,), jnp.float32)
    self.lm_bias = self.param("lm_bias", layers.zeros_init("vocab"),
                              (self.vocab_size,), jnp.float32)
    block_cls = TwoStreamBlock
    if self.remat != "none":
      if self.remat not in encoder_lib.REMAT_POLICIES:
        raise ValueError(
            f"Unknown remat policy {self.remat!r}; set --config.remat to one "
            f"of none, {', '.join(encoder_lib.REMAT_POLICIES)}.")
      # deterministic (argument 4, counting self) picks dropout on or off.
      block_cls = nn.remat(TwoStreamBlock,
                           policy=encoder_lib.REMAT_POLICIES[self.remat],
                           static_argnums=(4,))
    self.blocks = [
        block_cls(num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                  dropout_rate=self.dropout_rate,
                  attention_dropout_rate=self.attention_dropout_rate,
                  dtype=self.dtype, layer_norm_eps=self.layer_norm_eps,
                  activation=self.activation, name=f"layer_{i}")
        for i in range(self.num_layers)]
    self.dropout = nn.Dropout(rate=self.dropout_rate)

  def carry_shapes(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The segment memory a train step hands to the next (state.TrainState):
    ``memory`` float32 [batch, layers, M, embed], each layer's input over
    the last M positions, and ``memory_mask`` bool [batch, M], which of them
    held a real token. {} when mem_len is 0."""
    if self.mem_len <= 0:
      return {}
    return {
        "memory": jax.ShapeDtypeStruct(
            (batch_size, self.num_layers, self.mem_len, self.hidden_size),
            jnp.float32),
        "memory_mask": jax.ShapeDtypeStruct((batch_size, self.mem_len), bool),
    }

  def __call__(self, inputs: Mapping[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """Runs the model; see the module docstring for inputs and outputs."""
    tokens = inputs["tokens"]
    length = tokens.shape[1]
    h = self.dropout(
        layers.embed_rows(self.word_embeddings, tokens, self.dtype), deterministic)
    # A no-op unless a 'perturbations' collection is passed: the gradient
    # with respect to the embedded input (the tests' leakage check).
    h = self.perturb("embedded", h)
    content, earlier = stream_masks(inputs["doc_ids"], inputs.get("perm_visible"))
    memory = inputs.get("memory")
    memory_len = 0
    if memory is not None:
      # The previous segment's states are context, never trained through.
      memory = jax.lax.stop_gradient(memory)
      memory_mask = inputs["memory_mask"]
      memory_len = memory.shape[2]
      # Every token of both streams may read every real memory position of
      # its row (XLNet's rule: no reset at document boundaries).
      seen = jnp.broadcast_to(memory_mask[:, None, :],
                              (*content.shape[:2], memory_len))
      content = jnp.concatenate([seen, content], axis=-1)
      if earlier is not None:
        earlier = jnp.concatenate([seen, earlier], axis=-1)
    context = dict(
        table=self.dropout(relative_table(length, self.hidden_size,
                                          self.clamp_len, memory_len),
                           deterministic),
        segment_ids=inputs["segment_ids"], content_mask=content)
    g = None
    two_stream = "perm_visible" in inputs and "masked_positions" in inputs
    if two_stream:
      slots = inputs["masked_positions"]
      context["query_positions"] = slots
      context["query_mask"] = jnp.take_along_axis(earlier, slots[:, :, None],
                                                  axis=1)
      g = jnp.broadcast_to(self.mask_emb.astype(self.dtype),
                           (*slots.shape, self.hidden_size))
      g = self.dropout(g, deterministic)
    layer_inputs = []
    for i, block in enumerate(self.blocks):
      layer_inputs.append(h)
      layer_context = context if memory is None else dict(
          context, memory=memory[:, i])
      h, g = block(h, g, layer_context, deterministic)
    outputs = {"hidden": h}
    if memory is not None:
      outputs.update(next_memory(memory, memory_mask, layer_inputs,
                                 inputs["doc_ids"] > 0))
    if two_stream:
      outputs["mlm_logits"] = self.lm_logits(self.dropout(g, deterministic))
    elif "masked_positions" in inputs:
      picked = jnp.take_along_axis(
          h, inputs["masked_positions"][:, :, None], axis=1)
      outputs["mlm_logits"] = self.lm_logits(self.dropout(picked, deterministic))
    return outputs

  def lm_logits(self, x: jax.Array) -> jax.Array:
    """[..., embed] -> float32 [..., vocab]: tied output embedding + bias."""
    table = self.word_embeddings.embedding.astype(self.dtype)
    logits = jnp.einsum("...e,ve->...v", x.astype(self.dtype), table,
                        preferred_element_type=jnp.float32)
    return logits + self.lm_bias


def next_memory(memory: jax.Array, memory_mask: jax.Array,
                layer_inputs: list[jax.Array],
                real: jax.Array) -> dict[str, jax.Array]:
  """The memory the next segment of each row reads: per layer, the last M of
  (old memory, this segment's inputs to the layer), stop-gradient, as
  Transformer-XL's cache (transformers' ``cache_mem``).

  Args:
    memory: float32 [batch, layers, M, embed]; memory_mask bool [batch, M].
    layer_inputs: per layer [batch, length, embed].
    real: bool [batch, length], tokens that are not padding.

  Returns:
    {"memory": float32 [batch, layers, M, embed], "memory_mask": bool [batch, M]}.
  """
  memory_len = memory.shape[2]
  current = jnp.stack(layer_inputs, axis=1).astype(jnp.float32)
  both = jnp.concatenate([memory, current], axis=2)[:, :, -memory_len:]
  mask = jnp.concatenate([memory_mask, real], axis=1)[:, -memory_len:]
  return {"memory": jax.lax.stop_gradient(both), "memory_mask": mask}


def from_config(config: ml_collections.ConfigDict,
                dtype: Dtype) -> XLNetForPretraining:
  """Builds XLNetForPretraining from a config (see configs/xlnet.py).

  Args:
    config: a ConfigDict or a plain mapping: model_size (or explicit
      num_layers, hidden_size, num_heads, mlp_dim), vocab_size, dropout_rate,
      attention_dropout_rate and, when present, clamp_len, mem_len (the
      segment memory's length, 0 = none), scan_layers (only False), remat,
      layer_norm_eps and hidden_act.
    dtype: the compute dtype, already parsed from config.dtype.

  Raises:
    ValueError: for a feature bertjax's XLNet does not have.
  """
  size = sizes.resolve(config)
  get = config.get
  mem_len = int(get("mem_len", 0) or 0)
  if mem_len < 0:
    raise ValueError(f"mem_len={mem_len} must not be negative; set "
                     "--config.mem_len to 0 (no memory) or a positive length.")
  clamp_len = int(get("clamp_len", -1))
  if clamp_len < -1:
    # -1 and 0 both leave distances unclamped, as transformers' XLNet.
    raise ValueError(
        f"config.clamp_len={clamp_len} is invalid: it must be -1 (or 0: no "
        "clamp) or a positive distance; set --config.clamp_len=-1 or e.g. "
        "--config.clamp_len=512.")
  if bool(get("scan_layers", False)):
    raise ValueError("scan_layers is not supported by the XLNet model yet; "
                     "set --config.scan_layers=False.")
  return XLNetForPretraining(
      vocab_size=int(config["vocab_size"]),
      num_layers=size.num_layers,
      hidden_size=size.hidden_size,
      num_heads=size.num_heads,
      mlp_dim=size.mlp_dim,
      clamp_len=clamp_len,
      mem_len=mem_len,
      dropout_rate=float(config["dropout_rate"]),
      attention_dropout_rate=float(config["attention_dropout_rate"]),
      dtype=dtype,
      remat=str(get("remat", "none")),
      **layers.numerics(config))
