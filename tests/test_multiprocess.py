"""Several JAX processes on one machine: the binaries' --distributed start-up,
every host's data position in the checkpoint, and one end-to-end run of two
processes of bertjax.main (gloo collectives over 2 x 4 fake CPU devices)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from bertjax import checkpointing
from bertjax import multihost

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- start-up -----------------------------------------------------------------

def test_the_process_count_and_index_come_from_the_environment():
  env = {"JAX_COORDINATOR_ADDRESS": "localhost:1", "JAX_NUM_PROCESSES": "2",
         "JAX_PROCESS_ID": "1"}
  assert multihost.arguments(env) == {"num_processes": 2, "process_id": 1}
  assert multihost.arguments({}) == {}  # left to JAX's cluster detection


@pytest.mark.parametrize("env, named", [
    ({"JAX_NUM_PROCESSES": "2"}, "JAX_PROCESS_ID"),
    ({"JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "outside 0..1"),
    ({"JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}, "not a whole number"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS"),
])
def test_inconsistent_variables_are_one_sentence(env, named):
  env = dict(env)
  if named != "JAX_COORDINATOR_ADDRESS":
    env["JAX_COORDINATOR_ADDRESS"] = "localhost:1"
  with pytest.raises(ValueError, match=named):
    multihost.arguments(env)


# --- process 0 first, the same config everywhere ---------------------------------

class _FakeCoordinator:
  """JAX's coordination-service client as these functions use it: a key-value store."""

  def __init__(self, values=None):
    self.values = dict(values or {})

  def key_value_set(self, key, value):
    # JAX refuses to set a key twice; a process whose wait is replayed (the
    # KeyError below, then the same call again) sets the same value again.
    assert self.values.get(key, value) == value
    self.values[key] = value

  def blocking_key_value_get(self, key, timeout_ms):
    assert timeout_ms > 0
    return self.values[key]  # a KeyError stands for a wait that never ends

  def key_value_try_get(self, key):
    # Asked in a loop until the key is there: again, a KeyError stands for
    # a wait that never ends (JAX's client raises NOT_FOUND).
    return self.values[key]


@pytest.fixture
def as_process(monkeypatch):
  """Makes this process process ``index`` of 2, on a fake coordinator."""
  import itertools
  from jax._src import distributed

  def become(index, values=None):
    client = _FakeCoordinator(values)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: index)
    monkeypatch.setattr(distributed.global_state, "client", client)
    monkeypatch.setattr(multihost, "_calls", itertools.count())
    return client
  return become


def test_process_0_works_first_and_the_others_only_after_it(as_process):
  ran = []

  def work(index):
    return lambda: ran.append(index) or f"done by {index}"
  client = as_process(1)
  with pytest.raises(KeyError):  # process 1 waits for process 0's part
    multihost.process_0_first(work(1), "prepare the data")
  assert ran == [] and client.values == {}
  client = as_process(0, client.values)
  with pytest.raises(KeyError):  # process 0 has done its part, waits for 1's
    multihost.process_0_first(work(0), "prepare the data")
  assert ran == [0] and client.values == {"bertjax/process_0_first/0/0": ""}
  client = as_process(1, client.values)  # process 0 has said it is done: 1 runs
  assert multihost.process_0_first(work(1), "prepare the data") == "done by 1"
  assert ran == [0, 1] and client.values["bertjax/process_0_first/0/1"] == ""
  as_process(0, client.values)  # both done: process 0 returns too
  assert multihost.process_0_first(work(0), "prepare the data") == "done by 0"


def test_a_failure_on_process_0_stops_the_others_with_its_message(as_process):
  client = as_process(0)

  def fail():
    raise ValueError("no such file x.txt")
  with pytest.raises(ValueError, match="no such file"):
    multihost.process_0_first(fail, "prepare the data")
  as_process(1, client.values)
  ran = []
  with pytest.raises(ValueError, match="Process 0 could not prepare the data.*x.txt"):
    multihost.process_0_first(lambda: ran.append(1), "prepare the data")
  assert not ran


def test_a_failure_on_another_process_stops_process_0_too(as_process):
  """Process 0 has done its part when process 1's fails (hosts that do not
  share the data_dir prepare their own copy): it does not go on alone."""
  client = as_process(0, {"bertjax/process_0_first/0/1": "OSError: disk full"})
  with pytest.raises(ValueError, match="Process 1 could not prepare the data "
                                       r"\(OSError: disk full\)"):
    multihost.process_0_first(lambda: "made", "prepare the data")
  assert client.values["bertjax/process_0_first/0/0"] == ""


def test_a_process_stopped_by_a_preemption_notice_stops_them_all(as_process):
  from bertjax import guards

  def stopped():
    raise guards.Terminated
  # Process 1 stopped during its part, after process 0 had done its own:
  # process 0 stops as well, instead of training alone.
  client = as_process(1, {"bertjax/process_0_first/0/0": ""})
  with pytest.raises(guards.Terminated):
    multihost.process_0_first(stopped, "prepare the data")
  as_process(0, client.values)
  with pytest.raises(guards.Terminated):
    multihost.process_0_first(lambda: "made", "prepare the data")
  # Process 0 stopped during its part: process 1 stops without starting its own.
  client = as_process(0)
  with pytest.raises(guards.Terminated):
    multihost.process_0_first(stopped, "prepare the data")
  as_process(1, client.values)
  ran = []
  with pytest.raises(guards.Terminated):
    multihost.process_0_first(lambda: ran.append(1), "prepare the data")
  assert not ran


def _exchange(as_process, given, cwds=None):
  """``check_same_run`` on process 1, then 0, then 1 again, on one fake store:
  ``given[i]`` = (config, args, signalled) of process ``i``, started in the
  working directory ``cwds[i]`` if given. Returns each process's outcome,
  the list returned or the exception raised."""
  def enter(index):
    if cwds:
      os.chdir(cwds[index])
  client = as_process(1)
  enter(1)
  with pytest.raises(KeyError):  # process 1 waits for process 0's verdict
    multihost.check_same_run(*given[1])
  outcomes = []
  for index in (0, 1):
    client = as_process(index, client.values)
    enter(index)
    try:
      outcomes.append(multihost.check_same_run(*given[index]))
    except ValueError as e:
      outcomes.append(e)
  return outcomes


def test_processes_started_with_different_configs_are_refused(as_process):
  same = ({"seed": 0, "learning_rate": 0.002}, {"workdir": "/w"}, False)
  assert _exchange(as_process, [same, same]) == [[], []]  # the same: accepted
  other = ({"seed": 0, "learning_rate": 0.001}, {"workdir": "/w"}, False)
  for e in _exchange(as_process, [same, other]):  # both stop, with one sentence
    assert isinstance(e, ValueError)
    assert "config.learning_rate is 0.002 on process 0 and 0.001 on process 1" in str(e)


def test_processes_started_with_different_workdirs_are_refused(as_process):
  """Each would write its own checkpoints (or one the shared bucket, another
  a local directory) and nothing would say so."""
  config = {"seed": 0, "data_dir": "gs://b/data"}
  given = [(config, {"workdir": "gs://b/run", "data_dir": "gs://b/data"}, False),
           (config, {"workdir": "/tmp/run", "data_dir": "gs://b/data"}, False)]
  for e in _exchange(as_process, given):
    assert isinstance(e, ValueError)
    assert str(e).startswith("Process 0 and process 1 were started with different "
                             "workdirs: 'gs://b/run' on process 0 and '/tmp/run' on "
                             "process 1; start every process with the same --workdir")
  # The config's data_dir is compared as resolved: one string per directory.
  given = [({**config, "data_dir": "gs://b/data/"}, given[0][1], False),
           (config, given[0][1], False)]
  assert _exchange(as_process, given) == [[], []]


@pytest.mark.parametrize("field,value", [
    ("text_files", "corpus/*.txt,extra.txt"),
    ("tokenizer_path", "tok"),
    ("ernie_gazetteer", "tok/entities.txt"),
    ("train_files", "train.csv"),
    ("predict_files", "a.jsonl, b.jsonl"),
    ("mixture", "pg19 weight=2; bertjax_local_text text_files=corpus/*.txt"),
])
def test_a_relative_path_started_from_two_directories_is_refused(
    as_process, tmp_path, monkeypatch, field, value):
  """The same relative path in a config field names other files on a host
  started elsewhere: refused, naming both absolute paths; started from one
  directory, or given the same absolute path spelt two ways, accepted."""
  monkeypatch.chdir(tmp_path)  # os.chdir below is undone with it
  here, there = tmp_path / "here", tmp_path / "there"
  here.mkdir()
  there.mkdir()
  run = ({"seed": 0, field: value}, {"workdir": "/w"}, False)
  for e in _exchange(as_process, [run, run], [here, there]):
    assert isinstance(e, ValueError), e
    message = str(e)
    assert f"configs: config.{field} is " in message
    assert str(here) in message and str(there) in message
    assert "a relative one is read from each process's working directory" in message
  assert _exchange(as_process, [run, run], [here, here]) == [[], []]

  spelt = value.replace("corpus/", "corpus//./").replace("tok", "./tok/").replace(
      "train.csv", "x/../train.csv").replace("a.jsonl", "./a.jsonl")
  assert spelt != value
  moved = ({"seed": 0, field: spelt}, run[1], False)
  assert _exchange(as_process, [run, moved], [here, here]) == [[], []]
  # One host given the absolute path, the other the relative one from there.
  absolute = {"text_files": f"{here}/corpus/*.txt,{here}/extra.txt",
              "mixture": f"pg19 weight=2; bertjax_local_text text_files={here}/corpus/*.txt"}
  if field in absolute:
    given = ({"seed": 0, field: absolute[field]}, run[1], False)
    assert _exchange(as_process, [given, run], [there, here]) == [[], []]


def test_train_compares_the_normalised_workdir_before_anything_is_written(
    as_process, tmp_path, monkeypatch):
  """Before any read or write; ``paths.absolute``'s normalisation is the
  sameness (a trailing slash is the same directory, a symlink is not
  resolved: another host's file system may not have it)."""
  from bertjax import config_files, config_validation, train
  config = config_files.shipped("bert").get_config("tiny")
  config.data_dir = str(tmp_path / "data")
  (tmp_path / "real").mkdir()
  (tmp_path / "link").symlink_to(tmp_path / "real")

  class Passed(Exception):
    pass

  def passed(*a, **k):
    raise Passed
  monkeypatch.setattr(config_validation, "validate", passed)  # what comes next

  def both(workdirs):
    client = as_process(1)
    with pytest.raises(KeyError):  # waiting for process 0's verdict
      train.train_and_evaluate(config, workdirs[1])
    outcomes = []
    for index in (0, 1):
      client = as_process(index, client.values)
      with pytest.raises((ValueError, Passed)) as e:
        train.train_and_evaluate(config, workdirs[index])
      outcomes.append(e.value)
    return outcomes

  run = str(tmp_path / "run")
  assert [type(e) for e in both([run, run + "/"])] == [Passed, Passed]
  for e in both([str(tmp_path / "real"), str(tmp_path / "link")]):
    assert isinstance(e, ValueError) and "different workdirs" in str(e)
    assert f"'{tmp_path / 'real'}' on process 0 and '{tmp_path / 'link'}'" in str(e)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_evaluate_refuses_processes_given_different_workdirs(as_process, tmp_path):
  """``bertjax.evaluate --distributed`` too: each would read its own checkpoint."""
  from bertjax import config_files, evaluation
  config = config_files.shipped("bert").get_config("tiny")
  workdirs = [str(tmp_path / "a"), str(tmp_path / "b")]
  client = as_process(1)
  with pytest.raises(KeyError):  # waiting for process 0's verdict
    evaluation.evaluate_checkpoint(config, workdirs[1])
  for index in (0, 1):
    client = as_process(index, client.values)
    with pytest.raises(ValueError, match=f"different workdirs: '{workdirs[0]}' on "
                       f"process 0 and '{workdirs[1]}' on process 1"):
      evaluation.evaluate_checkpoint(config, workdirs[index])


def test_a_sigterm_before_jax_took_it_stops_every_process(as_process):
  """A SIGTERM that came before jax.distributed.initialize had installed
  JAX's notifier was taken by bertjax's own handler, which JAX never hears
  of: every process learns of it from the config check."""
  run = ({"seed": 0}, {"workdir": "/w"}, False)
  signalled = ({"seed": 0}, {"workdir": "/w"}, True)
  assert _exchange(as_process, [run, signalled]) == [[1], [1]]
  assert _exchange(as_process, [signalled, run]) == [[0], [0]]


def test_a_process_that_never_comes_is_a_message_not_a_wait_for_ever(as_process):
  client = as_process(0)
  waited = []

  def timed_out(key, timeout_ms):
    waited.append(timeout_ms)
    raise RuntimeError("DEADLINE_EXCEEDED: Barrier timed out. Id: " + key)
  client.wait_at_barrier = timed_out
  with pytest.raises(RuntimeError, match="Not every process reached the first step"):
    multihost.barrier("first step")
  assert 0 < waited[0] <= 60 * 60 * 1000  # bounded: a process that ended is not waited for


def test_sigterm_is_left_to_jax_when_there_are_several_processes(monkeypatch):
  """JAX's preemption notifier tells every process; a handler of ours would
  stop only the one signalled (the others then waited in the next step)."""
  from jax._src import distributed
  from bertjax import guards
  monkeypatch.setattr(distributed.global_state, "client", object())
  before = signal.getsignal(signal.SIGTERM)
  watcher = guards.PreemptionWatcher()
  try:
    assert signal.getsignal(signal.SIGTERM) is before
  finally:
    watcher.close()


# --- every host's data position -------------------------------------------------

def test_each_process_resumes_from_its_own_data_position(monkeypatch):
  data = {"iterator": {"at": 0}, "iterators": [{"at": 0}, {"at": 7}]}
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  assert checkpointing.own_iterator_state(data, "ckpt") == {"at": 7}
  # Saved by one process, resumed by two: process 0's position, with a warning.
  warned = []
  monkeypatch.setattr(checkpointing.logging, "warning", lambda *a: warned.append(a))
  assert checkpointing.own_iterator_state({"iterator": {"at": 3}}, "ckpt") == {"at": 3}
  assert warned and warned[0][2:] == (1, 2)


# --- two processes of bertjax.main ----------------------------------------------

STEPS = 12
TIMEOUT = 300  # seconds a run may take before the test fails (a hang, not a slow CPU)


def _gloo_available() -> bool:
  try:
    from jax._src.lib import _jax
  except ImportError:
    return False
  return hasattr(_jax, "make_gloo_tcp_collectives")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(workdir, data_dir, tmp_path, name, *, port=None, indices=(0, 1)):
  """Starts 2 processes of bertjax.main, 4 fake CPU devices each, on ``workdir``
  (preparing the demo corpus into it when ``data_dir`` is ''); only those of
  ``indices`` when given, on ``port`` (the coordinator's)."""
  port = port or _free_port()
  args = [sys.executable, "-m", "bertjax.main", "--config=configs/bert.py:tiny",
          f"--workdir={workdir}", f"--config.data_dir={data_dir}",
          "--config.batch_size=8", "--config.seq_len=32",
          "--config.max_predictions_per_seq=5", f"--config.num_train_steps={STEPS}",
          "--config.warmup_steps=2", "--config.log_every_steps=1",
          "--config.checkpoint_every_steps=4", "--config.eval_max_batches=1",
          # A window of 8 examples is used up every 2 steps (4 rows a host):
          # the hosts' data positions differ well before the first checkpoint.
          "--config.shuffle_window=8"]
  procs = []
  for index in indices:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=" ".join(  # conftest's flags, 4 devices instead of 8
                   [f for f in os.environ["XLA_FLAGS"].split() if "device_count" not in f]
                   + ["--xla_force_host_platform_device_count=4"]),
               JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(index))
    out = open(tmp_path / f"{name}.{index}.log", "w")
    procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, text=True))
  return procs


def _finish(procs, tmp_path, name):
  """Waits for both (killing both on a hang); returns their exit codes and logs."""
  deadline = time.time() + TIMEOUT
  try:
    for p in procs:
      p.wait(timeout=max(1, deadline - time.time()))
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
      p.wait()
  logs = [(tmp_path / f"{name}.{i}.log").read_text() for i in range(2)]
  return [p.returncode for p in procs], logs


def _step_losses(log):
  """{step: loss} of the progress lines a process printed."""
  return {int(line.split()[1].split("/")[0]): line.split()[2]
          for line in log.splitlines() if line.startswith("step ")}


def _logged(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.skipif(not _gloo_available(),
                    reason="this jaxlib has no gloo CPU collectives for several processes")
def test_two_processes_train_and_resume_after_sigterm_as_if_never_stopped(tmp_path):
  # Uninterrupted, preparing the corpus in the run: process 0 makes it, process 1
  # waits and reuses it (both would write the one directory otherwise).
  ref = str(tmp_path / "ref")
  codes, logs = _finish(_start(ref, "", tmp_path, "ref"), tmp_path, "ref")
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  losses = [_step_losses(log) for log in logs]
  assert sorted(losses[0]) == list(range(1, STEPS + 1))
  assert losses[0] == losses[1]  # both processes saw the one global loss
  records = [json.loads(log.strip().splitlines()[-1]) for log in logs]
  assert records[0] == records[1] and records[0]["step"] == STEPS
  assert 0 < records[0]["loss"] < 20
  # Only process 0 wrote the log: each step once.
  rows = [r["step"] for r in _logged(ref) if "loss" in r]
  assert rows == list(range(1, STEPS + 1))
  assert "Reusing tokenized shards" in logs[1]
  data_dir = os.path.join(ref, "data")

  # SIGTERM to both after the first checkpoint, then the same command again.
  work = str(tmp_path / "work")
  procs = _start(work, data_dir, tmp_path, "cut")
  first = os.path.join(work, "checkpoints", "4", "commit_success.txt")
  deadline = time.time() + TIMEOUT
  while not os.path.exists(first):
    assert all(p.poll() is None for p in procs), "a process ended before step 4"
    assert time.time() < deadline, "no checkpoint at step 4 in time"
    time.sleep(0.05)
  for p in procs:
    p.send_signal(signal.SIGTERM)
  codes, logs = _finish(procs, tmp_path, "cut")
  assert codes == [75, 75], logs[0][-3000:] + logs[1][-3000:]
  stopped = max(_step_losses(logs[0]))
  assert stopped < STEPS  # really cut short
  codes, logs = _finish(_start(work, data_dir, tmp_path, "resumed"),
                        tmp_path, "resumed")
  assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert min(_step_losses(logs[0])) == stopped + 1  # resumed, not restarted
  got = {r["step"]: r["loss"] for r in _logged(work) if "loss" in r}
  want = {r["step"]: r["loss"] for r in _logged(ref) if "loss" in r}
  assert got == want  # every step, the ones after the cut included
  assert json.loads(logs[1].strip().splitlines()[-1]) == records[0]

  # Both final checkpoints restore in this (one-process, 8-device) test run.
  from bertjax import config_files, models, optim, sharding, state as state_lib
  config = config_files.shipped("bert").get_config("tiny")
  config.seq_len, config.max_predictions_per_seq = 32, 5
  mesh = sharding.make_mesh(config.mesh_shape)
  abstract, shardings = state_lib.state_shardings(
      models.get_model(config), optim.make_optimizer(config), config, mesh)
  states = [checkpointing.Checkpointer(w).restore(STEPS, abstract, shardings)
            for w in (ref, work)]
  for a, b in zip(jax.tree.leaves(states[0][0]), jax.tree.leaves(states[1][0])):
    assert (jax.device_get(a) == jax.device_get(b)).all()
  assert states[0][1] == states[1][1]  # process 0's data position


def test_a_sigterm_while_waiting_for_the_others_to_connect_exits_75(tmp_path):
  """SIGTERM to process 0 while it waits in jax.distributed.initialize for a
  process 1 that never comes: it stops at once, nothing written (before:
  bertjax's handler took the signal, JAX's notifier, installed at the end of
  initialize, never heard of it, and both trained to the end once process 1
  came; with none coming, initialize failed after 5 minutes)."""
  port = _free_port()
  work = tmp_path / "work"
  procs = _start(work, "", tmp_path, "init", port=port, indices=(0,))
  deadline = time.time() + TIMEOUT
  while True:  # process 0's coordinator listens: it is inside initialize
    assert procs[0].poll() is None, "process 0 ended before initialize"
    assert time.time() < deadline, "process 0 never started its coordinator"
    try:
      socket.create_connection(("localhost", port), timeout=1).close()
      break
    except OSError:
      time.sleep(0.05)
  procs[0].send_signal(signal.SIGTERM)
  try:
    procs[0].wait(timeout=TIMEOUT)
  except subprocess.TimeoutExpired:
    procs[0].kill()
    procs[0].wait()
  log = (tmp_path / "init.0.log").read_text()
  assert procs[0].returncode == 75, log[-3000:]
  assert "Preempted while this process waited for the others to connect" in log
  assert not work.exists()


def test_a_sigterm_to_a_waiting_process_stops_process_0_preparing(tmp_path):
  """With two processes JAX's notifier has SIGTERM. Process 1, waiting for
  process 0 to prepare the demo corpus, gets it: both exit 75 at once, not
  once process 0 has prepared everything (tokenizer training included), and
  nothing is left that a rerun could take for prepared."""
  work = tmp_path / "work"
  procs = _start(work, "", tmp_path, "prep")
  deadline = time.time() + TIMEOUT
  while "Preparing bertjax_python_docs" not in (tmp_path / "prep.0.log").read_text():
    assert all(p.poll() is None for p in procs), "a process ended before preparing"
    assert time.time() < deadline, "process 0 never started preparing"
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)
  codes, logs = _finish(procs, tmp_path, "prep")
  assert codes == [75, 75], logs[0][-3000:] + logs[1][-3000:]
  for log in logs:
    assert "Preempted while preparing the data (no checkpoint yet)" in log
  assert "Training a unigram tokenizer" not in logs[0]  # stopped in the parse
  assert not (work / "data" / "tokenizers").exists()
  assert not (work / "checkpoints").exists() or not os.listdir(work / "checkpoints")
