"""The Batch contract between the host input pipeline and the device train step.

The data side (``bertjax.data``) produces batches; the objectives
(``bertjax.objectives``) consume them inside the jitted step. Neither imports
the other: both import only this module.

Every array has a static shape. ``B`` is the (per-host or global) batch size and
``L`` the sequence length (``config.seq_len``).

Fields (dtype, shape):
  tokens       int32 [B, L]  token ids; special tokens placed by the packer,
                             ``PAD_ID`` elsewhere.
  segment_ids  int32 [B, L]  0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding.
  positions    int32 [B, L]  position ids; restart at 0 for every packed
                             document in layouts that pack several.
  doc_ids      int32 [B, L]  1-based index of the packed document a token belongs
                             to inside its row; 0 on padding. Attention never
                             crosses different doc_ids (nor touches 0).
  word_starts  bool  [B, L]  True at the first sub-token of each word; also True
                             at special tokens (each is a one-token word).
  phrase_starts bool [B, L]  like word_starts, but False inside a phrase
                             after its first word, so that a whole phrase is
                             one unit (ERNIE's phrase-level masking).
  entity_starts bool [B, L]  the same with named entities as the units.
                             Both equal word_starts unless the shards were
                             prepared with ``config.knowledge_spans``
                             (bertjax/data/knowledge.py); a unit never
                             crosses a sentence, segment or special token.
  special      bool  [B, L]  True where a token must never be corrupted:
                             [CLS], [SEP], padding.
  a_lengths    int32 [B]     number of tokens of sentence A (no specials).
  b_lengths    int32 [B]     number of tokens of sentence B (no specials); 0 in
                             single-segment layouts.
  example_id   int32 [B, 2]  identity of the example in its split:
                             (document index, instance index within document)
                             in packing copy epoch % dupe_factor (pair layouts
                             re-draw their pairs per copy, as BERT's dupes do).
                             Static masks are a pure function of
                             (seed, example_id, epoch % dupe_factor).
  epoch        int32 [B]     how many times the pipeline has passed over the
                             split before this example (0 on the first pass).
  example_mask bool  [B]     False for padding examples (only the last eval
                             batch has any); their tokens are all PAD.

The sentence-pair layout is exactly ``[CLS] A [SEP] B [SEP] PAD...`` (or
``[CLS] A [SEP] [SEP] B [SEP] PAD...`` where the model's tokenizer joins pairs
so, ``config.pair_separators`` 2: bertjax/data/packing.py) so that the train
step can rebuild a row with another example's B (NSP negatives) or with A and
B swapped (SOP) from ``a_lengths``/``b_lengths`` alone (and the row's own
separators, ``objectives.nsp.separators``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

# Fixed special-token ids, the same for every tokenizer bertjax trains.
PAD_ID = 0
UNK_ID = 1
CLS_ID = 2
SEP_ID = 3
MASK_ID = 4
NUM_SPECIAL_TOKENS = 5
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Unit boundaries beyond words (ERNIE's knowledge masking). The packers and the
# in-step pair rebuilds treat each exactly like word_starts.
KNOWLEDGE_FIELDS = ("phrase_starts", "entity_starts")

# name -> (numpy dtype, shape suffix after the batch dimension; "L" = seq_len)
FIELDS: Mapping[str, tuple[Any, tuple[Any, ...]]] = {
    "tokens": (np.int32, ("L",)),
    "segment_ids": (np.int32, ("L",)),
    "positions": (np.int32, ("L",)),
    "doc_ids": (np.int32, ("L",)),
    "word_starts": (np.bool_, ("L",)),
    "phrase_starts": (np.bool_, ("L",)),
    "entity_starts": (np.bool_, ("L",)),
    "special": (np.bool_, ("L",)),
    "a_lengths": (np.int32, ()),
    "b_lengths": (np.int32, ()),
    "example_id": (np.int32, (2,)),
    "epoch": (np.int32, ()),
    "example_mask": (np.bool_, ()),
}

Batch = dict  # str -> array, with exactly the keys of FIELDS.


def field_shape(name: str, batch_size: int, seq_len: int) -> tuple[int, ...]:
  """Static shape of one Batch field."""
  _, suffix = FIELDS[name]
  return (batch_size,) + tuple(seq_len if d == "L" else d for d in suffix)


def empty_batch(batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
  """An all-padding batch (example_mask False everywhere) of the right shapes."""
  out = {}
  for name, (dtype, _) in FIELDS.items():
    out[name] = np.zeros(field_shape(name, batch_size, seq_len), dtype)
  out["special"][:] = True
  return out


def check_batch(batch: Mapping[str, Any], batch_size: int, seq_len: int) -> None:
  """Raises ValueError naming the first field whose key, dtype or shape is off."""
  missing = set(FIELDS) - set(batch)
  extra = set(batch) - set(FIELDS)
  if missing or extra:
    raise ValueError(
        f"Batch keys differ from the contract in bertjax/batch.py: missing "
        f"{sorted(missing)}, unexpected {sorted(extra)}.")
  for name, (dtype, _) in FIELDS.items():
    want = field_shape(name, batch_size, seq_len)
    arr = batch[name]
    if tuple(arr.shape) != want or np.dtype(arr.dtype) != np.dtype(dtype):
      raise ValueError(
          f"Batch field {name!r} is {np.dtype(arr.dtype)}{tuple(arr.shape)}, "
          f"the contract in bertjax/batch.py wants {np.dtype(dtype)}{want}.")
