"""Where ``--to_hf`` may write, checked before anything is loaded or written.

The rule (also in docs/interop.md):
  * a path that does not exist, or an empty directory: written;
  * a bertjax workdir (the ``--workdir`` itself, or any directory with a
    ``checkpoints/`` entry or a bertjax ``config.json``): refused, since the
    HF config.json would replace bertjax's;
  * a directory holding an earlier export (it has ``MANIFEST``, which every
    export writes, listing its files): refused unless ``overwrite``; with it
    the files that manifest lists are removed first, so nothing stale of the
    earlier export stays (an ELECTRA's ``generator/`` under a BERT);
  * a directory holding an unfinished export (killed midway; ``begin``
    wrote its manifest before any other file, and it names each file before
    that file is written): the files it names are replaced, with or without
    ``overwrite``. An export stopped by SIGTERM, Ctrl-C or an error removes
    what it wrote itself (``begin``), manifest last;
  * any other non-empty directory, or an earlier export beside which the
    user put a file of a name an export writes: refused. Nothing that an
    export did not write is ever deleted or overwritten.
"""

from __future__ import annotations

import contextlib
import json
from typing import Iterable, Iterator

from absl import logging
from etils import epath

from bertjax import paths
from bertjax.convert import hf_files

MANIFEST = "bertjax_export.json"
# Every name an export may write at the top of its directory (a companion
# such as ELECTRA's generator is a subdirectory of config.json + weights).
_EXPORT_NAMES = frozenset(("config.json", hf_files.SAFETENSORS, "generator", MANIFEST,
                           *hf_files.TOKENIZER_FILES))
_COMPANION_NAMES = frozenset(("config.json", hf_files.SAFETENSORS))


def is_bertjax_config(config: epath.Path) -> bool:
  """Whether the file ``config`` is a config.json bertjax wrote (a workdir's),
  not Hugging Face's or anyone else's."""
  try:
    saved = json.loads(config.read_text())
  except (ValueError, UnicodeDecodeError):
    return False
  # HF's config.json names a model_type; bertjax's a model or a task.
  return isinstance(saved, dict) and "model_type" not in saved and (
      "model" in saved or "task" in saved)


def _is_bertjax_workdir(directory: epath.Path) -> bool:
  if (directory / "checkpoints").exists():
    return True
  config = directory / "config.json"
  return config.is_file() and is_bertjax_config(config)


def _earlier_files(directory: epath.Path) -> tuple[list[str] | None, bool]:
  """(The relative names an earlier export listed, or None if there is none;
  whether it is unfinished)."""
  manifest = directory / MANIFEST
  if not manifest.is_file():
    return None, False
  try:
    record = json.loads(manifest.read_text())
    files = record["files"]
  except (ValueError, KeyError, TypeError):
    return None, False
  return [str(f) for f in files], bool(record.get("unfinished", False))


def _exportable(name: str) -> bool:
  """Whether ``name`` (relative, '/'-separated) is one an export writes."""
  parts = name.split("/")
  if len(parts) == 1:
    return parts[0] in _EXPORT_NAMES
  return len(parts) == 2 and parts[0] == "generator" and parts[1] in _COMPANION_NAMES


def check(out_dir: str, workdir: str, overwrite: bool) -> list[str]:
  """Refuses an export target (one-sentence ValueError) per the module rule.

  Returns:
    The earlier export's files to remove before writing (empty if none).
  """
  paths.require_directory(out_dir, "--to_hf")
  paths.require_bucket(out_dir, "--to_hf")
  paths.require_writable(out_dir, "--to_hf", "the export directory")
  target = paths.path(out_dir)
  if paths.absolute(out_dir) == paths.absolute(workdir):
    raise ValueError(
        f"--to_hf={out_dir} is the --workdir itself, whose config.json and "
        "checkpoints the export would overwrite; pass --to_hf a new directory.")
  if not target.exists() or not any(target.iterdir()):
    return []
  if _is_bertjax_workdir(target):
    raise ValueError(
        f"--to_hf={out_dir} is a bertjax workdir, whose config.json the export "
        "would overwrite; pass --to_hf a new directory.")
  earlier, unfinished = _earlier_files(target)
  if earlier is None:
    raise ValueError(
        f"--to_hf={out_dir} is a non-empty directory that holds no earlier "
        "bertjax export; pass --to_hf a new or empty directory.")
  if not overwrite and not unfinished:
    raise ValueError(
        f"--to_hf={out_dir} holds an earlier export; pass --overwrite to replace "
        "it (only the files that export wrote are removed) or pass a new directory.")
  listed = {f for f in earlier if _exportable(f)}
  strangers = sorted(e.name for e in target.iterdir() if _exportable(e.name)
                     and e.name not in listed and e.name != MANIFEST
                     and not (e.name == "generator" and any(
                         f.startswith("generator/") for f in listed)))
  if strangers:
    raise ValueError(
        f"--to_hf={out_dir} holds {strangers[0]}, which the earlier export did "
        "not write and this one may overwrite; move it away or pass a new directory.")
  return sorted(listed) + [MANIFEST]


def remove_earlier(out_dir: str, files: Iterable[str]) -> None:
  """Deletes an earlier export's files (``check``'s list), the temporary
  files of them a stopped export left (``paths.write_bytes``'s
  ``.<name>.tmp-*``), and ``generator/`` when that leaves it empty; nothing
  else."""
  target = paths.path(out_dir)
  for name in files:
    path = target / name
    if path.is_file():
      path.unlink()
    if path.parent.is_dir():
      for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        tmp.unlink()
  generator = target / "generator"
  if generator.is_dir() and not any(generator.iterdir()):
    generator.rmdir()


class Export:
  """An export being written into ``out_dir``: ``writing`` names each file in
  the manifest, marked unfinished, before the file is written, so that a
  rerun after a kill removes only files this export began (a user's file of
  an export's name is then refused by ``check``, not deleted)."""

  def __init__(self, out_dir: str, workdir: str, step: int):
    self.out_dir, self.workdir, self.step = out_dir, str(workdir), int(step)
    self.files: list[str] = []
    self._record(unfinished=True)

  def _record(self, **extra) -> None:
    paths.write_json(paths.join(self.out_dir, MANIFEST), {
        "files": sorted(self.files), "workdir": self.workdir, "step": self.step,
        **extra}, indent=2)

  def writing(self, *names: str) -> None:
    """Records ``names`` (relative, '/'-separated) before they are written."""
    new = [n for n in names if n not in self.files]
    if new:
      self.files += new
      self._record(unfinished=True)

  def under(self, subdir: str):
    """``writing`` for the files of ``subdir`` (ELECTRA's generator)."""
    return lambda *names: self.writing(*(f"{subdir}/{n}" for n in names))

  def finish(self, files: Iterable[str]) -> None:
    """Records what the export wrote, so a later --overwrite removes exactly
    that. Its last write: a SIGTERM from here on lets the export end."""
    from bertjax import guards
    guards.finish_on_sigterm()
    self.files = list(files)
    self._record()


@contextlib.contextmanager
def begin(out_dir: str, earlier: Iterable[str], workdir: str,
          step: int) -> Iterator[Export]:
  """Removes an earlier export's files (``check``'s list), then records an
  unfinished export before any file is written: one killed midway is
  replaced by the rerun (without it, the rerun refused the directory as one
  of other files, with --overwrite too). Stopped by an exception (SIGTERM in
  ``bertjax.convert``, Ctrl-C, an error), the export removes the files it
  began, their temporary files, then its manifest, and ``out_dir`` when it
  made it and left it empty: nothing half-written stays."""
  made = not paths.exists(out_dir)
  remove_earlier(out_dir, earlier)
  paths.makedirs(out_dir)
  export = Export(out_dir, workdir, step)
  try:
    yield export
  except BaseException:
    try:
      remove_earlier(out_dir, export.files + [MANIFEST])
      target = paths.path(out_dir)
      if made and not any(target.iterdir()):
        target.rmdir()
    except Exception as e:  # noqa: BLE001 — the export's own error is the one to raise
      logging.warning("Could not remove what the stopped export wrote in %s (%s); "
                      "rerunning it replaces them.", out_dir, e)
    raise
