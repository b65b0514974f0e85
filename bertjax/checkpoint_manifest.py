"""Checksums of a committed checkpoint, so that damage is detected, not guessed.

When orbax has committed ``checkpoints/<step>/``, process 0 writes
``<step>/bertjax_manifest.json``: the size and SHA-256 of every file of the
checkpoint (written to a temporary name, then renamed, so a manifest is
either whole or absent). Before a checkpoint is restored, ``verify`` reads
every file again and compares.

Cost: one read of the checkpoint at save (in orbax's background thread, off
the train loop) and one at restore, hashed by several threads: about a
second per GB on one core. A tiny BERT's 17 MB checkpoint takes a few
milliseconds.

A checkpoint without a manifest (written by an older bertjax, or a process
killed between the commit and the manifest) is "unverified": its JSON items
are checked for readability and it is restored all the same, but a failure
to restore it is reported rather than taken for damage.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
from typing import Any

from etils import epath

from bertjax import paths

MANIFEST = "bertjax_manifest.json"
ASIDE_SUFFIX = ".unreadable"
# The JSON items of a bertjax checkpoint (bertjax/checkpointing.py) and the
# file orbax's JsonSave writes for each.
JSON_ITEMS = ("config", "data")
JSON_FILE = "metadata"
_CHUNK = 1 << 20

OK = "ok"
UNVERIFIED = "unverified"
DAMAGED = "damaged"


@dataclasses.dataclass(frozen=True)
class Verdict:
  """``status``: OK, UNVERIFIED or DAMAGED; ``reason`` says why, for DAMAGED."""
  status: str
  reason: str = ""


def _files(step_dir: epath.Path) -> list[str]:
  """Relative paths of the checkpoint's files, the manifest itself left out."""
  return [rel for rel, _ in paths.walk_files(step_dir)
          if not rel.startswith(MANIFEST)]


def _digest(path: epath.Path) -> tuple[int, str]:
  sha, size = hashlib.sha256(), 0
  with path.open("rb") as f:
    while chunk := f.read(_CHUNK):
      sha.update(chunk)
      size += len(chunk)
  return size, sha.hexdigest()


def _digests(step_dir: epath.Path, names: list[str]) -> dict[str, tuple[int, str]]:
  # hashlib releases the GIL on large buffers, so threads hash in parallel.
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    results = pool.map(lambda n: _digest(step_dir / n), names)
    return dict(zip(names, results))


def write(step_dir: str | epath.Path) -> None:
  """Writes the manifest of a committed checkpoint directory (process 0 only)."""
  step_dir = epath.Path(step_dir)
  files = {name: {"size": size, "sha256": sha}
           for name, (size, sha) in _digests(step_dir, _files(step_dir)).items()}
  tmp = step_dir / (MANIFEST + ".tmp")
  tmp.write_text(json.dumps({"version": 1, "files": files}, indent=0))
  tmp.rename(step_dir / MANIFEST)


def read_json_item(step_dir: str | epath.Path, item: str) -> dict[str, Any]:
  """A JSON item ('config' or 'data') of a checkpoint; raises ValueError."""
  path = epath.Path(step_dir) / item / JSON_FILE
  try:
    value = json.loads(path.read_text())
  except FileNotFoundError:
    raise ValueError(f"{item}/{JSON_FILE} is missing") from None
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{item}/{JSON_FILE} is unreadable ({e})") from None
  if not isinstance(value, dict):
    raise ValueError(f"{item}/{JSON_FILE} is not a JSON object")
  return value


def verify(step_dir: str | epath.Path) -> Verdict:
  """Checks a checkpoint directory against its manifest; reads every file."""
  step_dir = epath.Path(step_dir)
  try:
    for item in JSON_ITEMS:
      read_json_item(step_dir, item)
  except ValueError as e:
    return Verdict(DAMAGED, str(e))
  manifest = step_dir / MANIFEST
  if not manifest.exists():
    return Verdict(UNVERIFIED)
  try:
    files = json.loads(manifest.read_text())["files"]
    expected = {name: (int(v["size"]), str(v["sha256"])) for name, v in files.items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    return Verdict(DAMAGED, f"its manifest is unreadable ({type(e).__name__})")
  missing = [n for n in sorted(expected) if not (step_dir / n).is_file()]
  if missing:
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return Verdict(DAMAGED, f"{missing[0]}{more} is missing")
  actual = _digests(step_dir, sorted(expected))
  for name in sorted(expected):
    size, sha = actual[name]
    if size != expected[name][0]:
      return Verdict(DAMAGED, f"{name} has {size} bytes, the manifest says "
                              f"{expected[name][0]}")
    if sha != expected[name][1]:
      return Verdict(DAMAGED, f"{name} does not match its checksum")
  return Verdict(OK)


def set_aside(step_dir: str | epath.Path) -> epath.Path:
  """Renames ``<step>`` to ``<step>.unreadable`` (or ``.unreadable.1``, ...),
  never over an existing copy; orbax lists neither name as a step."""
  step_dir = epath.Path(step_dir)
  target = step_dir.parent / (step_dir.name + ASIDE_SUFFIX)
  n = 0
  while target.exists():
    n += 1
    target = step_dir.parent / f"{step_dir.name}{ASIDE_SUFFIX}.{n}"
  step_dir.rename(target)
  return target


def set_aside_names(directory: str | epath.Path) -> list[str]:
  """Names of the checkpoints set aside in ``directory`` (newest step first)."""
  directory = epath.Path(directory)
  if not directory.is_dir():
    return []
  names = [p.name for p in directory.iterdir() if ASIDE_SUFFIX in p.name]

  def key(name):
    step, _, rest = name.partition(ASIDE_SUFFIX)
    return (-int(step) if step.isdigit() else 0, rest)

  return sorted(names, key=key)


def committed_steps(directory: str | epath.Path) -> list[int]:
  """Steps of the committed checkpoints in ``directory``, listed without a
  CheckpointManager (so without creating or logging anything)."""
  import orbax.checkpoint as ocp
  directory = epath.Path(directory)
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and p.is_dir() and ocp.step.is_path_finalized(p))
