"""Packing layouts: tokenized documents -> rows of the Batch contract.

Pure numpy, no grain: the pipeline (``bertjax.data.pipeline``) decides which
documents to pack and in which order; this module decides what one document
becomes. A layout is a function ``(doc, config, rng) -> list of rows`` chosen
by name from ``LAYOUTS`` (``config.layout``): ``sentence_pairs`` (BERT) and
``doc_sentences`` (RoBERTa, one document per row). ``full_sentences``
(RoBERTa) is the one layout whose rows cross documents; it is named in
``CROSS_DOCUMENT_LAYOUTS`` and read from the document stream with
``single_segment.fill_row``. The single-segment layouts live in
``bertjax/data/single_segment.py``.

A document is a mapping of numpy arrays:
  tokens            int32 [n]  token ids (>= NUM_SPECIAL_TOKENS).
  word_starts       bool  [n]  True at the first sub-token of each word.
  sentence_lengths  int32 [s]  tokens per sentence, summing to n.
  phrase_starts, entity_starts  bool [n], optional: ERNIE's unit boundaries
                    (bertjax/data/knowledge.py); word_starts where absent.
                    They travel exactly like word_starts, and a segment or
                    chunk always opens a unit in them.

A row is a dict with the per-example Batch fields of ``bertjax/batch.py``
without the batch dimension: tokens, segment_ids, positions, doc_ids,
word_starts, phrase_starts, entity_starts, special ([seq_len] each) and the
scalars a_lengths, b_lengths.
The pipeline adds example_id, epoch and example_mask.

The sentence-pair layout follows BERT's create_pretraining_data with two
changes: B is always the true continuation of A (NSP negatives are drawn on
device from other examples of the batch), and the target length is drawn per
pair rather than once per document, so that ``short_seq_prob`` is the fraction
of pairs with a short target whatever the document lengths. A model whose
tokenizer joins pairs with two separators (RoBERTa's own byte-level BPE:
``<s> A </s></s> B </s>``) gets rows ``[CLS] A [SEP] [SEP] B [SEP]``, as it
reads pairs in fine-tuning and in transformers (``PAIR_SEPARATORS_FIELD``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from bertjax import batch as batch_lib
from bertjax.data import knowledge
from bertjax.data import single_segment


# The config field of the [SEP]s between A and B of a sentence_pairs row: 2
# where the model's tokenizer joins pairs as RoBERTa's does (<s> A </s></s>
# B </s>), which an import records from the tokenizer's own pair template
# (bertjax/convert/pair_format.py); absent (1, BERT's [CLS] A [SEP] B [SEP])
# otherwise. The step reads the count back from the rows (objectives/nsp.py).
PAIR_SEPARATORS_FIELD = "pair_separators"


class Segment(NamedTuple):
  """One side of a pair: tokens int32 [n] and word_starts bool [n], n >= 1.

  phrase_starts / entity_starts bool [n]: ERNIE's unit boundaries; None
  means word_starts.
  """
  tokens: np.ndarray
  word_starts: np.ndarray
  phrase_starts: np.ndarray | None = None
  entity_starts: np.ndarray | None = None

  def starts(self, name: str) -> np.ndarray:
    """The boundary array ``name`` (word_starts for an absent knowledge one)."""
    value = getattr(self, name)
    return self.word_starts if value is None else value


class PairInstance(NamedTuple):
  """A sentence pair cut from one document.

  Offsets index the document's tokens: the chunk is ``[chunk_start,
  chunk_end)``, split into A and B at ``split``; after truncation A is
  ``[a_start, a_end)`` and B is ``[b_start, b_end)``, with
  ``chunk_start <= a_start < a_end <= split <= b_start < b_end <= chunk_end``.
  ``target_length`` is the token budget drawn for the chunk (before the
  ``max_tokens`` cap of truncation).
  """
  a: Segment
  b: Segment
  target_length: int
  chunk_start: int
  split: int
  chunk_end: int
  a_start: int
  a_end: int
  b_start: int
  b_end: int


def _segment(tokens: np.ndarray, starts: Mapping[str, np.ndarray], start: int,
             end: int, front_cut: bool) -> Segment:
  ws = starts["word_starts"][start:end]
  if front_cut:
    # The token that now opens the segment starts a word for whole-word
    # masking, even if it was the middle of a word in the document.
    ws = ws.copy()
    ws[0] = True
  units = {}
  for name in batch_lib.KNOWLEDGE_FIELDS:
    # A segment may start inside a phrase (a one-sentence chunk is split
    # between words): a word that opens the segment opens a unit too.
    units[name] = starts[name][start:end].copy()
    units[name][0] |= ws[0]
  return Segment(tokens[start:end], ws, **units)


def _truncation_counts(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
  """Tokens BERT's truncation removes from A and from B.

  BERT removes one token at a time from the longer side (B on ties) until the
  pair fits. Which side loses a token depends only on the lengths, so the
  counts are deterministic; only front-versus-back is random.
  """
  excess = len_a + len_b - max_tokens
  if excess <= 0:
    return 0, 0
  cut_a = cut_b = 0
  if len_a > len_b:
    cut_a = min(len_a - len_b, excess)
  elif len_b > len_a:
    cut_b = min(len_b - len_a, excess)
  rest = excess - cut_a - cut_b
  # Equal lengths from here on: B (tie) then A alternate.
  return cut_a + rest // 2, cut_b + (rest + 1) // 2


def _draw_target(max_tokens: int, short_seq_prob: float,
                 rng: np.random.Generator) -> int:
  if short_seq_prob > 0 and rng.random() < short_seq_prob:
    return int(rng.integers(2, max_tokens + 1))
  return max_tokens


PAIR_CHUNKING = ("bert", "whole_sentences")


def pair_instances(doc: Mapping[str, np.ndarray], *, seq_len: int,
                   short_seq_prob: float,
                   rng: np.random.Generator,
                   chunking: str = "bert",
                   separators: int = 1) -> list[PairInstance]:
  """Cuts one document into BERT sentence pairs (A, B = true continuation).

  Sentences are accumulated into a chunk until it reaches the drawn target
  length (``seq_len - 3``, or with probability ``short_seq_prob`` a uniform
  length in ``[2, seq_len - 3]``; one less per extra separator) or the
  document ends. A chunk of several
  sentences is split at a random sentence boundary; a one-sentence chunk at the
  word boundary nearest a random point (skipped if it is a single word). The
  pair is then truncated to ``seq_len - 3`` tokens as BERT does.

  ``chunking='whole_sentences'`` closes a chunk before the sentence that
  would take it past the target instead, so only a single over-long sentence
  is ever truncated. BERT's overshoot-then-truncate cuts tokens at the A|B
  junction as often as at the ends: on the demo corpus 69% of the pairs lose
  tokens there (median 5), so the "true continuation" is no longer adjacent --
  noise for sentence-order prediction, whose positives should be exactly
  adjacent (configs/albert.py uses it).

  Args:
    doc: tokens int32 [n], word_starts bool [n], sentence_lengths int32 [s].
    seq_len: row length including [CLS] and two [SEP]; at least 5.
    short_seq_prob: probability of a short target length.
    rng: the only source of randomness; the result is a pure function of it.
    chunking: 'bert' or 'whole_sentences' (``config.pair_chunking``).
    separators: [SEP]s between A and B in the row (``pair_row``).

  Returns:
    The pairs in document order.
  """
  if chunking not in PAIR_CHUNKING:
    raise ValueError(
        f"Unknown pair_chunking {chunking!r}; set --config.pair_chunking to "
        f"one of {', '.join(PAIR_CHUNKING)}.")
  max_tokens = seq_len - 2 - separators
  if max_tokens < 2:
    raise ValueError(
        f"seq_len={seq_len} leaves no room for a sentence pair; use seq_len >= "
        f"{4 + separators}.")
  tokens = np.asarray(doc["tokens"])
  starts = knowledge.unit_starts(doc)
  word_starts = starts["word_starts"]
  lengths = np.asarray(doc["sentence_lengths"])
  if int(lengths.sum()) != len(tokens) or any(
      len(v) != len(tokens) for v in starts.values()):
    raise ValueError(
        f"Document has {len(tokens)} tokens, {len(word_starts)} word_starts and "
        f"sentence_lengths summing to {int(lengths.sum())}; re-prepare the data "
        "so that the three agree.")
  # Sentence start offsets, empty sentences dropped (they add no boundary).
  bounds = np.concatenate([[0], np.cumsum(lengths[lengths > 0])]).tolist()
  num_sentences = len(bounds) - 1

  out = []
  target = _draw_target(max_tokens, short_seq_prob, rng)
  first = 0  # first sentence of the current chunk
  for last in range(num_sentences):
    start, end = bounds[first], bounds[last + 1]
    if chunking == "whole_sentences":
      # Close the chunk before the sentence that would overflow the target.
      if last < num_sentences - 1 and bounds[last + 2] - start <= target:
        continue
    elif end - start < target and last < num_sentences - 1:
      continue
    if last > first:
      split = bounds[int(rng.integers(first + 1, last + 1))]
    else:
      inner = np.flatnonzero(word_starts[start + 1:end]) + start + 1
      split = -1
      if len(inner):
        point = int(rng.integers(start + 1, end))
        i = int(np.searchsorted(inner, point))
        near = inner[max(i - 1, 0):i + 1]
        split = int(near[np.argmin(np.abs(near - point))])
    if split > 0:
      cut_a, cut_b = _truncation_counts(split - start, end - split, max_tokens)
      front_a = int(rng.binomial(cut_a, 0.5)) if cut_a else 0
      front_b = int(rng.binomial(cut_b, 0.5)) if cut_b else 0
      a_start, a_end = start + front_a, split - (cut_a - front_a)
      b_start, b_end = split + front_b, end - (cut_b - front_b)
      out.append(PairInstance(
          a=_segment(tokens, starts, a_start, a_end, front_a > 0),
          b=_segment(tokens, starts, b_start, b_end, front_b > 0),
          target_length=target, chunk_start=start, split=split,
          chunk_end=end, a_start=a_start, a_end=a_end, b_start=b_start,
          b_end=b_end))
    first = last + 1
    target = _draw_target(max_tokens, short_seq_prob, rng)
  return out


def pair_row(a: Segment, b: Segment, seq_len: int,
             separators: int = 1) -> dict[str, np.ndarray]:
  """Writes ``[CLS] A [SEP] B [SEP] PAD...`` as one row of the Batch contract,
  or with ``separators=2`` ``[CLS] A [SEP] [SEP] B [SEP] PAD...`` (the pair
  template of a RoBERTa-style tokenizer, ``<s> A </s></s> B </s>``); the
  separators after A have segment id 0.

  Args:
    a: sentence A, n_a >= 1 tokens.
    b: sentence B, n_b >= 1 tokens, n_a + n_b + 2 + separators <= seq_len.
    seq_len: row length L.
    separators: 1 or 2 [SEP]s between A and B.

  Returns:
    tokens, segment_ids, positions, doc_ids int32 [L]; word_starts,
    phrase_starts, entity_starts, special bool [L]; a_lengths, b_lengths
    int32 [] (n_a, n_b).
  """
  if separators not in (1, 2):
    raise ValueError(f"separators={separators}; a pair row has 1 or 2 [SEP] "
                     "between its segments.")
  la, lb = len(a.tokens), len(b.tokens)
  specials = 2 + separators
  n = la + lb + specials
  if la < 1 or lb < 1 or n > seq_len:
    raise ValueError(
        f"A pair of {la} + {lb} tokens does not fit seq_len={seq_len} with "
        f"{specials} special tokens; truncate both to >= 1 token and <= seq_len - "
        f"{specials} in total.")
  sep_a, b0 = la + 1, la + 1 + separators
  seps = [0, *range(sep_a, b0), n - 1]  # CLS, the separators, the last [SEP]
  tokens = np.zeros(seq_len, np.int32)
  tokens[0] = batch_lib.CLS_ID
  tokens[1:sep_a] = a.tokens
  tokens[sep_a:b0] = batch_lib.SEP_ID
  tokens[b0:n - 1] = b.tokens
  tokens[n - 1] = batch_lib.SEP_ID
  segment_ids = np.zeros(seq_len, np.int32)
  segment_ids[b0:n] = 1
  doc_ids = np.zeros(seq_len, np.int32)
  doc_ids[:n] = 1
  special = np.zeros(seq_len, bool)
  special[seps] = True
  special[n - 1:] = True
  row = {
      "tokens": tokens,
      "segment_ids": segment_ids,
      "positions": np.arange(seq_len, dtype=np.int32),
      "doc_ids": doc_ids,
      "special": special,
      "a_lengths": np.int32(la),
      "b_lengths": np.int32(lb),
  }
  for name in ("word_starts",) + batch_lib.KNOWLEDGE_FIELDS:
    starts = np.zeros(seq_len, bool)
    starts[1:sep_a] = a.starts(name)
    starts[b0:n - 1] = b.starts(name)
    starts[seps] = True
    row[name] = starts
  return row


def sentence_pair_rows(doc: Mapping[str, np.ndarray], config: Any,
                       rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
  """The ``sentence_pairs`` layout: one row per ``pair_instances`` pair.

  Uses config.seq_len, config.short_seq_prob, config.pair_chunking and
  config.pair_separators (1 when absent: ``PAIR_SEPARATORS_FIELD``).
  """
  separators = int(config.get(PAIR_SEPARATORS_FIELD, 1))
  return [pair_row(p.a, p.b, config.seq_len, separators)
          for p in pair_instances(doc, seq_len=config.seq_len,
                                  short_seq_prob=config.short_seq_prob,
                                  rng=rng,
                                  chunking=config.get("pair_chunking", "bert"),
                                  separators=separators)]


Layout = Callable[[Mapping[str, np.ndarray], Any, np.random.Generator],
                  list[dict[str, np.ndarray]]]

# config.layout -> packing function of one document.
LAYOUTS: dict[str, Layout] = {
    "sentence_pairs": sentence_pair_rows,
    "doc_sentences": single_segment.doc_sentence_rows,
}

# Layouts whose rows take sentences from consecutive documents of the stream;
# the pipeline reads them with ``single_segment.document_chunks`` and
# ``single_segment.fill_row``.
# ``stream`` packs the same rows as full_sentences, but each batch row reads
# its own documents, so that row r of step t+1 continues row r of step t
# (bertjax/data/streams.py; XLNet's segment memory needs it).
CROSS_DOCUMENT_LAYOUTS = ("full_sentences", "stream")


def is_cross_document(name: str) -> bool:
  """Whether layout ``name`` packs across documents; raises on unknown names."""
  if name in CROSS_DOCUMENT_LAYOUTS:
    return True
  get_layout(name)
  return False


def get_layout(name: str) -> Layout:
  """The per-document packing function registered as ``name`` in ``LAYOUTS``."""
  if name in CROSS_DOCUMENT_LAYOUTS:
    raise ValueError(
        f"Layout {name!r} packs across documents and has no per-document "
        "function; read it with single_segment.fill_row (the pipeline does).")
  if name not in LAYOUTS:
    names = sorted(LAYOUTS) + list(CROSS_DOCUMENT_LAYOUTS)
    raise ValueError(
        f"Unknown packing layout {name!r}; set config.layout to one of "
        f"{names}.")
  return LAYOUTS[name]
