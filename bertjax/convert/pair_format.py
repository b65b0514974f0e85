"""How many separators join the two texts of a pair: what the tokenizer says.

transformers' ``AutoTokenizer`` joins a pair by the tokenizer's own template,
not by the model's type: a genuine RoBERTa's byte-level BPE tokenizer writes
``<s> A </s></s> B </s>``, while a RoBERTa that bertjax pretrained ships its
sentencepiece tokenizer (``spm_export``: AlbertTokenizer) and writes
``[CLS] A [SEP] B [SEP]``, as it was trained and fine-tuned. So the number is
read from the tokenizer's files, in transformers' order:

  tokenizer.json   its ``post_processor``: RobertaProcessing 2, BertProcessing
                   1, a TemplateProcessing the special tokens between $A and
                   $B of its ``pair`` template (a Sequence: its first that says)
  tokenizer_config.json
                   else its ``tokenizer_class``: the RoBERTa-style classes
                   (``DOUBLE_SEPARATOR_CLASSES``) 2, any other class 1

and where neither says, as transformers then picks the class from
config.json's ``model_type``, the architecture's ``PAIR_SEPARATORS``. A
tokenizer bertjax trained (sentencepiece, no files of HF's) joins pairs with
one [SEP], as its export does.

``bertjax.load(...).tokenize`` and fine-tuning (``finetune.encoder_init``)
both read ``separators``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

# tokenizer_class (less "Fast") of the slow tokenizers whose pair template is
# <s> A </s></s> B </s>.
DOUBLE_SEPARATOR_CLASSES = frozenset((
    "RobertaTokenizer", "XLMRobertaTokenizer", "CamembertTokenizer", "BartTokenizer",
    "LongformerTokenizer", "MPNetTokenizer", "LEDTokenizer", "MvpTokenizer"))


def _template_separators(processor: Mapping[str, Any] | None) -> int | None:
  """Separators between the pair's texts in a tokenizers post_processor's JSON."""
  if not processor:
    return None
  kind = processor.get("type")
  if kind == "RobertaProcessing":
    return 2
  if kind == "BertProcessing":
    return 1
  if kind == "Sequence":
    for step in processor.get("processors") or ():
      found = _template_separators(step)
      if found is not None:
        return found
    return None
  if kind == "TemplateProcessing":
    pieces = processor.get("pair") or []
    names = [("A" if "Sequence" in p and p["Sequence"].get("id") == "A" else
              "B" if "Sequence" in p else "special") for p in pieces]
    if "A" in names and "B" in names and names.index("A") < names.index("B"):
      return names[names.index("A") + 1:names.index("B")].count("special")
  return None


def files_say(directory: str) -> int | None:
  """The separators a tokenizer directory's files give pairs; None where they
  do not say (no tokenizer.json template, no tokenizer_class)."""
  path = os.path.join(directory, "tokenizer.json")
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      found = _template_separators(json.load(f).get("post_processor"))
    if found is not None:
      return found
  path = os.path.join(directory, "tokenizer_config.json")
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      name = str(json.load(f).get("tokenizer_class") or "")
    if name:
      name = name[:-len("Fast")] if name.endswith("Fast") else name
      return 2 if name in DOUBLE_SEPARATOR_CLASSES else 1
  return None


def separators(config: Mapping[str, Any], tokenizer: Any) -> int:
  """Separators between two texts for a model of ``config`` read with
  ``tokenizer`` (module docstring): an HF tokenizer's
  ``pair_separators``, else the architecture's; 1 for bertjax's own."""
  from bertjax import convert
  if not hasattr(tokenizer, "pair_separators"):
    return 1  # bertjax's sentencepiece, exported with one [SEP] between texts
  if tokenizer.pair_separators is not None:
    return int(tokenizer.pair_separators)
  return int(getattr(convert.mapping_for_config(config), "PAIR_SEPARATORS", 1))
