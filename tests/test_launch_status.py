"""The worker script and the launcher's status protocol, run by bash: the
training outlives a dropped session, and an outcome counts only when this
run's training wrote it.

Worker 0 of a one-host slice is a directory (its HOME) where a fake gcloud
runs the ssh commands with bash; its python3 is a stand-in whose "training"
records itself and exits with the status in ~/exit (0 without it), waiting
first while ~/hold exists; its pip exits with the status in ~/pip-exit."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from launch import gcloud
from launch import tpu

WORKDIR = "gs://my-bucket/bert large"  # the space checks the quoting end to end
TARGET = gcloud.Target(name="pod-a", zone="z", project="", accelerator_type="v5p-8",
                       runtime_version="v2-alpha-tpuv5")


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                  *args], check=True, capture_output=True)


def _flag(argv, name):
  values = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
  assert len(values) == 1, (name, argv)
  return values[0]


# sshd starts a session's shell with SIGHUP at its default (the hang-up ends
# it), whatever this process inherited: run under nohup, the sessions below
# would otherwise ignore the hang-up they stand in for (bash cannot undo an
# ignored signal it inherits).
_AS_SSHD = [sys.executable, "-c", "import os, signal, sys; "
            "signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"]


def _until(condition, what, seconds=20):
  deadline = time.monotonic() + seconds
  while not condition():
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.02)


def _repository_and_python(tmp_path, python3_body):
  """(origin, home, bin_dir, rev): a repository of one commit to clone, an
  empty HOME and a bin directory holding the stand-in python3 given."""
  origin, home, bin_dir = tmp_path / "origin", tmp_path / "home", tmp_path / "bin"
  home.mkdir()
  bin_dir.mkdir()
  _git(tmp_path, "init", "-q", str(origin))
  (origin / "f.txt").write_text("1")
  _git(origin, "add", "f.txt")
  _git(origin, "commit", "-qm", "one")
  rev = subprocess.run(["git", "-C", str(origin), "rev-parse", "HEAD"],
                       capture_output=True, text=True, check=True).stdout.strip()
  python3 = bin_dir / "python3"
  python3.write_text(python3_body)
  python3.chmod(0o755)
  return origin, home, bin_dir, rev


class Worker:
  """Worker 0: its HOME, a repository to clone and the stand-in python3."""

  def __init__(self, tmp_path):
    self.origin, self.home, bin_dir, self.rev = _repository_and_python(
        tmp_path,
        '#!/bin/bash\n[ "$1 $2" = "-m pip" ] && exit "$(cat ~/pip-exit 2>/dev/null || echo 0)"\n'
        'echo "train $*" >> ~/trainings; echo "stand-in training"\n'
        'while [ -e ~/hold ]; do sleep 0.02; done\n'
        'exit "$(cat ~/exit 2>/dev/null || echo 0)"\n')
    self.env = {"HOME": str(self.home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "TPU_WORKER_ID": "0"}

  def command(self, *extra):
    train = gcloud.train_argv("configs/bert.py:tiny", "gs://b/run", list(extra))
    return gcloud.remote_command(str(self.origin), self.rev, train)

  def run(self, command):
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          env=self.env, timeout=60)

  def start(self, command):
    """The command in its own session, as sshd runs it (``drop`` hangs it up)."""
    return subprocess.Popen(_AS_SSHD + ["bash", "-c", command], env=self.env,
                            start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

  @staticmethod
  def drop(session):
    os.killpg(session.pid, signal.SIGHUP)  # what sshd does when the connection drops
    session.wait(timeout=10)

  def trainings(self):
    path = self.home / "trainings"
    return len(path.read_text().splitlines()) if path.exists() else 0

  def set(self, name, text=None):
    path = self.home / name
    if text is None:
      path.unlink(missing_ok=True)
    else:
      path.write_text(text)

  def wait_ended(self):
    """Until the training has written its status and its process is gone
    (reaped: here a zombie can linger until PID 1 reaps it)."""
    _until(lambda: self.status() is not None, "the training's status")
    pid = (self.home / "bertjax-train.pid").read_text().split()[0]
    _until(lambda: not os.path.exists(f"/proc/{pid}"), "the training's process to go")

  def runs(self):
    path = self.home / "bertjax-train.runs"
    return path.read_text().split() if path.exists() else []

  def status(self):
    path = self.home / "bertjax-train.status"
    return path.read_text().split()[0] if path.exists() else None


@pytest.fixture
def worker(tmp_path):
  w = Worker(tmp_path)
  yield w
  w.set("hold")  # no training left waiting behind a test
  if (w.home / "bertjax-train.pid").exists():
    _until(lambda: w.status() is not None, "the last training's status")


class WorkerRunner:
  """gcloud for a READY one-host slice whose worker 0 is ``worker``. The
  training ssh (``--worker=all``) fails with 255 before it reaches the worker
  while ``unreachable``; with ``drop_first`` the first one is hung up once its
  training has started. ``on_sleep`` runs in the launcher's waits."""

  def __init__(self, worker, unreachable=False, drop_first=False, on_sleep=None,
               max_trainings=100):
    self.worker, self.unreachable, self.drop_first = worker, unreachable, drop_first
    self.on_sleep, self.max_trainings = on_sleep, max_trainings
    self.calls = []

  def run(self, argv, capture=False):
    self.calls.append(list(argv))
    if "describe" in argv:
      return tpu.Result(0, "READY\n")
    if "ssh" not in argv:
      return tpu.Result(0)
    command = _flag(argv, "--command")
    if "--worker=all" in argv:
      assert self.verbs().count("ssh:all") <= self.max_trainings, "never gave up"
      if self.unreachable:
        return tpu.Result(tpu.SSH_FAILED)
      if self.drop_first:
        self.drop_first = False
        before = self.worker.trainings()
        session = self.worker.start(command)
        _until(lambda: self.worker.trainings() > before, "the training to start")
        self.worker.drop(session)
        return tpu.Result(tpu.SSH_FAILED)
    proc = self.worker.run(command)
    return tpu.Result(proc.returncode, proc.stdout if capture else "")

  def sleep(self, seconds):
    if self.on_sleep:
      self.on_sleep()

  def verbs(self):
    return [c[4] if c[4] != "ssh" else "ssh:" + _flag(c, "--worker") for c in self.calls]


def _last_line(capsys):
  return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("earlier", [1, 0, tpu.EXIT_PREEMPTED])
def test_a_status_an_earlier_run_left_is_not_this_runs_outcome(worker, earlier, capsys):
  # An earlier run ended (failed, done or preempted) and left its status on
  # worker 0.
  worker.set("exit", str(earlier))
  assert tpu.launch(TARGET, worker.command(), WorkerRunner(worker), max_restarts=0,
                    delete_at_end=False) == earlier
  assert worker.status() == str(earlier)
  # The same command again (a retry): gcloud's ssh fails before the script
  # reaches the worker, every time. The old status says nothing about this
  # run: its outcome is unknown, so nothing is deleted; it was read as this
  # run's failure, success or preemption, and the slice deleted.
  runner = WorkerRunner(worker, unreachable=True)
  rc = tpu.launch(TARGET, worker.command(), runner, max_restarts=0, delete_at_end=True)
  assert rc == tpu.SSH_FAILED
  assert "delete" not in runner.verbs()
  assert runner.verbs().count("ssh:all") == tpu.MAX_RECONNECTS + 1
  assert "outcome is unknown" in _last_line(capsys)
  assert worker.trainings() == 1


def test_a_training_an_earlier_run_left_running_is_not_this_runs(worker, capsys):
  # An earlier run's training (other flags) still runs on worker 0, detached
  # from its dropped session.
  worker.set("hold", "")
  session = worker.start(worker.command("--config.seed=1"))
  _until(lambda: worker.trainings() == 1, "the earlier training")
  Worker.drop(session)
  # This run's ssh never reaches the worker: the earlier training's pid
  # answered "running" for it, and the launcher reconnected for ever.
  runner = WorkerRunner(worker, unreachable=True, max_trainings=3 * tpu.MAX_RECONNECTS)
  rc = tpu.launch(TARGET, worker.command("--config.seed=2"), runner, max_restarts=0,
                  delete_at_end=True)
  assert rc == tpu.SSH_FAILED and "delete" not in runner.verbs()
  assert runner.verbs().count("ssh:all") == tpu.MAX_RECONNECTS + 1
  assert "outcome is unknown" in _last_line(capsys)


def test_an_ended_trainings_pid_that_lives_on_is_not_followed(worker):
  # An earlier run of the same command failed; its pid now names another
  # process (reused after a reboot, or a zombie not yet reaped). The script
  # took it for the training still running, followed it, and reported the
  # old failure as this run's.
  worker.set("exit", "1")
  assert tpu.launch(TARGET, worker.command(), WorkerRunner(worker), max_restarts=0,
                    delete_at_end=False) == 1
  worker.set("exit")
  other = subprocess.Popen(["sleep", "2"])
  threading.Thread(target=other.wait).start()  # reaped when it ends
  (worker.home / "bertjax-train.pid").write_text(f"{other.pid}\n")
  assert tpu.launch(TARGET, worker.command(), WorkerRunner(worker), max_restarts=0,
                    delete_at_end=True) == 0
  assert worker.trainings() == 2 and worker.status() == "0"


def test_a_pid_that_names_another_process_after_a_reboot_is_not_the_training(worker):
  # The training died with its machine (a reboot: no status written) and
  # its recorded pid now names another process. The probe said "running"
  # and the same command again followed that process instead of training.
  assert tpu.launch(TARGET, worker.command(), WorkerRunner(worker), max_restarts=0,
                    delete_at_end=False) == 0
  worker.wait_ended()
  (worker.home / "bertjax-train.status").unlink()
  other = subprocess.Popen(["sleep", "60"])
  try:
    pid_file = worker.home / "bertjax-train.pid"
    pid_file.write_text(" ".join([str(other.pid), *pid_file.read_text().split()[1:]]) + "\n")
    run = worker.runs()[0]
    assert worker.run(gcloud.probe_command(run)).stdout == "none\n"
    again = worker.run(gcloud.with_run(worker.command(), run))
    assert again.returncode == 0 and "following" not in again.stdout
    assert worker.trainings() == 2 and worker.status() == "0"
    assert other.poll() is None  # neither followed nor signalled
  finally:
    other.kill()
    other.wait()


def test_the_status_names_the_training_and_the_runs_that_followed_it(worker):
  # The first run starts the training; a second run of the same command
  # (the launcher run again) follows it. Both runs own its status; a third
  # run that never reached the worker owns nothing there.
  worker.set("hold", "")
  first = worker.start(gcloud.with_run(worker.command(), "a.0"))
  _until(lambda: worker.trainings() == 1, "the training")
  Worker.drop(first)
  second = worker.start(gcloud.with_run(worker.command(), "b.0"))
  _until(lambda: "b.0" in worker.runs(), "the second run to follow")
  worker.set("exit", "3")
  worker.set("hold")
  assert second.wait(timeout=30) == 3 and worker.trainings() == 1
  assert (worker.home / "bertjax-train.status").read_text() == "3 a.0\n"
  for run, printed in [("a.0", "3"), ("b.0", "3"), ("c.0", "none")]:
    assert worker.run(gcloud.probe_command(run)).stdout == printed + "\n"


def test_a_training_that_ends_while_the_launcher_reconnects_is_not_run_again(worker):
  # The session drops while the training runs; it fails before the launcher
  # reconnects. The reconnect reports that failure; it started the training
  # again (which failed again, or ran a failed configuration twice).
  worker.set("hold", "")
  worker.set("exit", "1")

  def finish():
    worker.set("hold")
    worker.wait_ended()

  runner = WorkerRunner(worker, drop_first=True, on_sleep=finish)
  rc = tpu.launch(TARGET, worker.command(), runner, max_restarts=3, delete_at_end=True)
  assert rc == 1
  assert worker.trainings() == 1
  assert runner.verbs() == ["describe", "ssh:all", "describe", "ssh:0", "describe",
                            "ssh:all", "describe", "ssh:0", "delete"]


def test_a_preemption_on_a_slice_that_stays_up_trains_again(worker):
  # Status 75 with the slice still READY (e.g. maintenance): the restart is a
  # new training, not a report of the preempted one.
  worker.set("exit", str(tpu.EXIT_PREEMPTED))
  runner = WorkerRunner(worker)
  original = runner.run

  def run(argv, capture=False):
    result = original(argv, capture)
    if "--worker=all" in argv:
      worker.set("exit")  # the restart finishes
    return result

  runner.run = run
  assert tpu.launch(TARGET, worker.command(), runner, max_restarts=1,
                    delete_at_end=False) == 0
  assert worker.trainings() == 2 and worker.status() == "0"


def test_a_reported_install_failure_shows_no_earlier_trainings_log(worker):
  # An earlier training wrote its log; this run's install fails, and its
  # session drops before the launcher hears: the reconnect reports the
  # failure with the log's tail, which was the earlier training's.
  assert worker.run(gcloud.with_run(worker.command(), "a.0")).returncode == 0
  worker.set("pip-exit", "7")
  command = gcloud.with_run(worker.command(), "b.0")
  assert worker.run(command).returncode == 7
  again = worker.run(command)
  assert again.returncode == 7 and "ended (status 7)" in again.stdout
  assert "stand-in training" not in again.stdout and worker.trainings() == 1


def test_worker_script_checks_out_the_commit_and_reports_the_status(tmp_path):
  """The worker script itself, run by bash against a local repository and a
  stand-in python3 (pip succeeds; 'training' prints its commit and argv)."""
  origin, home, bin_dir, rev = _repository_and_python(
      tmp_path, '#!/bin/bash\n[ "$1 $2" = "-m pip" ] && exit 0\n'
      'echo "train at $(git rev-parse HEAD): $*"; exit ${FAKE_EXIT:-0}\n')
  train = gcloud.train_argv("configs/bert.py:large", WORKDIR, ["--config.seed=3"])
  script = gcloud.remote_script(str(origin), rev, train)

  def run(worker, fake_exit, script):
    env = {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "TPU_WORKER_ID": worker, "FAKE_EXIT": str(fake_exit)}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env=env, timeout=60)

  expected = f"train at {rev}: {' '.join(train[1:])}"
  first = run("0", 75, script)
  assert first.returncode == 75, first.stderr
  assert expected in first.stdout  # worker 0 streams its output
  assert (home / "bertjax-train.status").read_text().split()[0] == "75"
  assert expected in (home / "bertjax-train.log").read_text()
  # A later commit, on another worker: the clone exists now, so it is fetched
  # and checked out; this worker's output goes to its log, not to the stream.
  (origin / "f.txt").write_text("2")
  _git(origin, "commit", "-qam", "two")
  rev2 = subprocess.run(["git", "-C", str(origin), "rev-parse", "HEAD"],
                        capture_output=True, text=True, check=True).stdout.strip()
  second = run("1", 0, gcloud.remote_script(str(origin), rev2, train))
  assert second.returncode == 0, second.stderr
  assert "train at" not in second.stdout
  assert (home / "bertjax-train.status").read_text().split()[0] == "0"
  assert f"train at {rev2}: " in (home / "bertjax-train.log").read_text()


def test_training_outlives_a_dropped_session_and_a_rerun_follows_it(tmp_path):
  """The worker script trains detached: killing its session (a dropped ssh)
  leaves the training running, and the same script run again follows that
  training to its status instead of starting a second one."""
  origin, home, bin_dir, rev = _repository_and_python(
      tmp_path, '#!/bin/bash\n[ "$1 $2" = "-m pip" ] && exit 0\n'
      'echo "train started"; sleep 3; echo "train ended"; exit 75\n')
  script = gcloud.remote_script(str(origin), rev, gcloud.train_argv("c.py", "gs://b", []))
  env = {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
         "TPU_WORKER_ID": "0"}
  session = subprocess.Popen(_AS_SSHD + ["bash", "-c", script], env=env,
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  log = home / "bertjax-train.log"
  for _ in range(100):
    if log.exists() and "train started" in log.read_text():
      break
    time.sleep(0.05)
  session.send_signal(signal.SIGHUP)  # the ssh connection drops
  session.wait(timeout=10)
  assert not (home / "bertjax-train.status").exists()  # still training
  again = subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                         text=True, timeout=30)
  assert again.returncode == 75, again.stderr
  assert "launch: following the training" in again.stdout and "train ended" in again.stdout
  assert log.read_text().count("train started") == 1  # one training, not two
  assert (home / "bertjax-train.status").read_text().split()[0] == "75"
