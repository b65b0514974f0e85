"""The grain host pipeline: documents -> packed, shuffled, fixed-shape Batches.

Training (``make_train_iterator``), per host:

  this host's documents (global index i with i % process_count == process_index)
    -> repeated forever, reshuffled every epoch (seed: config.seed, epoch)
    -> each document packed by the layout ``config.layout`` names
       (bertjax.data.packing), seeded by (config.seed, document index, copy)
       with copy = epoch % config.dupe_factor: like BERT's data script, which
       re-draws its pairs in every one of its dupe_factor duplications, there
       are dupe_factor packings of the corpus, each the same whenever it comes
       round: example_id = (document index, pair index) within the copy
       -- or, for a cross-document layout (full_sentences), cut into sentence
       chunks that one reader packs across consecutive documents:
       example_id = (document index, chunk index) of the row's first chunk
    -> flattened to single examples, window-shuffled (config.shuffle_window) so
       that the pairs of one document land in different batches (NSP negatives
       are B segments of other examples of the same batch)
    -> batched (remainder dropped) into the Batch of bertjax/batch.py.

Every stage is a grain dataset whose iterator checkpoints exactly: the state is
a small JSON-serialisable dict of counters, and a fresh iterator given it
yields the same batches as the one that produced it.

Evaluation (``make_eval_batches``) is one pass in document order with a fixed
packing seed. Its examples are dealt round-robin to hosts (every host packs the
whole split, which is small) so that every host yields the same number of
batches, as SPMD evaluation needs; the last batch is padded with empty rows.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Iterator, Mapping, Sequence

from absl import logging
import grain
import numpy as np

from bertjax import batch as batch_lib
from bertjax.data import packing
from bertjax.data import single_segment
from bertjax.data import streams

# Threads that read and pack documents ahead of the consumer. Packing holds the
# GIL, so more threads mostly help sources with slow reads (ArrayRecord files).
_READ_THREADS = 4
_READ_BUFFER = 64
_CACHED_EPOCHS = 4

# Tags that keep the random streams of the stages apart for one config.seed.
_ORDER_STREAM = 1
_WINDOW_STREAM = 2


def _stack_rows(rows: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Stacks per-example rows into a Batch: every field gets a leading [batch]."""
  return {name: np.stack([r[name] for r in rows]).astype(dtype, copy=False)
          for name, (dtype, _) in batch_lib.FIELDS.items()}


def _local_documents(source: Any, process_index: int,
                     process_count: int) -> range:
  if not 0 <= process_index < process_count:
    raise ValueError(
        f"process_index={process_index} is outside [0, {process_count}); pass "
        "jax.process_index() and jax.process_count().")
  docs = range(process_index, len(source), process_count)
  if not docs:
    raise ValueError(
        f"The split has {len(source)} documents, too few for host "
        f"{process_index} of {process_count}; prepare more data or use fewer hosts.")
  return docs


def _draws_nsp_negatives(config: Any) -> bool:
  """Whether the step will pair A with a B from another document (NSP)."""
  return (config.layout == "sentence_pairs"
          and float(config.get("nsp_negative_rate", 0.0) or 0.0) > 0)


def _few_documents_message(config: Any, split: str, count: int) -> str:
  return (f"Split {split!r} has {count} document(s), but NSP draws its negatives "
          f"from other documents, so with fewer than 2 every pair is positive "
          f"and NSP accuracy measures nothing (only how often the model says "
          f"'is next'); add documents (more files, or "
          f"--config.dataset=bertjax_local_text/paragraphs) or train a config "
          f"without NSP such as configs/roberta.py or configs/spanbert.py.")


def check_pair_documents(config: Any, split: str, count: int, *,
                         refuse: bool) -> None:
  """Refuses (training) or warns about (evaluation) NSP over < 2 documents.

  Training is refused: a run would learn nothing from NSP (every label is
  'is next').
  Evaluation only warns, because it runs after training and its MLM figures
  are still sound; the NSP accuracy it prints is then meaningless.
  """
  if count >= 2 or not _draws_nsp_negatives(config):
    return
  if refuse:
    raise ValueError(_few_documents_message(config, split, count))
  logging.warning("%s", _few_documents_message(config, split, count))


class _ShuffledDocument(grain.experimental.MapWithIndexTransform):
  """Position in the endless stream -> (epoch, global document index)."""

  def __init__(self, docs: range, seed: int):
    self._docs = docs
    self._seed = seed
    self._lock = threading.Lock()
    self._orders: dict[int, np.ndarray] = {}

  def _permutation(self, epoch: int) -> np.ndarray:
    # One numpy permutation per epoch, a pure function of (seed, epoch), so any
    # position of any epoch is known without replaying the stream (exact
    # resume). grain's index_shuffle would avoid the array but costs
    # milliseconds per call on small splits. A few epochs are cached because
    # the reading threads run ahead of each other, by several epochs when the
    # split is smaller than the read buffer; an evicted one is recomputed.
    with self._lock:
      order = self._orders.get(epoch)
      if order is None:
        rng = np.random.default_rng([self._seed, _ORDER_STREAM, epoch])
        order = self._orders[epoch] = rng.permutation(len(self._docs))
        if len(self._orders) > _CACHED_EPOCHS:
          del self._orders[min(self._orders)]
      return order

  def map_with_index(self, index: int, element: int) -> tuple[int, int]:
    epoch, position = divmod(index, len(self._docs))
    return epoch, self._docs[int(self._permutation(epoch)[position])]


class _PackDocument(grain.transforms.Map):
  """(epoch, document index) -> the document's rows, labelled with identity."""

  def __init__(self, source: Any, config: Any, seed: int):
    self._source = source
    self._config = config
    self._layout = packing.get_layout(config.layout)
    self._seed = seed

  def map(self, element: tuple[int, int]) -> list[dict[str, np.ndarray]]:
    epoch, doc_index = element
    return pack_document(self._source[doc_index], doc_index, self._layout,
                         self._config, self._seed, epoch)


class _ChunkDocument(grain.transforms.Map):
  """(epoch, document index) -> the document cut into sentence chunks."""

  def __init__(self, source: Any, seq_len: int):
    self._source = source
    self._seq_len = seq_len

  def map(self, element: tuple[int, int]) -> single_segment.DocumentChunks:
    epoch, doc_index = element
    return single_segment.document_chunks(self._source[doc_index], doc_index,
                                          epoch, self._seq_len)


class _CrossDocumentIterator(grain.DatasetIterator):
  """Packs a stream of ``DocumentChunks`` into full_sentences rows.

  The state is the parent's state just before the document being read plus
  the index of its next chunk: restoring re-reads that one document.
  """

  def __init__(self, parent: grain.DatasetIterator, seq_len: int):
    super().__init__(parent)
    self._seq_len = seq_len
    self._doc_start = parent.get_state()
    self._current: single_segment.DocumentChunks | None = None
    self._chunk = 0

  def _next_document(self) -> single_segment.DocumentChunks | None:
    self._doc_start = self._parent.get_state()
    return next(self._parent, None)

  def __next__(self) -> dict[str, np.ndarray]:
    row, self._current, self._chunk = single_segment.fill_row(
        self._current, self._chunk, self._next_document, self._seq_len)
    if row is None:
      raise StopIteration
    return row

  def get_state(self) -> dict[str, Any]:
    return {"doc_start": copy.deepcopy(self._doc_start),
            "has_document": self._current is not None, "chunk": self._chunk}

  def set_state(self, state: dict[str, Any]) -> None:
    self._doc_start = copy.deepcopy(state["doc_start"])
    self._parent.set_state(copy.deepcopy(state["doc_start"]))
    self._current = next(self._parent) if state["has_document"] else None
    self._chunk = state["chunk"]


class _CrossDocumentIterDataset(grain.IterDataset):
  """IterDataset of ``_CrossDocumentIterator``."""

  def __init__(self, parent: grain.IterDataset, seq_len: int):
    super().__init__(parent)
    self._seq_len = seq_len

  def __iter__(self) -> grain.DatasetIterator:
    return _CrossDocumentIterator(self._parent.__iter__(), self._seq_len)


class _Flatten(grain.experimental.FlatMapTransform):
  """A document's list of rows -> the rows one by one (any number of them)."""

  def flat_map(self, element: list[Any]) -> list[Any]:
    return element


class _WindowShuffleIterator(grain.DatasetIterator):
  """Emits its parent's elements in windows of ``window`` shuffled elements.

  The state is the parent's state at the start of the current window plus the
  position in it: restoring refills and reshuffles the window (the shuffle is a
  pure function of (seed, window index)) and skips what was already emitted.
  grain's WindowShuffleIterDataset does the same but draws the permutation
  with one index_shuffle call per element, which dominated the pipeline's time.
  """

  def __init__(self, parent: grain.DatasetIterator, window: int,
               seed: tuple[int, ...]):
    super().__init__(parent)
    self._window_size = window
    self._seed = seed
    self._window_index = 0
    self._position = 0
    self._window: list[Any] = []
    self._window_start = parent.get_state()

  def _fill(self) -> None:
    self._window_start = self._parent.get_state()
    items = []
    for item in self._parent:
      items.append(item)
      if len(items) == self._window_size:
        break
    rng = np.random.default_rng([*self._seed, self._window_index])
    order = rng.permutation(len(items))
    self._window = [items[i] for i in order]
    self._position = 0

  def __next__(self) -> Any:
    if self._position == len(self._window):
      if self._window:
        self._window_index += 1
      self._fill()
      if not self._window:
        raise StopIteration
    item = self._window[self._position]
    self._window[self._position] = None  # release it as soon as it is out
    self._position += 1
    return item

  def get_state(self) -> dict[str, Any]:
    return {"window_start": copy.deepcopy(self._window_start),
            "window_index": self._window_index, "position": self._position}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(copy.deepcopy(state["window_start"]))
    self._window_index = state["window_index"]
    self._fill()
    self._position = min(state["position"], len(self._window))
    self._window[:self._position] = [None] * self._position


class _WindowShuffleIterDataset(grain.IterDataset):
  """IterDataset of ``_WindowShuffleIterator``."""

  def __init__(self, parent: grain.IterDataset, window: int,
               seed: tuple[int, ...]):
    super().__init__(parent)
    self._window_size = window
    self._seed = seed

  def __iter__(self) -> grain.DatasetIterator:
    return _WindowShuffleIterator(self._parent.__iter__(), self._window_size,
                                  self._seed)


def packing_copy(epoch: int, config: Any) -> int:
  """Which of the config.dupe_factor packings of the corpus ``epoch`` reads."""
  return int(epoch) % max(int(config.get("dupe_factor", 1)), 1)


def pack_document(doc: Mapping[str, np.ndarray], doc_index: int,
                  layout: packing.Layout, config: Any, seed: int,
                  epoch: int) -> list[dict[str, np.ndarray]]:
  """Packs one document into complete Batch rows (no batch dimension).

  The rows depend only on (seed, doc_index, copy) and the document, never on
  the host, so that (example_id, copy) names the same tokens forever -- the
  same identity static masking keys on (``masking.example_keys``). Copy 0 is
  seeded by (seed, doc_index) alone, so the first epoch and evaluation pack as
  they did before copies existed. Only layouts that draw random numbers
  (sentence_pairs: chunk targets and split points) differ between copies.

  Args:
    doc: tokens int32 [n], word_starts bool [n], sentence_lengths int32 [s].
    doc_index: index of the document in its split (global, across hosts).
    layout: a function from ``packing.LAYOUTS``.
    config: passed to the layout (seq_len, short_seq_prob, ...).
    seed: packing seed.
    epoch: written to the rows' epoch field; with config.dupe_factor it
      picks the copy (``packing_copy``).

  Returns:
    Rows with every field of ``bertjax.batch.FIELDS``; example_id int32 [2] is
    (doc_index, row index in the document), example_mask True.
  """
  copy_index = packing_copy(epoch, config)
  rng = np.random.default_rng(
      [seed, doc_index] + ([copy_index] if copy_index else []))
  rows = layout(doc, config, rng)
  for k, row in enumerate(rows):
    row["example_id"] = np.array([doc_index, k], np.int32)
    row["epoch"] = np.int32(epoch)
    row["example_mask"] = np.bool_(True)
  return rows


def make_train_iterator(config: Any, source: Any, *, local_batch_size: int,
                        process_index: int = 0,
                        process_count: int = 1) -> grain.DatasetIterator:
  """The endless, checkpointable training iterator of this host.

  Args:
    config: uses seed, seq_len, layout, shuffle_window and what the layout
      reads (short_seq_prob for sentence_pairs).
    source: random access to tokenized documents (``len``, ``source[i]``),
      e.g. ``PreparedData.source("train")``.
    local_batch_size: rows per batch on this host.
    process_index: this host (``jax.process_index()``).
    process_count: number of hosts (``jax.process_count()``).

  Returns:
    A grain DatasetIterator of Batch dicts of numpy arrays, each field of
    shape ``bertjax.batch.field_shape(name, local_batch_size, seq_len)``;
    ``get_state()`` is a JSON-serialisable dict and ``set_state`` resumes
    exactly.
  """
  # Fails on a bad name before any reading.
  cross_document = packing.is_cross_document(config.layout)
  if local_batch_size < 1 or config.shuffle_window < 1:
    raise ValueError(
        f"local_batch_size={local_batch_size} and config.shuffle_window="
        f"{config.shuffle_window} must both be >= 1.")
  docs = _local_documents(source, process_index, process_count)
  # NSP negatives come from other examples of this host's batch.
  check_pair_documents(config, config.get("train_split", "train"), len(docs),
                       refuse=True)
  if config.layout == "stream":  # row r of each batch continues row r
    return streams.StreamIterator(
        source, docs, seq_len=config.seq_len, local_batch_size=local_batch_size,
        seed=config.seed, first_row=process_index * local_batch_size,
        stack=_stack_rows, split=config.get("train_split", "train"))
  ds = grain.MapDataset.range(len(docs)).repeat()
  ds = ds.map_with_index(_ShuffledDocument(docs, config.seed))
  read_options = grain.ReadOptions(
      num_threads=_READ_THREADS, prefetch_buffer_size=_READ_BUFFER)
  if cross_document:
    ds = ds.map(_ChunkDocument(source, config.seq_len))
    ds = _CrossDocumentIterDataset(ds.to_iter_dataset(read_options),
                                   config.seq_len)
  else:
    ds = ds.map(_PackDocument(source, config, config.seed))
    ds = grain.experimental.FlatMapIterDataset(
        ds.to_iter_dataset(read_options), _Flatten())
  ds = _WindowShuffleIterDataset(
      ds, config.shuffle_window, (config.seed, _WINDOW_STREAM, process_index))
  ds = ds.batch(local_batch_size, drop_remainder=True, batch_fn=_stack_rows)
  return iter(ds)


class EvalBatches:
  """One deterministic pass over an evaluation split, re-iterable.

  Every host packs all documents in order with the same seed; global example
  k goes to host ``k % process_count``. The stream is cut into groups of
  ``local_batch_size * process_count`` examples, one local batch per host per
  group, so all hosts yield the same number of batches. Rows of the last batch
  without an example are empty (all PAD, example_mask False).
  """

  def __init__(self, config: Any, source: Any, *, local_batch_size: int,
               process_index: int, process_count: int, max_batches: int):
    self._cross_document = packing.is_cross_document(config.layout)
    self._layout = None if self._cross_document else packing.get_layout(
        config.layout)
    _local_documents(source, process_index, process_count)
    check_pair_documents(config, config.get("eval_split", "eval"), len(source),
                         refuse=False)
    if local_batch_size < 1:
      raise ValueError(f"local_batch_size={local_batch_size} must be >= 1.")
    self._config = config
    self._source = source
    self._batch_size = local_batch_size
    self._process_index = process_index
    self._process_count = process_count
    self._max_batches = max_batches
    self._seed = int(config.get("eval_seed", 0))

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    host, hosts, size = self._process_index, self._process_count, self._batch_size
    limit = self._max_batches or None
    rows, produced, total = [], 0, 0
    for row in self._all_rows():
      if total % hosts == host:
        rows.append(row)
      total += 1
      if len(rows) == size:
        yield _stack_rows(rows)
        rows, produced = [], produced + 1
        if limit is not None and produced >= limit:
          return
    # Global example k sits in batch k // (size * hosts) on every host, so
    # every host owes ceil(total / (size * hosts)) batches; a host whose rows
    # ran out early pads the rest (at most one batch in practice).
    owed = -(-total // (size * hosts))
    if limit is not None:
      owed = min(owed, limit)
    while produced < owed:
      yield self._padded(rows)
      rows, produced = [], produced + 1

  def _all_rows(self) -> Iterator[dict[str, np.ndarray]]:
    """Every row of the split, in document order."""
    if self._cross_document:
      yield from single_segment.full_sentence_rows(
          (single_segment.document_chunks(self._source[i], i, 0,
                                          self._config.seq_len)
           for i in range(len(self._source))), self._config.seq_len)
      return
    for doc_index in range(len(self._source)):
      yield from pack_document(self._source[doc_index], doc_index, self._layout,
                               self._config, self._seed, 0)

  def _padded(self, rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    out = batch_lib.empty_batch(self._batch_size, self._config.seq_len)
    if rows:
      for name, value in _stack_rows(rows).items():
        out[name][:len(rows)] = value
    return out


def make_eval_batches(config: Any, source: Any, *, local_batch_size: int,
                      process_index: int = 0, process_count: int = 1,
                      max_batches: int = 0) -> EvalBatches:
  """One deterministic pass over an evaluation split (see ``EvalBatches``).

  Args:
    config: uses eval_seed (packing seed), seq_len, layout and the layout's
      fields.
    source: random access to tokenized documents.
    local_batch_size: rows per batch on this host.
    process_index: this host.
    process_count: number of hosts.
    max_batches: stop after this many batches; 0 = the whole split.

  Returns:
    A re-iterable of Batch dicts of numpy arrays [local_batch_size, ...].
  """
  return EvalBatches(config, source, local_batch_size=local_batch_size,
                     process_index=process_index, process_count=process_count,
                     max_batches=max_batches)
