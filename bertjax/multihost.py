"""Starting JAX's multi-process runtime for the binaries (``--distributed``).

On a Cloud TPU slice (and under SLURM, Open MPI or a Kubernetes JobSet)
``jax.distributed.initialize()`` finds the coordinator, the number of processes
and this process's index by itself. Anywhere else -- several processes of one
machine, GPU hosts without a cluster manager -- JAX reads only
``JAX_COORDINATOR_ADDRESS`` from the environment, and fails with "Number of
processes must be defined". So the binaries also read two variables of their
own and pass them on:

  JAX_COORDINATOR_ADDRESS=host0:12355  # process 0's host and a free port
  JAX_NUM_PROCESSES=2                  # processes in the run
  JAX_PROCESS_ID=0                     # this process, 0 .. JAX_NUM_PROCESSES-1

Each is passed only when set; what is unset is left to JAX's detection.

A process that has not connected to the others within
``BERTJAX_CONNECT_TIMEOUT`` seconds (default 300, JAX's own wait) ends with
one line saying which side is missing (``NotConnected``): nothing listening
at the coordinator's address, or processes that never came. JAX itself
would abort the process with a C++ stack trace that blames "another task".
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from typing import Any, Callable

from bertjax import paths

COORDINATOR = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES = "JAX_NUM_PROCESSES"
PROCESS_ID = "JAX_PROCESS_ID"
CONNECT_TIMEOUT = "BERTJAX_CONNECT_TIMEOUT"
# JAX aborts a process that has not connected after its initialization_timeout;
# bertjax's own deadline must come first, so JAX is given this much longer.
_JAX_GRACE_S = 60


def wanted(flag_value: bool | None) -> bool:
  """Whether to start the multi-process runtime.

  Args:
    flag_value: ``--distributed`` (None when not given).

  Returns:
    The flag when given; otherwise True when ``JAX_COORDINATOR_ADDRESS`` is set
    or ``TPU_WORKER_HOSTNAMES`` lists several hosts.
  """
  if flag_value is not None:
    return flag_value
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",")
  real_hosts = len(hosts) > 1 and all(h and " " not in h for h in hosts)
  return bool(os.environ.get(COORDINATOR)) or real_hosts


def _env_int(environ, name: str) -> int | None:
  value = environ.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"{name}={value!r} is not a whole number; set it to an "
                     f"integer, e.g. {name}=2.") from None


def arguments(environ=None) -> dict:
  """The keyword arguments for ``jax.distributed.initialize`` from the environment.

  Raises:
    ValueError: one sentence when the variables contradict each other, before
      JAX is asked to connect (a wrong index would otherwise wait for the
      coordinator until JAX's timeout).
  """
  environ = os.environ if environ is None else environ
  count, index = _env_int(environ, NUM_PROCESSES), _env_int(environ, PROCESS_ID)
  if (count is None) != (index is None):
    given, missing = ((NUM_PROCESSES, PROCESS_ID) if index is None
                      else (PROCESS_ID, NUM_PROCESSES))
    raise ValueError(f"{given} is set but {missing} is not; set both (or neither, "
                     "on a TPU slice or a cluster JAX detects).")
  if count is not None:
    if count < 1:
      raise ValueError(f"{NUM_PROCESSES}={count} must be at least 1.")
    if not 0 <= index < count:
      raise ValueError(f"{PROCESS_ID}={index} is outside 0..{count - 1} "
                       f"({NUM_PROCESSES}={count}); give each process its own "
                       "index in that range.")
    if not environ.get(COORDINATOR):
      raise ValueError(f"{NUM_PROCESSES} and {PROCESS_ID} are set but "
                       f"{COORDINATOR} is not; set it to process 0's host and a "
                       f"free port, e.g. {COORDINATOR}=localhost:12355.")
  kwargs = {}
  if count is not None:
    kwargs.update(num_processes=count, process_id=index)
  return kwargs


class StoppedWhileConnecting(Exception):
  """``stop()`` became true before this process had connected to the others."""


class NotConnected(Exception):
  """The processes did not all connect within ``BERTJAX_CONNECT_TIMEOUT``; the
  message says what to fix. JAX's connect still waits in its thread: the
  process must end at once (``os._exit``)."""


def connect_timeout(environ=None) -> float:
  """Seconds to wait for the other processes (``BERTJAX_CONNECT_TIMEOUT``)."""
  environ = os.environ if environ is None else environ
  value = environ.get(CONNECT_TIMEOUT, "").strip()
  if not value:
    return 300.0
  try:
    seconds = float(value)
  except ValueError:
    seconds = float("nan")
  if not 0 < seconds < float("inf"):
    raise ValueError(f"{CONNECT_TIMEOUT}={value!r} is not a positive number of "
                     f"seconds; set it to e.g. {CONNECT_TIMEOUT}=600.")
  return seconds


def _reachable(address: str) -> bool:
  """Whether something accepts TCP connections at ``host:port``."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
      return True
  except (OSError, ValueError):
    return False


def _not_connected(kwargs: dict, waited: float, environ=None) -> str:
  """What ``NotConnected`` says: which side is missing, and the fix."""
  environ = os.environ if environ is None else environ
  count, index = kwargs.get("num_processes"), kwargs.get("process_id")
  who = "This process" if index is None else f"Process {index} of {count}"
  address = environ.get(COORDINATOR)
  longer = f"or give them longer with {CONNECT_TIMEOUT}=SECONDS"
  if address and index != 0 and not _reachable(address):
    return (f"{who} found nothing listening at the coordinator's address {address} "
            f"({COORDINATOR}) in {waited:g} s; start process 0 on that host, check "
            f"the address and that its port is open between the hosts, {longer}.")
  if not address:  # a TPU slice or a cluster JAX detected
    return (f"{who} waited {waited:g} s for the other hosts to connect and not all "
            "did; start the same command on every host of the slice or job "
            f"(`python -m launch.tpu` does on a TPU slice), {longer}.")
  count_text = f"all {count}" if count else "all the"
  return (f"{who} waited {waited:g} s for the other processes to connect to the "
          f"coordinator at {address} and not all did; start {count_text} processes "
          f"with the same {COORDINATOR} and {NUM_PROCESSES}, each with its own "
          f"{PROCESS_ID}, {longer}.")


def initialize(flag_value: bool | None,
               stop: Callable[[], bool] | None = None) -> None:
  """Starts ``jax.distributed`` when ``wanted(flag_value)``; before any device work.

  Args:
    flag_value: ``--distributed`` (None when not given).
    stop: when given, asked every 0.1 s while this process waits for the
      others to connect: a process told to stop (SIGTERM) is not kept there.

  The wait goes on in a thread that cannot be cancelled: after either
  exception the caller must end the process at once (``os._exit``), without
  interpreter shutdown.

  Raises:
    StoppedWhileConnecting: ``stop()`` was true before the connection.
    NotConnected: not connected within ``connect_timeout()`` seconds.
  """
  if not wanted(flag_value):
    return
  kwargs = arguments()
  timeout = connect_timeout()
  kwargs["initialization_timeout"] = int(timeout) + _JAX_GRACE_S
  import jax

  def connect():
    try:
      jax.distributed.initialize(**kwargs)
    except ValueError as e:
      if "Number of processes must be defined" in str(e) or (
          "coordinator_address should be defined" in str(e)):
        raise ValueError(
            "--distributed found no TPU slice or cluster that tells JAX the "
            f"processes; set {COORDINATOR}=HOST:PORT (process 0's), "
            f"{NUM_PROCESSES}=N and {PROCESS_ID}=0..N-1 on each process.") from e
      raise

  import threading
  outcome = []

  def connect_in_thread():
    try:
      connect()
      outcome.append(None)
    except BaseException as e:  # noqa: BLE001 — raised again below, in the caller's thread
      outcome.append(e)

  # JAX's connect holds no GIL while it waits, so this thread runs Python
  # signal handlers (bertjax's SIGTERM handler) and asks ``stop``.
  thread = threading.Thread(target=connect_in_thread, daemon=True,
                            name="jax.distributed.initialize")
  thread.start()
  deadline = time.monotonic() + timeout
  while thread.is_alive():
    if stop is not None and stop():
      raise StoppedWhileConnecting
    if time.monotonic() > deadline:
      raise NotConnected(_not_connected(kwargs, timeout))
    thread.join(0.1)
  if outcome and outcome[0] is not None:
    raise outcome[0]


def gather_json(value: Any) -> list[Any]:
  """Every process's ``value`` (JSON-serialisable), in process order.

  A collective: every process must call it at the same point. With one process
  it returns ``[value]`` without touching a device.
  """
  import jax
  if jax.process_count() == 1:
    return [value]
  import numpy as np
  from jax.experimental import multihost_utils
  blob = np.frombuffer(json.dumps(value).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(
      np.array([blob.size], np.int32))).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:blob.size] = blob
  rows = np.asarray(multihost_utils.process_allgather(padded))
  return [json.loads(row[:int(n)].tobytes().decode()) for row, n in zip(rows, sizes)]


def coordination_client():
  """JAX's coordination-service client (key-value store, barriers). JAX has
  no public accessor for it; orbax's own multi-host barriers and
  ``multihost_utils`` read the same private state."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def try_get(client, key: str) -> str | None:
  """The value of ``key`` on the coordination service, or None if unset."""
  try:
    return client.key_value_try_get(key)
  except Exception as e:  # noqa: BLE001 — jax's runtime error, its kind in the text
    if "NOT_FOUND" in str(e):
      return None
    raise


_calls = itertools.count()
# A process's outcome in ``process_0_first`` when a preemption notice stopped it.
_STOPPED = "stopped by a preemption notice"
_POLL_S = 0.5


def process_0_first(fn: Callable[[], Any], what: str) -> Any:
  """``fn()`` on process 0, then on every other process once process 0's ended.

  For work that writes shared files (preparing a data_dir): process 0 makes
  them while the others wait, and the others then find them made and only read
  (on hosts that do not share the directory, each makes its own afterwards).
  The wait is on JAX's coordination service, not a device collective (XLA:CPU's
  gloo collectives give up after 30 s), polled, so that a preemption notice
  reaches a waiting process (``guards.sigterm_raises``; a process 0 that dies
  ends the others through JAX's heartbeats).

  Every process publishes how its part ended, and returns only once every
  other one has ended its part well: all go on, or all stop. One stopped by a
  notice (``guards.Terminated``) stops the others the same way, even one that
  had finished when the notice came; a notice after that is left to the
  train loop's sync point (``guards.finish_on_sigterm``).

  Args:
    fn: the work, the same on every process.
    what: what it does, e.g. "prepare the data", for the others' message.

  Returns:
    ``fn()``'s result on this process.

  Raises:
    guards.Terminated: a preemption notice stopped this or another process.
    ValueError: when ``fn`` failed on another process (its message).
  """
  import jax
  from bertjax import guards
  if jax.process_count() == 1:
    return fn()
  client = coordination_client()
  prefix = f"bertjax/process_0_first/{next(_calls)}"
  index = jax.process_index()

  def outcome_of(other: int) -> None:
    """Waits for process ``other``'s part; raises as it ended, if not well."""
    key = f"{prefix}/{other}"
    while (outcome := try_get(client, key)) is None:
      time.sleep(_POLL_S)
    if outcome == _STOPPED:
      raise guards.Terminated
    if outcome:
      raise ValueError(f"Process {other} could not {what} ({outcome}); this "
                       "process stops with it.")

  mine = f"{prefix}/{index}"
  try:
    if index != 0:
      outcome_of(0)  # process 0's failure needs no word from this one
  except guards.Terminated:
    client.key_value_set(mine, _STOPPED)
    raise
  try:
    result = fn()
    guards.finish_on_sigterm()  # from here on this process has done its part
  except guards.Terminated:
    client.key_value_set(mine, _STOPPED)
    raise
  except BaseException as e:
    client.key_value_set(mine, f"{type(e).__name__}: {e}")
    raise
  client.key_value_set(mine, "")
  for other in range(1 if index == 0 else 0, jax.process_count()):
    if other != index:
      outcome_of(other)
  return result


# How long a process waits for the others at a point they all reach within
# minutes of each other (the config check at the start, the first step). One
# that stopped with an error ended cleanly, which JAX's heartbeats do not
# report: without a limit the others would wait for it for ever.
_MEET_MS = 30 * 60 * 1000


def _meet(wait: Callable[[int], Any], what: str) -> Any:
  """``wait(timeout_ms)``, a wait on the coordination service for every process."""
  try:
    return wait(_MEET_MS)
  except Exception as e:  # noqa: BLE001 — jax's runtime error, its kind in the text
    if "DEADLINE_EXCEEDED" not in str(e):
      raise
    raise RuntimeError(
        f"Not every process reached {what} within {_MEET_MS // 60000} minutes: "
        "one has probably stopped with an error; see every process's log, "
        "then start them all again.") from e


def barrier(name: str) -> None:
  """Waits until every process has reached ``name``, on JAX's coordination service.

  Before the first step: the hosts reach it at different times (a restore or
  a compile that takes longer on one), and XLA:CPU's gloo collectives give up
  on a peer that comes more than 30 s after the first; the compiles that follow
  the barrier take about as long on every host.
  """
  import jax
  if jax.process_count() == 1:
    return
  client = coordination_client()
  key = f"bertjax/{name}/{next(_calls)}"
  _meet(lambda ms: client.wait_at_barrier(key, ms), f"the {name}")


# How to fix a difference in each argument of ``check_same_run``.
_ARGUMENT_FIXES = {
    "workdir": "start every process with the same --workdir, one that every "
               "host reaches (a gs:// bucket or a shared file system)",
    "data_dir": "start every process with the same --config.data_dir, absolute "
                "or gs:// (a relative one is read from each process's working "
                "directory)",
    "step": "start every process with the same --step",
}


# Config fields that hold paths (comma-separated where several), each read
# from the process's own working directory when relative: compared as the
# path layer makes them absolute on each host, as the workdir is, so that one
# relative path started from two directories is refused (the hosts would read
# different files) and two spellings of one absolute path are not.
_PATH_FIELDS = ("text_files", "tokenizer_path", "hf_kept_tensors", "tfds_data_dir",
                "ernie_gazetteer", "train_files", "eval_files", "predict_files")


def _absolute_list(text: str) -> str:
  """'a.txt, /x/../b/*.txt' -> '/cwd/a.txt,/b/*.txt' (URLs kept as given)."""
  return ",".join(paths.absolute(p.strip()) if p.strip() else "" for p in text.split(","))


def comparable(config: dict[str, Any]) -> dict[str, Any]:
  """``config`` with its path fields, and the ``text_files=`` options of its
  ``mixture`` entries, made absolute as this process reads them."""
  out = dict(config)
  for name in _PATH_FIELDS:
    if isinstance(out.get(name), str) and out[name]:
      out[name] = _absolute_list(out[name])
  if isinstance(out.get("mixture"), str) and out["mixture"].strip():
    out["mixture"] = "; ".join(
        " ".join("text_files=" + _absolute_list(option.partition("=")[2])
                 if option.startswith("text_files=") else option
                 for option in entry.split())
        for entry in out["mixture"].split(";"))
  return out


def _difference(mine: dict, theirs: dict, index: int, other: int) -> str | None:
  """The sentence naming the first argument, then config field, that differs
  between process ``index`` (``mine``) and ``other`` (``theirs``), or None."""
  first, second = sorted((index, other))
  for name in mine["args"]:  # in the caller's order: the workdir first
    values = {index: mine["args"][name], other: theirs["args"].get(name)}
    if values[index] != values[other]:
      fix = _ARGUMENT_FIXES.get(name, f"give every process the same {name}")
      return (f"Process {first} and process {second} were started with "
              f"different {name}s: {values[first]!r} on process {first} and "
              f"{values[second]!r} on process {second}; {fix}.")
  a, b = mine["config"], theirs["config"]
  field = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), None)
  if field is None:
    return None
  values = {index: a.get(field), other: b.get(field)}
  fix = ("start every process with the same --config and --config.FIELD flags"
         if field not in _PATH_FIELDS + ("mixture",) else
         f"give every process the same config.{field}, with absolute or gs:// "
         "paths (a relative one is read from each process's working directory)")
  return (f"Process {first} and process {second} were started with different "
          f"configs: config.{field} is {values[first]!r} on process {first} and "
          f"{values[second]!r} on process {second}; {fix}.")


def check_same_run(config: dict[str, Any], args: dict[str, Any],
                   signalled: bool) -> list[int]:
  """Refuses a run whose processes were started with different configs or
  arguments; says which processes got SIGTERM while they started.

  Every process compiles its own copy of the step; with another learning rate
  or seed on one host they would run side by side and train nonsense without
  an error, and with another workdir each would write its own checkpoints (or
  one the shared ones, another a local copy) without a word. Each process
  publishes what it was given on JAX's coordination service; process 0
  compares every other's with its own and publishes the verdict, which every
  process follows, so all stop with the same sentence or all go on.

  A SIGTERM that reached a process before ``jax.distributed.initialize`` had
  installed JAX's preemption notifier (after the process connected: before,
  ``initialize``'s ``stop`` ends it) was taken by bertjax's own handler
  (``guards.catch_sigterm``), and JAX's notifier never hears of it: the
  verdict carries it to every process, so that all stop before the first step.

  Args:
    config: the run's config as a dict (``ConfigDict.to_dict()``); its path
      fields are compared made absolute on this host (``comparable``).
    args: the run's other arguments that every process must share, by flag
      name, e.g. ``{"workdir": ...}``: paths as the path layer normalised them
      on this host (``paths.absolute``; local symlinks are not resolved, one
      host's file system says nothing about another's).
    signalled: whether this process got SIGTERM before the exchange.

  Returns:
    The processes that got SIGTERM before the exchange, the same list on
    every process ([] to go on; always [] with one process).

  Raises:
    ValueError: naming the first config field or argument that differs and
      its value on both processes, before any device work.
  """
  import jax
  if jax.process_count() == 1:
    return []
  client = coordination_client()
  call = next(_calls)
  index = jax.process_index()
  # The config's data_dir is compared as the caller resolved it, in ``args``.
  # Path fields as this host resolves them (``comparable``).
  config = {k: v for k, v in comparable(config).items() if k not in args}
  mine = {"config": json.loads(json.dumps(config, sort_keys=True, default=str)),
          "args": args, "signalled": bool(signalled)}
  client.key_value_set(f"bertjax/run/{call}/{index}", json.dumps(mine, default=str))
  verdict_key = f"bertjax/run/{call}/verdict"
  if index == 0:
    verdict = {"error": None, "signalled": [0] if signalled else []}
    for other in range(1, jax.process_count()):
      key = f"bertjax/run/{call}/{other}"
      theirs = json.loads(_meet(lambda ms: client.blocking_key_value_get(key, ms),
                                "the config check"))
      if theirs["signalled"]:
        verdict["signalled"].append(other)
      if verdict["error"] is None:
        verdict["error"] = _difference(mine, theirs, 0, other)
    client.key_value_set(verdict_key, json.dumps(verdict))
  else:
    verdict = json.loads(_meet(
        lambda ms: client.blocking_key_value_get(verdict_key, ms),
        "the config check"))
  if verdict["error"]:
    raise ValueError(verdict["error"])
  return verdict["signalled"]
