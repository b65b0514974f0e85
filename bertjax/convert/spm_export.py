"""A tokenizer bertjax trained (sentencepiece) written as a Hugging Face one.

An export of a model with bertjax's own tokenizer writes:
  spiece.model              the sentencepiece model, as trained
  tokenizer.json            the fast tokenizer: the same pieces and scores
                            (Unigram or BPE) with byte fallback on, the model's
                            own normalisation (its precompiled charsmap, outer
                            whitespace stripped, runs of spaces collapsed) and
                            nothing else, so its ids are bertjax's for any text
  tokenizer_config.json     AlbertTokenizer(Fast), casing and accents kept
  special_tokens_map.json   bertjax's [PAD] [UNK] [CLS] [SEP] [MASK]

Why tokenizer.json: without it transformers converts ``spiece.model`` to a
fast tokenizer itself, and its converter has no byte fallback for ALBERT
("...uses the byte fallback option which is not implemented in the fast
tokenizers"), so every character outside the vocabulary ("é", "漢", "🙂")
became [UNK] where bertjax has byte pieces. It is built with transformers'
sentencepiece converter (which extracts a BPE model's merges) and is left
out, with a warning, where transformers is not installed.

The slow ``AlbertTokenizer`` (``use_fast=False``) reads spiece.model with
byte fallback too, but rewrites ``\u0060\u0060`` and ``''`` as ``"`` and splits a
comma off a piece that ends in digit + comma; only there its ids differ.

Segments: with ``type_vocab_size`` 1 (SpanBERT, RoBERTa) the model has no
row for segment 1, so ``model_input_names`` leaves out token_type_ids (the
HF model then uses zeros, as bertjax does) and tokenizer.json gives the
second text of a pair type id 0 as well.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from absl import logging

from bertjax import batch as batch_lib
from bertjax import mirror
from bertjax import paths

SPIECE = "spiece.model"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


def input_names(type_vocab_size: int) -> list[str]:
  """The tokenizer's ``model_input_names`` for a model with that many segment rows."""
  if int(type_vocab_size) >= 2:
    return ["input_ids", "token_type_ids", "attention_mask"]
  return ["input_ids", "attention_mask"]


def _fast_tokenizer(model_path: str, pair_type_id: int) -> str | None:
  """tokenizer.json text for a bertjax sentencepiece model; None without transformers."""
  try:
    from tokenizers import Regex, decoders, normalizers, processors
    convert = importlib.import_module("transformers.convert_slow_tokenizer")
  except ImportError:
    return None

  class _Source:  # what transformers' converter reads of a slow tokenizer
    vocab_file = model_path
    add_prefix_space = True

  class _Converter(convert.SpmConverter):
    handle_byte_fallback = True

    def normalizer(self, proto):
      # sentencepiece's own: the charsmap, then remove_extra_whitespaces.
      steps = [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
      charsmap = proto.normalizer_spec.precompiled_charsmap
      if charsmap:
        steps.insert(0, normalizers.Precompiled(charsmap))
      return normalizers.Sequence(steps)

    def decoder(self, replacement, add_prefix_space):
      return decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(
          replacement=replacement, prepend_scheme="always")])

    def post_processor(self):
      b = pair_type_id
      return processors.TemplateProcessing(
          single="[CLS]:0 $A:0 [SEP]:0",
          pair=f"[CLS]:0 $A:0 [SEP]:0 $B:{b} [SEP]:{b}",
          special_tokens=[("[CLS]", batch_lib.CLS_ID), ("[SEP]", batch_lib.SEP_ID)])

  return _Converter(_Source()).converted().to_str()


def write(config: Mapping[str, Any], model_path: str, out_dir: str,
          record=None) -> list[str]:
  """Writes the HF tokenizer files of ``model_path`` into ``out_dir``.

  Args:
    config: the bertjax config (``max_position_embeddings``, ``type_vocab_size``).
    model_path: bertjax's sentencepiece ``.model``.
    out_dir: the HF directory.
    record: called with each name before its file is written (an export's
      manifest, bertjax/convert/export_target.py).

  Returns:
    The names written.
  """
  record = record or (lambda name: None)
  record(SPIECE)
  paths.path(model_path).copy(paths.path(out_dir) / SPIECE, overwrite=True)
  type_rows = int(config.get("type_vocab_size", 2))
  pad, unk, cls, sep, mask = batch_lib.SPECIAL_TOKENS
  specials = dict(pad_token=pad, unk_token=unk, cls_token=cls, sep_token=sep,
                  mask_token=mask, bos_token=cls, eos_token=sep)
  written = [SPIECE]
  fast = _fast_tokenizer(str(mirror.fetched(model_path)), 1 if type_rows >= 2 else 0)
  if fast is None:
    logging.warning("transformers is not installed, so no %s was written; "
                    "AutoTokenizer gives [UNK] for text outside the vocabulary "
                    "unless loaded with use_fast=False.", TOKENIZER_JSON)
  else:
    record(TOKENIZER_JSON)
    paths.write_text(paths.join(out_dir, TOKENIZER_JSON), fast)
    written.append(TOKENIZER_JSON)
  record(TOKENIZER_CONFIG)
  paths.write_json(paths.join(out_dir, TOKENIZER_CONFIG), dict(
      tokenizer_class="AlbertTokenizer", do_lower_case=False, keep_accents=True,
      remove_space=True, model_max_length=int(config["max_position_embeddings"]),
      model_input_names=input_names(type_rows), **specials), indent=2)
  record(SPECIAL_TOKENS_MAP)
  paths.write_json(paths.join(out_dir, SPECIAL_TOKENS_MAP), specials, indent=2)
  return written + [TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP]

