"""BERT <-> Hugging Face ``BertForPreTraining`` (model_type 'bert').

The whole architecture-specific part of conversion: config fields, tensor
rules, the special tokens, and how to build the bertjax module. A new
architecture copies this file's shape (see ``bertjax/convert/__init__.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.convert import rules as R
from bertjax.models import bert as bert_model
from bertjax.models import layers

MODEL_TYPE = "bert"  # HF config.json model_type
BERTJAX_MODEL = "bert"  # config.model of bertjax
HF_ARCHITECTURE = "BertForPreTraining"
# A bertjax BERT without the sentence head (configs/roberta.py's
# sentence_head=False) has no pooler or NSP parameters to export.
HF_ARCHITECTURE_MLM_ONLY = "BertForMaskedLM"
# Keys of the encoder start with this in the pretraining/MLM classes; a bare
# BertModel checkpoint has the same keys without it.
BASE_PREFIX = "bert."
# HF tensors that carry no parameter of their own: a buffer and the tied decoder.
IGNORED = ("bert.embeddings.position_ids", "cls.predictions.decoder.weight",
           "cls.predictions.decoder.bias")
# Default token strings of [PAD], [UNK], [CLS], [SEP], [MASK].
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# HF config key -> bertjax config field, for every BERT-family config.json
# (DeBERTa's as is; ALBERT and ELECTRA add embedding_size).
HF_FIELDS = {
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_heads",
    "intermediate_size": "mlp_dim",
    "hidden_dropout_prob": "dropout_rate",
    "attention_probs_dropout_prob": "attention_dropout_rate",
}


def model_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """bertjax config fields of an HF BERT config.json.

  Raises:
    ValueError: where the HF model computes something bertjax's BERT does not
      (an activation outside ``layers.ACTIVATIONS``, relative positions).
      LayerNorm epsilon and activation become the config fields
      ``layer_norm_eps`` and ``hidden_act``.
  """
  numerics = hf_numerics(hf_config, default_act="gelu")
  kind = hf_config.get("position_embedding_type", "absolute")
  if kind != "absolute":
    raise ValueError(
        f"config.json has position_embedding_type={kind!r}; bertjax's BERT "
        "has learned absolute positions only.")
  missing = [k for k in HF_FIELDS if k not in hf_config]
  if missing:
    raise ValueError(f"config.json lacks {missing}; is it a BERT config?")
  fields = {ours: hf_config[theirs] for theirs, ours in HF_FIELDS.items()}
  fields["model"] = BERTJAX_MODEL
  fields.update(numerics)
  return fields


def hf_numerics(hf_config: Mapping[str, Any], *, default_act: str) -> dict[str, Any]:
  """``layer_norm_eps`` and ``hidden_act`` of an HF config.json, as bertjax fields.

  Raises:
    ValueError: for an activation bertjax does not compute
      (``layers.ACTIVATIONS``).
  """
  act = str(hf_config.get("hidden_act", default_act))
  if act not in layers.ACTIVATIONS:
    raise ValueError(
        f"config.json has hidden_act={act!r}, which bertjax does not compute; "
        f"only {', '.join(layers.ACTIVATIONS)} convert with numerical parity.")
  return {"layer_norm_eps": float(hf_config.get("layer_norm_eps",
                                                layers.LAYER_NORM_EPS)),
          "hidden_act": act}


def _sentence_head(config: Mapping[str, Any]) -> bool:
  return bool(config.get("sentence_head", True))


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of a bertjax BERT config (with explicit dimensions)."""
  out = {theirs: config[ours] for theirs, ours in HF_FIELDS.items()}
  numerics = layers.numerics(config)
  architecture = HF_ARCHITECTURE if _sentence_head(config) else HF_ARCHITECTURE_MLM_ONLY
  out.update(
      model_type=MODEL_TYPE, architectures=[architecture],
      hidden_act=numerics["activation"],
      layer_norm_eps=numerics["layer_norm_eps"],
      initializer_range=layers.KERNEL_STDDEV,
      position_embedding_type="absolute", pad_token_id=int(pad_token_id))
  return out


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """Every tensor of ``BertForPreTraining`` (``BertForMaskedLM`` without the
  sentence head) and where it lives in bertjax."""
  out = [
      R.embedding("bert.embeddings.word_embeddings", ("embeddings", "word_embeddings"),
                  vocab=True),
      R.embedding("bert.embeddings.position_embeddings",
                  ("embeddings", "position_embeddings")),
      R.embedding("bert.embeddings.token_type_embeddings",
                  ("embeddings", "type_embeddings")),
      *R.layer_norm("bert.embeddings.LayerNorm", ("embeddings", "layer_norm")),
  ]
  for i in range(config["num_layers"]):
    hf, ours = f"bert.encoder.layer.{i}", ("encoder", f"layer_{i}")
    for name in ("query", "key", "value"):
      out += R.linear(f"{hf}.attention.self.{name}", ours + ("attention", name))
    out += R.linear(f"{hf}.attention.output.dense", ours + ("attention", "out"),
                    in_axes=2)
    out += R.layer_norm(f"{hf}.attention.output.LayerNorm", ours + ("attention_norm",))
    out += R.linear(f"{hf}.intermediate.dense", ours + ("mlp", "wi"))
    out += R.linear(f"{hf}.output.dense", ours + ("mlp", "wo"))
    out += R.layer_norm(f"{hf}.output.LayerNorm", ours + ("mlp_norm",))
  out += R.linear("cls.predictions.transform.dense", ("mlm_head", "dense"), head="mlm")
  out += R.layer_norm("cls.predictions.transform.LayerNorm", ("mlm_head", "layer_norm"),
                      head="mlm")
  out.append(R.Rule("cls.predictions.bias", ("mlm_head", "output_bias"), vocab=True,
                    head="mlm"))
  if _sentence_head(config):
    out += R.linear("bert.pooler.dense", ("pooler",), head="pooler")
    out += R.linear("cls.seq_relationship", ("nsp",), head="nsp")
  return out


def build_model(config: Mapping[str, Any], dtype: Any) -> bert_model.BertForPretraining:
  """The bertjax module for explicit dimensions (num_layers, hidden_size, ...)."""
  return bert_model.BertForPretraining(
      vocab_size=config["vocab_size"],
      max_position_embeddings=config["max_position_embeddings"],
      type_vocab_size=config["type_vocab_size"], num_layers=config["num_layers"],
      hidden_size=config["hidden_size"], num_heads=config["num_heads"],
      mlp_dim=config["mlp_dim"], dropout_rate=config["dropout_rate"],
      attention_dropout_rate=config["attention_dropout_rate"], dtype=dtype,
      sentence_head=_sentence_head(config), **layers.numerics(config))
