"""What the train loop prints and logs at each logging step: the progress
line (loss, accuracies, tokens/s, MFU, time left) and the metrics row."""

from __future__ import annotations

import time

from absl import logging

from bertjax import corpus_metrics
from bertjax import flops
from bertjax import metrics as metrics_lib
from bertjax.data import workers


class Progress:
  """Formats progress lines: step, loss, accuracies, tokens/s, time left."""

  def __init__(self, config, start_step: int):
    self._tokens_per_step = config.batch_size * config.seq_len
    self._flops_per_step = flops.step_flops(config)
    self._peak = flops.peak_flops_per_second()
    self._total = config.num_train_steps
    # (time, step) of the last line and of the first: tokens/s and MFU are
    # the rate since the last line, so the compile, data preparation and
    # restore before the first step weigh on the first line only; time_left
    # uses the rate since the first line (steadier), or the first window's.
    self._last = self._first = (time.time(), start_step)
    self._lines = 0

  def flops_total(self, step: int) -> float:
    """Useful FLOPs of steps 1..``step``: ``step * step_flops(config)``.

    A product, not a running sum, so it is exact across resume; the step's
    FLOPs count the whole global batch, so gradient accumulation
    (``microbatches``) changes nothing.
    """
    return step * self._flops_per_step

  def line(self, step: int, scalars: dict[str, float], now: float | None = None) -> str:
    now = time.time() if now is None else now
    steps_per_sec = _rate(self._last, now, step)
    scalars["tokens_per_sec"] = steps_per_sec * self._tokens_per_step
    # Useful-FLOP utilisation against the chip's peak (bertjax/flops.py).
    scalars["mfu"] = steps_per_sec * self._flops_per_step / self._peak
    self._lines += 1
    if self._lines == 2:  # the first window, with the compile, is behind
      self._first = self._last
    steady = _rate(self._first, now, step) if self._lines > 1 else steps_per_sec
    self._last = (now, step)
    left = (self._total - step) / steady if steady > 0 else float("nan")
    # The loss and every task's accuracy (mlm, nsp, sop, sbo, ...), MLM first.
    names = ["loss"] + sorted((k for k in scalars if k.endswith("_accuracy")
                               and "/" not in k),  # not a mixture's per corpus
                              key=lambda k: (not k.startswith("mlm_"), k))
    shown = " ".join(f"{k}={scalars[k]:.4g}" for k in names if k in scalars)
    return (f"step {step}/{self._total} {shown} "
            f"tokens/s={scalars['tokens_per_sec']:.0f} mfu={scalars['mfu']:.2f} "
            f"time_left={_time_left(left)}")


def _rate(since: tuple[float, int], now: float, step: int) -> float:
  """Steps a second from ``since`` (time, step) to ``now`` at ``step``."""
  return (step - since[1]) / max(now - since[0], 1e-9)


def _time_left(seconds: float) -> str:
  """HH:MM:SS, hours past a day counted on (strftime's %H wrapped at 24)."""
  return "?" if seconds != seconds else workers.format_eta(seconds)


def write_train_metrics(writer, progress: Progress, schedule, step: int, sums,
                        batch_hash: int, labels) -> None:
  """Writes step's metrics row (a mixture's per-corpus figures under each of
  ``labels``, ``bertjax/corpus_metrics.py``) and prints its progress line."""
  scalars = metrics_lib.reduce(corpus_metrics.expand(sums, labels))
  scalars["learning_rate"] = float(schedule(step - 1))
  line = progress.line(step, scalars)
  scalars["flops_total"] = progress.flops_total(step)
  writer.write(step, scalars, extra={"batch_hash": batch_hash})
  logging.info("%s", line)
  print(line, flush=True)
