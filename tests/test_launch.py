"""The pod launcher builds the right command (checked with --dry-run)."""

import os
import shlex
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "launch", "tpu_pod.sh")


def test_dry_run_prints_one_gcloud_command_for_all_workers():
  proc = subprocess.run(
      ["bash", SCRIPT, "--dry-run", "pod-a", "us-west4-a", "gs://b/run 1",
       "configs/bert.py:large", "--config.mesh_shape=1,-1,1"],
      capture_output=True, text=True, env={**os.environ, "REPO": "https://x/r.git",
                                           "REV": "abc123"}, timeout=30)
  assert proc.returncode == 0, proc.stderr
  argv = shlex.split(proc.stdout)
  assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod-a"]
  assert "--worker=all" in argv and "--zone=us-west4-a" in argv
  remote = [a for a in argv if a.startswith("--command=")][0]
  inner = shlex.split(remote[len("--command="):].replace(";", " ; "))
  assert "--distributed" in inner
  assert "--workdir=gs://b/run 1" in inner  # quoting survives the space
  assert "--config=configs/bert.py:large" in inner
  assert "--config.mesh_shape=1,-1,1" in inner
  assert "abc123" in inner


def test_missing_arguments_are_refused():
  proc = subprocess.run(["bash", SCRIPT, "pod-a"], capture_output=True, text=True,
                        timeout=30)
  assert proc.returncode == 2 and "usage:" in proc.stderr
