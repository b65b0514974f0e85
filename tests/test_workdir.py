"""The workdir: one run at a time (issue 11.4), one line when it cannot be
written (18.4), and a quiet ``bertjax.load`` that takes no lock (11.8)."""

import contextlib
import json
import logging
import os
import signal
import subprocess
import warnings

import pytest
from absl import logging as absl_logging

import bertjax
from bertjax import checkpointing
from bertjax import models
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax import workdir_lock

from test_resilience import cli_args, wait_for
from test_resume_faults import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_second_run_on_a_workdir_is_refused_and_kill9_frees_it(
    tmp_path, demo_config, demo_data):
  workdir = str(tmp_path / "work")
  config = tiny(demo_config, demo_data, num_train_steps=400, log_every_steps=1,
                checkpoint_every_steps=1000)
  first = subprocess.Popen(cli_args(config, workdir), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    metrics = os.path.join(workdir, "metrics.jsonl")
    wait_for(lambda: os.path.exists(metrics) and len(open(metrics).readlines()) >= 2,
             first)
    second = subprocess.run(cli_args(config, workdir), cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 2
    lines = [l for l in second.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith(f"error: Another bertjax run (pid {first.pid} on host ")
    assert "Traceback" not in second.stderr
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  steps = [json.loads(l)["step"] for l in open(metrics)]
  assert len(steps) == len(set(steps))  # nobody else appended
  # The dead run's lock went with it: the next run takes the workdir at once.
  with workdir_lock.WorkdirLock(workdir):
    pass


@contextlib.contextmanager
def unable_to_write(path):
  """``path`` made read-only, also for root (whose effective uid is dropped)."""
  os.chmod(path, 0o555)
  root = os.geteuid() == 0
  try:
    if root:
      os.seteuid(65534)
    yield
  finally:
    if root:
      os.seteuid(0)
    os.chmod(path, 0o755)


@pytest.fixture
def no_device_work(monkeypatch):
  def forbidden(*args, **kwargs):
    raise AssertionError("device work started before the refusal")
  monkeypatch.setattr(state_lib, "state_shardings", forbidden)


def test_workdir_that_is_a_file_gets_one_line(tmp_path, demo_config, demo_data,
                                              no_device_work):
  path = tmp_path / "a_file"
  path.write_text("x")
  for workdir in (path, path / "below"):
    with pytest.raises(ValueError, match=r"(is a file|lies under the file "
                       r".*a_file), not a directory") as e:
      train.train_and_evaluate(tiny(demo_config, demo_data), str(workdir))
    assert "\n" not in str(e.value)
  assert path.read_text() == "x"


def test_read_only_workdir_gets_one_line(tmp_path, demo_config, demo_data,
                                         no_device_work):
  workdir = tmp_path / "ro"
  workdir.mkdir()
  with unable_to_write(workdir):
    with pytest.raises(ValueError, match="Cannot write to the workdir .* "
                       r"\(permission denied\); make it writable"):
      train.train_and_evaluate(tiny(demo_config, demo_data), str(workdir))
  assert os.listdir(workdir) == []


@pytest.fixture(scope="module")
def saved_workdir(tmp_path_factory, demo_config, demo_data):
  """A workdir with one checkpoint (step 0), written without training."""
  workdir = str(tmp_path_factory.mktemp("saved"))
  config = tiny(demo_config, demo_data)
  mesh = sharding.make_mesh(config.mesh_shape)
  state, _ = state_lib.create_train_state(models.get_model(config),
                                          optim.make_optimizer(config), config, mesh)
  saver = checkpointing.Checkpointer(workdir)
  saver.save(0, state, {}, config, demo_data.fingerprint)
  saver.close()
  return workdir


def test_load_is_quiet_and_takes_no_lock(saved_workdir, caplog):
  caplog.set_level(logging.WARNING)
  with workdir_lock.WorkdirLock(saved_workdir):  # a run is training there
    with warnings.catch_warnings(record=True) as raised:
      warnings.simplefilter("always")
      model = bertjax.load(saved_workdir)
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
  assert [str(w.message) for w in raised] == []
  assert model.encode(["Quiet, please."])["hidden"].shape[0] == 1


def test_quiet_read_only_keeps_real_warnings(caplog):
  caplog.set_level(logging.WARNING)
  with checkpointing.quiet_read_only():
    absl_logging.warning("Given directory is read only=%s", "/somewhere")
    absl_logging.warning("Checkpoint step 7 is missing a file.")
  assert [r.getMessage() for r in caplog.records] == [
      "Checkpoint step 7 is missing a file."]
  absl_logging.warning("Given directory is read only=%s", "/elsewhere")
  assert len(caplog.records) == 2  # hidden only inside the scope
