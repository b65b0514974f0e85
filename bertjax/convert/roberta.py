"""RoBERTa <-> Hugging Face ``RobertaForMaskedLM`` (model_type 'roberta').

bertjax's RoBERTa is its BERT without the sentence head (configs/roberta.py:
``model='bert'``, ``sentence_head=False``), so the encoder's tensors are
BERT's under the prefix ``roberta.`` and the MLM head is ``lm_head``. Two
things differ from ``bert.py``:

* Positions. HF RoBERTa numbers the real tokens of a row from
  ``padding_idx + 1`` (``padding_idx`` is config.json's pad_token_id, 1), and
  gives padding the position ``padding_idx``; bertjax numbers them from 0.
  The import drops the first ``padding_idx + 1`` rows of the position table
  (``rules.Rule.skip_rows``), so bertjax's max_position_embeddings is HF's
  minus that offset (514 -> 512), and records the offset as
  ``hf_position_offset``. The dropped rows never meet a real token; the
  import keeps them in a side file of the workdir and the export puts them
  back, bit-identical. A RoBERTa pretrained in bertjax exports them as zeros
  (pad_token_id 0, offset 1).
* Special tokens. <s>=0 <pad>=1 </s>=2 <unk>=3 and <mask> last, which
  bertjax's vocabulary reordering (``rules.vocab_order``) moves to its fixed
  ids like BERT's.
* Segments. RoBERTa gives every token segment id 0, the second text of a
  pair included (transformers' tokenizer does, and RoBERTa pretrains without
  segments), whatever ``type_vocab_size`` the checkpoint has: RobertaConfig's
  default of 2 leaves an unused second row. The import records this as
  ``single_segment=True``, which ``bertjax.load(...).tokenize`` and the
  ``mlm_only`` objective of continued pretraining obey.
* Sentence head. RobertaForMaskedLM has none, and config.json does not
  choose one: as for BERT and DeBERTa, the import saves the params of the
  base config's model (``workdir._with_base_choices``). With
  ``configs/roberta.py`` (``sentence_head=False``) there is no pooler or NSP
  head, and a bare RobertaModel's ``roberta.pooler`` is listed as ignored.
  With a config that builds one (``configs/bert.py``, ``configs/unilm.py``:
  NSP on sentence pairs) the pooler is read from ``roberta.pooler.dense``
  where the checkpoint has it (a RobertaModel's, which transformers computes
  the same way: dense + tanh over <s>) and freshly initialised otherwise, the
  NSP head always (``FRESH_ONLY``); both are reported. The export writes
  RobertaForMaskedLM and so leaves both out (``NOT_EXPORTED``) and says so.
  That holds as well for a BERT pretrained in bertjax with its NSP head and
  written with ``--model_type=roberta``: ``--model_type=bert`` keeps them.
  ``model_fields``' ``sentence_head=False`` is the answer without a base
  config (``bertjax.load`` of an HF directory); a config without the field
  gets bertjax's BERT default, a sentence head.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from bertjax import batch as batch_lib
from bertjax.convert import bert as bert_mapping
from bertjax.convert import rules as R

MODEL_TYPE = "roberta"
BERTJAX_MODEL = "bert"
BASE_CONFIG = "roberta"  # configs/roberta.py: MLM only, full-sentence rows
HF_ARCHITECTURE = "RobertaForMaskedLM"
BASE_PREFIX = "roberta."
# Buffers and the tied decoder. (A bare RobertaModel's pooler is read only
# for a model with a sentence head, else reported as unused.)
IGNORED = ("roberta.embeddings.position_ids", "roberta.embeddings.token_type_ids",
           "lm_head.decoder.weight", "lm_head.decoder.bias")
# Parts of bertjax's model that no HF tensor holds: the NSP head, initialised
# afresh on import where the config builds it.
FRESH_ONLY = ("nsp",)
# Parts the export leaves out, as RobertaForMaskedLM has no place for them:
# those and the pooler (which an import reads from a RobertaModel).
NOT_EXPORTED = ("pooler", "nsp")
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
# RoBERTa's own tokenizer joins two segments as <s> A </s></s> B </s>; what
# the tokenizer's files say comes first (pair_format: a RoBERTa pretrained in
# bertjax ships its sentencepiece tokenizer, which uses one </s>) ...
PAIR_SEPARATORS = 2
# ... all with segment id 0 (config.single_segment, see the module docstring).
SINGLE_SEGMENT = True


def position_offset(config: Mapping[str, Any]) -> int:
  """HF position of bertjax's position 0: padding_idx + 1.

  An import records it (``hf_position_offset``); otherwise the pad id is
  the imported tokenizer's or bertjax's [PAD] (0).
  """
  if config.get("hf_position_offset"):
    return int(config["hf_position_offset"])
  special = config.get("hf_special_ids")
  return int(special[0] if special else batch_lib.PAD_ID) + 1


def model_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """bertjax config fields of an HF RoBERTa config.json.

  Raises:
    ValueError: where the model computes something bertjax's BERT does not
      (see ``bert.model_fields``), or has no pad_token_id to place positions.
  """
  fields = bert_mapping.model_fields(hf_config)
  pad = hf_config.get("pad_token_id")
  if pad is None or int(pad) < 0:
    raise ValueError(
        "config.json has no pad_token_id, which RoBERTa's positions start "
        "from; add it (1 for the released RoBERTa models).")
  offset = int(pad) + 1
  if fields["max_position_embeddings"] <= offset:
    raise ValueError(
        f"config.json has max_position_embeddings="
        f"{fields['max_position_embeddings']}, no room for positions after "
        f"padding_idx {pad}; is pad_token_id right?")
  # sentence_head: the answer without a base config (see the module docstring).
  fields.update(max_position_embeddings=fields["max_position_embeddings"] - offset,
                sentence_head=False, hf_model_type=MODEL_TYPE,
                hf_position_offset=offset, single_segment=SINGLE_SEGMENT)
  return fields


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of a bertjax RoBERTa (RobertaForMaskedLM).

  ``pad_token_id`` is the tokenizer's; the model's padding_idx is the one
  its position table was laid out for (``position_offset - 1``).
  """
  del pad_token_id
  offset = position_offset(config)
  out = bert_mapping.hf_config(config, offset - 1)
  special = config.get("hf_special_ids")
  cls_id, sep_id = (special[2], special[3]) if special else (
      batch_lib.CLS_ID, batch_lib.SEP_ID)
  out.update(model_type=MODEL_TYPE, architectures=[HF_ARCHITECTURE],
             max_position_embeddings=int(config["max_position_embeddings"]) + offset,
             bos_token_id=int(cls_id), eos_token_id=int(sep_id))
  return out


def _renamed(rule: R.Rule, old: str, new: str, **changes) -> R.Rule:
  return dataclasses.replace(rule, hf=new + rule.hf[len(old):], **changes)


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """Every tensor of ``RobertaForMaskedLM`` and where it lives in bertjax,
  plus, for a model with a sentence head, a RobertaModel's pooler (read on
  import where present, never exported: ``NOT_EXPORTED``)."""
  out = []
  for rule in bert_mapping.rules(config):
    if rule.head == "nsp":  # no HF tensor: FRESH_ONLY
      continue
    if rule.hf.startswith("bert."):
      rule = _renamed(rule, "bert.", BASE_PREFIX)
      if rule.path == ("embeddings", "position_embeddings", "embedding"):
        rule = dataclasses.replace(rule, skip_rows=position_offset(config))
    elif rule.hf.startswith("cls.predictions.transform.LayerNorm"):
      rule = _renamed(rule, "cls.predictions.transform.LayerNorm", "lm_head.layer_norm")
    elif rule.hf.startswith("cls.predictions.transform.dense"):
      rule = _renamed(rule, "cls.predictions.transform.dense", "lm_head.dense")
    elif rule.hf == "cls.predictions.bias":
      rule = dataclasses.replace(rule, hf="lm_head.bias")
    else:
      raise ValueError(f"No RoBERTa name for BERT tensor {rule.hf}.")
    out.append(rule)
  return out


def build_model(config: Mapping[str, Any], dtype: Any):
  """The bertjax module (BERT; sentence head as the config says, by default
  one, as ``bertjax.models.bert.from_config``) for explicit dimensions."""
  return bert_mapping.build_model(config, dtype)
