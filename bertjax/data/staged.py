"""Datasets written unit by unit by independent workers, then published for TFDS.

``prepare`` cuts each of its datasets (the text of local files, the tokenized
documents) into *units* fixed by the input alone: a range of input bytes or of
input records. Whichever process runs a unit -- the main process, one of
``config.prepare_workers`` spawned workers, or an Apache Beam worker -- writes
that unit's records of every split into staging files and then a small JSON
*receipt* (record counts and statistics). The receipt is written last and
atomically, so a unit whose receipt exists is complete; a killed prepare
leaves only whole units and stray temporary files, and the next run redoes
just the missing units.

When every unit has a receipt, ``publish`` renames the non-empty staged shards
into TFDS's names (``<name>-<split>.array_record-<i>-of-<n>``, in unit order),
writes their manifest (bertjax/data/shards.py; the sha256 of each shard was
taken by the worker that wrote it) and ``dataset_info.json`` through
``tfds.folder_dataset.write_metadata``, last: TFDS (and ``prepare``) treat a directory without it as not prepared.
Because a unit's records depend only on its input, the published shards are
the same bytes whatever the number of workers or the engine that ran them.

Staging lives in ``<dataset dir>/.staging``; receipts carry a ``plan`` key
(the fingerprint of the inputs, tokenizer and settings), and staged units of
another plan are never reused.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
from typing import Any, Iterable, Iterator, Mapping, Sequence

from array_record.python import array_record_data_source
from array_record.python import array_record_module
from etils import epath
import tensorflow_datasets as tfds
from tensorflow_datasets.core import example_serializer

from bertjax.data import shards
from bertjax.data import tokenizer as tokenizer_lib

STAGING = ".staging"
# One record per Riegeli chunk group: every record is a cheap random access.
_WRITER_OPTIONS = "group_size:1"
_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


class Serializer:
  """Encodes examples of a FeaturesDict to bytes, the same bytes in every process.

  TFDS's own ``serialize_example`` writes the tf.train.Example's feature map
  in an order that varies between processes; deterministic serialization sorts
  it, so that a unit's shard does not depend on which process wrote it.
  """

  def __init__(self, features):
    self._features = features
    self._serializer = example_serializer.ExampleSerializer(
        features.get_serialized_info())

  def __call__(self, example: Mapping[str, Any]) -> bytes:
    proto = self._serializer.get_tf_example(self._features.encode_example(example))
    return proto.SerializeToString(deterministic=True)


def is_local(path: str | os.PathLike) -> bool:
  return "://" not in os.fspath(path)


class Stage:
  """The staging area of one dataset directory.

  Args:
    dataset_dir: where the published dataset goes (TFDS's data_path, e.g.
      ``<data_dir>/bertjax_tokenized/<source>/1.0.0``); local or gs://.
    dataset_name: TFDS's name of it, the prefix of its shard files.
    plan: a fingerprint of everything the units' output depends on.
  """

  def __init__(self, dataset_dir: str, dataset_name: str, plan: str):
    self.dataset_dir = epath.Path(dataset_dir)
    self.dataset_name = dataset_name
    self.plan = plan
    self.dir = self.dataset_dir / STAGING

  def _shard(self, index: int, split: str) -> epath.Path:
    return self.dir / f"unit-{index:05d}.{split}.array_record"

  def _receipt(self, index: int) -> epath.Path:
    return self.dir / f"unit-{index:05d}.json"

  def receipt(self, index: int) -> dict[str, Any] | None:
    """The receipt of a finished unit of this plan whose shards are intact, else None."""
    path = self._receipt(index)
    if not path.exists():
      return None
    receipt = json.loads(path.read_text())
    if receipt.get("plan") != self.plan:
      return None
    for split, size in receipt["bytes"].items():
      shard = self._shard(index, split)
      if not shard.exists() or shard.stat().length != size:
        return None
    return receipt

  def write_unit(self, index: int, records: Mapping[str, Iterable[bytes]],
                 stats: Mapping[str, Any]) -> dict[str, Any]:
    """Writes a unit's serialized records per split, then its receipt.

    Args:
      index: the unit's position in the plan.
      records: split -> serialized examples, in order.
      stats: JSON-able statistics for ``publish`` and the caller.

    Returns:
      The receipt: plan, records (split -> count), bytes (split -> file
      size; a split without records has no file, and no entry) and stats.
    """
    self.dir.mkdir(parents=True, exist_ok=True)
    counts, sizes, digests = {}, {}, {}
    # A temporary directory only for a gs:// dataset: made for every unit, one
    # left empty in /tmp by each worker a kill stopped mid-unit.
    with contextlib.ExitStack() as stack:
      tmp = None
      for split, examples in records.items():
        examples = iter(examples)
        first = next(examples, None)
        if first is None:
          # Riegeli pads even an empty file to 128 KiB; a unit's split is
          # often empty (a small unit's validation), and publish skips it.
          counts[split] = 0
          continue
        examples = itertools.chain([first], examples)
        final = self._shard(index, split)
        # Riegeli writes local files; a gs:// dataset gets a copy of one.
        if is_local(final):
          local = os.fspath(final) + f".tmp-{os.getpid()}"
        else:
          if tmp is None:
            tmp = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="bertjax-unit-"))
          local = os.path.join(tmp, final.name)
        writer = array_record_module.ArrayRecordWriter(local, _WRITER_OPTIONS)
        count = 0
        try:
          for example in examples:
            writer.write(example)
            count += 1
          writer.close()
        except BaseException:
          # A full disk (or a stop) mid-write: the partial file, named by this
          # pid, would never be reused and would hold the space a rerun needs.
          with contextlib.suppress(Exception):
            writer.close()
          with contextlib.suppress(OSError):
            os.remove(local)
          raise
        # Hashed here, in the worker, for the manifest (shards.py).
        digests[split] = tokenizer_lib.file_fingerprint(local)
        if is_local(final):
          os.replace(local, final)
        else:
          epath.Path(local).copy(final, overwrite=True)
        counts[split] = count
        sizes[split] = final.stat().length
    receipt = {"plan": self.plan, "records": counts, "bytes": sizes,
               "sha256": digests, "stats": dict(stats)}
    _write_atomically(self._receipt(index), json.dumps(receipt, sort_keys=True))
    return receipt

  def records(self, index: int, split: str) -> Iterator[bytes]:
    """A finished unit's staged records of ``split``, in order (none where
    it had none: ``write_unit`` writes no file for an empty split)."""
    receipt = self.receipt(index)
    if receipt is None:
      raise RuntimeError(f"unit {index} of {self.dataset_dir} is unfinished")
    if not receipt["records"].get(split):
      return
    reader = array_record_data_source.ArrayRecordDataSource(
        [os.fspath(self._shard(index, split))])
    for lo in range(0, len(reader), 4096):
      yield from reader.__getitems__(range(lo, min(lo + 4096, len(reader))))

  def clear_other_plans(self) -> None:
    """Removes staged units of another plan (never a published shard)."""
    if not self.dir.exists():
      return
    for path in self.dir.iterdir():
      if path.suffix == ".json":
        try:
          plan = json.loads(path.read_text()).get("plan")
        except ValueError:
          plan = None
        if plan != self.plan:
          path.unlink()

  def publish(self, num_units: int, splits: Sequence[str], features,
              metadata: Mapping[str, Any], description: str) -> None:
    """Moves every unit's non-empty shards into TFDS names and writes its metadata.

    Args:
      num_units: units of the plan; each must have a receipt.
      splits: TFDS split names, each given at least one record.
      features: the tfds FeaturesDict the records were serialized with.
      metadata: JSON-able dataset metadata (``info.metadata``).
      description: for dataset_info.json.
    """
    receipts = [self.receipt(i) for i in range(num_units)]
    missing = [i for i, r in enumerate(receipts) if r is None]
    if missing:
      raise RuntimeError(f"units {missing[:10]} of {self.dataset_dir} are unfinished")
    split_infos, manifest = [], {}
    for split in splits:
      units = [i for i, r in enumerate(receipts) if r["records"].get(split)]
      if not units:
        raise ValueError(f"split {split!r} of {self.dataset_dir} has no record")
      lengths, num_bytes = [], 0
      for shard_index, unit in enumerate(units):
        name = (f"{self.dataset_name}-{split}.array_record-"
                f"{shard_index:05d}-of-{len(units):05d}")
        self._shard(unit, split).replace(self.dataset_dir / name)
        lengths.append(receipts[unit]["records"][split])
        num_bytes += receipts[unit]["bytes"][split]
        manifest[name] = {"bytes": receipts[unit]["bytes"][split],
                          "sha256": receipts[unit]["sha256"][split],
                          "records": receipts[unit]["records"][split]}
      template = tfds.core.ShardedFileTemplate(
          data_dir=self.dataset_dir, template=_TEMPLATE,
          dataset_name=self.dataset_name, split=split,
          filetype_suffix="array_record")
      split_infos.append(tfds.core.SplitInfo(
          name=split, shard_lengths=lengths, num_bytes=num_bytes,
          filename_template=template))
    _write_atomically(self.dataset_dir / shards.MANIFEST,
                      json.dumps(manifest, indent=1, sort_keys=True))
    tfds.folder_dataset.write_metadata(
        data_dir=self.dataset_dir, features=features, split_infos=split_infos,
        filename_template=_TEMPLATE, check_data=False, description=description,
        metadata=tfds.core.MetadataDict(metadata))
    self.remove()

  def remove(self) -> None:
    """Removes the staging directory (published shards are outside it)."""
    if is_local(self.dir):
      shutil.rmtree(self.dir, ignore_errors=True)
    elif self.dir.exists():
      self.dir.rmtree()


def _write_atomically(path: epath.Path, text: str) -> None:
  tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
  tmp.write_text(text)
  tmp.replace(path)


def is_published(dataset_dir: str | os.PathLike) -> bool:
  return (epath.Path(dataset_dir) / "dataset_info.json").exists()
