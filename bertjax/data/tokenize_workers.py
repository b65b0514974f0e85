"""Tokenization of documents in worker processes, in document order.

Documents are cut into chunks of a fixed number of documents (a pure function
of document index); each chunk is tokenized whole by whichever worker is free,
and the chunks come back in order, so the examples, and thus the shards, are
the same whatever the number of workers. At most ``2 * workers`` chunks are in
flight, so memory is bounded by chunks, not by the corpus.

Workers are started with 'spawn': the parent may have imported JAX, whose
threads must not be forked. This module imports only numpy and sentencepiece,
so a worker starts in well under a second.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
from typing import Iterable, Iterator, Sequence

import numpy as np

from bertjax.data import tokenizer as tokenizer_lib

# Documents per chunk: large enough to amortize inter-process transfer, small
# enough that a chunk's text and tokens stay a few MB.
CHUNK_DOCUMENTS = 256

Chunk = list[tuple[int, Sequence[str]]]  # (document index, sentences)
Example = dict[str, np.ndarray]

_worker_tokenizer: tokenizer_lib.Tokenizer | None = None


def resolve_workers(workers: int) -> int:
  """``config.prepare_workers``: 0 means every core of this machine."""
  if workers < 0:
    raise ValueError(
        f"prepare_workers={workers} is negative; set --config.prepare_workers "
        f"to 0 (all cores) or a positive number.")
  return workers or os.cpu_count() or 1


def encode_chunk(tok: tokenizer_lib.Tokenizer, chunk: Chunk
                 ) -> list[tuple[int, Example]]:
  """Tokenizes a chunk of documents; drops documents of fewer than 2 tokens.

  Returns:
    (document index, example) pairs in chunk order; example: tokens int32 [n],
    word_starts bool [n], sentence_lengths int32 [s] (empty sentences
    dropped, sum == n).
  """
  flat = [s for _, sents in chunk for s in sents]
  encoded = iter(tok.encode_batch(flat))
  out = []
  for index, sents in chunk:
    pieces = [next(encoded) for _ in sents]
    pieces = [p for p in pieces if p.size]
    tokens = np.concatenate(pieces) if pieces else np.zeros([0], np.int32)
    if tokens.size < 2:
      continue
    out.append((index, {
        "tokens": tokens,
        "word_starts": tok.word_starts(tokens),
        "sentence_lengths": np.array([p.size for p in pieces], np.int32),
    }))
  return out


def _init_worker(model_path: str) -> None:
  global _worker_tokenizer
  _worker_tokenizer = tokenizer_lib.Tokenizer(model_path)


def _encode_in_worker(chunk: Chunk) -> list[tuple[int, Example]]:
  return encode_chunk(_worker_tokenizer, chunk)


def _chunks(docs: Iterable[tuple[str, Sequence[str]]]) -> Iterator[Chunk]:
  chunk = []
  for index, (_, sents) in enumerate(docs):
    chunk.append((index, list(sents)))
    if len(chunk) == CHUNK_DOCUMENTS:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


def encode_documents(docs: Iterable[tuple[str, Sequence[str]]],
                     tok: tokenizer_lib.Tokenizer, workers: int = 1
                     ) -> Iterator[tuple[int, Example]]:
  """(document index, example) for every document of ``docs``, in order.

  With ``workers`` > 1, chunks are tokenized by that many spawned processes;
  the result is identical to ``workers=1``.
  """
  if workers <= 1:
    for chunk in _chunks(docs):
      yield from encode_chunk(tok, chunk)
    return
  context = multiprocessing.get_context("spawn")
  with context.Pool(workers, initializer=_init_worker, initargs=(tok.path,)) as pool:
    pending = collections.deque()
    for chunk in _chunks(docs):
      pending.append(pool.apply_async(_encode_in_worker, (chunk,)))
      if len(pending) >= 2 * workers:
        yield from pending.popleft().get()
    while pending:
      yield from pending.popleft().get()
