"""SpanBERT -> Hugging Face ``BertForMaskedLM`` (model_type 'bert').

SpanBERT's released checkpoints are BERT checkpoints: its encoder is BERT's
and so is its MLM head. The span boundary head has no Hugging Face class, so
an export drops it (and writes no pooler or NSP head: SpanBERT has none).
Importing a checkpoint of model_type 'bert' gives bertjax's BERT
(``bertjax/convert/bert.py``); this mapping is found from a SpanBERT
workdir's ``config.model`` (``mapping_for_model``), for ``--to_hf``,
``bertjax.load`` and ``bertjax.finetune``.
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.convert import bert
from bertjax.convert import rules as R
from bertjax.models import spanbert as spanbert_model

MODEL_TYPE = bert.MODEL_TYPE
BERTJAX_MODEL = "spanbert"
HF_ARCHITECTURE = bert.HF_ARCHITECTURE_MLM_ONLY
BASE_PREFIX = bert.BASE_PREFIX
IGNORED = bert.IGNORED
SPECIAL_TOKENS = bert.SPECIAL_TOKENS


def _without_sentence_head(config: Mapping[str, Any]) -> dict[str, Any]:
  return {**config, "sentence_head": False}


def model_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """bertjax config fields of an HF BERT config.json, as a SpanBERT."""
  return {**bert.model_fields(hf_config), "model": BERTJAX_MODEL,
          "sentence_head": False}


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json: BERT's, architecture ``BertForMaskedLM``."""
  return bert.hf_config(_without_sentence_head(config), pad_token_id)


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """BERT's encoder and MLM head; the span boundary head is not exported."""
  return bert.rules(_without_sentence_head(config))


def build_model(config: Mapping[str, Any], dtype: Any
                ) -> spanbert_model.SpanBertForPretraining:
  """The bertjax module for explicit dimensions: BERT's (bert.build_model),
  without a sentence head, plus the SBO head."""
  base = bert.build_model(_without_sentence_head(config), dtype)
  fields = {name: getattr(base, name)
            for name in type(base).__dataclass_fields__ if name not in ("parent", "name")}
  return spanbert_model.SpanBertForPretraining(
      sbo_max_offset=int(config.get("sbo_max_offset", 31)), **fields)
