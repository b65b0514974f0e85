"""The model inputs of a text written with ``[MASK]``, for ``Model.fill_mask``
(bertjax/api.py) and ``python -m bertjax.evaluate --fill_mask "..."``.

``[MASK]`` in the text is the mask token (id ``batch.MASK_ID``), whatever
the tokenizer calls it. With a tokenizer that matches special tokens in text
as transformers' fast ones do (an imported model's tokenizer.json, vocab.txt,
vocab.json + merges.txt) the whole text is tokenized at once with its own mask
token (RoBERTa's ``<mask>``) in place, so the ids are those transformers'
fill-mask pipeline gives: a byte-level BPE keeps the word-start mark of the
word after a mask (``Ġthe``), and the mask takes the spaces its flags say.
bertjax's sentencepiece (and an imported one read without tokenizer.json)
cannot produce the mask from text: the text is cut at each ``[MASK]``, the
pieces are tokenized and the mask ids placed between them, which gives the
same ids for sentencepiece, whose every piece after a space starts a word.
"""

from __future__ import annotations

import numpy as np

from bertjax import batch as batch_lib

MASK_TEXT = "[MASK]"


def check_top_k(top_k: int) -> None:
  """``--top_k`` must ask for at least one filling; checked before the
  checkpoint is read (``Model.fill_mask`` checks the vocabulary's bound)."""
  if top_k < 1:
    raise ValueError(f"--top_k={top_k} is invalid: the fillings per [MASK] must "
                     "be at least 1; pass e.g. --top_k=5.")


def mask_inputs(model, text: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """(model inputs of one row [CLS] ... [SEP], int [m] positions of the masks)."""
  parts = text.split(MASK_TEXT)
  if len(parts) < 2:
    raise ValueError(f"The text {text!r} has no {MASK_TEXT}; put {MASK_TEXT} "
                     "where a word should be predicted.")
  tokenizer = model.tokenizer
  ids = [batch_lib.CLS_ID]
  if getattr(tokenizer, "matches_specials", False):
    # One text, as transformers reads it: the word after a mask keeps its
    # leading space (byte-level BPE's 'Ġthe'), the mask's flags say which
    # spaces it takes.
    ids += [int(i) for i in tokenizer.encode_batch([tokenizer.mask_token.join(parts)])[0]]
  else:
    for k, part in enumerate(parts):
      if part.strip():
        ids += [int(i) for i in tokenizer.encode_batch([part.strip()])[0]]
      if k < len(parts) - 1:
        ids.append(batch_lib.MASK_ID)
  ids.append(batch_lib.SEP_ID)
  if ids.count(batch_lib.MASK_ID) != len(parts) - 1:
    raise ValueError(
        f"The text {text!r} holds the tokenizer's own mask token "
        f"{getattr(tokenizer, 'mask_token', MASK_TEXT)!r} besides {MASK_TEXT}; "
        f"write every mask as {MASK_TEXT}.")
  # Only a learned position table bounds the row (XLNet has none).
  from bertjax import models
  limit = models.position_table_rows(model.config)
  if limit is not None and len(ids) > limit:
    raise ValueError(f"The text is {len(ids)} tokens, longer than the model's {limit}; "
                     "shorten it.")
  tokens = np.asarray([ids], np.int32)
  inputs = {"tokens": tokens, "segment_ids": np.zeros_like(tokens),
            "positions": np.arange(len(ids), dtype=np.int32)[None],
            "doc_ids": np.ones_like(tokens)}
  return inputs, np.nonzero(tokens[0] == batch_lib.MASK_ID)[0]
