"""Train state and its sharded initialisation.

Initialisation never materialises an unsharded copy: the state's shapes and
logical axis names come from ``jax.eval_shape``, the rules table turns them
into shardings, and the jitted init writes each shard on its device.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.sharding import Mesh, PartitionSpec

from bertjax import sharding


@flax.struct.dataclass
class TrainState:
  """Everything the train step updates. A pytree of arrays only.

  ``carry`` is what one step hands to the next besides the parameters: a dict
  of arrays whose leading dimension is the global batch (row r's carry
  belongs to row r of the next batch), empty ``{}`` unless the model declares
  one (``model.carry_shapes``: XLNet's segment memory). It is sharded like
  the batch, checkpointed with the rest of the state, and sliced with the
  rows under gradient accumulation; the train step feeds it to the model as
  inputs of the same names and takes the next one from the model's outputs.
  """
  step: jax.Array  # int32 scalar: optimizer steps taken
  params: Any
  opt_state: Any
  carry: Any = flax.struct.field(default_factory=dict)


def carry_shapes(model: nn.Module, config) -> dict[str, jax.ShapeDtypeStruct]:
  """The model's carry for ``config.batch_size`` rows ({} for most models)."""
  declare = getattr(model, "carry_shapes", None)
  return {} if declare is None else dict(declare(int(config.batch_size)))


def empty_carry(model: nn.Module, config) -> dict[str, jax.Array]:
  """The carry before the first step: zeros (XLNet: no valid memory)."""
  return {k: jnp.zeros(s.shape, s.dtype)
          for k, s in carry_shapes(model, config).items()}


def dummy_inputs(config, batch_size: int = 1) -> dict[str, jax.Array]:
  """Model inputs of the right shapes and dtypes, for init and eval_shape."""
  shape = (batch_size, config.seq_len)
  return {
      "tokens": jnp.zeros(shape, jnp.int32),
      "segment_ids": jnp.zeros(shape, jnp.int32),
      "positions": jnp.broadcast_to(jnp.arange(config.seq_len, dtype=jnp.int32), shape),
      "doc_ids": jnp.ones(shape, jnp.int32),
      "masked_positions": jnp.zeros((batch_size, config.max_predictions_per_seq), jnp.int32),
  }


def _init_params(model: nn.Module, config, rng: jax.Array):
  """Boxed (nn.Partitioned) parameters, so that their logical names are known."""
  variables = model.init({"params": rng, "dropout": rng}, dummy_inputs(config),
                         deterministic=True)
  return variables["params"]


def state_shardings(model: nn.Module, tx: optax.GradientTransformation, config,
                    mesh: Mesh) -> tuple[TrainState, TrainState]:
  """Returns (abstract state, NamedSharding tree) of the TrainState."""
  boxed = jax.eval_shape(lambda r: _init_params(model, config, r), jax.random.key(0))
  param_specs = nn.get_partition_spec(boxed)
  abstract_params = nn.meta.unbox(boxed)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  # Optimizer moments mirror the parameters; counters and other scalars are
  # replicated.
  opt_specs = optax.tree_map_params(
      tx, lambda _, spec: spec, abstract_opt, param_specs,
      transform_non_params=lambda _: PartitionSpec(),
      is_leaf=lambda x: isinstance(x, PartitionSpec))
  abstract_carry = carry_shapes(model, config)
  specs = TrainState(step=PartitionSpec(), params=param_specs, opt_state=opt_specs,
                     carry={k: None for k in abstract_carry})
  abstract = TrainState(
      step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
      opt_state=abstract_opt, carry=abstract_carry)
  shardings = sharding.logical_to_sharding(specs, mesh)
  # The carry's rows are split over the devices like the batch's.
  return abstract, shardings.replace(
      carry={k: sharding.batch_sharding(mesh) for k in abstract_carry})


def with_carry_rows(abstract: TrainState, shardings: TrainState, rows: int,
                    mesh: Mesh) -> tuple[TrainState, TrainState]:
  """(abstract state, shardings) of ``state_shardings`` with a carry of
  ``rows`` rows, replicated: to restore a checkpoint's carry saved with
  another batch_size where it is not used (evaluation) or is empty anyway
  (an import's, at step 0). Unchanged for a model without a carry."""
  if not abstract.carry:
    return abstract, shardings
  carry = {k: jax.ShapeDtypeStruct((rows,) + a.shape[1:], a.dtype)
           for k, a in abstract.carry.items()}
  return (abstract.replace(carry=carry),
          shardings.replace(carry={k: sharding.replicated(mesh) for k in carry}))


def rescale_init(params: Any, config) -> Any:
  """Weights drawn with std ``layers.KERNEL_STDDEV`` rescaled to ``config.initializer_range``.

  Every module draws its kernels and embedding tables from a truncated normal
  of std 0.02 (BERT's); multiplying them by ``initializer_range / 0.02`` gives
  the same law with std ``initializer_range``. LayerNorm scales and biases
  are left alone. Narrow models want a larger std: at width H each residual
  branch is scaled by about ``std * sqrt(H)`` per projection, so 0.02 that
  suits H = 768 leaves a 128-wide model's sentence-level signal so weak that
  it learns nothing for hundreds of steps (configs/albert.py ``tiny``).
  """
  from bertjax.models import layers
  factor = float(config.get("initializer_range", layers.KERNEL_STDDEV)) / (
      layers.KERNEL_STDDEV)
  if factor == 1.0:
    return params

  def scale(path, leaf):
    name = str(getattr(path[-1], "key", path[-1]))
    return leaf * factor if name in ("kernel", "embedding") else leaf

  return jax.tree_util.tree_map_with_path(scale, params)


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, config,
                       mesh: Mesh) -> tuple[TrainState, TrainState]:
  """Initialises the state sharded over ``mesh``; returns (state, shardings)."""
  _, shardings = state_shardings(model, tx, config, mesh)

  def init(rng):
    params = rescale_init(nn.meta.unbox(_init_params(model, config, rng)), config)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), carry=empty_carry(model, config))

  rng = jax.random.fold_in(jax.random.key(config.seed), 0x1417)
  with sharding.use_mesh(mesh):
    state = jax.jit(init, out_shardings=shardings)(rng)
  return state, shardings


def nonfinite_leaves(tree: Any) -> list[str]:
  """Paths of the floating-point leaves of ``tree`` holding NaN or Inf.

  One jitted reduction over all leaves, one small transfer to the host; used
  on a restored TrainState before any step runs.
  """
  leaves = [(path, x) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
            if jnp.issubdtype(x.dtype, jnp.floating)]
  if not leaves:
    return []
  finite = jax.jit(lambda xs: jnp.stack([jnp.all(jnp.isfinite(x)) for x in xs]))(
      [x for _, x in leaves])
  return [jax.tree_util.keystr(path)
          for (path, _), ok in zip(leaves, jax.device_get(finite)) if not ok]
