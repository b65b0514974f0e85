"""The text prepare tokenizes: bertjax's own datasets (built here) or a public TFDS one.

``text_sources(config, data_dir, engine)`` returns, per wanted split, a
``units.TextSource`` (picklable random access to its documents) with the
split's size. It builds what is missing of bertjax's own text datasets:

* ``bertjax_python_docs``: the embedded demo corpus, a small TFDS builder.
* ``bertjax_local_text/<files|paragraphs>``: the user's files, read a block
  at a time by units (bertjax/data/units.py) on ``engine``'s workers, so that
  neither the files nor the splits are ever held in memory
  (bertjax/data/local_text.py).

A public TFDS dataset is read where the user prepared it; bertjax never
downloads one.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Iterable

from absl import logging
import tensorflow_datasets as tfds

from bertjax.data import bucket_units
from bertjax.data import builders
from bertjax.data import local_text
from bertjax.data import shards
from bertjax.data import units
from bertjax.data import workers

OWN_DATASETS = ("bertjax_python_docs", "bertjax_local_text")
# bertjax_local_text's own checks and paths (bertjax/data/local_text.py),
# named here too, where the callers of this module find them.
check_local_text_named = local_text.check_local_text_named
check_rebuildable = local_text.check_rebuildable
local_text_dir = local_text.local_text_dir
local_text_files = local_text.local_text_files
_local_text = local_text.build


@dataclasses.dataclass(frozen=True)
class Engine:
  """How units run: ``workers`` processes here, or Beam's ``beam_runner``."""
  workers: int = 1
  block_bytes: int = 8 << 20
  beam_runner: str = ""
  beam_options: tuple[str, ...] = ()
  # (local mirror, gs:// data_dir) when Beam workers must go through the
  # bucket (bertjax/data/bucket_units.py); empty otherwise.
  bucket: tuple[str, ...] = ()

  def run(self, fn, tasks, progress: workers.Progress | None = None) -> None:
    if self.beam_runner and self.bucket and tasks:
      bucket_units.run(fn, tasks, local_root=self.bucket[0],
                       remote_root=self.bucket[1], beam_runner=self.beam_runner,
                       beam_options=self.beam_options)
      return
    # Under a block of text, starting processes costs more than it saves.
    small = progress is not None and progress.total_bytes <= self.block_bytes
    workers.run(fn, tasks, workers=1 if small else self.workers,
                beam_runner=self.beam_runner, beam_options=self.beam_options,
                progress=progress)


@dataclasses.dataclass(frozen=True)
class Split:
  """One wanted split: its documents, their number and (estimated) text bytes."""
  source: units.TextSource
  num_docs: int
  num_bytes: int
  # Sentences in the split, when the dataset recorded them (else None).
  num_sentences: int | None = None


def _array_record_hint(name: str, data_dir: str = "", tfds_dir: str | None = None) -> str:
  """The fix for a TFDS dataset bertjax cannot open or read (one prepared as
  tfrecord, say): prepare reads documents by index (in ranges, on many
  workers), so ArrayRecord; built into the run's ``data_dir``, where prepare
  looks first, replacing the copy there if that is the one (``tfds_dir``)."""
  if not data_dir:
    return ("prepare it as array_record, which bertjax reads by index "
            f"(tfds build {name} --file_format=array_record)")
  replace = " --overwrite" if tfds_dir else ""
  return (f"prepare it as array_record, which bertjax reads by index, in the run's "
          f"data_dir {data_dir} (tfds build {name} --data_dir={data_dir}{replace} "
          f"--file_format=array_record)")


def _base_split(split: str) -> str:
  """'train[:10%]' -> 'train'."""
  return re.match(r"[\w-]*", split).group(0)


def _check_splits(dataset: str, available: Iterable[str], wanted: list[str],
                  entry: str = "") -> None:
  """``entry``: the config.mixture entry the splits come from, if any."""
  available = sorted(available)
  for split in wanted:
    if _base_split(split) not in available:
      field = "train_split" if split == wanted[0] else "eval_split"
      where = (f"{field}= in config.mixture entry {entry!r}" if entry
               else f"--config.{field}")
      raise ValueError(
          f"Dataset {dataset!r} has no split {split!r} (it has {available}); set "
          f"{where} to one of them, or a slice such as 'train[:1%]'.")


def _python_docs(data_dir: str) -> str:
  try:
    builder = builders.BertjaxPythonDocs(data_dir=data_dir,
                                         file_format=builders.FILE_FORMAT)
    prepared = builder.is_prepared()
  except Exception as e:  # pylint: disable=broad-except  (its dataset_info.json read)
    raise shards.DamagedShardError(shards.dataset_damaged_message(
        os.path.join(data_dir, "bertjax_python_docs"), e)) from e
  if prepared:
    logging.info("Reusing text dataset %s.", builder.data_path)
  else:
    builder.download_and_prepare()
    shards.write_manifest(os.fspath(builder.data_path))
  return os.fspath(builder.data_path)


def _public_data_dir(config, data_dir: str) -> str | None:
  """Where a public TFDS dataset lives: ``data_dir`` if it is there, else TFDS's default."""
  name = config.dataset.partition("/")[0].partition(":")[0]
  return data_dir if os.path.isdir(os.path.join(data_dir, name)) else None


def _tfds_builder(name: str, tfds_dir: str | None) -> Any:
  """``tfds.builder``, with TFDS's text catalog registered: ``import
  tensorflow_datasets`` leaves some of its modules (wikipedia's) unimported,
  and an unregistered dataset that is not prepared reads as unknown."""
  try:
    return builders.catalog_builder(name, tfds_dir)
  except tfds.core.registered.DatasetNotFoundError:
    import tensorflow_datasets.text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  return builders.catalog_builder(name, tfds_dir)


def check_dataset(config, data_dir: str, entry: str = "") -> None:
  """Refuses, reading only, a ``config.dataset`` that is neither bertjax's
  own nor a TFDS dataset prepared where prepare reads it, or a split it
  lacks; ``entry``: the config.mixture entry that set them, if any."""
  fix = f"begin config.mixture entry {entry!r} with" if entry else "set --config.dataset to"
  name = config.dataset.partition("/")[0]
  wanted = [config.train_split] + ([config.eval_split] if config.get("eval_split") else [])
  if name in OWN_DATASETS:
    if name == "bertjax_python_docs" and config.dataset.partition("/")[2]:
      raise ValueError(
          f"bertjax_python_docs has no config {config.dataset.partition('/')[2]!r}; "
          f"{fix} bertjax_python_docs.")
    _check_splits(config.dataset, ("train", "validation"), wanted, entry)
    return
  builder = _public_builder(config, _public_data_dir(config, data_dir), fix, data_dir)
  _check_splits(config.dataset, builder.info.splits, wanted, entry)


def _public_builder(config, tfds_dir: str | None,
                    fix: str = "set --config.dataset to", data_dir: str = "") -> Any:
  """The prepared builder of a public TFDS dataset, or a ValueError with the
  fix; ``data_dir``: the run's, looked in first and named in that fix."""
  name = config.dataset
  try:
    builder = _tfds_builder(name, tfds_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
        f"Unknown dataset {name!r}; {fix} bertjax_python_docs, bertjax_local_text "
        f"(with text_files) or the name of a TFDS text dataset (prepared with "
        f"tfds build NAME --file_format=array_record).") from None
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"Cannot open TFDS dataset {name!r} ({e}); "
        + _array_record_hint(name, data_dir, tfds_dir) + ".") from e
  if not builder.is_prepared():
    # Looked for in the run's data_dir, then in TFDS's default: name both, and
    # build it where the run looks first (not where a bare tfds build puts it).
    where = (f"{data_dir} (nor in TFDS's default {builder.data_dir})"
             if data_dir and tfds_dir is None else builder.data_dir)
    to = f" --data_dir={data_dir}" if data_dir else ""
    raise ValueError(
        f"TFDS dataset {name!r} is not prepared in {where}; prepare it "
        f"first (tfds build {name}{to} --file_format=array_record), bertjax never "
        f"downloads it.")
  return builder


def _sized(source: units.TextSource, info: Any, split: str,
           sentences: dict[str, int] | None, field: str = "train_split") -> Split:
  try:
    selected = info.splits[split].num_examples
  except Exception:  # pylint: disable=broad-except  (left to the read below)
    selected = None
  if selected == 0:
    full = info.splits[_base_split(split)].num_examples
    raise ValueError(
        f"Split {split!r} of {source.path} selects no documents (the split "
        f"has {full}); widen the slice, e.g. "
        f"--config.{field}={_base_split(split)}.")
  try:
    num_docs = len(source.open())
  except Exception as e:  # pylint: disable=broad-except
    if source.kind == "own":
      raise shards.DamagedShardError(shards.dataset_damaged_message(source.path, e)) from e
    raise ValueError(
        f"Cannot read TFDS dataset {source.path!r} split {split!r} ({e}); "
        + _array_record_hint(source.path, source.data_dir, source.tfds_dir) + ".") from e
  full = info.splits[_base_split(split)]
  num_bytes = full.num_bytes * num_docs // max(full.num_examples, 1)
  exact = (sentences or {}).get(split) if split == _base_split(split) else None
  return Split(source, num_docs, max(num_bytes, 1), exact)


def text_sources(config, data_dir: str, engine: Engine) -> dict[str, Split]:
  """split name -> its documents and size (train split first)."""
  wanted = [config.train_split] + ([config.eval_split] if config.get("eval_split") else [])
  name = config.dataset.partition("/")[0]
  if name in OWN_DATASETS:
    if name == "bertjax_python_docs" and config.dataset.partition("/")[2]:
      raise ValueError(
          f"bertjax_python_docs has no config {config.dataset.partition('/')[2]!r}; "
          f"set --config.dataset=bertjax_python_docs.")
    dataset_dir = (_python_docs(data_dir) if name == "bertjax_python_docs"
                   else _local_text(config, data_dir, engine))
    info = shards.own_info(dataset_dir)
    _check_splits(config.dataset, info.splits, wanted)
    return {s: _sized(units.TextSource("own", dataset_dir, s, data_dir), info, s,
                      info.metadata.get("num_sentences"), _field(s, wanted))
            for s in wanted}
  tfds_dir = _public_data_dir(config, data_dir)
  builder = _public_builder(config, tfds_dir, data_dir=data_dir)
  _check_splits(config.dataset, builder.info.splits, wanted)
  return {s: _sized(units.TextSource("public", config.dataset, s, data_dir, tfds_dir,
                                     config.text_feature), builder.info, s, None,
                    _field(s, wanted))
          for s in wanted}


def _field(split: str, wanted: list[str]) -> str:
  """The config field that asked for ``split`` (train first in ``wanted``)."""
  return "train_split" if split == wanted[0] else "eval_split"
