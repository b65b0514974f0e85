"""bertjax's datasets (array_record, no TensorFlow): names, features, tokenizing.

* ``bertjax_python_docs``: the embedded demo corpus (``python_docs.py``), a
  TFDS builder (it is small and made in memory).
* ``bertjax_local_text/<files|paragraphs>``: the user's text files
  (``config.text_files``), sentence-split; ``files`` makes one document per
  file (per block of a large file), ``paragraphs`` one per blank-line block.
* ``bertjax_tokenized/<source_key>``: the "tokenize once" output; its metadata
  records the tokenizer fingerprint, vocab size, source name and, per split,
  the number of tokens and of [UNK] tokens. Variant-independent: no masks, no
  pairs, only ids, word starts and sentence boundaries. A config with
  ``knowledge_spans`` (ERNIE) gets ``<source_key>__knowledge``, whose records
  add phrase and entity starts (``bertjax/data/knowledge.py``).

The last two are written unit by unit by bertjax/data/units.py and published
for TFDS by bertjax/data/staged.py. Text datasets have features
``{'id': Text, 'sentences': Sequence(Text)}``; all are read with
``tfds.builder_from_directory(path).as_data_source(split)``.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import re
import stat
import sys
import tempfile
from typing import Iterable, Iterator, Sequence

from absl import logging
import numpy as np
import tensorflow_datasets as tfds

from bertjax import batch as batch_lib
from bertjax import paths
from bertjax.data import knowledge as knowledge_lib
from bertjax.data import python_docs
from bertjax.data import tokenizer as tokenizer_lib

FILE_FORMAT = "array_record"
# Fraction of the user's documents held out for validation, by hash of their id.
LOCAL_VALIDATION_FRACTION = 0.05
# At most this many documents, and about this many sentences, are tokenized
# per sentencepiece batch call.
_ENCODE_CHUNK = 256
_ENCODE_SENTENCES = 4096

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


class OfflineBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of bertjax's builders, which never download anything."""

  # TFDS looks for URL checksums next to the builder's source file; finding that
  # file needs the importlib_resources backport for builders outside the
  # tensorflow_datasets package. Nothing is downloaded, so there is nothing to find.
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return None

  # TFDS prints "Downloading and preparing dataset ..." and "... downloaded and
  # prepared" around every build; nothing is downloaded, so say what happens.
  def _log_download_bytes(self) -> None:
    logging.info("Preparing %s in %s (bertjax's builders download nothing) ...",
                 self.name, self.data_dir)

  def _log_download_done(self) -> None:
    logging.info("Prepared %s in %s.", self.name, self.data_dir)


class OfflineInfo(tfds.core.DatasetInfo):
  """DatasetInfo that never looks in TFDS's bucket for pre-computed metadata.

  TFDS does that for every builder whose dataset is not prepared yet, and
  leaves an empty ``/tmp/tmp*tfds`` directory each time, even with its GCS
  access off (as it is): one per prepare, per test, per notebook run."""

  def initialize_from_bucket(self) -> None:
    pass


def catalog_builder(name: str, data_dir: str | None):
  """``tfds.builder(name, data_dir=data_dir)`` for a dataset of TFDS's
  catalog, leaving nothing behind in the system's temporary directory.

  A catalog dataset's builder has TFDS's own ``DatasetInfo``, not
  ``OfflineInfo``: when the dataset is not prepared, its bucket lookup makes
  an empty ``tmp*tfds`` directory before finding GCS off, and never removes
  it. The builder is made with Python's temporary directory pointed at one
  that is removed after (the lookup reads nothing from it). Called at
  start-up, before any thread that makes temporary files runs."""
  saved = tempfile.tempdir
  with tempfile.TemporaryDirectory(prefix="bertjax-tfds-") as scratch:
    tempfile.tempdir = scratch
    try:
      return tfds.builder(name, data_dir=data_dir)
    finally:
      tempfile.tempdir = saved


class BertjaxPythonDocs(OfflineBuilder):
  """Prose from the Python docs: pydoc topics and stdlib docstrings (~1.4 MB)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    return OfflineInfo(
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


# bertjax_local_text's configs: one document per file, or per blank-line block.
LOCAL_TEXT_CONFIGS = ("files", "paragraphs")


def resolve_text_files(text_files: str, outputs: Sequence[str] = ()) -> list[str]:
  """Expands comma-separated paths, globs and directories into sorted unique
  files; refuses, in one sentence, a local one that cannot be read, and a
  pattern that would read one of ``outputs`` (the run's workdir or data_dir,
  made or not yet) as text."""
  out, linked = [], []
  for pattern in (p.strip() for p in text_files.split(",")):
    if not pattern:
      continue
    if paths.is_remote(pattern):
      _refuse_reading_outputs(paths.absolute(pattern), pattern, outputs)
      out.extend(_resolve_remote(pattern))
      continue
    pattern = os.path.expanduser(pattern)
    _refuse_reading_outputs(os.path.abspath(pattern), pattern, outputs)
    for match in sorted(glob.glob(pattern, recursive=True)):
      if os.path.isdir(match):
        found = []
        for root, dirs, files in os.walk(match):  # links to directories: not entered
          found += [os.path.join(root, f) for f in files]
          linked += [os.path.join(root, d) for d in dirs
                     if os.path.islink(os.path.join(root, d))]
        out.extend(sorted(found))
      else:
        out.append(match)
  # One file named twice (a relative and an absolute spelling, 'dir/./a.txt',
  # a directory and a file in it) is read once: it was two documents of the
  # same id, both in the same split.
  unique: dict[str, str] = {}
  for path in out:
    unique.setdefault(path if paths.is_remote(path) else os.path.abspath(path), path)
  files = list(unique.values())
  _require_readable(files)
  _warn_skipped_links(linked, unique)
  return files


# Symlinked directories already named in a warning (resolve_text_files runs
# several times per prepare).
_WARNED_LINKS: set[str] = set()


def _warn_skipped_links(linked: Sequence[str], read: Iterable[str]) -> None:
  """Warns once about symlinked directories that a directory named in
  text_files holds and os.walk did not enter (nor another pattern named).
  They stay unread: reading them would change the files, and so the
  fingerprint, of corpora prepared before."""
  prefixes = tuple(os.path.abspath(p) + os.sep for p in linked)
  covered = {p for p in prefixes for f in read if f.startswith(p)}
  skipped = [p for p, full in zip(linked, prefixes)
             if full not in covered and full not in _WARNED_LINKS]
  if not skipped:
    return
  _WARNED_LINKS.update(os.path.abspath(p) + os.sep for p in skipped)
  logging.warning(
      "--config.text_files skips %d symlinked director%s (%s): a directory it "
      "names is read without following links; to read %s, add %s to "
      "--config.text_files after a comma or name a glob, which follows links "
      "(e.g. '%s').", len(skipped), "y" if len(skipped) == 1 else "ies",
      ", ".join(skipped), "it" if len(skipped) == 1 else "them",
      "it" if len(skipped) == 1 else "them",
      os.path.join(os.path.dirname(skipped[0]), "**"))


def _matches(pattern: str, path: str) -> bool:
  """Whether glob ``pattern`` (absolute) names ``path`` itself, component by
  component; a trailing ``**`` names everything under its prefix."""
  want, have = pattern.rstrip("/").split("/"), path.rstrip("/").split("/")
  if "**" in want:
    cut = want.index("**")
    if cut != len(want) - 1:  # '**/*.txt': files by name, not whole directories
      return False
    want, have = want[:cut], have[:cut]
  return len(want) == len(have) and all(
      fnmatch.fnmatchcase(h, w) for h, w in zip(have, want))


def _refuse_reading_outputs(pattern: str, given: str, outputs: Sequence[str]) -> None:
  """ValueError when ``pattern`` names one of ``outputs`` or a directory
  above it: every file under a named directory is read."""
  for output in outputs:
    output = paths.absolute(output)
    parts = output.rstrip("/").split("/")
    if any(_matches(pattern, "/".join(parts[:n])) for n in range(len(parts), 1, -1)):
      narrower = (os.path.join(given, "*.txt") if not glob.has_magic(given)
                  else os.path.join(os.path.dirname(given), "*.txt"))
      raise ValueError(
          f"--config.text_files={given!r} reads every file under {output} (the "
          f"run's workdir or data_dir), so the run would read its own "
          f"checkpoints, logs and shards as text; keep the workdir and data_dir "
          f"outside the text files' directories, or name only the text files, "
          f"e.g. --config.text_files={narrower!r}.")


def _require_readable(files: Sequence[str]) -> None:
  """Raises ValueError naming the first local file of ``files`` that this
  process may not read (a worker would fail on it mid-prepare)."""
  effective = os.access in os.supports_effective_ids
  for path in files:
    if paths.is_remote(path):
      continue
    if os.path.islink(path) and not os.path.exists(path):  # glob and os.walk list them
      raise ValueError(
          f"{path}, one of --config.text_files, is a broken symbolic link (to "
          f"{os.readlink(path)!r}, which does not exist); remove it or leave it "
          "out of --config.text_files.")
    mode = os.stat(path).st_mode if os.path.exists(path) else stat.S_IFREG
    if not stat.S_ISREG(mode):
      # A named pipe would block prepare's reader forever.
      kind = ("a named pipe" if stat.S_ISFIFO(mode) else "a socket"
              if stat.S_ISSOCK(mode) else "a device")
      raise ValueError(
          f"{path}, one of --config.text_files, is {kind}, not a regular "
          "file; write its text to a file first, or leave it out of "
          "--config.text_files.")
    if not os.access(path, os.R_OK, effective_ids=effective):
      raise ValueError(
          f"Cannot read {path} (permission denied), one of --config.text_files; "
          "make it readable or leave it out of --config.text_files.")


def _resolve_remote(pattern: str) -> list[str]:
  """A gs:// file, directory (every file under it) or glob (``*``, ``?``,
  ``[..]`` within one directory level each; object stores refuse ``**``)."""
  pattern = paths.absolute(pattern)
  if not glob.has_magic(pattern):
    if paths.isdir(pattern):
      return [paths.join(pattern, rel) for rel, _ in paths.walk_files(pattern)]
    return [pattern] if paths.exists(pattern) else []
  scheme, rest = pattern.split("://", 1)
  parts = rest.split("/")
  first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
  base = paths.path(f"{scheme}://" + "/".join(parts[:first]))
  if "**" in parts[first:]:
    raise ValueError(
        f"--config.text_files={pattern!r} uses '**', which object stores do not "
        f"support; name the directory instead (all files under it are read).")
  try:
    return sorted(os.fspath(p) for p in base.glob("/".join(parts[first:]))
                  if not p.is_dir())
  except FileNotFoundError:  # no such bucket: no match, as for a local glob
    return []


def no_files_message(text_files: str) -> str:
  return (f"--config.text_files={text_files!r} matches no files; pass "
          f"comma-separated paths or globs, e.g. --config.text_files='corpus/*.txt'.")


def files_fingerprint(files: Sequence[tuple[str, int]]) -> str:
  """sha256 over (absolute path, size) of the input files: changes when the
  inputs do."""
  digest = hashlib.sha256()
  for path, size in files:
    digest.update(f"{path}\t{size}\n".encode())
  return digest.hexdigest()


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
  prefix = getattr(tok, "sentence_prefix", "")

  def spaced(sents):
    # A sentence after another reads as in the running text: with its
    # whitespace before it (HfTokenizer.sentence_prefix; "" for most).
    out, started = [], False
    for s in sents:
      out.append(prefix + s if prefix and started and s and not s[0].isspace() else s)
      started = started or bool(s)
    return out

  def encode(flat):
    # Bounded batches: one huge document must not become one huge call.
    for start in range(0, len(flat), _ENCODE_SENTENCES):
      yield from tok.encode_batch(flat[start:start + _ENCODE_SENTENCES])

  def flush(chunk):
    encoded = encode([s for _, sents in chunk for s in spaced(sents)])
    for index, sents in chunk:
      pieces = [next(encoded) for _ in sents]
      pieces = [p for p in pieces if p.size]
      tokens = np.concatenate(pieces) if pieces else np.zeros([0], np.int32)
      if tokens.size < 2:
        continue
      lengths = np.array([p.size for p in pieces], np.int32)
      word_starts = tok.word_starts(tokens)
      # A sentence's first piece begins a word, marked or not (a document's
      # first word has no '\u0120' in a byte-level BPE, as in transformers).
      word_starts[np.cumsum(lengths) - lengths] = True
      example = {
          "tokens": tokens,
          "word_starts": word_starts,
          "sentence_lengths": lengths,
      }
      if marker is not None:
        example.update(marker.mark(example, reader))
      yield index, example

  chunk, sentences = [], 0
  for index, (_, sents) in enumerate(docs):
    chunk.append((index, sents))
    sentences += len(sents)
    if len(chunk) == _ENCODE_CHUNK or sentences >= _ENCODE_SENTENCES:
      yield from flush(chunk)
      chunk, sentences = [], 0
  yield from flush(chunk)


def tokenized_features(knowledge: bool) -> tfds.features.FeaturesDict:
  """Features of a tokenized document (bertjax_tokenized's records)."""
  features = {
      "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "word_starts": tfds.features.Tensor(shape=(None,), dtype=np.bool_),
      "sentence_lengths": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  }
  if knowledge:
    for name in batch_lib.KNOWLEDGE_FIELDS:
      features[name] = tfds.features.Tensor(shape=(None,), dtype=np.bool_)
  return tfds.features.FeaturesDict(features)
