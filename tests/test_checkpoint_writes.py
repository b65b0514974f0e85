"""How orbax writes a replicated state on CPU (bertjax/checkpointing.py's
``_whole_array_writes_on_cpu``): each array whole, no slice per replica; a
jax.Array handler the user registered is left alone."""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax import monitoring

from bertjax import checkpointing
from bertjax import sharding


@pytest.fixture
def handler_kept():
  """Puts back whatever handler jax.Array had when the test began."""
  before = ocp.type_handlers.get_type_handler(jax.Array)
  yield before
  ocp.type_handlers.register_type_handler(jax.Array, before, override=True)


def _slice_compiles_of_a_save(directory, config, rows):
  """Saves arrays replicated over the 8 devices, of a shape no other test
  uses (so slicing them would compile anew); counts the slice programs
  compiled meanwhile."""
  mesh = sharding.make_mesh("8,1,1")
  state = {"a": jax.device_put(np.arange(rows * 5, dtype=np.float32).reshape(rows, 5),
                               sharding.replicated(mesh)),
           "b": jax.device_put(np.ones((rows + 8, 3), np.int32), sharding.replicated(mesh))}
  compiled = []

  def on_duration(event, secs, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiled.append(kwargs.get("fun_name", ""))

  monitoring.register_event_duration_secs_listener(on_duration)
  try:
    ckpt = checkpointing.Checkpointer(directory)
    ckpt.save(1, state, {"note": "x"}, config, "fp")
    ckpt.wait()
  finally:
    monitoring.unregister_event_duration_listener(on_duration)
  restored = ckpt._manager.restore(1, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(state)))["state"]
  for name in state:
    np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(state[name]))
  ckpt.close()
  return [name for name in compiled if "slice" in name]


def test_replicated_arrays_are_written_whole_on_cpu(tmp_path, demo_config, handler_kept):
  assert len(jax.devices()) == 8 and jax.devices()[0].platform == "cpu"

  class Mine(ocp.type_handlers.ArrayHandler):
    pass

  # A handler of the user's own (here orbax's, with its replica-parallel
  # writes) is kept: the save cuts every replicated array into a slice per
  # replica, a slice program per shape.
  mine = Mine(use_replica_parallel=True)
  ocp.type_handlers.register_type_handler(jax.Array, mine, override=True)
  assert _slice_compiles_of_a_save(str(tmp_path / "sliced"), demo_config, 8 * 97)
  assert ocp.type_handlers.get_type_handler(jax.Array) is mine
  # Orbax's own handler, as a process has it before bertjax saves, is
  # replaced by bertjax's checkpointer, and no slice is cut; the arrays read
  # back are the same both times (checked in the helper).
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(), override=True)
  assert _slice_compiles_of_a_save(str(tmp_path / "whole"), demo_config, 8 * 89) == []
  assert not isinstance(ocp.type_handlers.get_type_handler(jax.Array), Mine)
