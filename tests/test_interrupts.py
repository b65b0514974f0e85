"""SIGTERM to the binaries other than bertjax.main's train loop (evaluate,
finetune) and TensorBoard event files of quick restarts: exit 75 with one
line, nothing partial left in the workdir, the rerun goes on."""

import os
import shutil
import signal
import subprocess
import sys

import pytest

from bertjax import guards
from bertjax import train

from test_resilience import ROOT, run_config, wait_for

STEPS = 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo_config, demo_data):
  """A workdir with the checkpoint of step STEPS and its final evaluation."""
  workdir = str(tmp_path_factory.mktemp("trained"))
  config = run_config(demo_config, demo_data, num_train_steps=STEPS,
                      checkpoint_every_steps=STEPS)
  train.train_and_evaluate(config, workdir)
  return workdir, config


def _listing(workdir):
  """Every file of the workdir but its data (hidden temporary files too)."""
  found = set()
  for root, dirs, files in os.walk(workdir):
    dirs[:] = [d for d in dirs if os.path.join(root, d) != os.path.join(workdir, "data")]
    found.update(os.path.relpath(os.path.join(root, f), workdir) for f in files)
  return found


def test_sigterm_during_evaluate_exits_75_writes_nothing_and_rerun_evaluates(
    tmp_path, trained):
  # It died of the signal (status 143, no word); the record is written by
  # rename, so only the status and the missing message were wrong.
  source, config = trained
  workdir = str(tmp_path / "work")
  shutil.copytree(source, workdir)
  before = _listing(workdir)
  # The whole eval split (not the 2 batches the run evaluated): the record
  # goes to eval_<step>-2.json, and there are batches left to stop in.
  args = [sys.executable, "-m", "bertjax.evaluate", "--config=configs/bert.py:tiny",
          f"--workdir={workdir}", "--config.eval_max_batches=0"] + [
              f"--config.{f}={config[f]}" for f in
              ("data_dir", "batch_size", "seq_len", "max_predictions_per_seq")]
  out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
  with open(out, "w") as o, open(err, "w") as e:
    proc = subprocess.Popen(args, cwd=ROOT, stdout=o, stderr=e)
    wait_for(lambda: f"Restored checkpoint {STEPS}" in err.read_text(), proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == guards.EXIT_PREEMPTED, err.read_text()[-3000:]
  assert out.read_text().strip().splitlines()[-1] == (
      f"Preempted while evaluating the checkpoint of step {STEPS}; nothing "
      "written, run the same command again to evaluate it.")
  assert "Traceback" not in err.read_text()
  assert _listing(workdir) == before
  rerun = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert _listing(workdir) == before | {f"eval_{STEPS}-2.json"}
