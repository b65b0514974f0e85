"""prepare's worker pool (bertjax/data/workers.py) under signals."""

import os
import signal
import threading
import time

from bertjax.data import workers


def _square(x):
  return {"stats": {}, "value": x * x}


def _within(seconds, fn):
  done = threading.Event()
  threading.Thread(target=lambda: (fn(), done.set()), daemon=True).start()
  return done.wait(seconds)


def _idle_pool():
  workers.run(_square, [1, 2, 3, 4], workers=2)
  time.sleep(0.5)  # idle: one worker blocks in the task queue, holding its lock
  return workers._POOLS[2]


def test_sigterm_to_the_process_group_leaves_the_pool_working():
  # SIGTERM to the whole group (a scheduler, kill -- -PGID) while the pool
  # idled, e.g. during the tokenizer's training, killed a worker inside the
  # task queue's lock: bertjax.main, which stops at its next safe point, then
  # hung in its next prepare stage, and prepare's own stop hung in terminate.
  try:
    for process in _idle_pool()._pool:
      os.kill(process.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert _within(20, lambda: workers.run(_square, [5, 6, 7], workers=2)), (
        "the pool hung after SIGTERM reached its idle workers")
  finally:
    assert _within(20, workers.shutdown)
  assert not workers._POOLS


def test_the_pool_stops_after_a_worker_was_killed_in_the_task_queue():
  for process in _idle_pool()._pool:
    os.kill(process.pid, signal.SIGKILL)
  time.sleep(0.5)
  assert _within(20, workers.shutdown), "terminate waited for ever on a dead worker's lock"
  assert not workers._POOLS
