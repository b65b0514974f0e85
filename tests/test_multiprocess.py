"""Several JAX processes on one machine: the binaries' --distributed start-up,
every host's data position in the checkpoint, and one end-to-end run of two
processes of bertjax.main (gloo collectives over 2 x 4 fake CPU devices)."""

import os

import jax
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


# --- process 0 first ------------------------------------------------------------

class _FakeCoordinator:
  """JAX's coordination-service client as these functions use it: a key-value store."""

  def __init__(self, values=None):
    self.values = dict(values or {})

  def key_value_set(self, key, value):
    assert key not in self.values  # JAX refuses to set a key twice
    self.values[key] = value

  def blocking_key_value_get(self, key, timeout_ms):
    assert timeout_ms > 0
    return self.values[key]  # a KeyError stands for a wait that never ends


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
  client = as_process(0)
  assert multihost.process_0_first(lambda: "made", "prepare the data") == "made"
  assert client.values == {"bertjax/process_0_first/0": ""}
  # Process 1 runs only once process 0 has said it is done (here: already).
  as_process(1, client.values)
  assert multihost.process_0_first(lambda: "read", "prepare the data") == "read"


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
