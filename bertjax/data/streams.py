"""The ``stream`` layout: every batch row keeps reading its own text stream.

Segment recurrence (XLNet's memory, bertjax/models/xlnet.py) needs row r of
step t+1 to continue the text of row r of step t. This host's documents
(``pipeline._local_documents``) are dealt to its ``local_batch_size`` rows:
row r owns documents ``docs[r::local_batch_size]``, reads them in an order
reshuffled every pass (a pure function of (seed, global row, pass)), one after
the other, and cuts them into ``full_sentences`` rows
(``single_segment.fill_row``: the same rows, RoBERTa's separator between
documents). No window shuffle: it would break the continuation.

The state of row r is (position of its current document in its endless
document sequence, next chunk of it), so a restored iterator re-reads at most
one document per row and yields exactly the batches the saved one would have.
Every row is a function of (seed, row, how many rows it has emitted) and the
global row index, so how the devices split the batch does not matter;
evaluation packs ``stream`` like ``full_sentences`` (pipeline.EvalBatches).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bertjax.data import single_segment

# Tag keeping the rows' document orders apart from the pipeline's streams.
_ROW_ORDER_STREAM = 3


class _RowReader:
  """One row's endless, checkpointable stream of ``full_sentences`` rows."""

  def __init__(self, source: Any, docs: Sequence[int], seq_len: int,
               seed: tuple[int, ...]):
    self._source = source
    self._docs = docs
    self._seq_len = seq_len
    self._seed = seed
    self._position = -1  # index of the current document in the endless order
    self._current: single_segment.DocumentChunks | None = None
    self._chunk = 0
    self._orders: dict[int, np.ndarray] = {}

  def _document(self, position: int) -> single_segment.DocumentChunks:
    epoch, k = divmod(position, len(self._docs))
    order = self._orders.get(epoch)
    if order is None:
      rng = np.random.default_rng([*self._seed, epoch])
      self._orders = {epoch: rng.permutation(len(self._docs))}
      order = self._orders[epoch]
    doc_index = int(self._docs[int(order[k])])
    return single_segment.document_chunks(self._source[doc_index], doc_index,
                                          epoch, self._seq_len)

  def _next_document(self) -> single_segment.DocumentChunks:
    self._position += 1
    return self._document(self._position)

  def next_row(self) -> dict[str, np.ndarray]:
    row, self._current, self._chunk = single_segment.fill_row(
        self._current, self._chunk, self._next_document, self._seq_len)
    return row

  def get_state(self) -> dict[str, int]:
    return {"position": self._position, "chunk": self._chunk}

  def set_state(self, state: Mapping[str, int]) -> None:
    self._position = int(state["position"])
    self._chunk = int(state["chunk"])
    self._current = (None if self._position < 0
                     else self._document(self._position))


class StreamIterator:
  """Batches whose row r continues row r of the previous batch.

  ``get_state()`` is a JSON-serialisable dict; ``set_state`` resumes exactly.
  """

  def __init__(self, source: Any, docs: Sequence[int], *, seq_len: int,
               local_batch_size: int, seed: int, first_row: int,
               stack: Callable[[list[dict[str, np.ndarray]]], dict[str, np.ndarray]],
               split: str):
    if len(docs) < local_batch_size:
      raise ValueError(
          f"Layout 'stream' gives each of the {local_batch_size} rows of this "
          f"host's batch its own documents, but split {split!r} has only "
          f"{len(docs)} for this host; prepare more documents or lower "
          "--config.batch_size.")
    self._rows = [
        _RowReader(source, docs[r::local_batch_size], seq_len,
                   (seed, _ROW_ORDER_STREAM, first_row + r))
        for r in range(local_batch_size)]
    self._stack = stack

  def __iter__(self) -> "StreamIterator":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return self._stack([reader.next_row() for reader in self._rows])

  def get_state(self) -> dict[str, Any]:
    return {"rows": [reader.get_state() for reader in self._rows]}

  def set_state(self, state: Mapping[str, Any]) -> None:
    rows = state.get("rows")
    if rows is None or len(rows) != len(self._rows):
      raise ValueError(
          "The checkpoint's data state is not that of a 'stream' layout with "
          f"{len(self._rows)} rows per host; resume with the layout and "
          "batch_size it was saved with, or pass a new --workdir.")
    for reader, row_state in zip(self._rows, rows):
      reader.set_state(copy.deepcopy(row_state))
