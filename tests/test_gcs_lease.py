"""The lock on a gs:// workdir and data_dir (bertjax/gcs_lease.py), against a
local GCS endpoint that keeps GCS's generation preconditions
(tests/gcs_emulator.py)."""

import contextlib
import json
import os
import socket
import threading
import time

import pytest

from gcs_emulator import Emulator
from bertjax import gcs_lease
from bertjax import workdir_lock


@pytest.fixture(scope="module")
def gcs():
  emulator = Emulator()
  saved = dict(os.environ)
  os.environ.update(emulator.environment())
  yield emulator
  os.environ.clear()
  os.environ.update(saved)
  emulator.stop()


@pytest.fixture
def workdir(gcs, request):
  return f"gs://{gcs.bucket}/{request.node.name}"


def _lock_text(gcs, workdir):
  from google.cloud import storage
  key = workdir[len(f"gs://{gcs.bucket}/"):] + "/.bertjax.lock"
  blob = storage.Client().bucket(gcs.bucket).blob(key)
  return blob, key


def _plant(gcs, workdir, **fields):
  """A lock object as another run would have left it."""
  blob, _ = _lock_text(gcs, workdir)
  holder = {"holder": "pid 4242 on host elsewhere, started 2026-12-01 10:00:00",
            "pid": 4242, "machine": "elsewhere|boot|ns", "process_started": "1",
            "renewed": time.time(), "lease_seconds": 120.0}
  holder.update(fields)
  blob.upload_from_string(json.dumps(holder).encode(), if_generation_match=0)


@contextlib.contextmanager
def _live_elsewhere(gcs, key, lease=1.2, **fields):
  """A run of another machine holding ``key``, renewing every quarter lease."""
  from google.cloud import storage
  blob = storage.Client().bucket(gcs.bucket).blob(key)
  holder = {"holder": "pid 7 on host other-vm, started 2026-12-07 01:00:00",
            "pid": 7, "machine": "other-vm||", "lease_seconds": lease, **fields}
  blob.upload_from_string(json.dumps({**holder, "renewed": time.time()}).encode(),
                          if_generation_match=0)
  stop = threading.Event()

  def renew():
    while not stop.wait(lease / 4):
      blob.upload_from_string(json.dumps({**holder, "renewed": time.time()}).encode(),
                              if_generation_match=blob.generation)
  thread = threading.Thread(target=renew)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()
    blob.delete()


def test_a_second_run_on_a_gs_workdir_is_refused_naming_the_first(gcs, workdir):
  first = workdir_lock.hold(workdir)
  _, key = _lock_text(gcs, workdir)
  assert key in gcs.object_names()
  with pytest.raises(workdir_lock.WorkdirBusy,
                     match=rf"^Another bertjax run \(pid {os.getpid()} on host "
                           rf"{socket.gethostname()}, started .*renewed \d+ s ago.*\) "
                           rf"is training in the workdir {workdir}; wait for it"):
    workdir_lock.hold(workdir)
  first.release()
  assert key not in gcs.object_names()  # released: the next run takes it
  workdir_lock.hold(workdir).release()
  assert workdir_lock.hold(workdir, process_index=1) is None  # process 0's alone


def test_a_live_lease_of_another_machine_is_kept_and_a_dead_one_waited_out(
    gcs, workdir):
  _, key = _lock_text(gcs, workdir)
  with _live_elsewhere(gcs, key, lease=1.2):
    start = time.time()
    with pytest.raises(workdir_lock.WorkdirBusy, match="pid 7 on host other-vm.*"
                       r"renewed \d+ s ago and lapses 1 s after"):
      workdir_lock.hold(workdir)
    assert time.time() - start < 1.2  # told apart by its renewal, not its lapse
  # A run whose machine died just now (as a restarted job finds it): its
  # lease is waited out, then taken.
  _plant(gcs, workdir, lease_seconds=1.2)
  start = time.time()
  lock = workdir_lock.hold(workdir)
  assert 1.0 < time.time() - start < 6
  blob, _ = _lock_text(gcs, workdir)
  blob.reload()
  assert json.loads(blob.download_as_bytes())["pid"] == os.getpid()
  lock.release()
  _plant(gcs, workdir, renewed=time.time() - 121)  # lapsed long ago: at once
  start = time.time()
  workdir_lock.hold(workdir).release()
  assert time.time() - start < 1


def test_a_lease_of_a_process_of_this_machine_that_ended_is_taken_at_once(
    gcs, workdir):
  # A run killed with SIGKILL here left its lock; the next run need not wait.
  gone = 2 ** 22 + 17  # above any pid this test machine hands out
  assert gcs_lease._started(gone) is None
  _plant(gcs, workdir, pid=gone, machine=gcs_lease._machine())
  workdir_lock.hold(workdir).release()
  # A live process of this machine (this one, as if started by another run)
  # keeps it.
  _plant(gcs, workdir, pid=os.getpid(), machine=gcs_lease._machine(),
         process_started=gcs_lease._started(os.getpid()))
  with pytest.raises(workdir_lock.WorkdirBusy):
    workdir_lock.hold(workdir)
  # The same pid, started at another time: a new process with a reused pid.
  blob, _ = _lock_text(gcs, workdir)
  blob.delete()
  _plant(gcs, workdir, pid=os.getpid(), machine=gcs_lease._machine(),
         process_started="12345")
  workdir_lock.hold(workdir).release()


def test_the_holder_renews_its_lease_so_it_does_not_lapse(gcs, workdir, monkeypatch):
  monkeypatch.setenv("BERTJAX_GCS_LEASE_SECONDS", "0.8")
  lock = workdir_lock.hold(workdir)
  blob, _ = _lock_text(gcs, workdir)
  renewed = []
  for _ in range(4):
    time.sleep(0.5)
    blob.reload()
    renewed.append(json.loads(blob.download_as_bytes())["renewed"])
  # Twice the lease has passed: still held, rewritten all along.
  assert renewed == sorted(renewed) and len(set(renewed)) >= 3
  assert time.time() - renewed[-1] < 0.8
  monkeypatch.setenv("BERTJAX_GCS_LEASE_SECONDS", "120")
  with pytest.raises(workdir_lock.WorkdirBusy):
    workdir_lock.hold(workdir)
  lock.release()


def test_of_two_runs_taking_a_lapsed_lease_at_once_one_gets_it(gcs, workdir):
  _plant(gcs, workdir, renewed=time.time() - 500)
  outcomes, barrier = [], threading.Barrier(4)

  def take():
    barrier.wait()
    try:
      outcomes.append(workdir_lock.hold(workdir))
    except workdir_lock.WorkdirBusy as e:
      outcomes.append(e)
  threads = [threading.Thread(target=take) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  held = [o for o in outcomes if not isinstance(o, Exception)]
  assert len(held) == 1 and len(outcomes) == 4, outcomes
  held[0].release()


def test_a_prepare_into_a_bucket_another_machine_prepares_into_is_refused(
    gcs, demo_config):
  from bertjax.data import prepare
  data_dir = f"gs://{gcs.bucket}/shared-data"
  with _live_elsewhere(gcs, "shared-data/.bertjax-prepare.lock"):
    with pytest.raises(workdir_lock.WorkdirBusy,
                       match=r"^Another bertjax prepare \(pid 7 on host other-vm.*\) "
                             rf"is writing the data_dir {data_dir}; wait for it"):
      prepare.prepare(demo_config, data_dir)
    assert [n for n in gcs.object_names() if n.startswith("shared-data/")] == [
        "shared-data/.bertjax-prepare.lock"]  # nothing written


def test_a_bad_lease_setting_is_one_sentence(monkeypatch):
  monkeypatch.setenv("BERTJAX_GCS_LEASE_SECONDS", "soon")
  with pytest.raises(ValueError, match=r"^BERTJAX_GCS_LEASE_SECONDS='soon' is "
                                       r"not a number of seconds above 0; unset"):
    gcs_lease.lease_seconds()


def test_locks_do_not_travel_between_a_mirror_and_its_bucket(gcs, tmp_path):
  # The mirror's lock is this machine's flock, the bucket's a lease: copied
  # across, a pull replaced the flocked file (unlocking the mirror) and a
  # push wrote over the lease.
  from bertjax import mirror
  local = tmp_path / "mirror"
  (local / "d").mkdir(parents=True)
  (local / "d" / "shard.bin").write_bytes(b"records")
  for name in (".bertjax-prepare.lock", ".bertjax.lock"):
    (local / name).write_text("pid 1 on host here\n")
  remote = f"gs://{gcs.bucket}/mirrored"
  mirror.push(str(local), remote)
  assert [n for n in gcs.object_names() if n.startswith("mirrored/")] == [
      "mirrored/d/shard.bin"]
  blob, _ = _lock_text(gcs, remote)  # a run's lease in the bucket
  blob.upload_from_string(b"{}", if_generation_match=0)
  pulled = tmp_path / "pulled"
  mirror.pull(remote, str(pulled))
  assert sorted(p.name for p in pulled.rglob("*")) == ["d", "shard.bin"]


def test_a_lock_left_in_the_bucket_by_an_older_bertjax_is_taken(gcs, workdir):
  # Its text was one line, not a lease: nothing renews it.
  blob, _ = _lock_text(gcs, workdir)
  blob.upload_from_string(b"pid 12 on host old-vm, started 2026-11-30 08:00:00\n")
  workdir_lock.hold(workdir).release()


def test_a_holder_whose_lease_was_taken_over_learns_it_and_keeps_off(
    gcs, workdir, monkeypatch):
  monkeypatch.setenv("BERTJAX_GCS_LEASE_SECONDS", "0.4")
  lock = workdir_lock.hold(workdir)
  lock.check()  # held
  blob, key = _lock_text(gcs, workdir)
  # Another run took it over (as after this one's renewals failed a lease long).
  blob.reload()
  taker = {"holder": "pid 99 on host new-vm, started now", "pid": 99,
           "machine": "new-vm||", "renewed": time.time(), "lease_seconds": 120.0}
  blob.upload_from_string(json.dumps(taker).encode(), if_generation_match=blob.generation)
  deadline = time.time() + 10
  while True:
    try:
      lock.check()
    except workdir_lock.WorkdirLost as e:
      assert str(e).startswith(f"The lock gs://{gcs.bucket}/{key} was taken over "
                               "by another run (pid 99 on host new-vm")
      break
    assert time.time() < deadline, "the holder never noticed"
    time.sleep(0.1)
  lock.release()  # leaves the taker's lock alone
  blob.reload()
  assert json.loads(blob.download_as_bytes())["pid"] == 99
