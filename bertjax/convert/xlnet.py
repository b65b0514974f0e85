"""XLNet <-> Hugging Face ``XLNetLMHeadModel`` (model_type 'xlnet').

bertjax's XLNet (bertjax/models/xlnet.py) is transformers' XLNet with
bidirectional attention (``attn_type='bi'``): the same relative attention
(q, k, v, r, o [d_model, heads, d_head]; r_w/r_r/r_s biases and seg_embed per
layer), the post-LayerNorm feed-forward, ``mask_emb`` and the LM head tied to
the word embeddings (``lm_loss.weight`` is the word table; its bias is
``lm_bias``). Every tensor maps by a plain reshape, so the round trip is
bit-identical. A bare ``XLNetModel`` (keys without ``transformer.``) imports
with a fresh LM bias.

XLNet has no absolute positions and no segment table: the import records
``max_position_embeddings`` 512 (the length the released models were trained
at; it only bounds ``seq_len``) and ``type_vocab_size`` 2 (segments only
compare equal or different).

Refused on import, with the reason: ``attn_type='uni'``, ``bi_data`` (the
forward/backward batch halves) and an activation bertjax does not compute.
``mem_len`` travels both ways: an import with ``mem_len`` > 0 trains with
that segment memory and therefore with the ``stream`` layout it needs; an
export writes the config's ``mem_len`` (None for 0, transformers' "no
memory"). Run with ``mems``, transformers' XLNetModel computes what bertjax
does with the same memory (``tests/test_xlnet_memory.py``).
The tokenizer is XLNet's sentencepiece model (``spiece.model``); its
``<pad> <unk> <cls> <sep> <mask>`` take bertjax's five special ids.
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.convert import rules as R
from bertjax.models import layers
from bertjax.models import xlnet as xlnet_model

MODEL_TYPE = "xlnet"
BERTJAX_MODEL = "xlnet"
HF_ARCHITECTURE = "XLNetLMHeadModel"
BASE_PREFIX = "transformer."
# The tied decoder's weight is the word table.
IGNORED = ("lm_loss.weight",)
SPECIAL_TOKENS = ("<pad>", "<unk>", "<cls>", "<sep>", "<mask>")
# What the import records for the config fields XLNet does not have.
MAX_POSITIONS = 512
TYPE_VOCAB_SIZE = 2

_FIELDS = {
    "vocab_size": "vocab_size",
    "n_layer": "num_layers",
    "d_model": "hidden_size",
    "n_head": "num_heads",
    "d_inner": "mlp_dim",
    "dropout": "dropout_rate",
}


def model_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """bertjax config fields of an HF XLNet config.json.

  Raises:
    ValueError: for an option bertjax does not compute (module docstring).
  """
  missing = [k for k in _FIELDS if k not in hf_config]
  if missing:
    raise ValueError(f"config.json lacks {missing}; is it an XLNet config?")
  act = str(hf_config.get("ff_activation", "gelu"))
  if act not in layers.ACTIVATIONS:
    raise ValueError(
        f"config.json has ff_activation={act!r}, which bertjax does not compute; "
        f"only {', '.join(layers.ACTIVATIONS)} convert with numerical parity.")
  if hf_config.get("attn_type", "bi") != "bi":
    raise ValueError(
        f"config.json has attn_type={hf_config.get('attn_type')!r}; bertjax's "
        "XLNet computes bidirectional attention ('bi') only.")
  if hf_config.get("bi_data", False):
    raise ValueError("config.json has bi_data=true (forward and backward batch "
                     "halves), which bertjax's XLNet does not compute.")
  fields = {ours: hf_config[theirs] for theirs, ours in _FIELDS.items()}
  fields.update(
      model=BERTJAX_MODEL, hf_model_type=MODEL_TYPE,
      max_position_embeddings=MAX_POSITIONS, type_vocab_size=TYPE_VOCAB_SIZE,
      attention_dropout_rate=fields["dropout_rate"],
      clamp_len=int(hf_config.get("clamp_len", -1) or -1),
      mem_len=int(hf_config.get("mem_len") or 0),
      hidden_act=act,
      layer_norm_eps=float(hf_config.get("layer_norm_eps", layers.LAYER_NORM_EPS)))
  if fields["mem_len"]:
    fields["layout"] = "stream"  # the memory continues each row's text
  return fields


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of a bertjax XLNet config (explicit dimensions)."""
  out = {theirs: config[ours] for theirs, ours in _FIELDS.items()}
  numerics = layers.numerics(config)
  out.update(
      model_type=MODEL_TYPE, architectures=[HF_ARCHITECTURE],
      ff_activation=numerics["activation"],
      layer_norm_eps=numerics["layer_norm_eps"],
      initializer_range=layers.KERNEL_STDDEV, attn_type="bi", bi_data=False,
      clamp_len=int(config.get("clamp_len", -1)),
      mem_len=int(config.get("mem_len", 0) or 0) or None,
      d_head=int(config["hidden_size"]) // int(config["num_heads"]),
      pad_token_id=int(pad_token_id))
  return out


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """Every tensor of ``XLNetLMHeadModel`` and where it lives in bertjax."""
  out = [R.Rule("transformer.word_embedding.weight", ("word_embeddings", "embedding"),
                hf_ndim=2, vocab=True),
         R.Rule("transformer.mask_emb", ("mask_emb",), hf_ndim=3)]
  for i in range(int(config["num_layers"])):
    hf, ours = f"transformer.layer.{i}", (f"layer_{i}",)
    att = ours + ("attention",)
    for theirs, name in (("q", "query"), ("k", "key"), ("v", "value"),
                         ("r", "relative")):
      out.append(R.Rule(f"{hf}.rel_attn.{theirs}", att + (name, "kernel"), hf_ndim=3))
    out.append(R.Rule(f"{hf}.rel_attn.o", att + ("out",), hf_ndim=3))
    for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
      out.append(R.Rule(f"{hf}.rel_attn.{name}", att + (name,), hf_ndim=2))
    out.append(R.Rule(f"{hf}.rel_attn.seg_embed", att + ("seg_embed",), hf_ndim=3))
    out += R.layer_norm(f"{hf}.rel_attn.layer_norm", ours + ("attention_norm",))
    out += R.linear(f"{hf}.ff.layer_1", ours + ("mlp", "wi"))
    out += R.linear(f"{hf}.ff.layer_2", ours + ("mlp", "wo"))
    out += R.layer_norm(f"{hf}.ff.layer_norm", ours + ("mlp_norm",))
  out.append(R.Rule("lm_loss.bias", ("lm_bias",), vocab=True, head="mlm"))
  return out


def build_model(config: Mapping[str, Any], dtype: Any) -> xlnet_model.XLNetForPretraining:
  """The bertjax module for explicit dimensions (num_layers, hidden_size, ...)."""
  return xlnet_model.from_config(config, dtype)
