"""Several JAX processes on one machine: the binaries' --distributed start-up,
every host's data position in the checkpoint, and one end-to-end run of two
processes of bertjax.main (gloo collectives over 2 x 4 fake CPU devices)."""

import os

import pytest

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

