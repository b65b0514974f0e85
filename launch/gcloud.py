"""The gcloud commands of a Cloud TPU run, as argv lists (pure functions).

Nothing here runs anything: ``launch/tpu.py`` hands these lists to a runner,
or prints them with ``--dry_run``. A slice is either a TPU VM (``tpu-vm
create``, on-demand or ``--spot``) or a queued resource (``queued-resources
create``, which asks for the same slice and waits in Google's queue for it;
``--spot`` there too). The TPU VM node of a queued resource gets the queued
resource's name, so ``ssh`` addresses both the same way.
"""

from __future__ import annotations

import dataclasses
import shlex

# The state ``describe`` prints once the slice can run: a TPU VM's and a
# queued resource's.
READY = frozenset({"READY", "ACTIVE"})
# States from which the slice does not come back by itself: it is deleted and
# created again (a spot TPU VM cannot be restarted after a preemption; a queued
# resource whose TPUs were taken is SUSPENDED and must be requested again).
LOST = frozenset({"PREEMPTED", "TERMINATED", "FAILED", "SUSPENDED"})

# Each worker writes the exit status of its training process here, with the
# training's id ("75 <id>"), so that the launcher can tell a preemption (75)
# from a failure whatever status gcloud makes of several workers' exits, and
# a status an earlier run left from this run's outcome.
STATUS_FILE = "~/bertjax-train.status"
LOG_FILE = "~/bertjax-train.log"
# The detached training's pid and the process's identity, and the commit
# and command it runs: a worker script run again while they still train
# follows that training.
PID_FILE = "~/bertjax-train.pid"
CMD_FILE = "~/bertjax-train.cmd"
# The runs (launcher attempts) that started the current training (the first
# line, which is the training's id) or followed it, one a line.
RUNS_FILE = "~/bertjax-train.runs"
# The variable the launcher sets to the attempt's run id before the command.
RUN_ENV = "BERTJAX_RUN"
# A pid is the training's only while the process holding it is the one that
# was started: after a reboot that left no status, or once pids wrap around,
# the pid may name another process. So the pid file holds, beside the pid,
# the boot id and the process's start time (field 22 of /proc/<pid>/stat,
# clock ticks since boot): ``ident PID`` prints them, ``alive PID IDENT``
# holds while that very process runs. A pid file without them (an older
# script's) is checked by the pid alone, as it was.
_PROCESS_CHECKS = (
    'ident() { local s b; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0; '
    's=${s##*) }; set -- $s; b=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null); '
    'echo "$b ${20}"; }; '
    'alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && '
    '{ [ -z "$2" ] || [ "$(ident "$1")" = "$2" ]; }; }')
_READ_PID = f"pid=; pident=; read -r pid pident 2>/dev/null < {PID_FILE}"
# The worker's index in the slice: GKE sets TPU_WORKER_ID; on a TPU VM the
# metadata server knows it.
_WORKER_ID = ("${TPU_WORKER_ID:-$(curl -sf -H Metadata-Flavor:Google "
              "http://metadata.google.internal/computeMetadata/v1/instance/"
              "attributes/agent-worker-number || echo 0)}")


@dataclasses.dataclass(frozen=True)
class Target:
  """Which slice, where, and how it is paid for."""
  name: str                 # TPU VM name (and queued resource id)
  zone: str
  project: str              # '' = gcloud's configured project
  accelerator_type: str     # e.g. 'v5p-128'
  runtime_version: str      # e.g. 'v2-alpha-tpuv5'
  spot: bool = False
  queued: bool = False


def _where(t: Target) -> list[str]:
  return [f"--zone={t.zone}"] + ([f"--project={t.project}"] if t.project else [])


def _tpu_vm(t: Target, verb: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", verb, t.name, *_where(t)]


def _queued(t: Target, verb: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "queued-resources", verb, t.name, *_where(t)]


def create_argv(t: Target) -> list[str]:
  """Creates the slice (a TPU VM) or queues the request for it."""
  spot = ["--spot"] if t.spot else []
  if t.queued:
    return [*_queued(t, "create"), f"--node-id={t.name}",
            f"--accelerator-type={t.accelerator_type}",
            f"--runtime-version={t.runtime_version}", *spot]
  return [*_tpu_vm(t, "create"), f"--accelerator-type={t.accelerator_type}",
          f"--version={t.runtime_version}", *spot]


def describe_argv(t: Target) -> list[str]:
  """Prints the slice's state alone (READY, ACTIVE, PREEMPTED, ...)."""
  if t.queued:
    return [*_queued(t, "describe"), "--format=value(state.state)"]
  return [*_tpu_vm(t, "describe"), "--format=value(state)"]


def delete_argv(t: Target) -> list[str]:
  """Deletes the slice without asking (a queued resource with its TPU VMs)."""
  if t.queued:
    return [*_queued(t, "delete"), "--force", "--quiet"]
  return [*_tpu_vm(t, "delete"), "--quiet"]


def ssh_argv(t: Target, command: str, worker: str = "all") -> list[str]:
  """Runs ``command`` on one worker ('0') or on all of them at once ('all')."""
  return [*_tpu_vm(t, "ssh"), f"--worker={worker}", f"--command={command}"]


def train_argv(config: str, workdir: str, extra: list[str]) -> list[str]:
  """The training command every worker runs (from the repository's root)."""
  return ["python3", "-m", "bertjax.main", "--distributed", f"--config={config}",
          f"--workdir={workdir}", *extra]


def remote_script(repo: str, rev: str, train: list[str]) -> str:
  """The bash script each worker runs: check out ``rev``, install, train.

  Every worker runs the same script. The training runs detached from the ssh
  session (SIGHUP ignored, output in ~/bertjax-train.log, its pid and identity in
  ~/bertjax-train.pid), so a dropped connection does not stop it; the script
  follows it until it writes its exit status to ~/bertjax-train.status, then
  exits with that status (75 after a preemption). Run again while the same
  commit and command still train, it follows that training instead of starting
  another (the launcher's reconnect); a training of another commit or command
  gets SIGTERM (it saves a checkpoint) before the new one starts. A failed
  checkout or install leaves its status in the status file too. Worker 0
  streams the log; the others print its tail if they fail, so the launcher's
  terminal shows one log, not 16 interleaved ones.

  The launcher's run id ($BERTJAX_RUN, ``with_run``) goes into
  ~/bertjax-train.runs for the training the script starts or follows, and
  the status names the training it belongs to, so that ``probe_command``
  never passes off another run's status as this run's. Run again with the id
  of a training that has ended (a reconnect after it ended), the script
  reports its status instead of training again.
  """
  q = shlex.quote
  train_cmd = shlex.join(train)
  cmd_line = q(f"{rev} {train_cmd}")  # what ~/bertjax-train.cmd records
  # The current training (the first run in the runs file) has ended when
  # the status names it; its pid may live on then (a zombie, or reused after
  # a reboot) and is neither followed nor signalled.
  read_status = (f"status=; ended=; read -r status ended 2>/dev/null < {STATUS_FILE}; "
                 f"tid=$(head -n 1 {RUNS_FILE} 2>/dev/null)")
  over = '[ -n "$status" ] && [ "$ended" = "$tid" ]'
  alive = f'alive "$pid" "$pident" && ! {{ {over}; }}'
  return "; ".join([
      "set -o pipefail",
      _PROCESS_CHECKS,
      f"worker={_WORKER_ID}",
      # Without the launcher (GKE, a command run by hand): an id of its own.
      f"runid=${{{RUN_ENV}:-$(date +%s%N)}}",
      _READ_PID,
      read_status,
      # A reconnect after this run's training ended: its status is the
      # outcome; training again would re-run a failed (or finished) training.
      f'if {over} && grep -qxF -- "$runid" {RUNS_FILE} 2>/dev/null; then '
      '[ "$worker" = 0 ] && echo "launch: the training ended (status $status) while '
      'the launcher was away; reporting it (last 20 lines of its log)"; pid=; lines=20; '
      f'elif {alive} && [ "$(cat {CMD_FILE} 2>/dev/null)" = {cmd_line} ]; then '
      '[ "$worker" = 0 ] && echo "launch: following the training that is still '
      'running on the slice (last 20 lines of its log first)"; lines=20; '
      f'grep -qxF -- "$runid" {RUNS_FILE} 2>/dev/null || echo "$runid" >> {RUNS_FILE}; '
      f"else if {alive}; then "
      '[ "$worker" = 0 ] && echo "launch: stopping the training of another commit '
      'or command that is still running (SIGTERM: it saves a checkpoint)"; '
      'pkill -TERM -P "$pid"; while alive "$pid" "$pident"; do sleep 1; done; fi',
      # The old status goes before this run is recorded as the training's.
      f"rm -f {STATUS_FILE} {PID_FILE} {CMD_FILE} {RUNS_FILE}",
      f'echo "$runid" > {RUNS_FILE}; tid=$runid',
      # The log is the current training's from here, even if the install fails.
      f": > {LOG_FILE}",
      "{ if [ -d ~/bertjax/.git ]; then cd ~/bertjax && "
      f"git remote set-url origin {q(repo)} && git fetch -q origin; "
      f"else git clone -q {q(repo)} ~/bertjax && cd ~/bertjax; fi && "
      f"git checkout -q --detach {q(rev)} && "
      'python3 -m pip install -q ".[tpu]"; } || '
      f'{{ status=$?; echo "$status $runid" > {STATUS_FILE}; exit $status; }}',
      f"echo {cmd_line} > {CMD_FILE}",
      # The detached process records itself, before it trains: a session
      # dropped just after the start cannot leave the pid file unwritten.
      f"( trap '' HUP; me=$BASHPID; echo \"$me $(ident $me)\" > {PID_FILE}.tmp; "
      f"mv {PID_FILE}.tmp {PID_FILE}; {train_cmd} >> {LOG_FILE} 2>&1; echo \"$? $runid\" > "
      f"{STATUS_FILE}.tmp; mv {STATUS_FILE}.tmp {STATUS_FILE} ) < /dev/null > /dev/null "
      "2>&1 & pid=$!; pident=; lines=+1; fi",  # its own child: the pid alone
      f'if [ "$worker" = 0 ]; then if [ -n "$pid" ]; then tail -n $lines -f '
      f'--pid="$pid" {LOG_FILE}; else tail -n $lines {LOG_FILE}; fi; fi',
      '[ -z "$pid" ] || while alive "$pid" "$pident"; do sleep 1; done',
      f'status=; ended=; read -r status ended 2>/dev/null < {STATUS_FILE}',
      '[ -n "$status" ] && [ "$ended" = "$tid" ] || { echo "launch: the training on '
      f'worker $worker ended without writing {STATUS_FILE} (killed?); see {LOG_FILE}"; '
      f'status=1; [ -e {STATUS_FILE} ] || echo "1 $tid" > {STATUS_FILE}; }}',
      f'[ "$worker" = 0 ] || [ "$status" = 0 ] || tail -n 20 {LOG_FILE}',
      "exit $status",
  ])


def with_run(command: str, run: str) -> str:
  """``command`` (run by the worker's shell) with the attempt's run id set."""
  return f"{RUN_ENV}={shlex.quote(run)} {command}"


def probe_command(run: str) -> str:
  """Prints worker 0's outcome of the training run ``run`` started or
  followed: its exit status, 'running', or 'none' when the worker holds no
  trace of it (the script never reached the worker, or another run's
  training has replaced it): a status file alone may be another run's."""
  script = "; ".join([
      _PROCESS_CHECKS,
      # The status first: a training started after it was read has another id.
      f"status=; ended=; read -r status ended 2>/dev/null < {STATUS_FILE}",
      f"tid=$(head -n 1 {RUNS_FILE} 2>/dev/null)",
      f'if [ -z "$tid" ] || ! grep -qxF -- {shlex.quote(run)} {RUNS_FILE} 2>/dev/null; '
      "then echo none",
      'elif [ -n "$status" ] && [ "$ended" = "$tid" ]; then echo "$status"',
      f'elif {_READ_PID}; alive "$pid" "$pident"; then echo running',
      "else echo none; fi",
  ])
  return shlex.join(["bash", "-c", script])


def remote_command(repo: str, rev: str, train: list[str]) -> str:
  """``remote_script`` as one command line for ``ssh --command`` (run by bash)."""
  return shlex.join(["bash", "-c", remote_script(repo, rev, train)])
