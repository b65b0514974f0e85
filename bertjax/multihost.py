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

import os

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

