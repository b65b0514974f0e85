"""prepare's worker pool (bertjax/data/workers.py) under signals."""

import os
import signal
import threading
import time

from bertjax.data import workers


def _square(x):
  return {"stats": {}, "value": x * x}


def test_the_pool_stops_after_its_idle_workers_got_sigterm():
  # SIGTERM to the whole process group (a scheduler, kill -- -PGID) while the
  # pool idles between stages, e.g. during the tokenizer's training: an idle
  # worker dies inside the task queue's lock, and the pool's terminate waited
  # on that lock for ever, so prepare hung instead of exiting with status 75.
  workers.run(_square, [1, 2, 3, 4], workers=2)
  pool = workers._POOLS[2]
  time.sleep(0.5)  # idle: one worker blocks in the task queue, holding its lock
  for process in pool._pool:
    os.kill(process.pid, signal.SIGTERM)
  time.sleep(0.5)
  done = threading.Event()
  threading.Thread(target=lambda: (workers.shutdown(), done.set()),
                   daemon=True).start()
  assert done.wait(20), "the pool's shutdown hung after SIGTERM reached its workers"
  assert not workers._POOLS
