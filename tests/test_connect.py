"""Processes that never all connect (``BERTJAX_CONNECT_TIMEOUT``,
bertjax/multihost.py): one line naming the missing side and the fix, within
the timeout, nothing written; JAX alone aborted such a process after 5
minutes with a C++ stack trace that blamed "another task"."""

import os
import subprocess
import sys
import time

import pytest

from bertjax import multihost
from test_multiprocess import ROOT
from test_multiprocess import _free_port


@pytest.mark.parametrize("value, seconds", [("", 300.0), ("7", 7.0), (" 2.5 ", 2.5)])
def test_the_timeout_comes_from_the_environment(value, seconds):
  assert multihost.connect_timeout({multihost.CONNECT_TIMEOUT: value}) == seconds


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf", "nan"])
def test_a_timeout_that_is_no_positive_number_is_one_sentence(value):
  with pytest.raises(ValueError, match="BERTJAX_CONNECT_TIMEOUT=.*positive number"):
    multihost.connect_timeout({multihost.CONNECT_TIMEOUT: value})


def _run_alone(tmp_path, index, port):
  """bertjax.main as process ``index`` of 2 with a 2-second timeout; the
  other process never comes. Returns (status, stderr, seconds taken)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
             JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index),
             BERTJAX_CONNECT_TIMEOUT="2")
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/bert.py:tiny",
       f"--workdir={tmp_path / 'work'}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  return proc.returncode, proc.stderr, time.monotonic() - start


def test_nothing_at_the_coordinators_address_is_named(tmp_path):
  port = _free_port()  # nothing listens there
  status, err, took = _run_alone(tmp_path, 1, port)
  lines = [l for l in err.splitlines() if l.startswith("error: ")]
  assert status == 1, err[-3000:]
  assert lines == [
      f"error: Process 1 of 2 found nothing listening at the coordinator's address "
      f"localhost:{port} (JAX_COORDINATOR_ADDRESS) in 2 s; start process 0 on that "
      "host, check the address and that its port is open between the hosts, or "
      "give them longer with BERTJAX_CONNECT_TIMEOUT=SECONDS."], err[-3000:]
  assert "Check failure" not in err and "another task" not in err
  assert not (tmp_path / "work").exists()
  assert took < 60  # the 2 s, start-up included, not JAX's 5 minutes


def test_process_0_alone_says_the_others_did_not_come(tmp_path):
  port = _free_port()
  status, err, _ = _run_alone(tmp_path, 0, port)
  assert status == 1, err[-3000:]
  said = [l for l in err.splitlines() if l.startswith("error: ")]
  assert len(said) == 1, err[-3000:]
  assert said[0].startswith(
      f"error: Process 0 of 2 waited 2 s for the other processes to connect to the "
      f"coordinator at localhost:{port} and not all did; start all 2 processes")
  assert not (tmp_path / "work").exists()


def test_a_slice_that_jax_detected_is_told_to_start_every_host():
  # No address in the environment (a TPU slice, SLURM): no variables to name.
  said = multihost._not_connected({}, 300.0, environ={})
  assert said.startswith("This process waited 300 s for the other hosts to connect")
  assert "every host of the slice" in said and "JAX_NUM_PROCESSES" not in said
