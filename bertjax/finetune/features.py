"""Examples -> fixed-shape arrays of model inputs and targets.

Every feature set is a dict of numpy arrays with a leading example axis:
  tokens, segment_ids  int32 [n, seq_len]  ([CLS] A [SEP] (B [SEP]), padding 0)
  classification       label int32 [n]
  regression           label float32 [n]
  tagging              tags int32 [n, seq_len] on each word's first piece,
                       tag_mask bool [n, seq_len] there, word_index int32
                       [n, seq_len] (the word a first piece starts, -1 elsewhere)
  qa                   start, end int32 [n] (0 = the answer is not in this
                       window), context_mask bool, offsets int32 [n, seq_len, 2],
                       example int32 [n] (the question a window belongs to)
Positions and document ids are derived in the step (``objective.model_inputs``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertjax import batch as batch_lib
from bertjax.finetune import qa as qa_lib


class Encoder:
  """Tokenizes for one model: its separators and segment ids.

  Args:
    tokenizer: a bertjax Tokenizer or HfTokenizer (bertjax ids).
    seq_len: row length.
    pair_separators: [SEP]s between two texts (2 where the tokenizer joins pairs
      as RoBERTa's own does: ``convert.pair_format``).
    single_segment: every token gets segment 0 (RoBERTa, type_vocab_size 1).
  """

  def __init__(self, tokenizer, seq_len: int, *, pair_separators: int = 1,
               single_segment: bool = False):
    self.tokenizer = tokenizer
    self.seq_len = seq_len
    self.separators = pair_separators
    self.second_segment = 0 if single_segment else 1

  def _ids(self, texts: list[str]) -> list[np.ndarray]:
    return self.tokenizer.encode_batch(list(texts))

  def pairs(self, examples: list[dict[str, Any]], kind: str) -> dict[str, np.ndarray]:
    """Sequence classification / regression rows (longest text cut first)."""
    n, length = len(examples), self.seq_len
    a_ids = self._ids([ex["text_a"] for ex in examples])
    has_b = "text_b" in examples[0] if examples else False
    b_ids = self._ids([ex["text_b"] for ex in examples]) if has_b else [None] * n
    tokens = np.zeros((n, length), np.int32)
    segments = np.zeros((n, length), np.int32)
    for k, (a, b) in enumerate(zip(a_ids, b_ids)):
      a, b = list(a), (None if b is None else list(b))
      room = length - (2 if b is None else 2 + self.separators)
      while len(a) + (0 if b is None else len(b)) > room:
        if b is not None and len(b) > len(a):
          b.pop()
        else:
          a.pop()
      row = [batch_lib.CLS_ID] + a + [batch_lib.SEP_ID]
      if b is not None:
        row += [batch_lib.SEP_ID] * (self.separators - 1) + b + [batch_lib.SEP_ID]
        segments[k, len(a) + 2:len(row)] = self.second_segment
      tokens[k, :len(row)] = row
    labels = np.asarray([ex["label"] for ex in examples],
                        np.float32 if kind == "regression" else np.int32)
    return {"tokens": tokens, "segment_ids": segments, "label": labels}

  def tagging(self, examples: list[dict[str, Any]],
              label_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Tag rows: each word's tag sits on its first piece; words past the row
    end are cut (and count as predicted 'O' by ``loop``)."""
    index = {t: i for i, t in enumerate(label_names)}
    n, length = len(examples), self.seq_len
    out = {"tokens": np.zeros((n, length), np.int32),
           "segment_ids": np.zeros((n, length), np.int32),
           "tags": np.zeros((n, length), np.int32),
           "tag_mask": np.zeros((n, length), bool),
           "word_index": np.full((n, length), -1, np.int32)}
    for k, ex in enumerate(examples):
      pieces = self._ids(ex["words"])
      row, pos = [batch_lib.CLS_ID], 1
      for w, (ids, tag) in enumerate(zip(pieces, ex["tags"])):
        ids = list(ids) or [batch_lib.UNK_ID]
        if pos + len(ids) > length - 1:
          break
        out["tags"][k, pos] = index[tag]
        out["tag_mask"][k, pos] = True
        out["word_index"][k, pos] = w
        row += ids
        pos += len(ids)
      row.append(batch_lib.SEP_ID)
      out["tokens"][k, :len(row)] = row
    return out

  def qa(self, examples: list[dict[str, Any]], *, doc_stride: int,
         max_query_tokens: int) -> dict[str, np.ndarray]:
    """Question/context windows (``qa.windows``), stacked."""
    rows = []
    for k, ex in enumerate(examples):
      q = self._ids([ex["question"]])[0]
      c_ids, c_off = self.tokenizer.encode_with_offsets(ex["context"])
      answer = None
      if ex["answer_start"] >= 0 and ex["answers"]:
        answer = (ex["answer_start"], ex["answer_start"] + len(ex["answers"][0]))
      rows += qa_lib.windows(k, q, c_ids, c_off, answer, seq_len=self.seq_len,
                             doc_stride=doc_stride, max_query_tokens=max_query_tokens,
                             context_segment=self.second_segment,
                             separators=self.separators)
    return {
        "tokens": np.stack([r.tokens for r in rows]),
        "segment_ids": np.stack([r.segment_ids for r in rows]),
        "start": np.asarray([r.start for r in rows], np.int32),
        "end": np.asarray([r.end for r in rows], np.int32),
        "context_mask": np.stack([r.context_mask for r in rows]),
        "offsets": np.stack([r.offsets for r in rows]),
        "example": np.asarray([r.example for r in rows], np.int32),
    }


def word_tags(examples: list[dict[str, Any]], feats: dict[str, np.ndarray],
              best: np.ndarray, names: tuple[str, ...]) -> list[list[str]]:
  """Each example's predicted tag per word, from ``best`` int [rows, seq_len]
  (the argmax tag of each piece): a word takes its first piece's tag; words
  cut off at the row end get 'O' (or the first tag where there is no 'O')."""
  outside = "O" if "O" in names else names[0]
  out = []
  for i, ex in enumerate(examples):
    tags = [outside] * len(ex["words"])
    for pos in np.nonzero(feats["word_index"][i] >= 0)[0]:
      tags[int(feats["word_index"][i, pos])] = names[int(best[i, pos])]
    out.append(tags)
  return out


def build(encoder: Encoder, task, examples: list[dict[str, Any]], config) -> dict[str, np.ndarray]:
  """Features of ``examples`` for ``task.kind`` (module docstring)."""
  if not examples:
    raise ValueError("The task has no examples in one of its splits; check its files.")
  if task.kind in ("classification", "regression"):
    return encoder.pairs(examples, task.kind)
  if task.kind == "tagging":
    return encoder.tagging(examples, task.label_names)
  return encoder.qa(examples, doc_stride=config.doc_stride,
                    max_query_tokens=config.max_query_tokens)


# Arrays that the device step reads; the rest stay on the host for decoding.
DEVICE_KEYS = {
    "classification": ("tokens", "segment_ids", "label"),
    "regression": ("tokens", "segment_ids", "label"),
    "tagging": ("tokens", "segment_ids", "tags", "tag_mask"),
    "qa": ("tokens", "segment_ids", "start", "end", "context_mask"),
}
