"""Single-segment packing layouts: RoBERTa's DOC-SENTENCES and FULL-SENTENCES.

Both fill rows of ``seq_len`` tokens with whole sentences (a sentence longer
than a row is cut at word starts) instead of sentence pairs:

  doc_sentences   ``[CLS] s1 s2 ... [SEP] PAD``: one document per row, never
                  crossing; a document's last row may be short (padded, so
                  shapes stay fixed).
  full_sentences  ``[CLS] doc1 sents [SEP] doc2 sents [SEP] ...``: sentences
                  taken contiguously from the document stream, crossing
                  document boundaries with a [SEP] between documents.

Every document part of a row has its own ``doc_ids`` value (attention is
blocked between parts unless the objective merges them) and its positions
restart at 1 (the first token after [CLS] in a one-part row). ``segment_ids``
are 0, ``a_lengths`` counts the non-special tokens and ``b_lengths`` is 0.

ERNIE's unit boundaries (phrase_starts, entity_starts; word_starts where a
document has none) travel with word_starts, and every chunk opens a unit.

``doc_sentence_rows`` is an ordinary per-document layout; ``full_sentences``
needs the stream, so the pipeline reads it through ``fill_row`` whose only
state is (current document, next chunk), which checkpoints exactly.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

import numpy as np

from bertjax import batch as batch_lib
from bertjax.data import knowledge

# The per-token boundary fields a row carries (bertjax/batch.py).
_STARTS = ("word_starts",) + batch_lib.KNOWLEDGE_FIELDS


def sentence_chunks(doc: Mapping[str, np.ndarray], max_tokens: int) -> np.ndarray:
  """Offsets of a document's sentences, each cut to at most ``max_tokens``.

  Empty sentences are dropped. A sentence longer than ``max_tokens`` is cut
  into pieces at the last word start that keeps the piece within the limit
  (a hard cut when a single word is longer), so every chunk fits one row.

  Args:
    doc: tokens int32 [n], word_starts bool [n], sentence_lengths int32 [s].
    max_tokens: the longest chunk allowed (>= 1).

  Returns:
    int64 [c + 1] ascending offsets; chunk j is ``[out[j], out[j + 1])``.
  """
  tokens = np.asarray(doc["tokens"])
  word_starts = np.asarray(doc["word_starts"], dtype=bool)
  lengths = np.asarray(doc["sentence_lengths"])
  if int(lengths.sum()) != len(tokens) or len(word_starts) != len(tokens):
    raise ValueError(
        f"Document has {len(tokens)} tokens, {len(word_starts)} word_starts and "
        f"sentence_lengths summing to {int(lengths.sum())}; re-prepare the data "
        "so that the three agree.")
  ends = np.cumsum(lengths)
  bounds = [0]
  for start, end in zip((ends - lengths).tolist(), ends.tolist()):
    while end - start > max_tokens:
      starts = np.flatnonzero(word_starts[start + 1:start + max_tokens + 1])
      start = start + 1 + int(starts[-1]) if len(starts) else start + max_tokens
      bounds.append(start)
    if end > start:
      bounds.append(end)
  return np.asarray(bounds, np.int64)


class RowBuilder:
  """Fills one single-segment row with whole chunks of one or more documents.

  The row is ``[CLS] part_1 [SEP] part_2 [SEP] ... part_k [SEP] PAD...``: a
  part is a run of consecutive chunks of one document, closed by [SEP] (the
  separator between documents, and the row's final one). Part k has doc id k
  ([CLS] belongs to part 1), and positions restart in every part so that a
  document's first token sits at position 1 in any part, as after [CLS].
  """

  def __init__(self, seq_len: int):
    if seq_len < 3:
      raise ValueError(
          f"seq_len={seq_len} leaves no room for [CLS] text [SEP]; use seq_len >= 3.")
    self.seq_len = seq_len
    self._parts: list[list[tuple[np.ndarray, dict[str, np.ndarray]]]] = []
    self._used = 1  # [CLS]

  @property
  def empty(self) -> bool:
    return not self._parts

  def add(self, tokens: np.ndarray, word_starts: np.ndarray,
          new_part: bool,
          units: Mapping[str, np.ndarray] | None = None) -> bool:
    """Appends a chunk if it fits; returns whether it did.

    Args:
      tokens: int32 [n], n >= 1; word_starts: bool [n].
      new_part: the chunk opens a new part (another document); the first
        chunk of a row always does.
      units: phrase_starts / entity_starts bool [n]; absent ones are
        word_starts.
    """
    new_part = new_part or not self._parts
    cost = len(tokens) + int(new_part)  # a new part brings its [SEP]
    if self._used + cost > self.seq_len:
      return False
    if new_part:
      self._parts.append([])
    starts = {name: word_starts for name in _STARTS}
    starts.update(units or {})
    self._parts[-1].append((tokens, starts))
    self._used += cost
    return True

  def row(self) -> dict[str, np.ndarray]:
    """The row's Batch fields (no batch dimension), see the module docstring."""
    n = self.seq_len
    out = {name: np.zeros(n, np.int32)
           for name in ("tokens", "segment_ids", "positions", "doc_ids")}
    for name in _STARTS:
      out[name] = np.zeros(n, bool)
      out[name][0] = True
    out["special"] = np.ones(n, bool)
    out["tokens"][0] = batch_lib.CLS_ID
    out["doc_ids"][0] = 1
    t = 1
    for k, part in enumerate(self._parts):
      start = t
      for tokens, starts in part:
        end = t + len(tokens)
        out["tokens"][t:end] = tokens
        for name in _STARTS:
          out[name][t:end] = starts[name]
          # A chunk may be the back of a cut word (or phrase); it still
          # opens a word (and a unit).
          out[name][t] = True
        out["special"][t:end] = False
        t = end
      out["tokens"][t] = batch_lib.SEP_ID
      for name in _STARTS:
        out[name][t] = True
      out["doc_ids"][start:t + 1] = k + 1
      out["positions"][start:t + 1] = np.arange(1, t + 2 - start)
      t += 1
    out["a_lengths"] = np.int32(t - 1 - len(self._parts))
    out["b_lengths"] = np.int32(0)
    return out


def doc_sentence_rows(doc: Mapping[str, np.ndarray], config: Any,
                      rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
  """The ``doc_sentences`` layout: rows of whole sentences of ONE document.

  Sentences (``sentence_chunks``, cut to ``seq_len - 2``) are packed greedily
  in order; a row is closed when the next sentence does not fit, and the
  document's last row is closed at its end, so it may be short (padded: the
  shapes stay fixed, unlike RoBERTa's dynamic batch size). Deterministic:
  ``rng`` is unused. Uses config.seq_len.
  """
  del rng
  tokens = np.asarray(doc["tokens"], np.int32)
  starts = knowledge.unit_starts(doc)
  bounds = sentence_chunks(doc, config.seq_len - 2)
  rows, builder = [], RowBuilder(config.seq_len)
  for start, end in zip(bounds[:-1], bounds[1:]):
    chunk = (tokens[start:end], starts["word_starts"][start:end], False,
             {k: starts[k][start:end] for k in batch_lib.KNOWLEDGE_FIELDS})
    if not builder.add(*chunk):
      rows.append(builder.row())
      builder = RowBuilder(config.seq_len)
      builder.add(*chunk)
  if not builder.empty:
    rows.append(builder.row())
  return rows


class DocumentChunks(NamedTuple):
  """A document of the stream, cut into chunks for cross-document layouts.

  tokens int32 [n], word_starts bool [n], bounds int64 [c + 1] (from
  ``sentence_chunks``), the identity doc_index / epoch of the document, and
  units: phrase_starts / entity_starts bool [n] (None: word_starts).
  """
  doc_index: int
  epoch: int
  tokens: np.ndarray
  word_starts: np.ndarray
  bounds: np.ndarray
  units: Mapping[str, np.ndarray] | None = None

  def chunk_units(self, start: int, end: int) -> dict[str, np.ndarray] | None:
    """The knowledge boundaries of tokens [start, end), None without them."""
    if self.units is None:
      return None
    return {name: value[start:end] for name, value in self.units.items()}

  @property
  def num_chunks(self) -> int:
    return len(self.bounds) - 1


def document_chunks(doc: Mapping[str, np.ndarray], doc_index: int, epoch: int,
                    seq_len: int) -> DocumentChunks:
  """Cuts one document into chunks of at most ``seq_len - 2`` tokens."""
  starts = knowledge.unit_starts(doc)
  return DocumentChunks(doc_index, epoch, np.asarray(doc["tokens"], np.int32),
                        starts["word_starts"], sentence_chunks(doc, seq_len - 2),
                        {k: starts[k] for k in batch_lib.KNOWLEDGE_FIELDS})


def fill_row(
    current: DocumentChunks | None, chunk: int,
    next_document: Callable[[], DocumentChunks | None], seq_len: int
) -> tuple[dict[str, np.ndarray] | None, DocumentChunks | None, int]:
  """One ``full_sentences`` row, read from a stream of documents.

  Chunks are taken in stream order from chunk ``chunk`` of ``current``; when
  a document runs out the next one is fetched with ``next_document`` and opens
  a new part (RoBERTa's extra separator between documents). The row closes
  when the next chunk does not fit. The reader's position is only
  (current document, chunk index), so a pipeline checkpoints it exactly.

  Args:
    current: the document being read (None before the first).
    chunk: index of its next unread chunk.
    next_document: returns the next document of the stream, None at its end.
    seq_len: row length L.

  Returns:
    (row or None when the stream ended before any chunk, document now being
    read, its next chunk). The row has the fields of ``RowBuilder.row`` plus
    example_id int32 [2] = (doc_index, chunk) of its first chunk, which no
    other row of the same pass shares, and that document's epoch.
  """
  builder = RowBuilder(seq_len)
  new_part, first = False, None
  while True:
    if current is None or chunk == current.num_chunks:
      current, chunk, new_part = next_document(), 0, True
      if current is None:
        break
      continue
    start, end = current.bounds[chunk], current.bounds[chunk + 1]
    if not builder.add(current.tokens[start:end],
                       current.word_starts[start:end], new_part,
                       current.chunk_units(start, end)):
      break
    if first is None:
      first = (current.doc_index, chunk, current.epoch)
    new_part = False
    chunk += 1
  if first is None:
    return None, current, chunk
  row = builder.row()
  row["example_id"] = np.array(first[:2], np.int32)
  row["epoch"] = np.int32(first[2])
  row["example_mask"] = np.bool_(True)
  return row, current, chunk


def full_sentence_rows(documents: Iterable[DocumentChunks],
                       seq_len: int) -> Iterator[dict[str, np.ndarray]]:
  """All ``full_sentences`` rows of a finite stream of documents, in order."""
  docs = iter(documents)
  current, chunk = None, 0
  while True:
    row, current, chunk = fill_row(current, chunk, lambda: next(docs, None),
                                   seq_len)
    if row is None:
      return
    yield row
