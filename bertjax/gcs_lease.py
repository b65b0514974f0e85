"""A lock on a gs:// workdir or data_dir: a lease object on GCS.

GCS has no ``flock``, and two runs on one gs:// workdir would write over each
other's checkpoints and metrics (a job still running on a VM thought gone is
the usual way). The lock is an object in the directory, created only if it is
absent (``ifGenerationMatch=0``), whose text says who holds it and when it was
last renewed. While the lock is held, a thread rewrites it every quarter of
the lease, each time only if the object is still the generation this process
wrote. Another run that finds it is refused with one sentence naming the
holder, unless the lease is stale: not renewed for its whole length (a
machine that died, a ``kill -9`` on another host), or held by a process of
this machine that no longer runs (the next run after a ``kill -9`` here need
not wait). A lease of another machine is watched before the refusal: a live
holder renews it within a quarter of the lease, and one that does not is
waited out until it lapses, so a job restarted on a new machine right after
its predecessor died takes the workdir over instead of failing. A stale lease is taken over only if nobody else took it first
(``ifGenerationMatch`` = the generation read). ``release`` deletes the
object, if it is still this process's.

Staleness is judged by the holder's own clock against this host's: hosts
whose clocks differ by more than a fraction of the lease (120 s, or
``BERTJAX_GCS_LEASE_SECONDS``) would misjudge it; cloud VMs keep theirs in
step (NTP).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Callable

from absl import logging

from bertjax import paths

LEASE_S = 120.0


def lease_seconds() -> float:
  """The lease this process takes (``BERTJAX_GCS_LEASE_SECONDS``, default 120)."""
  text = os.environ.get("BERTJAX_GCS_LEASE_SECONDS", "")
  try:
    value = float(text) if text else LEASE_S
  except ValueError:
    value = -1.0
  if not value > 0:
    raise ValueError(f"BERTJAX_GCS_LEASE_SECONDS={text!r} is not a number of "
                     "seconds above 0; unset it (120) or give one, e.g. 300.")
  return value


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return ""


def _machine() -> str:
  """This kernel's boot, pid namespace and host name: where a pid means a process."""
  try:
    namespace = os.readlink("/proc/self/ns/pid")
  except OSError:
    namespace = ""
  return "|".join([socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"),
                   namespace])


def _started(pid: int) -> str | None:
  """When process ``pid`` started (clock ticks since boot), or None if none runs."""
  stat = _read(f"/proc/{pid}/stat")
  if stat:
    return stat.rpartition(")")[2].split()[19]
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return None
  except PermissionError:
    pass
  return ""  # alive, start unknown (no /proc)


def _here(holder: dict) -> bool:
  """Whether ``holder`` is a process of this machine (its pid means one here)."""
  return holder.get("machine") == _machine() and isinstance(holder.get("pid"), int)


_RELEASED = object()  # ``GcsLease._outwait``: the lock was deleted meanwhile


def _client():
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  return storage.Client()


def _errors():
  from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
  return exceptions.PreconditionFailed, exceptions.NotFound


class GcsLease:
  """The lease on ``url`` (a gs:// object); ``busy(holder)`` is the sentence
  that refuses a run while another holds it."""

  def __init__(self, url: str, busy: Callable[[str], str]):
    self.url = paths.absolute(url)
    bucket, _, self.key = self.url[len("gs://"):].partition("/")
    self.busy = busy
    self.lease = lease_seconds()
    self._blob = _client().bucket(bucket).blob(self.key)
    self._generation = None
    self._lost = None  # the sentence ``check`` raises once another run took it
    self._stop = threading.Event()
    self._thread = None
    self._started = time.strftime("%Y-%m-%d %H:%M:%S")

  def _text(self) -> bytes:
    pid = os.getpid()
    return json.dumps({
        "holder": f"pid {pid} on host {socket.gethostname()}, started {self._started}",
        "pid": pid, "machine": _machine(), "process_started": _started(pid),
        "renewed": time.time(), "lease_seconds": self.lease}).encode()

  def _write(self, generation: int) -> None:
    self._blob.upload_from_string(self._text(), content_type="application/json",
                                  if_generation_match=generation)
    self._generation = self._blob.generation

  def _holder(self) -> tuple[dict, int] | None:
    """The lock's text and generation, or None if there is none."""
    _, not_found = _errors()
    try:
      self._blob.reload()
      data = self._blob.download_as_bytes(if_generation_match=self._blob.generation)
    except not_found:
      return None
    except _errors()[0]:  # rewritten between the two reads: read it again
      return self._holder()
    try:
      holder = json.loads(data)
      holder["renewed"] = float(holder["renewed"])
      holder["lease_seconds"] = float(holder.get("lease_seconds", LEASE_S))
    except (ValueError, KeyError, TypeError, AttributeError):
      holder = {"holder": "unreadable lock", "renewed": 0.0}
    return holder, self._blob.generation

  @staticmethod
  def _gone(holder: dict) -> str | None:
    """Why ``holder``'s lease no longer holds, or None while it may."""
    age = time.time() - holder["renewed"]
    lease = float(holder.get("lease_seconds", LEASE_S))
    if _here(holder):
      started = _started(holder["pid"])
      if started is None or (started and started != holder.get("process_started")):
        return "its process no longer runs on this machine"
    if age > lease:
      return f"not renewed for {age:.0f} s, past its {lease:.0f} s lease"
    return None

  def _outwait(self, holder: dict, generation: int):
    """Watches a lease of another machine until it is renewed (a live run:
    its new text and generation are returned) or lapses (a run that died
    there, as a restarted job finds its predecessor's: None), or is deleted
    (``_RELEASED``). A live holder renews every quarter of its lease, so a
    live run is told apart within that; a dead one is waited out."""
    lease = float(holder.get("lease_seconds", LEASE_S))
    logging.info("The lock %s is held by %s, renewed %.0f s ago: waiting for it "
                 "to be renewed (a run that is alive) or to lapse %.0f s after "
                 "its last renewal (one that died).", self.url,
                 holder.get("holder", "an unknown process"),
                 time.time() - holder["renewed"], lease)
    while time.time() - holder["renewed"] <= lease:
      time.sleep(min(1.0, lease / 8))
      found = self._holder()
      if found is None:
        return _RELEASED
      if found[1] != generation:
        return found
    return None

  def acquire(self) -> "GcsLease":
    """Takes the lease, or raises ``workdir_lock.WorkdirBusy`` naming the holder."""
    from bertjax import workdir_lock
    precondition, _ = _errors()
    for _ in range(5):
      try:
        self._write(0)
        break
      except precondition:
        pass
      found = self._holder()
      if found is None:
        continue  # released meanwhile: create it again
      holder, generation = found
      why = self._gone(holder)
      if why is None and not _here(holder):
        seen = self._outwait(holder, generation)
        if seen is _RELEASED:
          continue
        if seen is None:
          why = self._gone(holder)
        else:
          holder, generation = seen
      if why is None:
        age = max(0.0, time.time() - holder["renewed"])
        lease = float(holder.get("lease_seconds", LEASE_S))
        raise workdir_lock.WorkdirBusy(self.busy(
            f"{holder.get('holder', 'unknown process')}; its lock {self.url} was "
            f"renewed {age:.0f} s ago and lapses {lease:.0f} s after its last "
            "renewal if that run is gone"))
      try:
        self._write(generation)
      except precondition:
        continue  # another run took it first: look again
      logging.warning("Took over the lock %s of %s: %s.", self.url,
                      holder.get("holder", "an unknown process"), why)
      break
    else:
      raise workdir_lock.WorkdirBusy(self.busy(f"another run taking {self.url} "
                                               "at the same moment"))
    self._thread = threading.Thread(target=self._renew, daemon=True,
                                    name="bertjax-gcs-lease")
    self._thread.start()
    return self

  def _renew(self) -> None:
    precondition, not_found = _errors()
    while not self._stop.wait(self.lease / 4):
      try:
        self._write(self._generation)
      except (precondition, not_found):
        try:
          found = self._holder()
        except Exception:  # noqa: BLE001 — who took it is only for the message
          found = None
        taker = found[0].get("holder", "unknown process") if found else "unknown now"
        self._lost = (
            f"The lock {self.url} was taken over by another run ({taker}) after "
            f"this one had not renewed it for {self.lease:.0f} s, so two runs "
            f"were writing {self.url.rpartition('/')[0]}: this one stops here "
            "without writing more; check the other run, then run again the one "
            "you want.")
        logging.error("%s", self._lost)
        return
      except Exception as e:  # noqa: BLE001 — a network error: try again later
        logging.warning("Could not renew the lock %s (%s); trying again.", self.url, e)

  def check(self) -> None:
    """Raises ``workdir_lock.WorkdirLost`` once another run has taken the lease
    over (this one's renewals failed for a whole lease: a VM suspended, a
    network cut); the run calls it before each thing it writes."""
    if self._lost is not None:
      from bertjax import workdir_lock
      raise workdir_lock.WorkdirLost(self._lost)

  def release(self) -> None:
    """Stops renewing and deletes the lock if it is still this process's."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self._generation is not None and self._lost is None:
      try:
        self._blob.delete(if_generation_match=self._generation)
      except Exception as e:  # noqa: BLE001 — taken over, or gone: not ours to delete
        logging.warning("Left the lock %s in place (%s).", self.url, e)
      self._generation = None

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()
