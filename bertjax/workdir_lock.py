"""One training run per workdir, and a workdir that can be written.

``bertjax.main`` holds an exclusive ``fcntl.flock`` on ``<workdir>/.bertjax.lock``
for the life of the run; the file's text names the holder (pid, host, start
time) so that a second run is refused with one sentence naming it. The
operating system drops the lock when the process dies, however it dies, so a
``kill -9`` never blocks the next run. The file itself stays (removing a lock
file races with the next taker); its text changes with each run.

A ``gs://`` workdir gets a lease object instead (bertjax/gcs_lease.py), which
a run that died elsewhere holds until its lease lapses. Limits: other URL
schemes are not locked, and on a multi-host pod only process 0 takes the lock. Worker processes
forked while the lock is held (data preparation) inherit it and hold it until
they exit. ``bertjax.evaluate`` and ``bertjax.load`` only read and take no lock.

``DataDirLock`` is the same lock on ``<data_dir>/.bertjax-prepare.lock``, held
by data preparation (``bertjax.prepare`` and a training run's prepare step)
only while it writes the data_dir (bertjax/data/prepare.py): a second prepare
of the same data_dir is refused, naming the first, while runs that only read
data prepared there take no lock and are never blocked.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from typing import Callable

LOCK_FILE = ".bertjax.lock"
DATA_LOCK_FILE = ".bertjax-prepare.lock"


class WorkdirBusy(ValueError):
  """Another live run holds the workdir."""


class WorkdirLost(ValueError):
  """Another run took over this run's lease on a gs:// workdir."""


def _unwritable(workdir: str, error: OSError, flag: str = "--workdir",
                what: str = "the workdir") -> ValueError:
  if isinstance(error, (NotADirectoryError, FileExistsError)) or (
      os.path.exists(workdir) and not os.path.isdir(workdir)):
    return ValueError(
        f"{flag}={workdir} is a file, or lies under one, not a directory; "
        "pass the path of a directory (it is created if missing).")
  reason = os.strerror(error.errno) if error.errno else type(error).__name__
  return ValueError(
      f"Cannot write to {what} {workdir} ({reason.lower()}); make it "
      f"writable or pass another {flag}.")


# What a run rewrites, appends to or prunes in its workdir: where one exists
# read-only, the run would fail at its first log row or checkpoint.
WRITTEN = ("checkpoints", "best_checkpoint", "tensorboard", "metrics.jsonl", LOCK_FILE)


def _read_only_entry(workdir: str) -> str | None:
  """The first of ``WRITTEN`` (a directory under them included) in
  ``workdir`` that exists and cannot be written, or None."""
  effective = os.access in os.supports_effective_ids
  for name in WRITTEN:
    top = os.path.join(workdir, name)
    if not os.path.exists(top):
      continue
    below = [os.path.join(root, d) for root, dirs, _ in os.walk(top) for d in dirs]
    for entry in [top] + sorted(below):
      mode = os.W_OK | (os.X_OK if os.path.isdir(entry) else 0)
      if not os.access(entry, mode, effective_ids=effective):
        return entry
  return None


def check_writable(workdir: str) -> None:
  """Refuses, in one sentence and before any work, a local workdir whose run
  could not write what it writes: the workdir itself (or the parent it is
  created in) and the entries of ``WRITTEN`` it holds. Writes nothing."""
  if "://" in workdir:
    return
  from bertjax import paths
  paths.require_writable(workdir, "--workdir", "the workdir")
  entry = _read_only_entry(workdir)
  if entry is not None:
    raise ValueError(
        f"Cannot write to the workdir {workdir}: {entry} is read-only (permission "
        f"denied); make it writable (chmod -R u+w {entry}) or pass another --workdir.")


class WorkdirLock:
  """The run's hold on its workdir; ``release`` (or process death) ends it."""

  lock_file = LOCK_FILE
  flag, what = "--workdir", "the workdir"

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.path = os.path.join(workdir, self.lock_file)
    self._fd = None

  def _check(self) -> None:
    check_writable(self.workdir)

  def _busy(self, holder: str) -> str:
    return (f"Another bertjax run ({holder}) is training in the workdir "
            f"{self.workdir}; wait for it to end or stop it, or pass another "
            "--workdir.")

  def acquire(self) -> "WorkdirLock":
    """Creates the workdir if needed and takes the lock.

    Raises:
      ValueError: the workdir is a file or cannot be written.
      WorkdirBusy: another live process holds it.
    """
    try:
      os.makedirs(self.workdir, exist_ok=True)
    except OSError as e:
      raise _unwritable(self.workdir, e, self.flag, self.what) from None
    self._check()  # before the lock file is made
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise _unwritable(self.workdir, e, self.flag, self.what) from None
    effective = os.access in os.supports_effective_ids
    # An existing lock file opens all the same: the directory must be writable.
    if not os.access(self.workdir, os.W_OK, effective_ids=effective):
      os.close(fd)
      raise _unwritable(self.workdir, PermissionError(errno.EACCES, ""),
                       self.flag, self.what) from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.pread(fd, 400, 0).decode("utf-8", "replace").strip()
      os.close(fd)
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise _unwritable(self.workdir, e, self.flag, self.what) from None
      raise WorkdirBusy(self._busy(holder or "unknown process")) from None
    text = (f"pid {os.getpid()} on host {socket.gethostname()}, started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode()
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, text, 0)
    except OSError as e:
      os.close(fd)
      raise _unwritable(self.workdir, e, self.flag, self.what) from None
    self._fd = fd
    return self

  def check(self) -> None:
    """Nothing to check: the operating system never takes a flock away."""

  def release(self) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


class DataDirLock(WorkdirLock):
  """Data preparation's hold on a local data_dir while it writes there."""

  lock_file = DATA_LOCK_FILE
  flag, what = "--config.data_dir", "the data_dir"

  def _check(self) -> None:
    from bertjax import paths
    paths.require_writable(self.workdir, self.flag, self.what)

  def _busy(self, holder: str) -> str:
    return (f"Another bertjax prepare ({holder}) is writing the data_dir "
            f"{self.workdir}; wait for it to end and run this command again "
            "(it then reuses what that one prepared), or point "
            "--config.data_dir at another directory.")


def _run_busy(workdir: str) -> Callable[[str], str]:
  return lambda holder: WorkdirLock(workdir)._busy(holder)  # pylint: disable=protected-access


def hold(workdir: str, process_index: int = 0):
  """Takes the workdir's lock on process 0: ``WorkdirLock`` on a local path,
  a lease on a gs:// one (bertjax/gcs_lease.py); None elsewhere. The result's
  ``release`` ends it."""
  if process_index != 0:
    return None
  if workdir.startswith("gs://"):
    from bertjax import gcs_lease  # pylint: disable=g-import-not-at-top
    return gcs_lease.GcsLease(workdir.rstrip("/") + "/" + LOCK_FILE,
                              _run_busy(workdir)).acquire()
  if "://" in workdir:
    return None
  return WorkdirLock(workdir).acquire()
