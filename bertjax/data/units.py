"""prepare's units of work: pure functions of their input, run by any engine.

Three kinds, each a picklable task plus a module-level ``run_*`` function that
reads its input, writes its output through ``staged.Stage`` and returns the
receipt (bertjax/data/workers.py runs them):

* ``TextTask`` -- local text files to the sentence-split text dataset. A unit
  is about ``config.prepare_block_mb`` of input: several small files, or one
  piece of a large file. Pieces are cut near multiples of the block size at
  the first line break after it (else whitespace, else a character boundary),
  so a file of any size, even a single 50 MB line, is read a block at a time.
  A file of several pieces gives one document per piece ('files'; all of
  them go to the file's split) or its paragraphs ('paragraphs', each held out
  by the hash of its id, as in a small file). A file with a bad byte in any
  piece gives none (bertjax/data/bad_text_files.py).
* ``SampleTask`` -- the tokenizer's training sample: every sentence of a
  range of train documents whose hash ``sentence_key(seed, doc, sentence)``
  falls below a threshold, i.e. a Bernoulli sample of rate p, the same
  sentences whatever the units, workers or engine.
* ``TokenizeTask`` -- a range of a split's text documents to tokenized
  examples (and knowledge spans when the task carries a fitted Marker).

Memory is bounded by a unit (a block of text, or a range of documents), not
by the corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds

from bertjax import batch as batch_lib
from bertjax import mirror
from bertjax import paths
from bertjax.data import bad_text_files
from bertjax.data import builders
from bertjax.data import knowledge as knowledge_lib
from bertjax.data import python_docs
from bertjax.data import sentences as sentences_lib
from bertjax.data import shards
from bertjax.data import staged

# Bytes read past a block's nominal end to find a line break to cut at.
_CUT_WINDOW = 1 << 16
# Records read from a text source per call.
_READ_BATCH = 256


# --------------------------------------------------------------------------
# Text sources: random access to (document id, sentences).


@dataclasses.dataclass(frozen=True)
class TextSource:
  """Where a split's text documents are, picklable.

  kind 'own': a dataset prepare wrote or built (``path`` = its TFDS
  directory); kind 'public': a prepared public TFDS dataset (``path`` = its
  name, ``tfds_dir`` = TFDS's data_dir or None, ``feature`` = its text field).
  """
  kind: str
  path: str
  split: str
  data_dir: str
  tfds_dir: str | None = None
  feature: str = "text"

  def plan_key(self) -> str:
    """The source as the plans of staged units name it: its fields and, for
    a public dataset, whose text is split into sentences here, the
    splitter's revision ('cr-lines': a lone "\r" ends a line), so that units
    an older bertjax split otherwise are redone, not reused. An own
    dataset's sentences were split when it was written."""
    return str(self) + ("|cr-lines" if self.kind == "public" else "")

  def open(self) -> Any:
    """Random access (``len``, ``__getitems__``) to the split's records.

    On a Beam worker of a gs:// data_dir the paths are in the bucket
    (bertjax/data/bucket_units.py): ArrayRecord reads local files only, so
    the dataset is first copied into this machine's mirror of the data_dir
    (once per machine: files already there are not fetched again).
    """
    if self.kind == "own":
      path, data_dir = self.path, self.data_dir
      if paths.is_remote(path):
        path = mirror.fetched_within(data_dir, path)
        data_dir = mirror.local_mirror(data_dir)
      builder = tfds.builder_from_directory(path)
      info = builder.info.splits[self.split]
      return shards.CheckedSource(
          builder.as_data_source(self.split), [os.fspath(p) for p in info.filepaths],
          info.shard_lengths, data_dir)
    tfds_dir = self.tfds_dir
    if tfds_dir and paths.is_remote(tfds_dir):
      name = self.path.partition("/")[0].partition(":")[0]
      mirror.fetched_within(tfds_dir, paths.join(tfds_dir, name))
      tfds_dir = mirror.local_mirror(tfds_dir)
    return tfds.data_source(self.path, split=self.split, data_dir=tfds_dir,
                            download=False)

  def document(self, index: int, record: dict[str, Any]) -> builders.Document:
    if self.kind == "own":
      return (record["id"].decode("utf-8"),
              [s.decode("utf-8") for s in record["sentences"]])
    if self.feature not in record:
      raise ValueError(
          f"{self.path} has no feature {self.feature!r} (it has {sorted(record)}); "
          f"set --config.text_feature to the one holding the text.")
    text = record[self.feature]
    text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
    return str(index), sentences_lib.split_sentences(text)

  def documents(self, start: int, end: int, source: Any = None
                ) -> Iterator[tuple[int, builders.Document]]:
    """(index, document) for the records in [start, end)."""
    source = self.open() if source is None else source
    for lo in range(start, end, _READ_BATCH):
      indices = range(lo, min(lo + _READ_BATCH, end))
      records = (source.__getitems__(list(indices)) if hasattr(source, "__getitems__")
                 else [source[i] for i in indices])
      for index, record in zip(indices, records):
        yield index, self.document(index, record)


def ranges(num_records: int, num_bytes: int, block_bytes: int) -> list[tuple[int, int]]:
  """[start, end) ranges of about ``block_bytes`` each (equal record counts)."""
  parts = max(1, min(num_records, -(-num_bytes // block_bytes)))
  bounds = [num_records * i // parts for i in range(parts + 1)]
  return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


# --------------------------------------------------------------------------
# Sentence sample keys.

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: a bijective, well-mixed hash of uint64 values."""
  with np.errstate(over="ignore"):
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sentence_keys(seed: int, doc_index: int, num_sentences: int) -> np.ndarray:
  """uint64 [num_sentences]: the sample key of each sentence of a document."""
  with np.errstate(over="ignore"):
    doc = _mix64(np.array([seed * 0x9E3779B97F4A7C15 + doc_index], np.uint64) & _M64)
    return _mix64(doc + np.arange(num_sentences, dtype=np.uint64))


# --------------------------------------------------------------------------
# Local text files -> the text dataset.


@dataclasses.dataclass(frozen=True)
class Piece:
  """Bytes [start, end) of a file (nominal: cut points move to a line break)."""
  path: str
  name: str  # path relative to the files' common directory: the document id
  start: int
  end: int
  size: int  # of the whole file


@dataclasses.dataclass(frozen=True)
class TextTask:
  index: int
  pieces: tuple[Piece, ...]
  paragraphs: bool
  dataset_dir: str
  dataset_name: str
  plan: str
  # document id -> split, overriding the hash (keeps both splits non-empty).
  overrides: tuple[tuple[str, str], ...] = ()
  # Names of files another unit found bad: left out whole, unread
  # (bertjax/data/bad_text_files.py).
  excluded: tuple[str, ...] = ()


def _without_scheme(path: str) -> str:
  """A file's path with a URL's ``gs:/`` dropped (for naming documents)."""
  return "/" + path.split("://", 1)[1] if paths.is_remote(path) else os.path.abspath(path)


def plan_text(files: Sequence[str], block_bytes: int) -> list[list[Piece]]:
  """Groups files (local or gs://) into units of about ``block_bytes``; large
  files are cut. A document is named by its file's path relative to the
  files' common directory, so the same files give the same names anywhere."""
  root = os.path.commonpath([os.path.dirname(_without_scheme(p)) for p in files])
  units, current, current_bytes = [], [], 0
  for path in files:
    size = paths.path(path).stat().length
    name = os.path.relpath(_without_scheme(path), root)
    for start in range(0, max(size, 1), block_bytes):
      current.append(Piece(path, name, start, min(start + block_bytes, size), size))
      current_bytes += min(block_bytes, size - start)
      if current_bytes >= block_bytes:
        units.append(current)
        current, current_bytes = [], 0
  if current:
    units.append(current)
  return units


def _cut(f, nominal: int, size: int) -> int:
  """Where a piece boundary near ``nominal`` really falls (same for both neighbours)."""
  if nominal <= 0 or nominal >= size:
    return min(max(nominal, 0), size)
  f.seek(nominal)
  window = f.read(_CUT_WINDOW)
  # A line end first: "\n", else an old Mac file's lone "\r".
  for mark in (b"\n", b"\r", b" ", b"\t"):
    at = window.find(mark)
    if at >= 0:
      return nominal + at + 1
  for at, byte in enumerate(window):
    if byte & 0xC0 != 0x80:  # not a UTF-8 continuation byte
      return nominal + at
  return min(nominal + len(window), size)


def read_piece(piece: Piece) -> bytes:
  with paths.path(piece.path).open("rb") as f:
    start = _cut(f, piece.start, piece.size)
    end = _cut(f, piece.end, piece.size)
    f.seek(start)
    return f.read(max(end - start, 0))


def _piece_start(piece: Piece) -> int:
  """Where the bytes ``read_piece`` returns begin in the file."""
  with paths.path(piece.path).open("rb") as f:
    return _cut(f, piece.start, piece.size)


def _utf16_file(piece: Piece, data: bytes) -> bool:
  """Whether the piece's file starts with a UTF-16 byte-order mark (its NUL
  bytes are then text, in an encoding bertjax does not read)."""
  if piece.start:
    with paths.path(piece.path).open("rb") as f:
      data = f.read(2)
  return data[:2] in (b"\xff\xfe", b"\xfe\xff")


def _piece_documents(piece: Piece, text: str, paragraphs: bool
                     ) -> Iterator[tuple[str, str, list[str]]]:
  """(document id, name deciding its split, sentences) of one piece's text."""
  whole = piece.size <= piece.end - piece.start
  prefix = piece.name if whole else f"{piece.name}@{piece.start}"
  if paragraphs:
    for i, block in enumerate(sentences_lib.split_paragraphs(text)):
      doc_id = f"{prefix}#{i}"
      yield doc_id, doc_id, sentences_lib.split_paragraph(block)
  else:
    yield prefix, piece.name, sentences_lib.split_sentences(text)


def _digest(name: str) -> str:
  return hashlib.sha256(name.encode("utf-8")).hexdigest()


def _decode(piece: Piece, data: bytes) -> tuple[str | None, tuple[str, int] | None]:
  """``bad_text_files.decode`` of a piece, its finding's offset in the file."""
  text, found = bad_text_files.decode(data)
  if found is None:
    # A UTF-8 byte-order mark (Windows editors write one) is no text: kept,
    # it made the file's first word another token than everywhere else.
    if piece.start == 0 and text.startswith("\ufeff"):
      text = text[1:]
    return text, None
  if found[0] == bad_text_files.BINARY and _utf16_file(piece, data):
    return None, (bad_text_files.UTF16, 0)
  return None, (found[0], _piece_start(piece) + found[1])


def run_text(task: TextTask) -> dict[str, Any]:
  """Reads a unit's pieces, splits sentences, writes its train/validation records.

  A file is taken whole or not at all: its documents here are dropped when
  any of its pieces here is bad, and the receipt says which files were
  (``bad``: name -> [reason, offset]) and which held only whitespace here
  (``blank``), for ``bad_text_files`` to merge across units.
  """
  serialize = staged.Serializer(builders.text_features())
  overrides = dict(task.overrides)
  out = {"train": [], "validation": []}
  bad: dict[str, tuple[str, int]] = {}
  blank: list[str] = []
  sentences = {"train": 0, "validation": 0}
  docs = input_bytes = 0
  # The train document nearest the hold-out threshold, and the validation one:
  # moved across when a split would otherwise be empty.
  edge = {"train": None, "validation": None}
  # plan_text puts a file's pieces next to each other.
  for name, pieces in itertools.groupby(task.pieces, key=lambda p: p.name):
    if name in task.excluded:
      continue
    found, texts = None, []
    for piece in pieces:
      data = read_piece(piece)
      input_bytes += len(data)
      if not data.strip():
        continue
      text, piece_found = _decode(piece, data)
      found = bad_text_files.worse(found, piece_found)
      if found is None and text.strip():  # a byte-order mark alone is blank too
        texts.append((piece, text))
    if found is not None:
      bad[name] = found
      continue
    if not texts:
      blank.append(name)
    for piece, text in texts:
      for doc_id, doc_name, sents in _piece_documents(piece, text, task.paragraphs):
        if not sents:
          continue
        split = overrides.get(doc_id) or (
            "validation"
            if python_docs.is_validation(doc_name, builders.LOCAL_VALIDATION_FRACTION)
            else "train")
        out[split].append(serialize({"id": doc_id, "sentences": sents}))
        sentences[split] += len(sents)
        docs += 1
        key = (_digest(doc_name), doc_id)
        best = edge[split]
        if best is None or (key < best if split == "train" else key > best):
          edge[split] = key
  stage = staged.Stage(task.dataset_dir, task.dataset_name, task.plan)
  return stage.write_unit(task.index, out, {
      "documents": docs, "input_bytes": input_bytes,
      "bad": {n: list(f) for n, f in bad.items()}, "blank": blank,
      "excluded": list(task.excluded),
      "sentences": sentences,
      "edge": {k: list(v) if v else None for k, v in edge.items()}})


# --------------------------------------------------------------------------
# The tokenizer's sample.


@dataclasses.dataclass(frozen=True)
class SampleTask:
  index: int
  source: TextSource
  start: int
  end: int
  threshold: int  # keep sentences whose key < threshold (2**64: all)
  seed: int
  stage_dir: str
  plan: str


def run_sample(task: SampleTask) -> dict[str, Any]:
  """Writes the sampled sentences of documents [start, end), in corpus order."""
  kept = []
  docs = input_bytes = 0
  for index, (_, sents) in task.source.documents(task.start, task.end):
    docs += 1
    input_bytes += sum(len(s) for s in sents)
    if task.threshold >= 1 << 64:
      chosen = range(len(sents))
    else:
      keys = sentence_keys(task.seed, index, len(sents))
      chosen = np.flatnonzero(keys < np.uint64(task.threshold))
    kept.extend(sents[i].encode("utf-8") for i in chosen)
  stage = staged.Stage(task.stage_dir, "sample", task.plan)
  return stage.write_unit(task.index, {"sample": kept},
                          {"documents": docs, "input_bytes": input_bytes})


# --------------------------------------------------------------------------
# Tokenizing.


@dataclasses.dataclass(frozen=True)
class TokenizeTask:
  index: int
  source: TextSource
  split_key: str  # TFDS name of the tokenized split
  start: int
  end: int
  tokenizer_path: str
  knowledge_dir: str  # '' = no knowledge spans
  dataset_dir: str
  dataset_name: str
  plan: str


def load_tokenizer(path: str):
  """A sentencepiece model file, or an imported Hugging Face tokenizer directory."""
  if paths.isdir(path):
    from bertjax.convert import hf_tokenizers  # pylint: disable=g-import-not-at-top
    return hf_tokenizers.HfTokenizer(path)
  from bertjax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  return tokenizer_lib.Tokenizer(path)


def run_tokenize(task: TokenizeTask) -> dict[str, Any]:
  """Tokenizes documents [start, end) of a split into one staged shard."""
  tok = load_tokenizer(task.tokenizer_path)
  marker = (knowledge_lib.Marker.read(task.knowledge_dir)
            if task.knowledge_dir else None)
  serialize = staged.Serializer(builders.tokenized_features(marker is not None))
  # Filled in while the shard is written; the receipt is written after.
  stats = {"documents": 0, "input_bytes": 0, "tokens": 0, "unk": 0}

  def documents():
    for _, (doc_id, sents) in task.source.documents(task.start, task.end):
      stats["input_bytes"] += sum(len(s) for s in sents)
      yield doc_id, sents

  keyed = []
  for offset, example in builders.tokenize_documents(documents(), tok, marker):
    stats["documents"] += 1
    stats["tokens"] += int(example["tokens"].size)
    stats["unk"] += int(np.count_nonzero(example["tokens"] == batch_lib.UNK_ID))
    keyed.append((shuffle_key(task.split_key, task.start + offset), serialize(example)))
  keyed.sort(key=lambda pair: pair[0])
  stage = staged.Stage(task.dataset_dir, task.dataset_name, task.plan)
  return stage.write_unit(task.index, {task.split_key: (r for _, r in keyed)}, stats)


def shuffle_key(split: str, index: int) -> int:
  """Where a document goes within its unit: md5 of (split name, its text index).

  A unit's documents are written in this order, a shuffle fixed by the input
  alone. It is the order TFDS's own writer gave the whole split, so a corpus
  of one unit per split (the demo's) keeps the shards it had before prepare
  streamed, and with them every figure measured on them.
  """
  return int.from_bytes(hashlib.md5(f"{split}{index}".encode()).digest(), "big")
