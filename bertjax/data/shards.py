"""Damaged shards: a manifest written at prepare time, checks, and one-line errors.

Prepared shards are ArrayRecord (Riegeli) files. Riegeli hashes its chunks, so
flipped bytes or a truncated file are detected when read, but as a
``RuntimeError`` from deep inside grain that names neither the file nor what to
do. This module turns such damage into a ``DamagedShardError`` (a ValueError,
so the binaries print it as one line) naming the shard, its data_dir and the
fix, and finds damage in three ways, from cheap to thorough:

* ``check_sizes`` (every time ``prepare`` reuses shards, before any device
  work): each shard exists with the size the manifest recorded. Catches
  truncation and deletion in a few ``stat`` calls.
* ``CheckedSource`` (while training and evaluating): the random-access source
  the pipeline reads; an error reading a record becomes the one-line error of
  the shard holding it. Catches flipped bytes when they are read.
* ``verify`` (``python -m bertjax.prepare --verify``): every shard by both
  checksum and full decode -- the sha256 and size against the manifest
  (catches any change, even in bytes Riegeli does not hash) and every record
  read and decoded, their number against TFDS's recorded shard lengths
  (catches damage in shards prepared before manifests existed).

The manifest, ``bertjax_shards.json`` in each dataset directory, maps shard
file name -> {bytes, sha256, records}. It is written right after TFDS finishes
a dataset, so it describes the shards as made. Shards are deterministic (same
text and tokenizer give the same documents at the same indices; not the same
bytes, as the serialized fields' order varies, so a re-prepared dataset gets a
new manifest), so a damaged dataset is repaired by removing it and preparing
again (``remove_damaged``, ``--repair``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Any, Sequence

from array_record.python import array_record_data_source
import numpy as np
import tensorflow_datasets as tfds

from bertjax import mirror
from bertjax import paths
from bertjax.data import tokenizer as tokenizer_lib

MANIFEST = "bertjax_shards.json"
# Datasets that prepare makes (and so can make again) under a data_dir.
OWN_DATASETS = ("bertjax_python_docs", "bertjax_local_text", "bertjax_tokenized",
                "bertjax_mixture_text")
# Records read per call when verifying: large enough to amortise the reads.
_VERIFY_BATCH = 256


class DamagedShardError(ValueError):
  """A prepared shard cannot be read as prepare wrote it."""


def damaged_message(path: str, data_dir: str, reason: str) -> str:
  """The one line a user sees for a damaged shard."""
  return (f"Shard {path} of data_dir {data_dir} is damaged ({reason}); "
          f"re-prepare it with `python -m bertjax.prepare --repair` and the same "
          f"--config and --workdir (`--verify` lists every damaged shard).")


def dataset_damaged_message(dataset_dir: str, error: BaseException) -> str:
  """The one line for a dataset prepare made whose record (dataset_info.json,
  features.json) or shards cannot be opened: bertjax's own datasets are made
  again by prepare, not by TFDS."""
  return (f"The prepared dataset {dataset_dir} cannot be read "
          f"({short_reason(error)}); re-prepare it with `python -m "
          f"bertjax.prepare --repair` and the same --config and --workdir "
          f"(`--verify` lists what is damaged).")


def own_info(dataset_dir: str) -> Any:
  """TFDS's info of a dataset prepare made, or a DamagedShardError saying
  how to make it again when its record is damaged."""
  try:
    return tfds.builder_from_directory(dataset_dir).info
  except Exception as e:  # pylint: disable=broad-except  (JSON, proto, template errors)
    raise DamagedShardError(dataset_damaged_message(dataset_dir, e)) from e


def short_reason(error: BaseException) -> str:
  """Riegeli's first complaint without hash values: 'chunk data hash mismatch at byte 1180'."""
  if not str(error):  # array_record's reader says nothing when it cannot open a file
    return f"unreadable: {type(error).__name__}"
  text = str(error).splitlines()[0]
  text = text.replace("Corrupted Riegeli/records file: ", "")
  text = re.sub(r" \(computed 0x\w+, stored 0x\w+\)", "", text)
  text = re.sub(r", chunk at \d+( with length \d+)?", "", text)
  text = re.sub(r";? at byte (\d+)", r" at byte \1", text)
  return text.split(";")[0][:120]


@dataclasses.dataclass(frozen=True)
class Shard:
  """One shard file of a prepared dataset, as TFDS recorded it."""
  dataset_dir: str
  split: str
  path: str
  records: int


def dataset_shards(dataset_dir: str) -> list[Shard]:
  """The shard files of a TFDS dataset directory, per its dataset_info.json."""
  info = tfds.builder_from_directory(dataset_dir).info
  return [Shard(dataset_dir, name, os.fspath(path), int(n))
          for name, split in info.splits.items()
          for path, n in zip(split.filepaths, split.shard_lengths)]


def write_manifest(dataset_dir: str) -> None:
  """Records size, sha256 and record count of every shard of a freshly built dataset."""
  manifest = {os.path.basename(s.path): {
      "bytes": os.path.getsize(s.path), "sha256": tokenizer_lib.file_fingerprint(s.path),
      "records": s.records} for s in dataset_shards(dataset_dir)}
  tmp = os.path.join(dataset_dir, f".{MANIFEST}.tmp-{os.getpid()}")
  with open(tmp, "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  os.replace(tmp, os.path.join(dataset_dir, MANIFEST))


def read_manifest(dataset_dir: str) -> dict[str, dict[str, Any]] | None:
  """The manifest of a dataset, or None for shards prepared before manifests."""
  path = os.path.join(dataset_dir, MANIFEST)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _size_problem(shard: Shard, manifest: dict[str, Any] | None) -> str | None:
  if not os.path.exists(shard.path):
    return "the file is missing"
  if manifest is None:
    return None
  want = manifest.get(os.path.basename(shard.path), {}).get("bytes")
  have = os.path.getsize(shard.path)
  if want is not None and have != want:
    return f"{have} bytes where prepare wrote {want}"
  return None


def check_sizes(dataset_dir: str, data_dir: str) -> None:
  """Raises DamagedShardError for a missing shard or one whose size changed."""
  manifest = read_manifest(dataset_dir)
  for shard in dataset_shards(dataset_dir):
    problem = _size_problem(shard, manifest)
    if problem:
      raise DamagedShardError(damaged_message(shard.path, data_dir, problem))


def _decode_problem(shard: Shard, features) -> str | None:
  """Reads and decodes every record of one shard file; None when all is well."""
  try:
    reader = array_record_data_source.ArrayRecordDataSource([shard.path])
    count = len(reader)
    for start in range(0, count, _VERIFY_BATCH):
      for record in reader.__getitems__(range(start, min(start + _VERIFY_BATCH, count))):
        features.deserialize_example_np(record)
  except Exception as e:  # pylint: disable=broad-except
    # Whatever Riegeli or the feature decoder raise, the file is unreadable.
    return short_reason(e)
  if count != shard.records:
    return f"{count} records where prepare wrote {shard.records}"
  return None


@dataclasses.dataclass(frozen=True)
class Report:
  """The verdict on one shard: ``problem`` is None when it is intact."""
  shard: Shard
  problem: str | None
  checksum: bool  # whether a recorded sha256 was compared
  # For a gs:// data_dir (``shard`` then names the bucket's object): the
  # dataset's directory in the local mirror, where it was decoded.
  mirror_dataset_dir: str | None = None


def own_dataset_dirs(data_dir: str) -> list[str]:
  """Directories of the datasets prepare made under data_dir (finished ones only)."""
  found = []
  for name in OWN_DATASETS:
    for root, dirs, files in os.walk(os.path.join(data_dir, name)):
      # TFDS builds in incomplete.* directories and renames them when done.
      dirs[:] = sorted(d for d in dirs if not d.startswith("incomplete"))
      if "dataset_info.json" in files:
        found.append(root)
  return found


def verify(data_dir: str) -> list[Report]:
  """Checks every shard of every dataset prepare made under data_dir; writes
  nothing there. A gs:// data_dir is checked in its local mirror (ArrayRecord
  reads local files), refreshed from the bucket first."""
  if paths.is_remote(data_dir):
    return _verify_remote(data_dir)
  reports = []
  for dataset_dir in own_dataset_dirs(data_dir):
    try:
      manifest = read_manifest(dataset_dir)
      builder = tfds.builder_from_directory(dataset_dir)
      found = dataset_shards(dataset_dir)
    except Exception as e:  # pylint: disable=broad-except
      # Its record (dataset_info.json, features.json, the manifest) is
      # damaged: no shard can be named, the whole dataset is to be made again.
      reports.append(Report(Shard(dataset_dir, "(record)", dataset_dir, 0),
                            f"its record cannot be read: {short_reason(e)}", False))
      continue
    for shard in found:
      recorded = (manifest or {}).get(os.path.basename(shard.path), {})
      size = _size_problem(shard, manifest)
      decoded = None if size == "the file is missing" else _decode_problem(
          shard, builder.info.features)
      digest = None
      if size is None and "sha256" in recorded and (
          tokenizer_lib.file_fingerprint(shard.path) != recorded["sha256"]):
        digest = "sha256 differs from what prepare recorded"
      # Most telling first: a size says truncated, Riegeli says where.
      problem = size or decoded or digest
      reports.append(Report(shard, problem, "sha256" in recorded))
  return reports


def _verify_remote(data_dir: str) -> list[Report]:
  """``verify`` of a gs:// data_dir: each shard decoded in the mirror (pulled
  first: what it lacks or holds at another size) and the bucket's object
  hashed against the manifest, so damage on either side is found."""
  local, remote = mirror.local_mirror(data_dir), paths.absolute(data_dir)
  mirror.pull(remote, local)
  reports = []
  for r in verify(local):
    dataset_dir = paths.join(remote, os.path.relpath(r.shard.dataset_dir, local))
    shard = dataclasses.replace(r.shard, dataset_dir=dataset_dir, path=dataset_dir if (
        r.shard.path == r.shard.dataset_dir) else paths.join(
            dataset_dir, os.path.basename(r.shard.path)))
    problem = r.problem
    want = None if problem else (read_manifest(r.shard.dataset_dir) or {}).get(
        os.path.basename(r.shard.path), {}).get("sha256")
    if problem is None and want and tokenizer_lib.file_fingerprint(shard.path) != want:
      problem = "the bucket's copy: sha256 differs from what prepare recorded"
    reports.append(Report(shard, problem, r.checksum, r.shard.dataset_dir))
  return reports


def remove_damaged(reports: Sequence[Report]) -> list[str]:
  """Removes each dataset directory holding a damaged shard; returns them
  (a gs:// data_dir's from the bucket, dataset markers first so that a
  removal cut short never leaves a dataset that looks whole, and from the
  mirror).

  Only datasets prepare makes are ever verified, so ``prepare`` makes the
  removed ones again, document for document.
  """
  damaged = {r.shard.dataset_dir: r.mirror_dataset_dir for r in reports if r.problem}
  for dataset_dir in damaged:  # all or none: refused before any is removed
    blocker = paths.unwritable(os.path.dirname(dataset_dir)) or paths.unwritable(
        dataset_dir)
    if blocker is not None:
      raise ValueError(
          f"Cannot remove the damaged dataset {dataset_dir}: {blocker} is read-only "
          f"({paths.denial(blocker)}); make the data_dir writable, or point "
          "--config.data_dir at a new directory to prepare it there.")
  for dataset_dir, local in sorted(damaged.items()):
    if local is None:
      shutil.rmtree(dataset_dir)
      continue
    for marker in mirror.MARKERS:
      paths.path(dataset_dir, marker).unlink(missing_ok=True)
    paths.path(dataset_dir).rmtree(missing_ok=True)
    shutil.rmtree(local, ignore_errors=True)
  return sorted(damaged)


class CheckedSource:
  """Random access to a split's records that names the shard of a failed read.

  Wraps a TFDS data source (``len``, ``source[i]``) for the pipeline; an error
  from reading record ``i`` becomes a DamagedShardError naming the shard
  holding ``i`` (shards hold consecutive records in TFDS's order).
  """

  def __init__(self, source: Any, shard_paths: Sequence[str],
               shard_lengths: Sequence[int], data_dir: str):
    self._source = source
    self._paths = list(shard_paths)
    self._ends = np.cumsum(shard_lengths)
    self._data_dir = data_dir

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> Any:
    try:
      return self._source[index]
    except (IndexError, KeyError, TypeError):
      raise  # a wrong index is the caller's bug, not damage
    except Exception as e:  # pylint: disable=broad-except
      shard = self._paths[min(int(np.searchsorted(self._ends, index, side="right")),
                              len(self._paths) - 1)]
      raise DamagedShardError(
          damaged_message(shard, self._data_dir, short_reason(e))) from e
