r"""Pretrains on a Cloud TPU slice: create it, train on every worker, resume after preemptions.

From the repository's root (``launch/`` is not part of the installed package):

  python -m launch.tpu --name=bert-large --zone=us-east5-a --project=my-proj \
      --accelerator_type=v5p-128 --spot --config=configs/bert.py:large \
      --workdir=gs://my-bucket/bert-large --max_restarts=20 --delete_at_end \
      -- --config.mesh_shape=1,-1,1 --config.scan_layers=True

1. creates the slice (``tpu-vm create``, or ``queued-resources create`` with
   ``--queued``) unless it already exists, and waits until it is READY/ACTIVE;
2. on every worker (one ``ssh --worker=all``): clones the repository at the
   checkout's commit, ``pip install '.[tpu]'``, and runs ``python3 -m
   bertjax.main --distributed --config=... --workdir=gs://...`` with the flags
   after ``--``; worker 0's output streams here (all workers keep
   ~/bertjax-train.log);
3. when training ends with status 75 (SIGTERM: preemption or maintenance; the
   run saved a checkpoint) or the slice was lost under it, waits for the slice
   (deleting and recreating a preempted spot VM or suspended queued resource)
   and runs again, resuming from the workdir, at most ``--max_restarts`` times;
   any other failure stops here with its status; a dropped ssh session on a
   READY slice is no failure: the workers train detached from it, and the
   launcher reconnects to follow the training to its status;
4. with ``--delete_at_end``, deletes the slice however the run ended, unless
   its training's outcome is unknown (worker 0 unreachable, or holding no
   status or live training of this run: a status an earlier run left does
   not count).

``--dry_run`` prints every command instead of running it. ``--gke_manifest``
prints a GKE JobSet manifest running the same command (``launch/gke.py``).
The training runs on if the launcher's ssh session or terminal dies; running
the same command again follows it (or resumes the run once it has stopped).
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from typing import Callable, Sequence

from absl import app
from absl import flags

from launch import gcloud
from launch import gke
from launch import preflight
from launch import topologies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_PREEMPTED = 75  # bertjax.guards.EXIT_PREEMPTED (not imported: no JAX here)

def _define_flags() -> None:
  """Defines the launcher's flags; only when run as a program, so that
  importing this module (tests, other tools) adds nothing to absl's
  global flags, where bertjax's binaries define --config and --workdir."""
  global _NAME, _ZONE, _PROJECT, _ACCELERATOR, _RUNTIME, _SPOT, _QUEUED, _CONFIG, _WORKDIR, _REPO
  global _REV, _ALLOW_DIRTY, _MAX_RESTARTS, _DELETE, _DRY_RUN, _POLL, _READY_TIMEOUT, _GKE, _GKE_IMAGE
  _NAME = flags.DEFINE_string("name", None, "TPU VM (and queued resource) name.")
  _ZONE = flags.DEFINE_string("zone", None, "Zone, e.g. us-east5-a (v5p) or us-west4-a (v5e).")
  _PROJECT = flags.DEFINE_string("project", "", "Google Cloud project ('' = gcloud's default).")
  _ACCELERATOR = flags.DEFINE_string(
      "accelerator_type", None, "Cloud TPU type, e.g. v4-32, v5litepod-16, v5p-128, v6e-8.")
  _RUNTIME = flags.DEFINE_string(
      "runtime_version", "", "TPU VM software version ('' = the generation's default "
      "from launch/topologies.py, e.g. v2-alpha-tpuv5 for v5p).")
  _SPOT = flags.DEFINE_bool("spot", False, "Spot capacity: cheaper, can be preempted.")
  _QUEUED = flags.DEFINE_bool(
      "queued", False, "Request the slice as a queued resource and wait in the queue.")
  _CONFIG = flags.DEFINE_string(
      "config", None, "Config spec inside the repository, e.g. configs/bert.py:large.")
  _WORKDIR = flags.DEFINE_string("workdir", None, "gs:// run directory shared by all workers.")
  _REPO = flags.DEFINE_string("repo", "", "Git URL the workers clone ('' = this checkout's origin).")
  _REV = flags.DEFINE_string(
      "rev", "", "Commit the workers check out ('' = this checkout's HEAD, which "
      "must be clean and pushed).")
  _ALLOW_DIRTY = flags.DEFINE_bool(
      "allow_dirty", False, "Launch HEAD although the checkout has uncommitted changes.")
  _MAX_RESTARTS = flags.DEFINE_integer(
      "max_restarts", 0, "Re-run after a preemption (exit 75 or a lost slice) this many times.")
  _DELETE = flags.DEFINE_bool("delete_at_end", False, "Delete the slice when the run ends.")
  _DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the commands instead of running them.")
  _POLL = flags.DEFINE_integer("poll_seconds", 30, "Seconds between state checks.")
  _READY_TIMEOUT = flags.DEFINE_integer(
      "ready_timeout_minutes", 180, "Give up when the slice is not ready after this long.")
  _GKE = flags.DEFINE_bool("gke_manifest", False, "Print a GKE JobSet manifest and exit.")
  _GKE_IMAGE = flags.DEFINE_string(
      "gke_image", "python:3.11", "Container image of the GKE pods (needs git, python3, pip).")


_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class LaunchError(ValueError):
  """Bad input or a gcloud step that failed; its message is one sentence."""


@dataclasses.dataclass
class Result:
  returncode: int
  stdout: str = ""


class Runner:
  """Runs argv lists with subprocess, echoing each to stderr."""

  def run(self, argv: Sequence[str], capture: bool = False) -> Result:
    shown = shlex.join(argv)
    print(f"+ {shown if len(shown) < 300 else shown[:300] + ' ...'}",
          file=sys.stderr, flush=True)
    proc = subprocess.run(list(argv), text=True, check=False,
                          stdout=subprocess.PIPE if capture else None)
    return Result(proc.returncode, proc.stdout or "")

  def sleep(self, seconds: float) -> None:
    time.sleep(seconds)


def _log(message: str) -> None:
  print(f"launch: {message}", file=sys.stderr, flush=True)


def state(target: gcloud.Target, runner: Runner) -> str | None:
  """The slice's state, or None when it does not exist."""
  result = runner.run(gcloud.describe_argv(target), capture=True)
  if result.returncode != 0:
    return None
  return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""


def ensure_ready(target: gcloud.Target, runner: Runner, *, poll_seconds: float,
                 timeout_seconds: float) -> None:
  """Creates the slice (again, if it was preempted) and waits until it is ready."""
  waited = 0.0
  while True:
    current = state(target, runner)
    if current in gcloud.READY:
      return
    if current is None:
      if runner.run(gcloud.create_argv(target)).returncode != 0:
        raise LaunchError(
            f"Creating {target.name} ({target.accelerator_type} in {target.zone}) "
            "failed (see gcloud's message above); check quota and capacity, or "
            "try --queued or another zone.")
      continue
    if current in gcloud.LOST:
      _log(f"{target.name} is {current}; deleting it to create it again.")
      if runner.run(gcloud.delete_argv(target)).returncode != 0:
        raise LaunchError(f"Deleting the {current} slice {target.name} failed; "
                          "delete it by hand and run this command again.")
      continue
    if waited >= timeout_seconds:
      raise LaunchError(
          f"{target.name} is still {current or 'not ready'} after "
          f"{waited / 60:.0f} min; raise --ready_timeout_minutes or try another zone.")
    runner.sleep(poll_seconds)
    waited += poll_seconds


SSH_FAILED = 255  # what gcloud's ssh exits with when the connection fails
# Reconnects in a row without a status or a live training on worker 0 (it
# cannot be reached, or never started); then the launcher stops, leaving the
# slice (and whatever runs on it) alone.
MAX_RECONNECTS = 10


def outcome(target: gcloud.Target, runner: Runner, returncode: int, run: str) -> str:
  """What the training ssh's exit status means: 'done', 'preempted', 'failed',
  or, when it says nothing about the training, 'running' (worker 0 still
  trains) or 'unknown' (worker 0 cannot be reached, or has neither a status
  nor a live training of the attempt ``run``).

  The workers train detached from the ssh session (``gcloud.remote_script``),
  so a dropped session (gcloud's 255) does not end the training.
  """
  if returncode == 0:
    return "done"
  if returncode == EXIT_PREEMPTED:
    return "preempted"
  if state(target, runner) not in gcloud.READY:
    return "preempted"  # the slice went away under the run
  # gcloud may not pass a worker's 75 through; worker 0 wrote its own status,
  # which counts only if it names this attempt's training: the ssh may have
  # failed before the script reached the worker, leaving an earlier run's.
  probe = gcloud.probe_command(run)
  status = runner.run(gcloud.ssh_argv(target, probe, worker="0"), capture=True)
  written = status.stdout.strip()
  if status.returncode != 0 or not written.isdigit():
    return "running" if status.returncode == 0 and written == "running" else "unknown"
  if written == str(EXIT_PREEMPTED):
    return "preempted"
  if written == "0" and returncode == SSH_FAILED:
    return "done"  # the training finished; only the session failed
  return "failed"


def launch(target: gcloud.Target, command: str, runner: Runner, *, max_restarts: int,
           delete_at_end: bool, poll_seconds: float = 30,
           timeout_seconds: float = 3600) -> int:
  """Trains on the slice until done; returns 0, 75 (restarts used up) or the
  failure's status (the ssh's when the training's outcome stays unknown)."""
  restarts = misses = 0
  unknown = False  # the slice may still be training: never delete it then
  # Each attempt (this invocation's first training, each restart) has its own
  # run id; a reconnect keeps it, so it follows or reports that training.
  nonce = secrets.token_hex(6)
  try:
    while True:
      ensure_ready(target, runner, poll_seconds=poll_seconds,
                   timeout_seconds=timeout_seconds)
      run = f"{nonce}.{restarts}"
      returncode = runner.run(
          gcloud.ssh_argv(target, gcloud.with_run(command, run))).returncode
      result = outcome(target, runner, returncode, run)
      if result == "done":
        _log("training finished.")
        return 0
      if result == "failed":
        _log(f"training failed with status {returncode}; not re-running it "
             "(worker logs: ~/bertjax-train.log on each worker).")
        return returncode
      if result in ("running", "unknown"):
        misses = 0 if result == "running" else misses + 1
        if misses > MAX_RECONNECTS:
          unknown = True
          _log(f"the ssh session to {target.name} ended (status {returncode}) "
               f"{misses} times in a row without a training status from worker 0, "
               "so the outcome is unknown; the slice is left as it is (not "
               "deleted): run the same command again to follow the training.")
          return returncode
        why = ("the training runs on" if result == "running" else
               "worker 0 gave no training status")
        _log(f"the ssh session to {target.name} ended (status {returncode}) on the "
             f"READY slice and {why}; reconnecting to follow it.")
        runner.sleep(poll_seconds)
        continue
      misses = 0
      if restarts >= max_restarts:
        _log(f"preempted after {restarts} restart(s) (--max_restarts={max_restarts}); "
             "run the same command again to resume from the last checkpoint.")
        return EXIT_PREEMPTED
      restarts += 1
      _log(f"preempted; resuming from the last checkpoint (restart {restarts} of "
           f"{max_restarts}).")
  finally:
    if delete_at_end and not unknown:
      runner.run(gcloud.delete_argv(target))


def dry_run(target: gcloud.Target, command: str, *, delete_at_end: bool,
            out: Callable[[str], None] = print) -> None:
  """Prints the commands ``launch`` runs, one per line (comments start with #)."""
  ready = "ACTIVE" if target.queued else "READY"
  out("# create the slice unless it exists")
  out(shlex.join(gcloud.create_argv(target)))
  out(f"# poll until it prints {ready}")
  out(shlex.join(gcloud.describe_argv(target)))
  out("# train on every worker; after exit 75 (preempted) wait for the slice and run "
      "again, after a dropped session run again to follow the training (the launcher "
      f"sets {gcloud.RUN_ENV} to each attempt's run id before the command)")
  out(shlex.join(gcloud.ssh_argv(target, command)))
  if delete_at_end:
    out("# delete the slice")
    out(shlex.join(gcloud.delete_argv(target)))


def _git(*args: str) -> str:
  proc = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                        check=False)
  return proc.stdout.strip() if proc.returncode == 0 else ""


def resolve_source(repo: str, rev: str, allow_dirty: bool) -> tuple[str, str]:
  """The repository URL and commit the workers install."""
  repo = repo or _git("remote", "get-url", "origin")
  if not repo:
    raise LaunchError("This checkout has no 'origin' remote; pass --repo=<git URL "
                      "the workers can clone>.")
  if not rev:
    rev = _git("rev-parse", "HEAD")
    if not rev:
      raise LaunchError(f"{ROOT} is not a git checkout; pass --rev=<commit>.")
    if not allow_dirty and _git("status", "--porcelain", "--untracked-files=no"):
      raise LaunchError("The checkout has uncommitted changes that the workers would "
                        "not get; commit and push them, or pass --allow_dirty.")
  return repo, rev


def validate(*, name: str, accelerator_type: str, config: str, workdir: str,
             extra: Sequence[str]) -> topologies.Slice:
  """Checks the flags before anything runs; returns the slice's shape."""
  if not _NAME_RE.match(name):
    raise LaunchError(f"--name={name!r} is not a valid TPU name; use lowercase letters, "
                      "digits and '-', starting with a letter (at most 63).")
  try:
    slice_ = topologies.parse(accelerator_type)
  except ValueError as e:
    raise LaunchError(str(e)) from None
  if slice_.multi_host and not workdir.startswith("gs://"):
    raise LaunchError(
        f"--workdir={workdir!r} is not shared by the {slice_.hosts} hosts of a "
        f"{accelerator_type}; use a bucket path such as gs://my-bucket/run1.")
  path = config.split(":", 1)[0]
  if os.path.isabs(path) or path.startswith("~"):
    raise LaunchError(f"--config={config!r} points outside the repository; the workers "
                      "run from a fresh clone, so give a path inside it, e.g. "
                      "configs/bert.py:large.")
  for flag in extra:
    if not flag.startswith("--config."):
      raise LaunchError(f"{flag!r} after '--' is not a --config.FIELD=VALUE override; "
                        "the launcher sets --config, --workdir and --distributed itself.")
  return slice_


_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")  # region-letter: us-east5-a
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")


def check_zone(zone: str) -> None:
  """Refuses a --zone that is no zone (a region, a typo) before gcloud does."""
  if _ZONE_RE.match(zone):
    return
  if _REGION_RE.match(zone):
    raise LaunchError(f"--zone={zone!r} is a region, not a zone; pass one of its "
                      f"zones, e.g. --zone={zone}-a.")
  raise LaunchError(f"--zone={zone!r} is not a Cloud TPU zone; pass region-letter, "
                    "e.g. --zone=us-east5-a (v5p) or --zone=us-west4-a (v5e).")


def check_workdir(workdir: str, *, spot: bool, queued: bool, max_restarts: int,
                  delete_at_end: bool, gke: bool) -> None:
  """Refuses a workdir on the slice's own disk where that disk, with the
  checkpoints, goes away: a re-created slice (preemption), --delete_at_end,
  or a GKE pod. (A multi-host slice needs gs:// anyway: ``validate``.)"""
  if workdir.startswith("gs://"):
    return
  if gke:
    lost = "a GKE pod's disk, which goes with the pod"
  elif delete_at_end:
    lost = "the TPU VM's own disk, which --delete_at_end deletes with the slice"
  elif spot or queued or max_restarts > 0:
    lost = ("the TPU VM's own disk, which a preempted or lost slice loses when it "
            "is created again, so the run could not resume")
  else:
    return
  raise LaunchError(f"--workdir={workdir!r} is on {lost}; use a bucket path such as "
                    "gs://my-bucket/run1.")


def require_gcloud() -> None:
  """Refuses to start without the gcloud CLI, before anything is created."""
  if shutil.which("gcloud") is None:
    raise LaunchError(
        "The gcloud CLI is not on PATH; install it (https://cloud.google.com/sdk/"
        "docs/install) and run gcloud auth login, or pass --dry_run to print the "
        "commands without running them.")


def check_config(config: str, rev: str, extra: Sequence[str],
                 slice_: topologies.Slice) -> None:
  """The config exists in the commit, its overrides apply, its batch and mesh
  fit the slice and it passes bertjax's own checks (all but the first only
  where bertjax is installed here)."""
  try:
    preflight.config_in_commit(ROOT, config, rev)
    loaded = preflight.load_config(ROOT, config, extra)
    if loaded is None:
      _log("bertjax is not installed beside the launcher, so the config's "
           "fields, batch and mesh are checked only on the workers.")
      return
    preflight.batch_fits(loaded, slice_)
    preflight.config_fits(loaded, slice_)
  except ValueError as e:
    raise LaunchError(str(e)) from None


def main(argv: Sequence[str]) -> int:
  extra = list(argv[1:])
  required = ["name", "accelerator_type", "config", "workdir"]
  if not _GKE.value:
    required.append("zone")
  missing = [f"--{f}" for f in required if not flags.FLAGS[f].value]
  if missing:
    raise LaunchError(f"Missing {', '.join(missing)}; see python -m launch.tpu --help.")
  if _MAX_RESTARTS.value < 0:
    raise LaunchError(f"--max_restarts={_MAX_RESTARTS.value} is negative; use 0 "
                      "(never re-run) or more.")
  slice_ = validate(name=_NAME.value, accelerator_type=_ACCELERATOR.value,
                    config=_CONFIG.value, workdir=_WORKDIR.value, extra=extra)
  if _ZONE.value:
    check_zone(_ZONE.value)
  check_workdir(_WORKDIR.value, spot=_SPOT.value, queued=_QUEUED.value,
                max_restarts=_MAX_RESTARTS.value, delete_at_end=_DELETE.value,
                gke=_GKE.value)
  repo, rev = resolve_source(_REPO.value, _REV.value, _ALLOW_DIRTY.value)
  check_config(_CONFIG.value, rev, extra, slice_)
  if not (_GKE.value or _DRY_RUN.value):
    require_gcloud()
  train = gcloud.train_argv(_CONFIG.value, _WORKDIR.value, extra)
  if _GKE.value:
    print(gke.manifest(name=_NAME.value, slice_=slice_,
                       script=gcloud.remote_script(repo, rev, train),
                       image=_GKE_IMAGE.value, spot=_SPOT.value,
                       max_restarts=_MAX_RESTARTS.value), end="")
    return 0
  target = gcloud.Target(
      name=_NAME.value, zone=_ZONE.value, project=_PROJECT.value,
      accelerator_type=_ACCELERATOR.value,
      runtime_version=_RUNTIME.value or slice_.runtime_version,
      spot=_SPOT.value, queued=_QUEUED.value)
  command = gcloud.remote_command(repo, rev, train)
  if _DRY_RUN.value:
    dry_run(target, command, delete_at_end=_DELETE.value)
    return 0
  return launch(target, command, Runner(), max_restarts=_MAX_RESTARTS.value,
                delete_at_end=_DELETE.value, poll_seconds=_POLL.value,
                timeout_seconds=_READY_TIMEOUT.value * 60)


def _main(argv: Sequence[str]) -> int:
  try:
    return main(argv)
  except ValueError as e:  # LaunchError, or a template that cannot be filled
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  _define_flags()
  app.run(_main)
