"""JAX's preemption sync point as bertjax asks it with several processes
(``guards.PreemptionWatcher``): every process stops after the same train step
or before the same evaluation batch, whichever process got the SIGTERM.
Scripts of two JAX processes on one machine, no model."""

import os
import subprocess
import sys

import pytest

from test_multiprocess import ROOT, TIMEOUT, _free_port


def _run(tmp_path, source: str, count: int, *args: str) -> list[str]:
  """Runs ``source`` as ``count`` processes of one jax.distributed cluster;
  their outputs, each having exited 0."""
  script = tmp_path / "script.py"
  script.write_text(source)
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, str(script), str(count), str(index), *args], cwd=ROOT,
      env=dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"localhost:{port}"),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for index in range(count)]
  outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
  assert [p.returncode for p in procs] == [0] * count, outs
  return outs


def _lines(out: str, prefix: str) -> list[str]:
  return [line for line in out.splitlines() if line.startswith(prefix)]


# Each process: JAX's notifier gets SIGTERM (process 0's) before the watcher is
# asked anything, as when it comes during a resumed run's start-up; then the
# watcher is asked after steps 5, 6, ... as the train loop of a run resumed
# at step 4 asks it. Prints the step it stopped after.
_WATCHER = """
import os, signal, sys, time
import jax
count, index = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(num_processes=count, process_id=index)
from bertjax import guards, multihost
# A SIGTERM bertjax's handler took before JAX's notifier was there (here:
# the last process's, said so) reaches every process at the config check.
late = multihost.check_same_run({"seed": 0}, {"workdir": "/w"}, index == count - 1)
print("signalled", late, flush=True)
if index == 0:
  os.kill(os.getpid(), signal.SIGTERM)
time.sleep(3)  # the notice reaches every process before the first question
watcher = guards.PreemptionWatcher()
assert not watcher.before_first_step()
for step in range(5, 15):
  if watcher.should_stop(step):
    print("stopped after", step, flush=True)
    break
  time.sleep(0.2)
"""


@pytest.mark.parametrize("count", [2, 1])
def test_a_notice_during_start_up_stops_a_resumed_run(tmp_path, count):
  """JAX's sync point is the step after the newest any process had asked
  about, counted from 0: a run resumed at step 4 that passed its global
  steps waited for step 1 and never stopped (and one process alone, with
  jax.distributed, never asked JAX at all)."""
  outs = _run(tmp_path, _WATCHER, count)
  assert [_lines(out, "stopped") for out in outs] == [["stopped after 5"]] * count, outs
  told = [_lines(out, "signalled") for out in outs]
  assert told == [[f"signalled {[1] if count == 2 else []}"]] * count, outs


# Each process: three train steps, then an evaluation of 40 batches; the
# process given as the last argument sends itself SIGTERM before its 4th
# batch. The other may be ahead or behind it (no collectives here, only a
# sleep per batch); prints the batch it stopped before, or that it finished.
_EVALUATION = """
import os, signal, sys, time
import jax
count, index, signalled = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(num_processes=count, process_id=index)
from bertjax import guards
watcher = guards.PreemptionWatcher()
for step in range(1, 4):
  assert not watcher.should_stop(step)
for batch in range(40):
  if index == signalled and batch == 3:
    os.kill(os.getpid(), signal.SIGTERM)
  if watcher.should_stop_evaluating():
    print("stopped before batch", batch, flush=True)
    break
  time.sleep(0.1 if index == 0 else 0.15)
else:
  print("evaluated every batch", flush=True)
"""


@pytest.mark.parametrize("signalled", [0, 1])
def test_a_notice_during_an_evaluation_stops_every_process_at_one_batch(
    tmp_path, signalled):
  """The train loop's evaluations (and bertjax.evaluate's, and a fine-tuning
  run's last) ask the sync point before each batch: a SIGTERM to either
  process stops both before the same batch, not after the evaluation."""
  outs = _run(tmp_path, _EVALUATION, 2, str(signalled))
  stopped = [_lines(out, "stopped") for out in outs]
  assert stopped[0] == stopped[1] and len(stopped[0]) == 1, outs
  batch = int(stopped[0][0].rsplit(" ", 1)[1])
  # JAX's sync point is one past the newest question either process had
  # asked when the notice came: the signalled one had asked 3 + 3, the other
  # at most a few more (0.1 against 0.15 s a batch); never the end.
  assert 3 <= batch < 20, outs


# Each process: process 0 first's part (bertjax.main preparing the data, here
# a minute of sleeps), then the others'; the process given as the last
# argument sends itself SIGTERM once the process whose part it is not has
# started that part: process 1 while it waits for process 0, process 0 after
# it has done its own. Prints how many seconds of the part ran.
_PREPARE = """
import os, signal, sys, threading, time
import jax
count, index, signalled = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(num_processes=count, process_id=index)
from bertjax import guards, multihost
from jax._src import distributed
client = distributed.global_state.client
slow = 1 - signalled  # the process whose part is long

def signal_when_started():
  client.blocking_key_value_get("test/started", 60_000)
  os.kill(os.getpid(), signal.SIGTERM)

def part():
  if index != slow:
    return "quick"
  client.key_value_set("test/started", "")
  start = time.time()
  try:
    while time.time() - start < 60:
      time.sleep(0.05)
  finally:
    print(f"worked {time.time() - start:.1f} s", flush=True)
  return "slow"

if index == signalled:
  threading.Thread(target=signal_when_started, daemon=True).start()
try:
  with guards.sigterm_raises():
    print("went on with", multihost.process_0_first(part, "prepare"), flush=True)
except guards.Terminated:
  print("terminated", flush=True)
"""


@pytest.mark.parametrize("signalled", [1, 0])
def test_a_notice_while_preparing_stops_every_process_at_once(tmp_path, signalled):
  """With several processes JAX's notifier has SIGTERM; preparing the data
  asks no sync point, and used to run to its end (hours, on a large corpus)
  while the others waited. The notice of either process now stops the part
  that runs within a second, and every process with it: process 1 waiting
  for process 0 (signalled=1), or process 0 that had done its part and was
  waiting for process 1's (signalled=0)."""
  outs = _run(tmp_path, _PREPARE, 2, str(signalled))
  assert [_lines(out, "terminated") for out in outs] == [["terminated"]] * 2, outs
  assert not any(_lines(out, "went on") for out in outs), outs
  slow = 1 - signalled
  worked = _lines(outs[slow], "worked")
  assert len(worked) == 1 and float(worked[0].split()[1]) < 15, outs
