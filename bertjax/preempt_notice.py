"""With several processes, a preemption notice stops work that has no step.

With ``jax.distributed`` running, JAX's preemption notifier takes SIGTERM
(``guards.PreemptionWatcher``): the train loop learns of it from JAX's sync
point, which it asks after every step, and all processes stop after the same
one. Work before the first step asks no such question, and some of it runs
for hours: process 0 preparing a corpus while the others wait for it. JAX's
notifier also publishes the notice on the coordination service, where every
process can read it: ``raising`` polls it from a thread and raises
``guards.Terminated`` in the main thread, wherever it is, as
``guards.sigterm_raises`` does with one process for the process's own
SIGTERM. The notice counts whichever process got the signal; the processes
then agree on stopping in ``multihost.process_0_first``.

The main thread is reached with SIGUSR1, sent to it alone and only while the
block is armed (a real signal, so that a wait on a lock or a pipe, as a pool
of prepare's workers has, is interrupted too); the handler from before is
back afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading

from absl import logging

# Where JAX's notifier writes the notice (xla/tsl's preemption sync manager):
# a time stamp under this key once any process has got SIGTERM.
_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"
_POLL_S = 0.5
_RESEND_S = 1.0


def _gc_callback_codes() -> set:
  """The code of the garbage collector's callbacks (JAX has one), where an
  exception is printed and lost."""
  return {getattr(callback, "__code__", None) for callback in gc.callbacks}


def _handling_terminated() -> bool:
  """Whether the main thread (the caller) is handling a ``guards.Terminated``,
  or an error it was turned into: cleaning up on its way out of the block."""
  from bertjax import guards
  error = sys.exc_info()[1]
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, guards.Terminated):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


def noticed() -> bool:
  """Whether any process of the run has got a preemption notice (SIGTERM)."""
  from bertjax import multihost  # pylint: disable=g-import-not-at-top
  client = multihost.coordination_client()
  return client is not None and multihost.try_get(client, _NOTICE_KEY) is not None


class _Arm:
  """One ``raising`` block: the watcher thread and the handler it triggers."""

  def __init__(self):
    # Re-entrant: the handler may run in the main thread while that thread
    # holds the lock in ``disarm``.
    self.lock = threading.RLock()
    self.armed = True
    self.done = threading.Event()
    self.main = threading.main_thread().ident

  def handler(self, signum, frame):
    del signum
    if frame is not None and frame.f_code in _gc_callback_codes():
      return  # Python would print the Terminated and drop it: the next one
    with self.lock:
      fire = self.armed and not _handling_terminated()
    if fire:
      from bertjax import guards
      raise guards.Terminated

  def watch(self):
    from bertjax import guards
    while True:
      try:
        seen = noticed()
      except Exception as e:  # noqa: BLE001 — the service gone: nothing to watch
        logging.warning("Stopped watching for preemption notices: %s", e)
        return
      if seen:
        guards.remember_sigterm()
        logging.warning("A process of the run got a preemption notice: "
                        "stopping this one's work before the first step.")
        break
      if self.done.wait(_POLL_S):
        return
    # Again every second until the block ends: a Terminated raised where
    # Python ignores exceptions (a garbage-collection callback, a __del__)
    # is lost, and the handler does not raise while one is on its way out.
    while True:
      with self.lock:
        if not self.armed:
          return
        signal.pthread_kill(self.main, signal.SIGUSR1)
      if self.done.wait(_RESEND_S):
        return

  def disarm(self):
    with self.lock:
      self.armed = False


_current: _Arm | None = None


@contextlib.contextmanager
def raising():
  """Within it, a preemption notice of any process raises ``guards.Terminated``
  in the main thread (within about half a second). Main thread only."""
  global _current
  if threading.current_thread() is not threading.main_thread() or _current:
    yield
    return
  arm = _Arm()
  previous = signal.signal(signal.SIGUSR1, arm.handler)
  watcher = threading.Thread(target=arm.watch, name="bertjax-preemption-notice",
                             daemon=True)
  _current = arm
  watcher.start()
  try:
    yield
  finally:
    arm.disarm()
    arm.done.set()
    watcher.join()
    _current = None
    # A system call, so that a SIGUSR1 the watcher sent just before it was
    # disarmed is delivered now, to the handler that ignores it.
    signal.pthread_sigmask(signal.SIG_BLOCK, [])
    signal.signal(signal.SIGUSR1, signal.SIG_DFL if previous is None else previous)


def hold() -> None:
  """From here to the end of the ``raising`` block a notice no longer raises:
  it is left to the train loop's sync point (``guards.finish_on_sigterm``)."""
  if _current is not None:
    _current.disarm()
