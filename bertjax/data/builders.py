"""TFDS builders (array_record, no TensorFlow) for bertjax's text and shards.

* ``bertjax_python_docs``: the embedded demo corpus (``python_docs.py``).
* ``bertjax_local_text``: the user's text files (``config.text_files``); config
  ``files`` (default) makes one document per file, ``paragraphs`` one per
  blank-line-separated block.
* ``bertjax_tokenized``: the "tokenize once" output. One BuilderConfig per text
  source (its name is the source's ``source_key``); its metadata records the
  tokenizer fingerprint, vocab size, source name and, per split, the number
  of tokens and of [UNK] tokens. Variant-independent: no
  masks, no pairs, only ids, word starts and sentence boundaries. A config
  with ``knowledge_spans`` (ERNIE) gets its own BuilderConfig,
  ``<source_key>__knowledge``, whose shards add phrase and entity starts
  (``bertjax/data/knowledge.py``), so both kinds live side by side in one
  data directory and share the tokenizer.

Text datasets have features ``{'id': Text, 'sentences': Sequence(Text)}``.
Build with ``Cls(data_dir=..., file_format='array_record').download_and_prepare()``
and read with ``builder.as_data_source(split)`` (random access, numpy dicts).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import sys
from typing import Callable, Iterable, Iterator, Sequence

from absl import logging
import numpy as np
import tensorflow_datasets as tfds

from bertjax import batch as batch_lib
from bertjax.data import knowledge as knowledge_lib
from bertjax.data import python_docs
from bertjax.data import sentences as sentences_lib
from bertjax.data import tokenizer as tokenizer_lib

FILE_FORMAT = "array_record"
# Fraction of the user's documents held out for validation, by hash of their id.
LOCAL_VALIDATION_FRACTION = 0.05
# Documents tokenized per sentencepiece batch call.
_ENCODE_CHUNK = 256

# A text document as the tokenizer step sees it: (document id, sentences).
Document = tuple[str, list[str]]
# Suffix of the tokenized BuilderConfig whose shards carry knowledge spans.
KNOWLEDGE_SUFFIX = "__knowledge"


def text_features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({
      "id": tfds.features.Text(),
      "sentences": tfds.features.Sequence(tfds.features.Text()),
  })


def source_key(dataset: str) -> str:
  """A file-name-safe key for a text source ('wikipedia/20230601.en' -> 'wikipedia_20230601_en')."""
  return re.sub(r"\W+", "_", dataset).strip("_").lower()


def split_key(split: str) -> str:
  """TFDS split name of the tokenized copy of a (maybe sliced) source split.

  Plain names stay ('train'); a slice such as 'train[:80%]' becomes its base
  name plus a short hash of the full string, so that different slices never
  share a name.
  """
  if re.fullmatch(r"\w+", split):
    return split
  base = re.sub(r"\W+", "_", split.partition("[")[0]).strip("_")
  return f"{base}__{hashlib.sha256(split.encode()).hexdigest()[:8]}"


def _split_by_hash(docs: list[Document], fraction: float) -> dict[str, list[Document]]:
  """Deterministic train/validation split; both non-empty when there are 2+ documents."""
  val = [d for d in docs if python_docs.is_validation(d[0], fraction)]
  train = [d for d in docs if not python_docs.is_validation(d[0], fraction)]
  def digest(doc):
    return hashlib.sha256(doc[0].encode("utf-8")).digest()

  # Few documents can leave a side empty: then move the document whose hash is
  # nearest the threshold (still a function of the ids alone).
  if len(docs) >= 2 and not val:
    val = [min(train, key=digest)]
    train.remove(val[0])
  if len(docs) >= 2 and not train:
    train = [max(val, key=digest)]
    val.remove(train[0])
  return {"train": train, "validation": val}


class OfflineBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of bertjax's builders, which never download anything."""

  # TFDS looks for URL checksums next to the builder's source file; finding that
  # file needs the importlib_resources backport for builders outside the
  # tensorflow_datasets package. Nothing is downloaded, so there is nothing to find.
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return None


class BertjaxPythonDocs(OfflineBuilder):
  """Prose from the Python docs: pydoc topics and stdlib docstrings (~1.4 MB)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=python_docs.__doc__,
        features=text_features(),
        metadata=tfds.core.MetadataDict(
            python_version="%d.%d.%d" % sys.version_info[:3]))

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is on disk already.
    # Parse the stdlib once for both splits.
    docs = list(python_docs.documents())
    return {
        split: self._generate_examples(
            [d for d in docs if python_docs.is_validation(d[0]) == (split == "validation")])
        for split in ("train", "validation")
    }

  def _generate_examples(self, docs: list[Document]):
    for doc_id, sents in docs:
      yield doc_id, {"id": doc_id, "sentences": sents}


@dataclasses.dataclass
class LocalTextConfig(tfds.core.BuilderConfig):
  """unit: 'file' (one document per file) or 'paragraph' (per blank-line block)."""
  unit: str = "file"


def resolve_text_files(text_files: str) -> list[str]:
  """Expands comma-separated paths, globs and directories into sorted unique files."""
  out = []
  for pattern in (p.strip() for p in text_files.split(",")):
    if not pattern:
      continue
    pattern = os.path.expanduser(pattern)
    for match in sorted(glob.glob(pattern, recursive=True)):
      if os.path.isdir(match):
        out.extend(sorted(
            os.path.join(root, f) for root, _, files in os.walk(match) for f in files))
      else:
        out.append(match)
  return list(dict.fromkeys(out))


def _no_files_message(text_files: str) -> str:
  return (f"--config.text_files={text_files!r} matches no files; pass "
          f"comma-separated paths or globs, e.g. --config.text_files='corpus/*.txt'.")


def files_fingerprint(paths: Sequence[str]) -> str:
  """sha256 over (path, size) of the input files: changes when the inputs do."""
  digest = hashlib.sha256()
  for path in paths:
    digest.update(f"{os.path.abspath(path)}\t{os.path.getsize(path)}\n".encode())
  return digest.hexdigest()


def read_text_files(paths: Sequence[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
  """Reads UTF-8 text files, setting aside bad ones.

  Returns:
    (texts: path -> text of the good files, skipped: reason -> paths), where a
    reason is 'empty', 'binary (NUL bytes)' or 'not UTF-8'.
  """
  texts, skipped = {}, {}
  for path in paths:
    with open(path, "rb") as f:
      data = f.read()
    if not data.strip():
      reason = "empty"
    elif b"\x00" in data:
      reason = "binary (NUL bytes)"
    else:
      try:
        texts[path] = data.decode("utf-8")
        continue
      except UnicodeDecodeError:
        reason = "not UTF-8"
    skipped.setdefault(reason, []).append(path)
  return texts, skipped


class BertjaxLocalText(OfflineBuilder):
  """The user's own UTF-8 text files (``config.text_files``)."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
      LocalTextConfig(name="files", unit="file",
                      description="One document per file."),
      LocalTextConfig(name="paragraphs", unit="paragraph",
                      description="One document per blank-line-separated block."),
  ]

  def __init__(self, *, text_files: str = "", **kwargs):
    self._text_files = text_files
    self._paths = resolve_text_files(text_files) if text_files else []
    if text_files and not self._paths:
      raise ValueError(_no_files_message(text_files))
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="The user's text files, split into sentences.",
        features=text_features(),
        metadata=tfds.core.MetadataDict(
            text_files=self._text_files,
            files_fingerprint=files_fingerprint(self._paths)))

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is on disk already.
    if not self._paths:
      raise ValueError(_no_files_message(self._text_files))
    texts, skipped = read_text_files(self._paths)
    for reason, paths in sorted(skipped.items()):
      logging.warning("Skipped %d %s text file(s): %s", len(paths), reason,
                      ", ".join(paths))
    if not texts:
      problems = "; ".join(f"{len(p)} {r}: {', '.join(p[:5])}"
                           for r, p in sorted(skipped.items()))
      raise ValueError(
          f"None of the {len(self._paths)} files of --config.text_files is "
          f"usable ({problems}); pass non-empty UTF-8 text files.")
    # Document ids are paths relative to the files' common directory, so the
    # hold-out does not change when the corpus directory moves.
    root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in texts])
    docs = []
    for path, text in texts.items():
      name = os.path.relpath(os.path.abspath(path), root)
      if self.builder_config.unit == "paragraph":
        blocks = sentences_lib.split_paragraphs(text)
        docs.extend((f"{name}#{i}", sentences_lib.split_paragraph(b))
                    for i, b in enumerate(blocks))
      else:
        docs.append((name, sentences_lib.split_sentences(text)))
    docs = [d for d in docs if d[1]]
    if len(docs) < 2:
      raise ValueError(
          f"--config.text_files gives {len(docs)} document(s) but a train and a "
          f"validation split need at least 2; add files or use "
          f"--config.dataset=bertjax_local_text/paragraphs.")
    logging.info("bertjax_local_text: %d documents from %d files (%d skipped).",
                 len(docs), len(texts), sum(len(p) for p in skipped.values()))
    return {split: self._generate_examples(split_docs) for split, split_docs
            in _split_by_hash(docs, LOCAL_VALIDATION_FRACTION).items()}

  def _generate_examples(self, docs: list[Document]):
    for doc_id, sents in docs:
      yield doc_id, {"id": doc_id, "sentences": sents}


def tokenize_documents(docs: Iterable[Document], tok: tokenizer_lib.Tokenizer,
                       marker: knowledge_lib.Marker | None = None
                       ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
  """Tokenizes documents into shard examples, in batches for speed.

  Yields:
    (index of the document in ``docs``, example) for every document with at
    least 2 tokens; example: tokens int32 [n], word_starts bool [n],
    sentence_lengths int32 [s] (empty sentences dropped, sum == n), and with
    a ``marker`` also phrase_starts and entity_starts bool [n].
  """
  reader = knowledge_lib.WordReader(tok) if marker is not None else None

  def flush(chunk):
    flat = [s for _, sents in chunk for s in sents]
    encoded = iter(tok.encode_batch(flat))
    for index, sents in chunk:
      pieces = [next(encoded) for _ in sents]
      pieces = [p for p in pieces if p.size]
      tokens = np.concatenate(pieces) if pieces else np.zeros([0], np.int32)
      if tokens.size < 2:
        continue
      example = {
          "tokens": tokens,
          "word_starts": tok.word_starts(tokens),
          "sentence_lengths": np.array([p.size for p in pieces], np.int32),
      }
      if marker is not None:
        example.update(marker.mark(example, reader))
      yield index, example

  chunk = []
  for index, (_, sents) in enumerate(docs):
    chunk.append((index, sents))
    if len(chunk) == _ENCODE_CHUNK:
      yield from flush(chunk)
      chunk = []
  yield from flush(chunk)


class BertjaxTokenized(OfflineBuilder):
  """Tokenized documents of one text source; config name = ``source_key``.

  Construct with ``config=tfds.core.BuilderConfig(name=source_key(dataset))``;
  for building also pass ``sources`` (split name -> callable returning an
  iterable of Documents), ``tokenizer`` and ``source_name``. With
  ``knowledge`` (name ``source_key + KNOWLEDGE_SUFFIX``) the phrase chunker
  and default entities are fitted on split ``fit_split`` first, their lists
  written to ``knowledge_dir``, and every example gets phrase and entity
  starts.
  """

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, *, sources: dict[str, Callable[[], Iterable[Document]]] | None = None,
               tokenizer: tokenizer_lib.Tokenizer | None = None,
               source_name: str = "",
               knowledge: knowledge_lib.Settings | None = None,
               fit_split: str = "", knowledge_dir: str = "", **kwargs):
    self._sources = sources or {}
    self._tokenizer = tokenizer
    self._source_name = source_name
    self._knowledge = knowledge
    self._fit_split = fit_split
    self._knowledge_dir = knowledge_dir
    self._marker: knowledge_lib.Marker | None = None
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    metadata = {}
    if self._tokenizer is not None:
      metadata = dict(
          tokenizer_fingerprint=self._tokenizer.fingerprint,
          vocab_size=self._tokenizer.vocab_size,
          source=self._source_name,
          split_names={split_key(s): s for s in self._sources},
          num_tokens={}, num_unk={})
    features = {
        "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
        "word_starts": tfds.features.Tensor(shape=(None,), dtype=np.bool_),
        "sentence_lengths": tfds.features.Tensor(shape=(None,), dtype=np.int32),
    }
    if self._knowledge is not None:
      metadata["knowledge_fingerprint"] = self._knowledge.fingerprint()
      for name in batch_lib.KNOWLEDGE_FIELDS:
        features[name] = tfds.features.Tensor(shape=(None,), dtype=np.bool_)
    return tfds.core.DatasetInfo(
        builder=self,
        description="Tokenized documents: ids, word starts, sentence lengths.",
        features=tfds.features.FeaturesDict(features),
        metadata=tfds.core.MetadataDict(metadata))

  def _split_generators(self, dl_manager):
    del dl_manager  # The text source is already prepared.
    if self._tokenizer is None or not self._sources:
      raise ValueError(
          "bertjax_tokenized is built by bertjax.data.prepare.prepare(config, "
          "data_dir); run `python -m bertjax.prepare --config=... --workdir=...`.")
    if self._knowledge is not None:
      self._marker = knowledge_lib.fit(
          (ex for _, ex in tokenize_documents(self._sources[self._fit_split](),
                                              self._tokenizer)),
          knowledge_lib.WordReader(self._tokenizer), self._knowledge)
      logging.info("Knowledge units: %d phrases, %d entities (lists in %s).",
                   len(self._marker.phrases), len(self._marker.entities),
                   self._knowledge_dir)
      if self._knowledge_dir:
        self._marker.write(self._knowledge_dir)
    return {split_key(split): self._generate_examples(split, docs)
            for split, docs in self._sources.items()}

  def _generate_examples(self, split: str, docs: Callable[[], Iterable[Document]]):
    count = tokens = unknown = 0
    for index, example in tokenize_documents(docs(), self._tokenizer,
                                             self._marker):
      count += 1
      tokens += example["tokens"].size
      unknown += int(np.count_nonzero(example["tokens"] == batch_lib.UNK_ID))
      yield index, example
    # DatasetInfo (metadata included) is written after all splits are generated.
    self.info.metadata["num_tokens"][split_key(split)] = tokens
    self.info.metadata["num_unk"][split_key(split)] = unknown
    if not count:
      raise ValueError(
          f"Split {split!r} of {self._source_name} has no document with 2 or more "
          f"tokens; add text to it or choose another --config.eval_split/train_split.")
