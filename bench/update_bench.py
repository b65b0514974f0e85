r"""The optimizer update alone, under each form of the non-finite guard.

  JAX_PLATFORMS=cpu python bench/update_bench.py --config=configs/bert.py:base \
      --config.vocab_size=30522 --guards=cond,where,none --update_rounds=30

Times one jitted function per guard, interleaved: global gradient norm,
then the config's optimizer (clipping, AdamW or LAMB) on the model's full
parameter tree, params and optimizer state donated as in the train step,
with constant finite gradients. The guards:

  cond   ``guards.update_by_cond``, the train step's guard on a CPU or
         TPU: one ``lax.cond`` around the update.
  where  ``guards.update_by_select``, the train step's guard on a GPU:
         selects (``jnp.where``) over the updated and the old trees (on a
         CPU, XLA copies every donated optimizer-state buffer that the
         update writes in place while the select still reads it).
  none   the update with no guard: the floor.
  cond_optax_clip  the cond, with clipping by ``optax.clip_by_global_norm``
         (a divided copy of every gradient, and the norm computed again
         inside the cond), as before ``optim.clip_by_global_norm``.

Every form but cond_optax_clip is given the gradient norm computed for the
finiteness test, as the train step passes it on to the clipping.

Prints one JSON line: per guard the median seconds of a call and the ratio
to the first guard listed. No train step runs, so the figures are the
update's own cost, without the step's noise around it.
"""

from __future__ import annotations

# Malloc tunables as the binaries have them (bertjax/host_memory.py).
if __name__ == "__main__":
  from bertjax import host_memory
  host_memory.reexec_with_malloc_tunables()

import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(__file__))
# Importing ab_step defines the --config flag.
import ab_step  # noqa: E402
from bertjax import guards  # noqa: E402
from bertjax import models  # noqa: E402
from bertjax import optim  # noqa: E402
from bertjax import sharding  # noqa: E402
from bertjax import state as state_lib  # noqa: E402

_GUARDS = flags.DEFINE_list("guards", ["cond", "where", "none"],
                            "Guards to time; the first is the reference.")
_ROUNDS = flags.DEFINE_integer("update_rounds", 30, "Interleaved timed rounds.")


def _none(finite, tx, grads, params, opt_state, grad_norm=None):
  del finite
  updates, opt_state = tx.update(grads, opt_state, params, grad_norm=grad_norm)
  return optax.apply_updates(params, updates), opt_state


_FORMS = {"cond": guards.update_by_cond,
          "where": guards.update_by_select,
          "none": _none,
          "cond_optax_clip": guards.update_by_cond}


def _optax_clip_optimizer(config):
  """The config's optimizer with ``optax.clip_by_global_norm``."""
  saved = optim.clip_by_global_norm
  optim.clip_by_global_norm = optax.clip_by_global_norm
  try:
    return optim.make_optimizer(config)
  finally:
    optim.clip_by_global_norm = saved


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  unknown = set(_GUARDS.value) - set(_FORMS)
  if unknown:
    raise app.UsageError(f"Unknown guard(s) {sorted(unknown)}; pick from "
                         f"{', '.join(_FORMS)}.")
  config = flags.FLAGS.config
  mesh = sharding.make_mesh(config.mesh_shape)
  tx = optim.make_optimizer(config)
  state, _ = state_lib.create_train_state(models.get_model(config), tx,
                                          config, mesh)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), state.params)
  steps, boxes = {}, {}
  old_tx = _optax_clip_optimizer(config)
  for name in _GUARDS.value:
    def update(params, opt_state, grads, form=_FORMS[name],
               old=name == "cond_optax_clip"):
      norm = optax.tree.norm(grads)
      finite = jnp.isfinite(norm)
      if old:
        return form(finite, old_tx, grads, params, opt_state)
      return form(finite, tx, grads, params, opt_state, norm)
    steps[name] = jax.jit(update, donate_argnums=(0, 1))
    boxes[name] = jax.tree.map(jnp.copy, (state.params, state.opt_state))

  def run(name):
    boxes[name] = steps[name](*boxes[name], grads)
    jax.block_until_ready(boxes[name])

  for name in steps:  # compile and warm up
    run(name)
    run(name)
  times = {name: [] for name in steps}
  for _ in range(_ROUNDS.value):
    for name in steps:
      start = time.perf_counter()
      run(name)
      times[name].append(time.perf_counter() - start)
  ref = statistics.median(times[_GUARDS.value[0]])
  print(json.dumps({
      "model": f"{config.model}-{config.model_size}",
      "params": sum(x.size for x in jax.tree.leaves(state.params)),
      "rounds": _ROUNDS.value,
      "guards": {name: {"median_s": round(statistics.median(t), 4),
                        "ratio": round(statistics.median(t) / ref, 3)}
                 for name, t in times.items()}}))


if __name__ == "__main__":
  app.run(main)
