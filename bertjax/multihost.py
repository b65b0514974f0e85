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
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any, Callable

COORDINATOR = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES = "JAX_NUM_PROCESSES"
PROCESS_ID = "JAX_PROCESS_ID"


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


def initialize(flag_value: bool | None) -> None:
  """Starts ``jax.distributed`` when ``wanted(flag_value)``; before any device work."""
  if not wanted(flag_value):
    return
  kwargs = arguments()
  import jax
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


def _client():
  """JAX's coordination-service client (key-value store, barriers). JAX has
  no public accessor for it; orbax's own multi-host barriers and
  ``multihost_utils`` read the same private state."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client

# How long the other processes wait for process 0's part of process_0_first:
# preparing a large corpus takes hours. A process 0 that dies does not leave
# them waiting this long: JAX's heartbeats end them.
_WAIT_MS = 7 * 24 * 3600 * 1000
_calls = itertools.count()


def process_0_first(fn: Callable[[], Any], what: str) -> Any:
  """``fn()`` on process 0, then on every other process once process 0's ended.

  For work that writes shared files (preparing a data_dir): process 0 makes
  them while the others wait, and the others then find them made and only read
  (on hosts that do not share the directory, each makes its own afterwards).
  The wait is on JAX's coordination service, not a device collective (XLA:CPU's
  gloo collectives give up after 30 s).

  Args:
    fn: the work, the same on every process.
    what: what it does, e.g. "prepare the data", for the others' message.

  Returns:
    ``fn()``'s result on this process.

  Raises:
    ValueError: on the others, when ``fn`` failed on process 0 (its message).
  """
  import jax
  if jax.process_count() == 1:
    return fn()
  client = _client()
  key = f"bertjax/process_0_first/{next(_calls)}"
  if jax.process_index() == 0:
    try:
      result = fn()
    except BaseException as e:
      client.key_value_set(key, f"{type(e).__name__}: {e}")
      raise
    client.key_value_set(key, "")
    return result
  failure = client.blocking_key_value_get(key, _WAIT_MS)
  if failure:
    raise ValueError(f"Process 0 could not {what} ({failure}); this process "
                     "stops with it.")
  return fn()


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
  client = _client()
  key = f"bertjax/{name}/{next(_calls)}"
  _meet(lambda ms: client.wait_at_barrier(key, ms), f"the {name}")


def check_same_config(config: dict[str, Any]) -> None:
  """Refuses a run whose processes were started with different configs.

  Every process compiles its own copy of the step; with another learning rate
  or seed on one host they would run side by side and train nonsense without
  an error. Each process publishes its config on JAX's coordination service;
  process 0 compares every other's with its own, the others theirs with
  process 0's, so that each stops with the same sentence.

  Args:
    config: the run's config as a dict (``ConfigDict.to_dict()``).

  Raises:
    ValueError: naming the first field that differs, before any device work.
  """
  import jax
  if jax.process_count() == 1:
    return
  client = _client()
  call = next(_calls)
  mine = json.dumps(config, sort_keys=True, default=str)
  index = jax.process_index()
  client.key_value_set(f"bertjax/config/{call}/{index}", mine)
  others = range(1, jax.process_count()) if index == 0 else [0]
  for other in others:
    key = f"bertjax/config/{call}/{other}"
    theirs = _meet(lambda ms: client.blocking_key_value_get(key, ms),
                   "the config check")
    if theirs == mine:
      continue
    a, b = json.loads(mine), json.loads(theirs)
    field = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), "?")
    first, second = sorted((index, other))
    values = {index: a.get(field), other: b.get(field)}
    raise ValueError(
        f"Process {first} and process {second} were started with different "
        f"configs: config.{field} is {values[first]!r} on process {first} and "
        f"{values[second]!r} on process {second}; start every process with the "
        "same --config and --config.FIELD flags.")
