"""bertjax_local_text: the text dataset made of the user's own text files.

``build(config, data_dir, engine)`` reads ``config.text_files`` (local or
gs://) a block at a time in units (bertjax/data/units.py) on ``engine``'s
workers, so that neither the files nor the splits are ever held in memory,
and publishes the dataset under ``local_text_dir``. A dataset already there
is reused while its files are unchanged (their paths, sizes and content
stamps are recorded); a change is refused or warned about, naming the files.
bertjax/data/text_sources.py picks this or another source of text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, TYPE_CHECKING

from absl import logging

from bertjax import paths
from bertjax.data import bad_text_files
from bertjax.data import builders
from bertjax.data import shards
from bertjax.data import staged
from bertjax.data import units
from bertjax.data import workers

if TYPE_CHECKING:
  from bertjax.data import text_sources

_LOCAL_VERSION = "1.0.0"
_LISTED_FILES = 10_000
# In a local text dataset's staging: the stamp (paths.file_stamp) of each
# input file the staged units were read from.
_STAMPS = "inputs.json"


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


def build(config, data_dir: str, engine: text_sources.Engine) -> str:
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


def _fill_empty_split(tasks, receipts, stage: staged.Stage,
                      engine: text_sources.Engine) -> None:
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
