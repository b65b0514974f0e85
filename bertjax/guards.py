"""Guards of the train loop: preemption and non-finite losses.

Preemption: TPU VMs are preempted with SIGTERM; on pods JAX also offers a
preemption sync point so that every host stops at the same step. Either way
the loop saves a checkpoint at the current step, waits for it to commit and
raises ``Preempted``; ``python -m bertjax.main`` then exits with status
``EXIT_PREEMPTED`` (75, EX_TEMPFAIL: "try again"), and rerunning the same
command resumes from that checkpoint.

Non-finite loss: the train step never applies an update whose loss or
gradient norm is NaN/Inf (it reports the step as skipped instead). With
``config.nonfinite='stop'`` (default) the loop stops at the first such step
with ``NonFiniteLoss`` and saves nothing, so the last good checkpoint stays
the newest; with ``'skip'`` it carries on and stops only after
``config.max_consecutive_skips`` skipped steps in a row.
"""

from __future__ import annotations

import signal
import threading

import jax
from absl import logging

EXIT_PREEMPTED = 75
NONFINITE_MODES = ("stop", "skip")


class Preempted(Exception):
  """The run was preempted; a checkpoint of the current step was committed."""

  def __init__(self, step: int):
    super().__init__(f"Preempted at step {step}; a checkpoint of that step was "
                     "saved, run the same command again to resume.")
    self.step = step


class NonFiniteLoss(ValueError):
  """The loss or gradient norm became NaN/Inf."""


class PreemptionWatcher:
  """Notices SIGTERM (and, on pods, JAX's preemption sync point)."""

  def __init__(self):
    self._event = threading.Event()
    self._previous = None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_signal)

  def _on_signal(self, signum, frame):
    del frame
    logging.warning("Received signal %d: saving a checkpoint and stopping.", signum)
    self._event.set()

  def should_stop(self, step: int) -> bool:
    if self._event.is_set():
      return True
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      try:
        return bool(multihost_utils.reached_preemption_sync_point(step))
      except RuntimeError:  # no preemption service in this cluster set-up
        return False
    return False

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


class NonFiniteGuard:
  """Reads each step's 'skipped' flag (one step late) and applies the policy."""

  def __init__(self, mode: str, max_consecutive: int):
    if mode not in NONFINITE_MODES:
      raise ValueError(f"config.nonfinite={mode!r} is invalid; set "
                       f"--config.nonfinite to one of {', '.join(NONFINITE_MODES)}.")
    self.mode = mode
    self.max_consecutive = max(int(max_consecutive), 1)
    self.consecutive = 0
    self.total = 0

  def check(self, step: int, skipped_flag) -> None:
    """``skipped_flag``: the step's metrics['skipped'] (sum, count) pair."""
    skipped = float(jax.device_get(skipped_flag[0])) > 0
    if not skipped:
      self.consecutive = 0
      return
    self.total += 1
    self.consecutive += 1
    if self.mode == "stop":
      raise NonFiniteLoss(
          f"The loss or gradient norm became NaN/Inf at step {step}; the newest "
          "checkpoint is the last good one. Lower --config.learning_rate, or set "
          "--config.nonfinite=skip to skip such updates.")
    logging.warning("Skipped the update of step %d: non-finite loss or gradient "
                    "(%d in a row, %d in all).", step, self.consecutive, self.total)
    if self.consecutive >= self.max_consecutive:
      raise NonFiniteLoss(
          f"{self.consecutive} updates in a row had a NaN/Inf loss or gradient "
          f"(last at step {step}); lower --config.learning_rate or check the data.")
