"""The directories prepare writes, and the check that no file stands in their way.

``check_directories(config, workdir)`` is what a binary calls first, before
it writes anything (the workdir included); ``prepare`` itself calls
``check_data_dir`` before its first write. Both only look (a stat per path):
a refusal leaves the workdir and data_dir as they were. A gs:// path has no
files that could block a directory, so it always passes.
"""

from __future__ import annotations

import os

from bertjax import paths
from bertjax.data import builders
from bertjax.data import mixture

# Version directories of the datasets prepare builds (as in text_sources.py,
# builders.py and tokenized.py).
_VERSION = "1.0.0"


def resolve_data_dir(config, workdir: str) -> str:
  """``config.data_dir`` if set, else ``<workdir>/data``."""
  return paths.absolute(config.get("data_dir") or paths.join(workdir, "data"))


def tokenized_dir(config, data_dir: str) -> str:
  """Where prepare keeps ``config``'s tokenized shards under ``data_dir``
  (of a mixture: its first corpus's)."""
  corpora = mixture.parse(config)
  if corpora:
    return paths.join(data_dir, "bertjax_tokenized",
                      mixture.shards_name(config, corpora[0]), _VERSION)
  key = builders.source_key(config.get("dataset") or "")
  spans = bool(config.get("knowledge_spans", False))
  return paths.join(data_dir, "bertjax_tokenized",
                    key + (builders.KNOWLEDGE_SUFFIX if spans else ""), _VERSION)


def written_directories(config, data_dir: str) -> list[str]:
  """The directories under ``data_dir`` that prepare may create for ``config``."""
  corpora = mixture.parse(config)
  if corpora:
    knowledge = ([paths.join(data_dir, "knowledge", mixture.name(corpora))]
                 if config.get("knowledge_spans", False) else [])
    return [paths.join(data_dir, "tokenizers")] + knowledge + [
        paths.join(data_dir, "bertjax_tokenized", mixture.shards_name(config, c),
                   _VERSION)
        for c in corpora] + [mixture.text_dir(data_dir, c)
                             for c in corpora if c.is_local_text()]
  dataset = config.get("dataset") or ""
  key = builders.source_key(dataset)
  spans = bool(config.get("knowledge_spans", False))
  out = [paths.join(data_dir, "tokenizers"), tokenized_dir(config, data_dir)]
  if spans:
    out.append(paths.join(data_dir, "knowledge", key))
  name, _, cfg = dataset.partition("/")
  if name == "bertjax_python_docs":
    out.append(paths.join(data_dir, name, _VERSION))
  elif name == "bertjax_local_text":
    out.append(paths.join(data_dir, name, cfg or "files", _VERSION))
  return out


def check_data_dir(config, data_dir: str, *, writing: bool = True) -> None:
  """Raises a one-sentence ValueError when a file stands where ``data_dir``
  or a directory prepare writes under it should be, or (``writing``: prepare
  is about to run) when one it still has to create cannot be; writes nothing."""
  if config.get("data_dir"):
    paths.require_directory(data_dir, "--config.data_dir")
  else:
    blocker = paths.file_in_the_way(data_dir)
    if blocker == os.path.abspath(data_dir):
      raise ValueError(
          f"{data_dir} is a file, where prepare keeps the workdir's data "
          f"(<workdir>/data); move the file away or pass --config.data_dir=<a "
          f"directory>.")
    if blocker is not None:
      paths.require_directory(os.path.dirname(os.path.abspath(data_dir)), "--workdir")
  for directory in written_directories(config, data_dir):
    blocker = paths.file_in_the_way(directory)
    if blocker is not None:
      raise ValueError(
          f"{blocker} is a file where prepare writes the directory {directory}; "
          f"move the file away or point --config.data_dir at a new directory.")
  if not writing or paths.is_remote(data_dir):  # a bucket's rights: its first upload
    return
  # A prepared data_dir may be read-only (a shared corpus): only a directory
  # prepare still has to create needs a writable parent.
  flag = "--config.data_dir" if config.get("data_dir") else "--workdir"
  for directory in written_directories(config, data_dir):
    blocker = None if paths.exists(directory) else paths.unwritable(directory)
    if blocker is not None:
      raise ValueError(
          f"Cannot write to the data_dir {data_dir} ({paths.denial(blocker)}: {blocker} "
          f"is read-only and prepare has to create {directory} under it); make it "
          f"writable or pass another {flag}.")


def check_directories(config, workdir: str) -> None:
  """Refuses, in one sentence and before anything is written, a ``--workdir``,
  ``--config.data_dir`` or prepare directory that a file stands in the way of,
  or a gs:// one in a bucket that does not exist."""
  paths.require_directory(workdir, "--workdir")
  paths.require_bucket(workdir, "--workdir")
  data_dir = resolve_data_dir(config, workdir)
  if config.get("data_dir"):
    paths.require_bucket(data_dir, "--config.data_dir")
  # Whether prepare can write is its own check (``--verify`` only reads).
  check_data_dir(config, data_dir, writing=False)
