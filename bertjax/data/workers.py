"""Running prepare's units: in this process, in worker processes, or on Apache Beam.

A *task* is a picklable description of one unit of work (bertjax/data/units.py)
and ``run_unit(task)`` does it, writing its output and receipt itself
(bertjax/data/staged.py), so the engine only has to call it once per task:

* ``workers == 1``: in this process, in order.
* ``workers > 1``: a pool of spawned processes (spawn, not fork: the parent
  may hold JAX, whose threads do not survive a fork). Each worker handles
  whole units; the output does not depend on which worker ran what.
* ``beam_runner``: an Apache Beam pipeline ``Create(tasks) | Map(run_unit)``
  on that runner (DirectRunner locally -- run as Beam's FnApiRunner, since
  the DirectRunner would first download its Prism binary --, DataflowRunner,
  SparkRunner, ...),
  with ``beam_options`` as its pipeline options. Beam workers need bertjax
  installed and a data_dir they can all reach (gs:// on Dataflow).

Progress is reported as units finish: documents, MB of input, MB/s and ETA.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.context
import multiprocessing.pool
import os
import signal
import time
from typing import Any, Callable, Sequence

from absl import logging


def resolve_workers(value: int) -> int:
  """config.prepare_workers: 0 = one per core of this machine."""
  if value < 0:
    raise ValueError(
        f"config.prepare_workers={value} is negative; set it to 0 (all cores) "
        f"or a number of processes.")
  return value or (os.cpu_count() or 1)


def _init_worker() -> None:
  # A worker stops with its pool: Ctrl-C and SIGTERM go to the parent, which
  # terminates the pool (with SIGKILL, _Worker); handlers inherited from the
  # program must not run here. A SIGTERM to the whole process group (a
  # scheduler, kill -- -PGID) used to kill the workers themselves: one idle
  # in the task queue died holding its lock, and every later task waited on
  # that lock for ever (bertjax.main, which stops only at its next safe
  # point, hung in its next prepare stage).
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Progress:
  """Logs a line per finished unit: units, documents, MB, MB/s, ETA."""

  def __init__(self, what: str, total_bytes: int, num_units: int, *,
               counted_in_total: bool = True):
    """``counted_in_total``: the bytes ``update`` counts are those of
    ``total_bytes`` (the text files read); else (text read back from shards,
    whose total is their compressed size) the line shows the bytes read
    and the ETA comes from the units done."""
    self._what = what
    self.total_bytes = total_bytes
    self._counted_in_total = counted_in_total
    self._units = num_units
    self._start = time.time()
    self._done_units = self._docs = self._bytes = 0
    self._last = 0.0

  def update(self, docs: int, num_bytes: int) -> None:
    self._done_units += 1
    self._docs += docs
    self._bytes += num_bytes
    now = time.time()
    if now - self._last < 10 and self._done_units < self._units:
      return
    self._last = now
    elapsed = max(now - self._start, 1e-9)
    rate = self._bytes / elapsed
    if not self._counted_in_total:
      eta = elapsed * (self._units - self._done_units) / self._done_units
      logging.info("%s: %d/%d units, %d documents, %.1f MB read, %.2f MB/s, ETA %s",
                   self._what, self._done_units, self._units, self._docs,
                   self._bytes / 1e6, rate / 1e6, format_eta(eta))
      return
    left = self.total_bytes - self._bytes
    # Zero bytes so far (empty files) give no rate: the ETA is unknown, or
    # nothing when no bytes are left either.
    eta = 0.0 if left <= 0 else (left / rate if rate > 0 else float("inf"))
    logging.info("%s: %d/%d units, %d documents, %.1f/%.1f MB, %.2f MB/s, ETA %s",
                 self._what, self._done_units, self._units, self._docs,
                 self._bytes / 1e6, self.total_bytes / 1e6, rate / 1e6,
                 format_eta(eta))


def format_eta(seconds: float) -> str:
  """Seconds as HH:MM:SS (hours past 24 counted on, not wrapped to a day);
  'unknown' for inf or nan (no rate yet)."""
  if not math.isfinite(seconds):
    return "unknown"
  total = max(int(round(seconds)), 0)
  return f"{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"


def run(run_unit: Callable[[Any], dict[str, Any]], tasks: Sequence[Any], *,
        workers: int, beam_runner: str = "", beam_options: Sequence[str] = (),
        progress: Progress | None = None) -> None:
  """Runs ``run_unit`` on every task (each writes its own output and receipt).

  Args:
    run_unit: a module-level function (picklable); returns the unit's
      receipt, whose ``stats`` may hold ``documents`` and ``input_bytes``.
    tasks: picklable unit descriptions.
    workers: processes on this machine when no Beam runner is given.
    beam_runner: an Apache Beam runner name; '' runs on this machine.
    beam_options: extra Beam pipeline options, e.g. ['--project=p'].
    progress: reporter of finished units.
  """
  if not tasks:
    return

  def report(receipt):
    if progress is not None:
      stats = receipt.get("stats", {})
      progress.update(stats.get("documents", 0), stats.get("input_bytes", 0))

  if beam_runner:
    _run_beam(run_unit, tasks, beam_runner, beam_options)
    return
  if workers <= 1 or len(tasks) == 1:
    for task in tasks:
      report(run_unit(task))
    return
  for receipt in _pool(workers).imap_unordered(run_unit, tasks, chunksize=1):
    report(receipt)


# The worker pool of this process: started by the first stage that needs one
# and kept for the next (each spawned worker pays a few seconds of imports).
_POOLS: dict[int, Any] = {}


# How long the pool's terminate waits for the task queue's read lock.
_QUEUE_LOCK_WAIT_S = 5.0


class _Worker(multiprocessing.context.SpawnProcess):
  """A pool worker, stopped with SIGKILL: it ignores SIGTERM (_init_worker)."""

  def terminate(self) -> None:
    self.kill()


class _Pool(multiprocessing.pool.Pool):
  """A Pool of _Worker processes whose terminate cannot hang on a dead worker.

  An idle worker waits for its next task holding the task queue's read lock;
  killed there (the OOM killer, kill -9 of one worker), it leaves the lock
  taken for ever, and ``Pool.terminate`` waited on that lock before stopping
  anything. The queue is drained as Pool does, with the lock when it comes
  within a few seconds, without it otherwise (the workers are being killed).
  """

  @staticmethod
  def Process(ctx, *args, **kwds):  # pylint: disable=invalid-name
    del ctx  # always spawn (_pool)
    return _Worker(*args, **kwds)

  @staticmethod
  def _help_stuff_finish(inqueue, task_handler, size):
    del size
    inqueue._rlock.acquire(timeout=_QUEUE_LOCK_WAIT_S)  # pylint: disable=protected-access
    while task_handler.is_alive() and inqueue._reader.poll():  # pylint: disable=protected-access
      inqueue._reader.recv()  # pylint: disable=protected-access
      time.sleep(0)


def _pool(workers: int):
  if workers not in _POOLS:
    shutdown()
    context = multiprocessing.get_context("spawn")
    _POOLS[workers] = _Pool(workers, initializer=_init_worker, context=context)
  return _POOLS[workers]


def shutdown() -> None:
  """Stops the worker pool, if any (prepare calls it when it returns or fails)."""
  while _POOLS:
    _, pool = _POOLS.popitem()
    pool.terminate()
    pool.join()


def _run_beam(run_unit, tasks, runner: str, options: Sequence[str]) -> None:
  try:
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
    from apache_beam.options import pipeline_options  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(
        "--beam_runner needs Apache Beam; install it "
        "(pip install 'apache-beam>=2.60'; in a checkout, the beam extra).") from None
  if runner == "DirectRunner":
    # Beam's DirectRunner first tries Prism, a binary it downloads; bertjax
    # never reaches the network, so it runs Beam's local FnApiRunner, which the
    # same --direct_num_workers / --direct_running_mode options drive.
    runner = "FnApiRunner"
  opts = pipeline_options.PipelineOptions(list(options), runner=runner)
  logging.info("Running %d units on Beam's %s.", len(tasks), runner)
  with beam.Pipeline(options=opts) as pipeline:
    _ = (pipeline
         | "units" >> beam.Create(list(tasks), reshuffle=True)
         | "run" >> beam.Map(run_unit))
