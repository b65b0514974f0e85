"""Extractive QA: question + context windows, and decoding spans back to text.

A context longer than a row is cut into overlapping windows of context
tokens, each row ``[CLS] question [SEP] window [SEP]``; window starts are
``doc_stride`` tokens apart, so an answer near one window's edge lies whole
inside the next. Each context token keeps its character span in the context
(``offsets``), so a predicted token span maps back to the exact characters.

Decoding (``best_span``) scores every (start, end) pair of context tokens of
every window of a question with ``start_logit + end_logit``, keeps only legal
pairs (both in the context, ``start <= end``, at most ``max_answer_tokens``
tokens and, when ``max_answer_words`` is set, inside that many
whitespace-separated words of the context) and returns the best pair's
characters; a span is therefore never reversed and never leaves the context,
whatever the logits. The word limit is for tasks whose answers are known to be
short in words (cloze: one word): without it a model's span may run over
several words, which SQuAD's F1 rewards with partial credit for containing
the answer rather than for finding it.

Questions with no answer (SQuAD 2.0) are trained to point both ends at
[CLS], as is every window that does not hold the answer. Decoding scores "no
answer" as [CLS]'s start plus end logit, the lowest over the question's
windows (``no_answer_score``: the window that most believes it holds the
answer), and predicts it where it beats the best span's score by more than a
threshold, as BERT's SQuAD 2.0 recipe does.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from bertjax import batch as batch_lib


@dataclasses.dataclass
class Window:
  """One row of one question: ``tokens`` etc. are int32 [seq_len]."""
  example: int  # index of the question in the example list
  tokens: np.ndarray
  segment_ids: np.ndarray
  context_mask: np.ndarray  # bool [seq_len]: a context token
  offsets: np.ndarray  # int32 [seq_len, 2]: its [begin, end) chars; -1 elsewhere
  start: int  # answer's first token in this row; 0 ([CLS]) = not inside
  end: int


def token_span(offsets: np.ndarray, begin: int, end: int) -> tuple[int, int] | None:
  """Tokens covering characters [begin, end) of a text: (first, last) indices
  into ``offsets`` (int [n, 2]), or None when no token overlaps them."""
  overlaps = np.nonzero((offsets[:, 1] > begin) & (offsets[:, 0] < end))[0]
  if overlaps.size == 0:
    return None
  return int(overlaps[0]), int(overlaps[-1])


def windows(example: int, question_ids: np.ndarray, context_ids: np.ndarray,
            context_offsets: np.ndarray, answer: tuple[int, int] | None, *,
            seq_len: int, doc_stride: int, max_query_tokens: int,
            context_segment: int = 1, separators: int = 1) -> list[Window]:
  """Rows of one question over its context.

  Args:
    example: the question's index, carried into each Window.
    question_ids, context_ids: int32 token ids (no specials).
    context_offsets: int [n_context, 2] character spans of the context tokens.
    answer: character span [begin, end) of the gold answer, or None.
    seq_len: row length.
    doc_stride: tokens between the starts of consecutive windows.
    max_query_tokens: the question is cut to this many tokens.
    context_segment: segment id of the context (0 for single-segment models).
    separators: [SEP]s between question and context (2 for RoBERTa).

  Returns:
    At least one Window; consecutive ones overlap by ``span - doc_stride``.
  """
  question = np.asarray(question_ids[:max_query_tokens], np.int32)
  head = 1 + len(question) + separators
  span = seq_len - head - 1
  if span < 1:
    raise ValueError(
        f"seq_len {seq_len} leaves no room for the context after a question of "
        f"{len(question)} tokens; raise --config.seq_len or lower "
        "--config.max_query_tokens.")
  if doc_stride < 1 or doc_stride > span:
    raise ValueError(
        f"doc_stride {doc_stride} must be between 1 and the {span} context tokens "
        "a row holds; set --config.doc_stride accordingly.")
  gold = None if answer is None else token_span(context_offsets, *answer)
  n = len(context_ids)
  starts = list(range(0, max(n - span, 0) + 1, doc_stride))
  if starts[-1] + span < n:
    starts.append(n - span)
  out = []
  for first in starts:
    last = min(first + span, n)
    tokens = np.zeros(seq_len, np.int32)
    segments = np.zeros(seq_len, np.int32)
    offsets = np.full((seq_len, 2), -1, np.int32)
    row = [batch_lib.CLS_ID, *question.tolist(), *[batch_lib.SEP_ID] * separators]
    row += context_ids[first:last].tolist() + [batch_lib.SEP_ID]
    tokens[:len(row)] = row
    segments[head:len(row)] = context_segment
    offsets[head:head + last - first] = context_offsets[first:last]
    mask = np.zeros(seq_len, bool)
    mask[head:head + last - first] = True
    s = e = 0
    if gold is not None and gold[0] >= first and gold[1] < last:
      s, e = gold[0] - first + head, gold[1] - first + head
    out.append(Window(example, tokens, segments, mask, offsets, s, e))
  return out


def word_index(context: str, offsets: np.ndarray) -> np.ndarray:
  """Which whitespace-separated word of ``context`` each token begins in:
  int [n] for ``offsets`` int [n, 2] (rows of -1, non-context tokens, get -1).

  A token's word is that of the first non-whitespace character at or after
  its start: a span that keeps its word's leading space, or a piece that is
  only a space, belongs to the word that follows, not the one before.
  """
  starts = np.asarray([m.start() for m in re.finditer(r"\S+", context)], np.int64)
  solid = np.asarray([m.start() for m in re.finditer(r"\S", context)] + [len(context)],
                     np.int64)
  first = solid[np.minimum(np.searchsorted(solid, offsets[:, 0]), len(solid) - 1)]
  words = np.searchsorted(starts, first, side="right") - 1
  return np.where(offsets[:, 0] >= 0, words, -1)


def best_span(start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray],
              context_masks: Sequence[np.ndarray], offsets: Sequence[np.ndarray],
              max_answer_tokens: int, *, context: str | None = None,
              max_answer_words: int = 0) -> tuple[int, int, float]:
  """The best legal span of one question over all its windows.

  Args:
    start_logits, end_logits: float [seq_len] per window.
    context_masks: bool [seq_len] per window.
    offsets: int [seq_len, 2] per window.
    max_answer_tokens: longest span, in tokens.
    context: the context text the offsets index (needed for max_answer_words;
      with it, an answer never begins with whitespace).
    max_answer_words: longest span, in whitespace-separated words of the
      context; 0 = no limit.

  Returns:
    (begin, end) characters of the answer in the context and its score;
    (0, 0, -inf) when no window has a context token.
  """
  if max_answer_words and context is None:
    raise ValueError("best_span needs the context text to limit answers in words.")
  best = (0, 0, -np.inf)
  for s_log, e_log, mask, off in zip(start_logits, end_logits, context_masks, offsets):
    n = len(mask)
    i = np.arange(n)
    legal = (mask[:, None] & mask[None, :] & (i[None, :] >= i[:, None])
             & (i[None, :] - i[:, None] < max_answer_tokens))
    if max_answer_words:
      w = word_index(context, np.asarray(off))
      legal &= w[None, :] - w[:, None] < max_answer_words
    if not legal.any():
      continue
    scores = np.where(legal, np.asarray(s_log, np.float64)[:, None]
                      + np.asarray(e_log, np.float64)[None, :], -np.inf)
    s, e = np.unravel_index(int(np.argmax(scores)), scores.shape)
    if scores[s, e] > best[2]:
      best = (int(off[s, 0]), int(off[e, 1]), float(scores[s, e]))
  begin, end, score = best
  while context is not None and begin < end and context[begin].isspace():
    begin += 1  # a span starting on a piece that is only a space
  return begin, end, score


def no_answer_score(start_logits: Sequence[np.ndarray],
                    end_logits: Sequence[np.ndarray]) -> float:
  """The score of "no answer": [CLS]'s start + end logit, the lowest over the
  question's windows (module docstring); +inf when it has no window."""
  return min((float(s[0]) + float(e[0]) for s, e in zip(start_logits, end_logits)),
             default=np.inf)


def decode(examples, feats, logits: np.ndarray, config, *, no_answer: bool,
           threshold: float = 0.0) -> tuple[list[str], list[float], list[dict]]:
  """Every question's answer from the head's logits.

  Args:
    examples: the QA examples (``tasks`` module), in feature order.
    feats: their features (``features.build``): 'example', 'context_mask'
      and 'offsets' per row.
    logits: float [rows, seq_len, 2] start and end logits.
    config: ``max_answer_tokens`` and ``max_answer_words``.
    no_answer: decode "no answer" too (module docstring).
    threshold: "no answer" where its margin over the best span exceeds this.

  Returns:
    (best span text per question, no-answer margin per question (empty
    unless ``no_answer``), one prediction record per question).
  """
  by_example: dict[int, list[int]] = {}
  for row, ex in enumerate(feats["example"]):
    by_example.setdefault(int(ex), []).append(row)
  spans, margins, records = [], [], []
  for i, ex in enumerate(examples):
    rows = by_example.get(i, [])
    starts, ends = [logits[r, :, 0] for r in rows], [logits[r, :, 1] for r in rows]
    b, e, best = best_span(starts, ends, [feats["context_mask"][r] for r in rows],
                           [feats["offsets"][r] for r in rows], config.max_answer_tokens,
                           context=ex["context"],
                           max_answer_words=config.get("max_answer_words", 0))
    text = ex["context"][b:e]
    spans.append(text)
    record = {"id": ex["id"], "prediction": text, "answers": ex["answers"]}
    if no_answer:
      margin = no_answer_score(starts, ends) - best
      margins.append(margin)
      record.update(prediction="" if margin > threshold else text, best_span=text,
                    no_answer_margin=float(margin) if np.isfinite(margin) else None)
    records.append(record)
  return spans, margins, records
