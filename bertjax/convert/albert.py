"""ALBERT <-> Hugging Face ``AlbertForPreTraining`` (model_type 'albert').

bertjax's ALBERT (bertjax/models/albert.py) with ``layer_sharing='all'`` is
HF's ALBERT with one layer group of one layer (``num_hidden_groups=1``,
``inner_group_num=1``, as every released ALBERT): one set of layer weights
applied num_hidden_layers times. Other group settings have no bertjax
counterpart and are refused. The factorized embedding is the V x E tables,
their LayerNorm over E, and ``embedding_hidden_mapping_in`` (E -> H); the MLM
head maps H -> E and is tied to the V x E table; the SOP head reads the
pooler. A bare AlbertModel has the encoder and pooler only;
AlbertForMaskedLM has no pooler or SOP head.
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax import batch as batch_lib
from bertjax.convert import bert as bert_mapping
from bertjax.convert import rules as R
from bertjax.models import albert as albert_model
from bertjax.models import layers

MODEL_TYPE = "albert"
BERTJAX_MODEL = "albert"
HF_ARCHITECTURE = "AlbertForPreTraining"
BASE_PREFIX = "albert."
# A buffer and the tied decoder.
IGNORED = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids",
           "predictions.decoder.weight", "predictions.decoder.bias")
# AlbertTokenizer's defaults, at ids 0..4 of the released sentencepiece models.
SPECIAL_TOKENS = ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")

_FIELDS = {**bert_mapping.HF_FIELDS, "embedding_size": "embedding_size"}
# The one shared layer of HF's single group.
_LAYER = "albert.encoder.albert_layer_groups.0.albert_layers.0"


def model_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """bertjax config fields of an HF ALBERT config.json.

  Raises:
    ValueError: where the HF model computes something bertjax's ALBERT does
      not: other layer groups, activation, LayerNorm epsilon or positions.
  """
  groups = (int(hf_config.get("num_hidden_groups", 1)),
            int(hf_config.get("inner_group_num", 1)))
  if groups != (1, 1):
    raise ValueError(
        f"config.json has num_hidden_groups={groups[0]}, inner_group_num={groups[1]}; "
        "bertjax's ALBERT shares one layer across all layers, so only 1 and 1 convert.")
  numerics = bert_mapping.hf_numerics(hf_config, default_act="gelu_new")
  kind = hf_config.get("position_embedding_type", "absolute")
  if kind != "absolute":
    raise ValueError(
        f"config.json has position_embedding_type={kind!r}; bertjax's ALBERT "
        "has learned absolute positions only.")
  missing = [k for k in _FIELDS if k not in hf_config]
  if missing:
    raise ValueError(f"config.json lacks {missing}; is it an ALBERT config?")
  fields = {ours: hf_config[theirs] for theirs, ours in _FIELDS.items()}
  fields.update(model=BERTJAX_MODEL, layer_sharing="all", **numerics)
  return fields


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of a bertjax ALBERT config (explicit dimensions)."""
  _check_sharing(config)
  special = config.get("hf_special_ids")
  cls_id, sep_id = (special[2], special[3]) if special else (
      batch_lib.CLS_ID, batch_lib.SEP_ID)
  out = {theirs: config[ours] for theirs, ours in _FIELDS.items()}
  numerics = layers.numerics(config)
  out.update(
      model_type=MODEL_TYPE, architectures=[HF_ARCHITECTURE],
      hidden_act=numerics["activation"], num_hidden_groups=1, inner_group_num=1,
      layer_norm_eps=numerics["layer_norm_eps"],
      initializer_range=layers.KERNEL_STDDEV,
      position_embedding_type="absolute", classifier_dropout_prob=config["dropout_rate"],
      pad_token_id=int(pad_token_id), bos_token_id=int(cls_id), eos_token_id=int(sep_id))
  return out


def _check_sharing(config: Mapping[str, Any]) -> None:
  sharing = config.get("layer_sharing", "all")
  if sharing != "all":
    raise ValueError(
        f"This ALBERT has layer_sharing={sharing!r}; Hugging Face's ALBERT "
        "shares whole layers, so only layer_sharing='all' exports.")


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """Every tensor of ``AlbertForPreTraining`` and where it lives in bertjax."""
  _check_sharing(config)
  emb = "albert.embeddings"
  out = [
      R.embedding(f"{emb}.word_embeddings", ("embeddings", "word_embeddings"), vocab=True),
      R.embedding(f"{emb}.position_embeddings", ("embeddings", "position_embeddings")),
      R.embedding(f"{emb}.token_type_embeddings", ("embeddings", "type_embeddings")),
      *R.layer_norm(f"{emb}.LayerNorm", ("embeddings", "layer_norm")),
      *R.linear("albert.encoder.embedding_hidden_mapping_in", ("embeddings", "projection")),
  ]
  for name in ("query", "key", "value"):
    out += R.linear(f"{_LAYER}.attention.{name}", ("encoder", "attention_0", name))
  out += R.linear(f"{_LAYER}.attention.dense", ("encoder", "attention_0", "out"), in_axes=2)
  out += R.layer_norm(f"{_LAYER}.attention.LayerNorm", ("encoder", "attention_norm_0"))
  out += R.linear(f"{_LAYER}.ffn", ("encoder", "mlp_0", "wi"))
  out += R.linear(f"{_LAYER}.ffn_output", ("encoder", "mlp_0", "wo"))
  out += R.layer_norm(f"{_LAYER}.full_layer_layer_norm", ("encoder", "mlp_norm_0"))
  out += R.linear("albert.pooler", ("pooler",), head="pooler")
  out += R.linear("predictions.dense", ("mlm_head", "dense"), head="mlm")
  out += R.layer_norm("predictions.LayerNorm", ("mlm_head", "layer_norm"), head="mlm")
  out.append(R.Rule("predictions.bias", ("mlm_head", "output_bias"), vocab=True,
                    head="mlm"))
  out += R.linear("sop_classifier.classifier", ("sop",), head="sop")
  return out


def build_model(config: Mapping[str, Any], dtype: Any) -> albert_model.AlbertForPretraining:
  """The bertjax module for explicit dimensions (num_layers, embedding_size, ...)."""
  return albert_model.AlbertForPretraining(
      vocab_size=config["vocab_size"],
      max_position_embeddings=config["max_position_embeddings"],
      type_vocab_size=config["type_vocab_size"], embedding_size=config["embedding_size"],
      num_layers=config["num_layers"], hidden_size=config["hidden_size"],
      num_heads=config["num_heads"], mlp_dim=config["mlp_dim"],
      layer_sharing=config.get("layer_sharing", "all"),
      dropout_rate=config["dropout_rate"],
      attention_dropout_rate=config["attention_dropout_rate"], dtype=dtype,
      **layers.numerics(config))
