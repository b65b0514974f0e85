"""Metric reduction and writers (JSON lines + TensorBoard).

The train and eval steps return metrics as ``{name: (sum, count)}``; they are
summed on device across steps and divided only when written.
"""

from __future__ import annotations

import json
import os

from typing import Any, Mapping

import jax
import numpy as np

from bertjax import mirror
from bertjax import paths


def add(a, b):
  """Adds two ``{name: (sum, count)}`` trees (``a`` may be None)."""
  return b if a is None else jax.tree.map(lambda x, y: x + y, a, b)


def reduce(sums: Mapping[str, tuple[Any, Any]]) -> dict[str, float]:
  """``{name: (sum, count)}`` (host or device) -> ``{name: sum / count}``."""
  host = jax.device_get(sums)
  return {k: float(np.asarray(s) / max(float(np.asarray(c)), 1e-12))
          for k, (s, c) in host.items()}


# On an object store (gs://) metrics.jsonl and the TensorBoard event files
# are uploaded whole (objects cannot be appended to), so rows are uploaded at
# most this often, plus whenever the caller asks (a checkpoint, an evaluation)
# and at close. Local files get every row at once.
REMOTE_FLUSH_SECONDS = 60.0


def has_row(workdir: str, step: int, prefix: str, filename: str = "metrics.jsonl") -> bool:
  """Whether ``workdir/filename`` holds a row of ``step`` with a ``prefix``
  scalar (e.g. the evaluation a finished run already logged)."""
  p = paths.path(paths.join(workdir, filename))
  if not p.exists():
    return False
  for line in p.read_text(encoding="utf-8").splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if (isinstance(row, dict) and row.get("step") == step
        and any(str(k).startswith(prefix) for k in row)):
      return True
  return False


_EVENT_FILE = "events.out.tfevents."


def _start_suffix(tb_dir: str) -> str:
  """``.<n>``, the end of this start's event file name (after tensorboardX's
  whole seconds and hostname): n counts the event files there already.

  Without it two starts within one second (a quick resume) got one name, and
  tensorboardX opens its file with "wb": the second start erased the first's
  records. Names of one second so sort in start order, the order TensorBoard
  reads them in (and applies a resumed start's purge of redone steps)."""
  try:
    names = [n for n in os.listdir(tb_dir) if n.startswith(_EVENT_FILE)]
  except FileNotFoundError:
    names = []
  n = len(names)
  while any(name.endswith(f".{n:06d}") for name in names):  # some were deleted
    n += 1
  return f".{n:06d}"


class MetricWriter:
  """Writes scalars to ``workdir/metrics.jsonl`` and TensorBoard event files.

  Only process 0 writes, so that hosts of a pod do not clobber each other.
  On gs:// the files are uploaded at most every ``remote_flush_seconds``,
  with every ``flush=True`` row, with the first row at or past the step given
  to ``flush_from_step`` and at ``close``.
  """

  def __init__(self, workdir: str, *, filename: str = "metrics.jsonl",
               remote_flush_seconds: float = REMOTE_FLUSH_SECONDS,
               resumed_at: int | None = None):
    """``resumed_at``: the step a resumed run restarts from; what an
    interrupted run logged after it is dropped (JSON rows) or purged
    (TensorBoard), since those steps are about to be redone."""
    self._active = jax.process_index() == 0
    self._jsonl = None
    self._tb = None
    self._tb_remote = None
    self._flush_from = None
    if self._active:
      paths.makedirs(workdir)
      self._jsonl = paths.JsonLines(paths.join(workdir, filename),
                                    min_interval_s=remote_flush_seconds,
                                    drop_after_step=resumed_at)
      tb_dir = paths.join(workdir, "tensorboard")
      if paths.is_remote(tb_dir):
        # Event files are written locally and uploaded whole with the rows
        # (through the path layer: an object cannot be appended to).
        self._tb_remote, tb_dir = tb_dir, mirror.local_mirror(tb_dir)
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(tb_dir, purge_step=(
            None if resumed_at is None else resumed_at + 1),
                                 filename_suffix=_start_suffix(tb_dir))
      except ImportError:  # TensorBoard files are optional; JSON lines are not.
        self._tb = None

  def flush_from_step(self, step: int) -> None:
    """Uploads at the first row whose step is ``step`` or later (for a
    caller that writes a checkpoint's row after the checkpoint; the train
    loop writes it before and calls ``flush``)."""
    self._flush_from = int(step)

  def flush(self) -> None:
    """Uploads the rows not uploaded yet (object stores; a no-op locally)."""
    if self._jsonl is not None and self._jsonl.write_pending():
      self._jsonl.flush()
      if self._tb is not None and self._tb_remote:
        self._tb.flush()
        mirror.push(self._tb.logdir, self._tb_remote)

  def write(self, step: int, scalars: Mapping[str, float], prefix: str = "",
            extra: Mapping[str, Any] | None = None, *, flush: bool = False) -> None:
    """Writes one JSON line (scalars plus ``extra`` values) and the scalars to
    TensorBoard; ``flush`` uploads now on an object store."""
    if not self._active:
      return
    if self._flush_from is not None and step >= self._flush_from:
      flush, self._flush_from = True, None
    record = {"step": int(step)}
    record.update({prefix + k: float(v) for k, v in scalars.items()})
    record.update(extra or {})
    uploaded = self._jsonl.write(record, flush=flush)
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(prefix + k, float(v), int(step))
      self._tb.flush()
      if self._tb_remote and uploaded:  # the events go up with the rows
        mirror.push(self._tb.logdir, self._tb_remote)

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
      if self._tb_remote:
        mirror.push(self._tb.logdir, self._tb_remote)
    # Dropped now, not at exit: a gs:// event writer uploads again when freed.
    self._jsonl = self._tb = None
