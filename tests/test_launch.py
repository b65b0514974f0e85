"""The Cloud TPU launcher: --dry_run commands, the relaunch loop, the GKE manifest."""

import os
import shlex
import subprocess
import sys

import pytest
import yaml  # PyYAML comes with flax

from launch import gcloud
from launch import gke
from launch import topologies
from launch import tpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REV = "0123456789abcdef0123456789abcdef01234567"
WORKDIR = "gs://my-bucket/bert large"  # the space checks the quoting end to end
TRAIN = ["python3", "-m", "bertjax.main", "--distributed",
         "--config=configs/bert.py:large", f"--workdir={WORKDIR}",
         "--config.mesh_shape=1,-1,1"]


def _launch(*flags, cwd, extra=("--config.mesh_shape=1,-1,1",), path=None):
  """Runs python -m launch.tpu from another directory, as a user would."""
  env = {**os.environ, "PYTHONPATH": ROOT, "PATH": path or os.environ["PATH"]}
  return subprocess.run(
      [sys.executable, "-m", "launch.tpu", "--repo=https://example.com/bertjax.git",
       f"--rev={REV}", "--config=configs/bert.py:large", f"--workdir={WORKDIR}",
       "--name=pod-a", "--zone=us-east5-a", *flags, "--", *extra],
      capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def _commands(stdout):
  return [shlex.split(line) for line in stdout.splitlines()
          if line and not line.startswith("#")]


def _flag(argv, name):
  values = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
  assert len(values) == 1, (name, argv)
  return values[0]


def _train_commands(script):
  """Every `python3 -m bertjax.main ...` the worker script runs, as argv lists."""
  tokens = shlex.split(script.replace(";", " ; "))
  found = []
  for i, token in enumerate(tokens):
    if token == "bertjax.main":
      j = i + 1
      while tokens[j] not in (";", ">", ">>", "2>&1", "|"):
        j += 1
      found.append(tokens[i - 2:j])
  return found


def _worker_script(ssh):
  bash = shlex.split(_flag(ssh, "--command"))
  assert bash[:2] == ["bash", "-c"] and len(bash) == 3
  return bash[2]


@pytest.mark.parametrize("accelerator,runtime,hosts", [
    ("v5p-128", "v2-alpha-tpuv5", 16), ("v5litepod-16", "v2-alpha-tpuv5-lite", 4)])
def test_dry_run_spot_slice(tmp_path, accelerator, runtime, hosts):
  proc = _launch(f"--accelerator_type={accelerator}", "--spot", "--dry_run",
                 "--delete_at_end", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  create, describe, ssh, delete = _commands(proc.stdout)
  assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod-a"]
  assert _flag(create, "--accelerator-type") == accelerator
  assert _flag(create, "--version") == runtime
  assert "--spot" in create and _flag(create, "--zone") == "us-east5-a"
  assert describe[3:6] == ["tpu-vm", "describe", "pod-a"]
  # One ssh reaches every worker: all of them get the same script.
  assert ssh[3:6] == ["tpu-vm", "ssh", "pod-a"] and _flag(ssh, "--worker") == "all"
  script = _worker_script(ssh)
  assert f"git checkout -q --detach {REV}" in script
  assert "git clone -q https://example.com/bertjax.git" in script
  assert _train_commands(script) == [TRAIN]  # the same on every worker
  assert delete[3:6] == ["tpu-vm", "delete", "pod-a"] and "--quiet" in delete
  assert topologies.parse(accelerator).hosts == hosts


def test_dry_run_queued_resource(tmp_path):
  proc = _launch("--accelerator_type=v5litepod-16", "--queued", "--spot",
                 "--runtime_version=v2-alpha-tpuv5-lite-test", "--project=proj",
                 "--dry_run", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  commands = _commands(proc.stdout)
  assert len(commands) == 3  # no delete without --delete_at_end
  create, describe, ssh = commands
  assert create[3:6] == ["queued-resources", "create", "pod-a"]
  assert _flag(create, "--node-id") == "pod-a"
  assert _flag(create, "--accelerator-type") == "v5litepod-16"
  assert _flag(create, "--runtime-version") == "v2-alpha-tpuv5-lite-test"
  assert "--spot" in create and _flag(create, "--project") == "proj"
  assert describe[3:5] == ["queued-resources", "describe"]
  assert _flag(describe, "--format") == "value(state.state)"
  assert _flag(ssh, "--worker") == "all" and _flag(ssh, "--project") == "proj"
  assert _train_commands(_worker_script(ssh)) == [TRAIN]


def test_on_demand_has_no_spot_flag(tmp_path):
  proc = _launch("--accelerator_type=v4-32", "--dry_run", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  create = _commands(proc.stdout)[0]
  assert "--spot" not in create and _flag(create, "--version") == "tpu-ubuntu2204-base"


@pytest.mark.parametrize("flags,words", [
    (["--accelerator_type=v5p-128", "--workdir=/tmp/run"], ["gs://", "16 hosts"]),
    (["--accelerator_type=v5p-127"], ["multiple of 2"]),
    (["--accelerator_type=v5p-8", "--zone=us-east5"], ["region, not a zone",
                                                        "--zone=us-east5-a"]),
    (["--accelerator_type=v5p-8", "--zone=useast5a"], ["not a Cloud TPU zone"]),
    (["--accelerator_type=v5p-8", "--workdir=/tmp/run", "--spot", "--max_restarts=20",
      "--delete_at_end"], ["/tmp/run", "--delete_at_end deletes", "gs://"]),
    (["--accelerator_type=v7-8"], ["not a Cloud TPU type"]),
    (["--accelerator_type=v5p-8", "--config=/home/me/my.py"], ["inside"]),
    (["--accelerator_type=v5p-8", "--name=Pod_A"], ["lowercase"]),
    (["--accelerator_type=v5e-16"], ["spells it v5litepod-16"]),
    (["--accelerator_type=v5p-12"], ["whole hosts of 4", "6 chips"]),
    # The config as the workers would load it, checked against the slice.
    (["--accelerator_type=v5p-128", "--", "--config.batch_size=96"],
     ["batch_size=96", "64 data-parallel chips", "--config.batch_size=64"]),
    (["--accelerator_type=v5p-128", "--", "--config.mesh_shape=1,8,1"],
     ["64 chips of a v5p-128", "mesh_shape='1,8,1'"]),
    # bertjax's own checks, as bertjax.main runs them before any device work,
    # on the slice's chips: 16 heads do not split over a tensor axis of 32.
    (["--accelerator_type=v5p-128", "--", "--config.mesh_shape=1,2,32"],
     ["On a v5p-128 (64 chips)", "num_heads=16", "tensor axis"]),
    (["--accelerator_type=v5p-8", "--", "--config.mask_rate=1.0"],
     ["config.mask_rate=1.0", "strictly between 0 and 1"]),
    (["--accelerator_type=v5p-8", "--", "--config.seq_len=1024"],
     ["config.seq_len=1024", "max_position_embeddings (512)"]),
    (["--accelerator_type=v5p-8", "--", "--config.allow_changes=sequence_len"],
     ["allow_changes names 'sequence_len'"]),
    # Local text named by no files: the workers' bertjax.main refused it.
    (["--accelerator_type=v5p-8", "--", "--config.dataset=bertjax_local_text"],
     ["bertjax_local_text needs input files", "--config.text_files"]),
    (["--accelerator_type=v5p-8", "--", "--config.bach_size=8"],
     ["did you mean --config.batch_size"]),
    (["--accelerator_type=v5p-8", "--", "--config.batch_size=many"], ["many"]),
    (["--accelerator_type=v5p-8", "--config=configs/bert.py:huge"], ["'huge'"]),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, flags, words):
  flags, extra = (flags[:flags.index("--")], flags[flags.index("--") + 1:]) if (
      "--" in flags) else (flags, [])
  proc = _launch(*flags, "--dry_run", cwd=tmp_path, extra=extra)
  assert proc.returncode == 2
  assert proc.stdout == ""  # not one command printed
  message = proc.stderr.strip()
  assert message.startswith("error:") and "\n" not in message
  for word in words:
    assert word in message


def test_a_workdir_on_the_vms_disk_is_refused_where_the_disk_goes_away():
  # One host: a local workdir passed, but a re-created spot VM (or the
  # deleted slice) takes the checkpoints with it: no resume, no result.
  def check(**kw):
    args = dict(spot=False, queued=False, max_restarts=0, delete_at_end=False,
                gke=False)
    tpu.check_workdir("/tmp/run", **{**args, **kw})
  for kw, words in [({"spot": True}, "could not resume"),
                    ({"queued": True}, "could not resume"),
                    ({"max_restarts": 3}, "could not resume"),
                    ({"delete_at_end": True}, "--delete_at_end deletes"),
                    ({"gke": True}, "GKE pod")]:
    with pytest.raises(tpu.LaunchError, match=f"^--workdir='/tmp/run' is on .*{words}"
                       ".*; use a bucket path such as gs://my-bucket/run1.$"):
      check(**kw)
  check()  # an on-demand VM kept after the run keeps its disk
  tpu.check_workdir("gs://b/run", spot=True, queued=True, max_restarts=3,
                    delete_at_end=True, gke=True)


def test_zones():
  for zone in ("us-east5-a", "europe-west4-b", "northamerica-northeast1-c"):
    tpu.check_zone(zone)
  with pytest.raises(tpu.LaunchError, match="^--zone='europe-west4' is a region"):
    tpu.check_zone("europe-west4")


def test_only_config_overrides_pass_through(tmp_path):
  env = {**os.environ, "PYTHONPATH": ROOT}
  proc = subprocess.run(
      [sys.executable, "-m", "launch.tpu", "--rev=abc", "--repo=r", "--name=a",
       "--zone=z", "--accelerator_type=v5p-8", "--config=configs/bert.py:tiny",
       "--workdir=gs://b/w", "--dry_run", "--", "--workdir=gs://other"],
      capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
  assert proc.returncode == 2 and "--config.FIELD" in proc.stderr
  assert proc.stdout == ""


def test_no_gcloud_is_one_sentence_before_anything_runs(tmp_path):
  # PATH with Python alone: neither gcloud nor git.
  proc = _launch("--accelerator_type=v5p-8", cwd=tmp_path,
                 path=os.path.dirname(sys.executable))
  assert proc.returncode == 2, proc.stderr
  message = proc.stderr.strip()
  assert message.startswith("error: The gcloud CLI is not on PATH") and "\n" not in message
  assert "--dry_run" in message and proc.stdout == ""


def test_config_the_commit_lacks_is_refused(tmp_path):
  head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()
  def launch(config):
    return _launch("--accelerator_type=v5p-8", "--dry_run", f"--rev={head}",
                   f"--config={config}", cwd=tmp_path, extra=())
  # An untracked copy of a config passes `git status --untracked-files=no`,
  # but the workers' clone would not have it.
  proc = launch("configs/my_bert_copy.py:large")
  assert proc.returncode == 2 and proc.stdout == ""
  assert "configs/my_bert_copy.py is not in commit" in proc.stderr
  for shipped in ("configs/bert.py:large", "bert:large", "bert.py:large"):
    proc = launch(shipped)
    assert proc.returncode == 0, (shipped, proc.stderr)


@pytest.mark.parametrize("accelerator,nearest", [
    ("v5litepod-12", "v5litepod-8, v5litepod-16"), ("v6e-24", "v6e-16, v6e-32"),
    ("v3-16", "v3-8, v3-32"), ("v2-64", "v2-32, v2-128")])
def test_sizes_cloud_tpu_does_not_offer_are_refused(accelerator, nearest):
  # v5litepod-12 (three whole hosts of 4 chips) used to pass, and only
  # gcloud refused it, after the launcher had checked out and built.
  with pytest.raises(ValueError, match=f"^--accelerator_type='{accelerator}' is not a "
                     f"slice Cloud TPU offers; pick one of .*{nearest}"):
    topologies.parse(accelerator)
  # Every size the message offers parses.
  gen = topologies.GENERATIONS[accelerator.split("-")[0]]
  for chips in gen.offered_chips:
    assert topologies.parse(f"{accelerator.split('-')[0]}-{chips * gen.cores_per_chip}").chips == chips


@pytest.mark.parametrize("accelerator,chips,pick", [
    ("v5p-2", "1 chip is", "pick v5p-8."), ("v5p-4", "2 chips are", "pick v5p-8."),
    ("v5p-6", "3 chips are", "pick v5p-8."), ("v4-4", "2 chips are", "pick v4-8."),
    ("v5p-12", "6 chips are", "pick v5p-8 or v5p-16.")])
def test_v4_and_v5p_below_a_whole_host_are_refused(accelerator, chips, pick):
  # v5p-2/4/6 and v4-4 were taken for one host of 1-3 chips; Cloud TPU's
  # smallest v4/v5p slice is one host of 4 chips (v4-8, v5p-8).
  with pytest.raises(ValueError, match="whole hosts of 4 chips") as e:
    topologies.parse(accelerator)
  assert chips in str(e.value) and str(e.value).endswith(pick)


def test_host_counts_and_topologies():
  # accelerator type -> (chips, hosts, chips per host, topology)
  expected = {
      "v4-32": (16, 4, 4, "2x2x4"),
      "v5litepod-16": (16, 4, 4, "4x4"),
      "v5p-128": (64, 16, 4, "4x4x4"),
      "v5p-8": (4, 1, 4, "2x2x1"),
      "v5litepod-8": (8, 1, 8, "2x4"),
      "v6e-8": (8, 1, 8, "2x4"),
      "v3-32": (16, 4, 4, "4x4"),
  }
  for name, want in expected.items():
    s = topologies.parse(name)
    assert (s.chips, s.hosts, s.chips_per_host, s.topology) == want, name
    assert s.chips == s.hosts * s.chips_per_host


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                  *args], check=True, capture_output=True)


def test_source_is_the_clean_checkout(tmp_path, monkeypatch):
  _git(tmp_path, "init", "-q")
  (tmp_path / "f.txt").write_text("a")
  _git(tmp_path, "add", "f.txt")
  _git(tmp_path, "commit", "-qm", "c")
  monkeypatch.setattr(tpu, "ROOT", str(tmp_path))
  with pytest.raises(tpu.LaunchError, match="--repo"):
    tpu.resolve_source("", "", allow_dirty=False)
  _git(tmp_path, "remote", "add", "origin", "https://example.com/x.git")
  head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                        capture_output=True, text=True, check=True).stdout.strip()
  assert tpu.resolve_source("", "", allow_dirty=False) == (
      "https://example.com/x.git", head)
  (tmp_path / "f.txt").write_text("b")
  with pytest.raises(tpu.LaunchError, match="--allow_dirty"):
    tpu.resolve_source("", "", allow_dirty=False)
  assert tpu.resolve_source("", "", allow_dirty=True)[1] == head


class FakeRunner:
  """Records argv lists; answers describe with scripted states and the
  training ssh with scripted exit codes."""

  def __init__(self, states, exits, worker0_status="1", worker0_rc=0):
    self.states, self.exits = list(states), list(exits)
    self.worker0_status, self.worker0_rc = worker0_status, worker0_rc
    self.calls, self.slept = [], 0.0

  def run(self, argv, capture=False):
    self.calls.append(list(argv))
    if "describe" in argv:
      current = self.states.pop(0)
      return tpu.Result(1, "") if current is None else tpu.Result(0, current + "\n")
    if "ssh" in argv and "--worker=all" in argv:
      return tpu.Result(self.exits.pop(0))
    if "ssh" in argv:
      return tpu.Result(self.worker0_rc, self.worker0_status + "\n")
    return tpu.Result(0)

  def sleep(self, seconds):
    self.slept += seconds

  def verbs(self):
    return [c[4] if c[4] != "ssh" else "ssh:" + _flag(c, "--worker") for c in self.calls]


def _target(**kw):
  return gcloud.Target(name="pod-a", zone="z", project="", accelerator_type="v5p-128",
                       runtime_version="v2-alpha-tpuv5", **kw)


def test_spot_slice_is_recreated_and_training_rerun_after_exit_75():
  runner = FakeRunner(states=[None, "READY", "PREEMPTED", None, "READY"], exits=[75, 0])
  rc = tpu.launch(_target(spot=True), "CMD", runner, max_restarts=3, delete_at_end=False)
  assert rc == 0
  assert runner.verbs() == ["describe", "create", "describe", "ssh:all",
                            "describe", "delete", "describe", "create", "describe",
                            "ssh:all"]
  # The same command, with a run id per attempt (the restart is a new training).
  runs = [_flag(c, "--command").split() for c in runner.calls if "--worker=all" in c]
  assert [r[1:] for r in runs] == [["CMD"], ["CMD"]]
  first, second = (r[0].removeprefix(f"{gcloud.RUN_ENV}=") for r in runs)
  assert first.endswith(".0") and second == first[:-2] + ".1"
  assert all("--spot" in c for c in runner.calls if "create" in c)


def test_suspended_queued_resource_is_requested_again():
  runner = FakeRunner(states=["ACTIVE", "SUSPENDED", None, "WAITING_FOR_RESOURCES",
                              "ACTIVE"], exits=[75, 0])
  rc = tpu.launch(_target(spot=True, queued=True), "CMD", runner, max_restarts=1,
                  delete_at_end=True, poll_seconds=5)
  assert rc == 0
  assert runner.verbs() == ["describe", "ssh:all", "describe", "delete", "describe",
                            "create", "describe", "describe", "ssh:all", "delete"]
  assert all(c[3] == "queued-resources" for c in runner.calls if c[4] != "ssh")
  assert runner.slept == 5  # one poll while the request waited in the queue


def test_failure_is_not_rerun():
  runner = FakeRunner(states=["READY", "READY"], exits=[1], worker0_status="1")
  rc = tpu.launch(_target(spot=True), "CMD", runner, max_restarts=5, delete_at_end=False)
  assert rc == 1
  assert runner.verbs().count("ssh:all") == 1
  assert "delete" not in runner.verbs()


def test_max_restarts_is_honoured_and_slice_deleted_at_end():
  runner = FakeRunner(states=["READY"] * 3, exits=[75] * 3)
  rc = tpu.launch(_target(spot=True), "CMD", runner, max_restarts=2, delete_at_end=True)
  assert rc == tpu.EXIT_PREEMPTED
  assert runner.verbs().count("ssh:all") == 3  # the first run and two restarts
  assert runner.verbs()[-1] == "delete"


def test_a_lost_slice_or_worker_status_75_counts_as_preemption():
  # gcloud's ssh fails (255) because the VMs went away under it.
  runner = FakeRunner(states=["READY", "PREEMPTED", None, "READY"], exits=[255, 0])
  assert tpu.launch(_target(spot=True), "C", runner, max_restarts=1,
                    delete_at_end=False) == 0
  assert runner.verbs().count("ssh:all") == 2
  # gcloud reports 1 for the workers, but worker 0 saved and exited 75.
  runner = FakeRunner(states=["READY", "READY", "READY"], exits=[1, 0],
                      worker0_status="75")
  assert tpu.launch(_target(), "C", runner, max_restarts=1, delete_at_end=False) == 0
  assert runner.verbs() == ["describe", "ssh:all", "describe", "ssh:0", "describe",
                            "ssh:all"]


def test_dropped_ssh_on_a_ready_slice_reconnects_and_never_deletes_early(capsys):
  # gcloud's ssh fails (255) on a READY slice while worker 0 still trains
  # (detached from the session): not a failure; the launcher reconnects, and
  # deletes the slice only once the training has finished.
  runner = FakeRunner(states=["READY"] * 4, exits=[255, 0], worker0_status="running")
  rc = tpu.launch(_target(spot=True), "C", runner, max_restarts=20, delete_at_end=True)
  assert rc == 0
  assert runner.verbs() == ["describe", "ssh:all", "describe", "ssh:0", "describe",
                            "ssh:all", "delete"]
  err = capsys.readouterr().err
  assert "failed" not in err and "reconnecting" in err
  # The session dropped after worker 0 had finished: done, not failed.
  runner = FakeRunner(states=["READY"] * 2, exits=[255], worker0_status="0")
  assert tpu.launch(_target(), "C", runner, max_restarts=0, delete_at_end=True) == 0
  assert runner.verbs()[-1] == "delete" and runner.verbs().count("ssh:all") == 1


def test_a_slice_whose_training_outcome_stays_unknown_is_not_deleted(capsys):
  # Neither the training ssh nor worker 0 can be reached (gcloud's 255 for both).
  tries = tpu.MAX_RECONNECTS + 1
  runner = FakeRunner(states=["READY"] * (2 * tries), exits=[255] * tries,
                      worker0_status="", worker0_rc=255)
  rc = tpu.launch(_target(spot=True), "C", runner, max_restarts=20, delete_at_end=True,
                  poll_seconds=5)
  assert rc == 255
  assert runner.verbs().count("ssh:all") == tries and "delete" not in runner.verbs()
  assert runner.slept == 5 * tpu.MAX_RECONNECTS
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert "outcome is unknown" in last and "not deleted" in last


def test_waiting_too_long_gives_up():
  runner = FakeRunner(states=["CREATING"] * 10, exits=[])
  with pytest.raises(tpu.LaunchError, match="--ready_timeout_minutes"):
    tpu.launch(_target(queued=True), "C", runner, max_restarts=0, delete_at_end=False,
               poll_seconds=60, timeout_seconds=180)
  assert runner.slept == 180 and "ssh:all" not in runner.verbs()


@pytest.mark.parametrize("accelerator,hosts,topology,label", [
    ("v5p-128", 16, "4x4x4", "tpu-v5p-slice"),
    ("v5litepod-16", 4, "4x4", "tpu-v5-lite-podslice")])
def test_gke_manifest_runs_the_same_command(tmp_path, accelerator, hosts, topology, label):
  proc = _launch(f"--accelerator_type={accelerator}", "--gke_manifest", "--spot",
                 "--max_restarts=7", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  jobset = yaml.safe_load(proc.stdout)
  assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
  assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 7
  job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
  assert job["parallelism"] == job["completions"] == hosts
  pod = job["template"]["spec"]
  assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": label,
                                 "cloud.google.com/gke-tpu-topology": topology,
                                 "cloud.google.com/gke-spot": "true"}
  (container,) = pod["containers"]
  assert container["resources"]["limits"]["google.com/tpu"] == 4
  # The pods run exactly the script the gcloud path sends over ssh.
  dry = _launch(f"--accelerator_type={accelerator}", "--dry_run", cwd=tmp_path)
  ssh = _commands(dry.stdout)[2]
  assert container["command"] == ["bash", "-c", _worker_script(ssh)]
  assert _train_commands(container["command"][2]) == [TRAIN]


def test_running_the_gke_module_points_to_the_launcher():
  proc = subprocess.run([sys.executable, "-m", "launch.gke"], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 1 and proc.stdout == ""
  assert "python -m launch.tpu --gke_manifest" in proc.stderr


def test_gke_refuses_what_it_does_not_offer():
  with pytest.raises(ValueError, match="GKE offers no v3"):
    gke.manifest(name="a", slice_=topologies.parse("v3-32"), script="true",
                 image="i", spot=False, max_restarts=0)


def test_importing_the_launcher_defines_no_global_flags():
  # bertjax's binaries define --config and --workdir on absl's global flags;
  # a test (or tool) that imports launch.tpu must not collide with them.
  code = ("import launch.tpu\nfrom absl import flags\n"
          "from bertjax import aot\nassert 'name' not in flags.FLAGS\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
