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
    if self._active:
      os.makedirs(workdir, exist_ok=True)
      self._jsonl = open(os.path.join(workdir, filename), "a", encoding="utf-8")
      try:
        from tensorboardX import SummaryWriter
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
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
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(prefix + k, float(v), int(step))
      self._tb.flush()

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
