"""Hugging Face interoperability: import and export checkpoints and tokenizers.

  python -m bertjax.convert --from_hf=DIR --workdir=OUT   # HF dir -> bertjax workdir
  python -m bertjax.convert --to_hf=OUT --workdir=DIR     # bertjax workdir -> HF dir

Layout of the package:
  rules.py          the one mechanism: a Rule per tensor (transpose/reshape,
                    vocabulary reordering), shared by every architecture
  <model_type>.py   one mapping file per architecture (``bert.py``): config
                    fields, the list of Rules, special tokens, the module
  core.py           HF tensors <-> bertjax params with a mapping
  hf_files.py       reading/writing HF directories (safetensors needs no torch)
  hf_tokenizers.py  the imported model's own tokenizer, with bertjax's ids
  workdir.py        import into an orbax checkpoint workdir
  export.py         export from one (and a checkpoint's params, read alone)
  export_target.py  which --to_hf directories an export may write (or replace)
  spm_export.py     a bertjax-trained sentencepiece tokenizer as HF files
  pair_format.py    the separators between a pair's texts, as its tokenizer says

Adding an architecture: write ``bertjax/convert/<model_type>.py`` with the
attributes of ``bert.py`` (MODEL_TYPE, BERTJAX_MODEL, HF_ARCHITECTURE,
BASE_PREFIX, IGNORED, SPECIAL_TOKENS, model_fields, hf_config, rules,
build_model) and name it in ``ARCHITECTURES``. Optional: BASE_CONFIG (the
configs/<name>.py whose training fields an import takes; default
BERTJAX_MODEL) and PAIR_SEPARATORS (separators between two segments where
the tokenizer's files do not say, ``pair_format``; default 1). ``roberta.py``
and ``albert.py`` show the two kinds of difference: a table with extra rows
(``skip_rows``) and another parameter layout.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# HF model_type -> mapping module. bertjax's own config.model names the same
# module through BERTJAX_MODEL.
ARCHITECTURES = {
    "bert": "bertjax.convert.bert",
    "roberta": "bertjax.convert.roberta",
    "albert": "bertjax.convert.albert",
    "deberta-v2": "bertjax.convert.deberta",
    "electra": "bertjax.convert.electra",
    "xlnet": "bertjax.convert.xlnet",
}


# bertjax models exported as another model's HF type (SpanBERT as a BERT),
# found from ``config.model`` only: an HF import of that type gives the
# model ARCHITECTURES names.
EXPORT_ONLY = ("bertjax.convert.spanbert",)


def mapping_for_hf(model_type: str) -> ModuleType:
  """The mapping module of an HF ``model_type``, or a ValueError listing them."""
  if model_type not in ARCHITECTURES:
    raise ValueError(
        f"HF model_type {model_type!r} has no bertjax mapping; supported: "
        f"{', '.join(sorted(ARCHITECTURES))}.")
  return importlib.import_module(ARCHITECTURES[model_type])


def mapping_for_model(model: str) -> ModuleType:
  """The mapping module whose BERTJAX_MODEL is bertjax's ``config.model``.

  Several HF types can share one bertjax model (RoBERTa is bertjax's BERT);
  the HF type of the same name comes first.
  """
  if model in ARCHITECTURES:
    return importlib.import_module(ARCHITECTURES[model])
  for name in (*ARCHITECTURES.values(), *EXPORT_ONLY):
    module = importlib.import_module(name)
    if module.BERTJAX_MODEL == model:
      return module
  raise ValueError(
      f"bertjax model {model!r} cannot be exported to Hugging Face yet; "
      f"supported: {', '.join(sorted(ARCHITECTURES))}, spanbert.")


def mapping_for_config(config) -> ModuleType:
  """The mapping of a bertjax config: the HF model_type an import recorded
  (``hf_model_type``), else the default one of ``config['model']``."""
  model_type = config.get("hf_model_type")
  if model_type:
    return mapping_for_hf(model_type)
  return mapping_for_model(config["model"])
