"""The demo tasks, built deterministically from the demo corpus's held-out
documents (``python_docs.documents('validation')``): no download, the same
examples on every machine.

  coherence  is passage B the continuation of passage A, or from another
             document (classification).
  cloze_qa   a word is blanked out of a sentence and asked for from its
             context (extractive QA); with ``unanswerable_fraction`` > 0, that
             share of the questions is asked of a passage of another document
             that does not hold the word: their answer is "no answer", as
             SQuAD 2.0's unanswerable questions.

Documents are split between a task's train and eval parts by a hash of their
name, so no document's text is in both.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

import numpy as np

DEMO_TASKS = ("coherence", "cloze_qa")
# Share of the held-out documents that go to the demo tasks' train part.
DEMO_TRAIN_FRACTION = 0.7
# A cloze answer: a word of at least four characters.
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]{3,}")


def _stable_fraction(name: str) -> float:
  # Salted: the corpus's own hold-out hashes the bare name (python_docs), so
  # every held-out document would fall on one side of an unsalted split.
  digest = hashlib.sha256(b"bertjax-finetune:" + name.encode()).digest()
  return int.from_bytes(digest[:8], "big") / 2**64


@functools.lru_cache(maxsize=1)
def documents() -> tuple[tuple, tuple]:
  """(train, eval) documents, each (name, sentences); parsed once per process
  (the stdlib's docstrings take seconds to read), immutable so that the
  cached copy stays as read."""
  from bertjax.data import python_docs
  docs = [(name, tuple(sents)) for name, sents in python_docs.documents("validation")]
  return (tuple(d for d in docs if _stable_fraction(d[0]) < DEMO_TRAIN_FRACTION),
          tuple(d for d in docs if _stable_fraction(d[0]) >= DEMO_TRAIN_FRACTION))


def coherence_examples(docs, seed: int = 0, sentences: int = 2) -> list[dict[str, Any]]:
  """Pairs of passages of ``sentences`` sentences. Every passage A that has a
  successor gives two pairs: A with the passage that follows it in its
  document (label 1), and A with a passage drawn at random from another
  document (label 0, from a fixed generator). Each A therefore appears once
  with each label, so nothing about A alone (its length, its document, its
  place) predicts the label: only how B relates to A does. A starts at every
  sentence that leaves room for a whole B."""
  rng = np.random.default_rng(seed)
  out = []
  for d, (_, sents) in enumerate(docs):
    for i in range(len(sents) - 2 * sentences + 1):
      a = " ".join(sents[i:i + sentences])
      out.append({"text_a": a, "text_b": " ".join(sents[i + sentences:i + 2 * sentences]),
                  "label": 1})
      if len(docs) < 2:
        continue
      other = int(rng.integers(len(docs) - 1))
      other += other >= d
      pool = docs[other][1]
      j = int(rng.integers(max(len(pool) - sentences, 0) + 1))
      out.append({"text_a": a, "text_b": " ".join(pool[j:j + sentences]), "label": 0})
  return out


def _context(sents, i: int) -> tuple[str, int]:
  """Sentence ``i`` with the one before it and the one after it: (text,
  where sentence ``i`` starts in it)."""
  before = " ".join(sents[max(i - 1, 0):i])
  prefix = before + " " if before else ""
  return prefix + " ".join(sents[i:i + 2]), len(prefix)


def _foreign_context(docs, d: int, word: str, rng, tries: int = 8) -> str | None:
  """A context of the same shape from another document than ``d`` that does
  not hold ``word`` (case-insensitively, as a whole word); None when
  ``tries`` draws all held it."""
  if len(docs) < 2:
    return None
  holds = re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE)
  for _ in range(tries):
    other = int(rng.integers(len(docs) - 1))
    other += other >= d
    sents = docs[other][1]
    text, _ = _context(sents, int(rng.integers(len(sents))))
    if not holds.search(text):
      return text
  return None


def cloze_examples(docs, seed: int = 0,
                   unanswerable_fraction: float = 0.0) -> list[dict[str, Any]]:
  """Cloze QA: one word of a sentence is blanked out ('_') to make the
  question; the context is that sentence with its neighbours, where the
  answer is the word at its original place. With ``unanswerable_fraction``,
  each question is, with that probability, asked of a passage of another
  document without the word instead (``answers`` empty, ``answer_start``
  -1). The draws come from their own generator, so the answerable questions
  and their words are the same at every fraction."""
  rng = np.random.default_rng(seed)
  swap = np.random.default_rng([seed, 1])
  out = []
  for d, (name, sents) in enumerate(docs):
    for i, sent in enumerate(sents):
      words = list(_WORD.finditer(sent))
      if len(sent.split()) < 6 or not words:
        continue
      word = words[int(rng.integers(len(words)))]
      context, start = _context(sents, i)
      example = {"id": f"{name}#{i}", "context": context,
                 "question": sent[:word.start()] + "_" + sent[word.end():],
                 "answers": [word.group()], "answer_start": start + word.start()}
      if unanswerable_fraction and swap.random() < unanswerable_fraction:
        foreign = _foreign_context(docs, d, word.group(), swap)
        if foreign is not None:
          example.update(context=foreign, answers=[], answer_start=-1)
      out.append(example)
  return out
