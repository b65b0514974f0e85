"""Metric reduction and writers (JSON lines + TensorBoard).

The train and eval steps return metrics as ``{name: (sum, count)}``; they are
summed on device across steps and divided only when written.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np

from bertjax import paths


def add(a, b):
  """Adds two ``{name: (sum, count)}`` trees (``a`` may be None)."""
  return b if a is None else jax.tree.map(lambda x, y: x + y, a, b)


def reduce(sums: Mapping[str, tuple[Any, Any]]) -> dict[str, float]:
  """``{name: (sum, count)}`` (host or device) -> ``{name: sum / count}``."""
  host = jax.device_get(sums)
  return {k: float(np.asarray(s) / max(float(np.asarray(c)), 1e-12))
          for k, (s, c) in host.items()}


class MetricWriter:
  """Writes scalars to ``workdir/metrics.jsonl`` and TensorBoard event files.

  Only process 0 writes, so that hosts of a pod do not clobber each other.
  """

  def __init__(self, workdir: str, *, filename: str = "metrics.jsonl"):
    self._active = jax.process_index() == 0
    self._jsonl = None
    self._tb = None
    self._tb_remote = None
    if self._active:
      paths.makedirs(workdir)
      self._jsonl = paths.JsonLines(paths.join(workdir, filename))
      tb_dir = paths.join(workdir, "tensorboard")
      if paths.is_remote(tb_dir):
        # Event files are written locally and uploaded whole after each flush
        # through the path layer (an object cannot be appended to).
        self._tb_remote, tb_dir = tb_dir, paths.local_mirror(tb_dir)
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(tb_dir)
      except ImportError:  # TensorBoard files are optional; JSON lines are not.
        self._tb = None

  def write(self, step: int, scalars: Mapping[str, float], prefix: str = "",
            extra: Mapping[str, Any] | None = None) -> None:
    """Writes one JSON line (scalars plus ``extra`` values) and the scalars to
    TensorBoard."""
    if not self._active:
      return
    record = {"step": int(step)}
    record.update({prefix + k: float(v) for k, v in scalars.items()})
    record.update(extra or {})
    self._jsonl.write(record)
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(prefix + k, float(v), int(step))
      self._tb.flush()
      if self._tb_remote:
        paths.push(self._tb.logdir, self._tb_remote)

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
      if self._tb_remote:
        paths.push(self._tb.logdir, self._tb_remote)
    # Dropped now, not at exit: a gs:// event writer uploads again when freed.
    self._jsonl = self._tb = None
