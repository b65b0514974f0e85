"""The text prepare tokenizes: bertjax's own datasets (built here) or a public TFDS one.

``text_sources(config, data_dir, engine)`` returns, per wanted split, a
``units.TextSource`` (picklable random access to its documents) with the
split's size. It builds what is missing of bertjax's own text datasets:

* ``bertjax_python_docs``: the embedded demo corpus, a small TFDS builder.
* ``bertjax_local_text/<files|paragraphs>``: the user's files, read a block
  at a time by units (bertjax/data/units.py) on ``engine``'s workers, so that
  neither the files nor the splits are ever held in memory.

A public TFDS dataset is read where the user prepared it; bertjax never
downloads one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from typing import Any, Iterable

from absl import logging
import tensorflow_datasets as tfds

from bertjax import paths
from bertjax.data import bad_text_files
from bertjax.data import bucket_units
from bertjax.data import builders
from bertjax.data import shards
from bertjax.data import staged
from bertjax.data import units
from bertjax.data import workers

OWN_DATASETS = ("bertjax_python_docs", "bertjax_local_text")
_LOCAL_VERSION = "1.0.0"
_LISTED_FILES = 10_000
# In a local text dataset's staging: the stamp (paths.file_stamp) of each
# input file the staged units were read from.
_STAMPS = "inputs.json"


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


def check_local_text_named(dataset: str, text_files: str) -> None:
  """The refusals of a ``bertjax_local_text`` input that read no file (so the
  TPU launcher can run them where the files are not): ValueError with the fix
  for an unknown config name or no ``text_files``."""
  cfg = dataset.partition("/")[2] or "files"
  if cfg not in builders.LOCAL_TEXT_CONFIGS:
    raise ValueError(
        f"bertjax_local_text has no config {cfg!r}; set --config.dataset to "
        f"{' or '.join('bertjax_local_text/' + k for k in builders.LOCAL_TEXT_CONFIGS)}.")
  if not text_files:
    raise ValueError(
        "bertjax_local_text needs input files; set --config.text_files to "
        "comma-separated paths or globs of UTF-8 text files.")


def local_text_files(dataset: str, text_files: str, data_dir: str | None = None,
                     outputs: tuple[str, ...] = ()) -> list[str]:
  """The files a ``bertjax_local_text`` input reads (reading only: globs
  resolved, nothing opened); ValueError with the fix when its config name is
  unknown, no files are given, a directory read whole holds one of ``outputs``
  (the run's workdir and data_dir), or none match. None match but ``data_dir``
  holds the text dataset prepared from the same ``text_files``: [] (the data
  is there; the files may have moved since)."""
  check_local_text_named(dataset, text_files)
  found = builders.resolve_text_files(text_files, outputs)
  if not found:
    if data_dir is not None and _prepared_from(local_text_dir(data_dir, dataset),
                                               text_files):
      return []
    raise ValueError(builders.no_files_message(text_files))
  return found


def local_text_dir(data_dir: str, dataset: str) -> str:
  """Where the text dataset of a ``bertjax_local_text`` input is built."""
  cfg = dataset.partition("/")[2] or "files"
  return os.path.join(data_dir, "bertjax_local_text", cfg, _LOCAL_VERSION)


def _stored(dataset_dir: str) -> dict[str, Any] | None:
  """The metadata of the text dataset published at ``dataset_dir``, or None."""
  if not staged.is_published(dataset_dir):
    return None
  return dict(shards.own_info(dataset_dir).metadata or {})


def _prepared_from(dataset_dir: str, text_files: str) -> bool:
  stored = _stored(dataset_dir)
  return stored is not None and stored.get("text_files") == text_files


def _changed_files(stored: dict[str, Any], files: list[tuple[str, int, int]]) -> str:
  """'2 added (…/c.txt, …), 1 removed (…)' between the recorded files and
  ``files`` (path, size, mtime); '' when the record predates the per-file list."""
  if "files" not in stored:
    return ""
  then = {f[0]: f[1] for f in stored["files"]}
  now = {f[0]: f[1] for f in files}
  parts = []
  for what, names in (
      ("added", [p for p in now if p not in then]),
      ("removed", [p for p in then if p not in now]),
      ("resized", [p for p in now if p in then and now[p] != then[p]])):
    if names:
      parts.append(f"{len(names)} {what} ({', '.join(names[:2])}"
                   f"{', …' if len(names) > 2 else ''})")
  return ", ".join(parts)


def _warn_if_edited(stored: dict[str, Any], files: list[tuple[str, int, int]],
                    dataset_dir: str) -> None:
  """Warns when files of the same paths and sizes were edited after the text
  was prepared from them. Judged by each file's content stamp where the record
  has one (``paths.same_stamp``: an edit in the second of the prepare, or one
  that put the mtime back, included; no content read while the file's ctime
  is unchanged); in a dataset prepared before stamps were recorded, by a
  whole-second mtime later than the recorded one, as then."""
  then = {f[0]: f for f in stored.get("files", []) if len(f) > 2}
  edited = [p for p, _, mtime in files if p in then and (
      not paths.same_stamp(p, then[p][3], then[p][4]) if len(then[p]) > 4
      else mtime > then[p][2])]
  if edited:
    logging.warning(
        "%d of the text files were modified after %s was prepared from them "
        "(their sizes are the same: %s); the text prepared then is used. To "
        "prepare their text as it is now, point --config.data_dir at a new "
        "directory.", len(edited), dataset_dir,
        ", ".join(edited[:3]) + (", …" if len(edited) > 3 else ""))


def _files_now(found: list[str]) -> tuple[list[tuple[str, int, int]], str]:
  """(path, size, mtime) of each file as it is now, and their fingerprint."""
  files = []
  for p in found:
    stat = paths.path(p).stat()
    files.append((paths.absolute(p), int(stat.length), int(stat.mtime or 0)))
  return files, builders.files_fingerprint([f[:2] for f in files])


def _changed_message(stored: dict[str, Any], files: list[tuple[str, int, int]],
                     dataset_dir: str, purpose: str) -> str:
  changes = _changed_files(stored, files)
  return (f"The files of --config.text_files={stored.get('text_files')!r} have "
          f"changed since {dataset_dir} was prepared from them"
          f"{' (' + changes + ')' if changes else ''}; put them back as they "
          f"were {purpose}, or point --config.data_dir at a new directory to "
          f"prepare them anew.")


def check_rebuildable(dataset_dir: str) -> None:
  """ValueError unless the local text dataset at ``dataset_dir`` (damaged,
  about to be removed by ``--repair``) would be made again from the same
  files: rebuilt from files changed since, it would no longer be the text the
  run's tokenized shards, and its resumes, were made of. Any other dataset,
  or one whose record cannot be read, passes."""
  if "bertjax_local_text" not in paths.path(dataset_dir).parts:
    return
  try:
    stored = _stored(dataset_dir)
  except Exception:  # pylint: disable=broad-except
    return  # the record itself is damaged: nothing to compare with
  if not stored or "files_fingerprint" not in stored:
    return
  found = builders.resolve_text_files(stored.get("text_files", ""), ())
  files, fingerprint = _files_now(found) if found else ([], "")
  if fingerprint != stored["files_fingerprint"]:
    raise ValueError(_changed_message(
        stored, files, dataset_dir, "to repair it (--repair makes it again from them)"))


def _local_text(config, data_dir: str, engine: Engine) -> str:
  """Builds (if missing) the text dataset of config.text_files; returns its directory."""
  cfg = config.dataset.partition("/")[2] or "files"
  text_files = config.get("text_files", "")
  found = local_text_files(config.dataset, text_files, data_dir, (data_dir,))
  dataset_dir = local_text_dir(data_dir, config.dataset)
  stored = _stored(dataset_dir)
  if stored is not None and not found:
    logging.warning(
        "--config.text_files=%r matches no files now; using the text dataset "
        "prepared from them in %s.", text_files, dataset_dir)
    return dataset_dir
  files, fingerprint = _files_now(found)
  if stored is not None:
    if stored.get("files_fingerprint") != fingerprint:
      if stored.get("text_files") != text_files:
        raise ValueError(
            f"{dataset_dir} was prepared from --config.text_files="
            f"{stored.get('text_files')!r}, not {text_files!r}; point "
            f"--config.data_dir at a new directory to prepare {text_files!r}.")
      raise ValueError(_changed_message(stored, files, dataset_dir, "to go on with that data"))
    _warn_if_edited(stored, files, dataset_dir)
    logging.info("Reusing text dataset %s.", dataset_dir)
    return dataset_dir

  start = time.time()
  # The plan names each file's content stamp, not just its size: a unit an
  # interrupted prepare staged is reused only while its files are unchanged.
  stamped = {f[0]: paths.stamp_with_ctime(f[0]) for f in files}
  stamps = {p: stamp for p, (stamp, _) in stamped.items()}
  content = hashlib.sha256(json.dumps(stamps, sort_keys=True).encode()).hexdigest()
  # 'whole-files': units of the receipts that report bad files by name;
  # 'no-bom': units that drop a UTF-8 byte-order mark; 'cr-lines': units that
  # take a lone "\r" for a line end.
  plan = hashlib.sha256(
      f"{fingerprint}|{content}|{cfg}|{engine.block_bytes}|whole-files|no-bom|cr-lines"
      .encode()
  ).hexdigest()[:16]
  stage = staged.Stage(dataset_dir, "bertjax_local_text", plan)
  _warn_if_restarted(stage, stamps)
  stage.clear_other_plans()
  paths.write_json(stage.dir / _STAMPS, {"plan": plan, "stamps": stamps})
  groups = units.plan_text(found, engine.block_bytes)
  tasks = [units.TextTask(i, tuple(g), cfg == "paragraphs", dataset_dir,
                          "bertjax_local_text", plan)
           for i, g in enumerate(groups)]
  todo = [t for t in tasks if stage.receipt(t.index) is None]
  logging.info("Reading %d text files (%.1f MB) in %d units, %d to do ...",
               len(found), sum(f[1] for f in files) / 1e6,
               len(tasks), len(todo))
  engine.run(units.run_text, todo, workers.Progress(
      "text", sum(sum(min(p.end, p.size) - p.start for p in t.pieces) for t in todo),
      len(todo)))
  receipts = [stage.receipt(t.index) for t in tasks]
  # A file found bad by one unit is left out whole: the units that made
  # documents of its other pieces run again without it.
  tasks, rerun = bad_text_files.exclude(tasks, receipts)
  if rerun:
    engine.run(units.run_text, rerun)
    receipts = [stage.receipt(t.index) for t in tasks]
  skipped = bad_text_files.verdicts(tasks, receipts)
  path_of = {p.name: p.path for t in tasks for p in t.pieces}
  bad_text_files.warn(skipped, path_of, logging.warning)
  docs = sum(r["stats"]["documents"] for r in receipts)
  if not docs and skipped:
    stage.remove()
    raise ValueError(
        f"None of the {len(found)} files of --config.text_files is usable "
        f"({bad_text_files.summary(skipped, path_of)}); pass non-empty UTF-8 text files.")
  if docs < 2:
    stage.remove()
    raise ValueError(
        f"--config.text_files gives {docs} document(s) but a train and a "
        f"validation split need at least 2; add files or use "
        f"--config.dataset=bertjax_local_text/paragraphs.")
  _fill_empty_split(tasks, receipts, stage, engine)
  receipts = [stage.receipt(t.index) for t in tasks]
  sentences = {split: sum(r["stats"]["sentences"].get(split, 0) for r in receipts)
               for split in ("train", "validation")}
  stage.publish(len(tasks), ["train", "validation"], builders.text_features(), {
      "text_files": text_files, "files_fingerprint": fingerprint,
      # The per-file list names what changed when the files do (up to a size
      # a metadata file carries well): path, size, mtime, content stamp, ctime.
      **({"files": [[*f, *stamped[f[0]]] for f in files]}
         if len(files) <= _LISTED_FILES else {}),
      "num_sentences": sentences}, "The user's text files, split into sentences.")
  logging.info("Built %s in %.1f s: %d documents from %d files.", config.dataset,
               time.time() - start, docs, len(found))
  return dataset_dir


def _warn_if_restarted(stage: staged.Stage, stamps: dict[str, str]) -> None:
  """Warns, naming them, when files an interrupted prepare had begun to read
  have changed since (an edit of the same size included): no unit it staged
  is reused (the plan differs), the text is read again from the start."""
  record = stage.dir / _STAMPS
  try:
    before = json.loads(record.read_text()) if record.exists() else {}
  except ValueError:
    return  # cut short: the plan alone decides
  if before.get("plan") == stage.plan:
    return
  changed = [p for p, stamp in stamps.items()
             if p in before.get("stamps", {}) and before["stamps"][p] != stamp]
  if changed:
    logging.warning(
        "%d of the text files changed since an interrupted prepare began to "
        "read them (%s); their text dataset is made again from the start, "
        "from the files as they are now.", len(changed),
        ", ".join(changed[:3]) + (", …" if len(changed) > 3 else ""))


def _fill_empty_split(tasks, receipts, stage: staged.Stage, engine: Engine) -> None:
  """Moves the document nearest the hold-out threshold into an empty split.

  Few documents can leave one split empty; the moved document is a function
  of the documents' names alone, so the choice does not depend on the units.
  """
  counts = {s: sum(r["records"].get(s, 0) for r in receipts)
            for s in ("train", "validation")}
  for empty, other, pick in (("validation", "train", min), ("train", "validation", max)):
    if counts[empty]:
      continue
    candidates = [(tuple(r["stats"]["edge"][other]), t)
                  for t, r in zip(tasks, receipts) if r["stats"]["edge"][other]]
    (_, doc_id), task = pick(candidates, key=lambda c: c[0])
    moved = dataclasses.replace(task, overrides=((doc_id, empty),))
    engine.run(units.run_text, [moved])
    return


def _public_data_dir(config, data_dir: str) -> str | None:
  """Where a public TFDS dataset lives: ``data_dir`` if it is there, else TFDS's default."""
  name = config.dataset.partition("/")[0].partition(":")[0]
  return data_dir if os.path.isdir(os.path.join(data_dir, name)) else None


def _tfds_builder(name: str, tfds_dir: str | None) -> Any:
  """``tfds.builder``, with TFDS's text catalog registered: ``import
  tensorflow_datasets`` leaves some of its modules (wikipedia's) unimported,
  and an unregistered dataset that is not prepared reads as unknown."""
  try:
    return tfds.builder(name, data_dir=tfds_dir)
  except tfds.core.registered.DatasetNotFoundError:
    import tensorflow_datasets.text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  return tfds.builder(name, data_dir=tfds_dir)


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
