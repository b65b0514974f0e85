"""Checks a config before any device work, with errors that say what to do.

Each check raises ValueError with one sentence naming the field and the fix.
Objectives and models validate their own specialised fields when built; this
module covers the fields the loop itself relies on.
"""

from __future__ import annotations

import math

from bertjax import optim
from bertjax.data import mixture
from bertjax.models import attention
from bertjax.models import layers
from bertjax.models import sizes

_DTYPES = ("float32", "bfloat16")
_MASKING = ("static", "dynamic")
_REMAT = ("none", "full", "dots")


def _fail(field: str, value, want: str) -> None:
  raise ValueError(f"config.{field}={value!r} is invalid: {want}; set "
                   f"--config.{field}=... accordingly.")


def validate(config) -> None:
  """Range and choice checks on the loop's config fields, and a mesh_shape
  that fits the devices and divides the model's sharded dimensions."""
  if "task" in config and "objective" not in config:
    raise ValueError(
        "This is a fine-tuning config (configs/finetune.py), not a "
        "pretraining one; run it with python -m bertjax.finetune "
        "--config=... --init=<pretrained workdir>, or pass a pretraining "
        "config such as --config=configs/bert.py:tiny.")
  sizes.resolve(config)
  # XLNet (configs/xlnet.py) masks nothing and has no mask_rate.
  if "mask_rate" in config and not 0.0 < config.mask_rate < 1.0:
    _fail("mask_rate", config.mask_rate, "it must lie strictly between 0 and 1")
  if config.masking not in _MASKING:
    _fail("masking", config.masking, f"it must be one of {', '.join(_MASKING)}")
  if config.dupe_factor < 1:
    _fail("dupe_factor", config.dupe_factor, "it must be at least 1")
  layers.numerics(config)  # layer_norm_eps and hidden_act
  if not config.get("initializer_range", 0.02) > 0:
    _fail("initializer_range", config.initializer_range, "it must be positive")
  if config.get("optimizer", "adamw") not in optim.OPTIMIZERS:
    _fail("optimizer", config.optimizer,
          f"it must be one of {', '.join(optim.OPTIMIZERS)}")
  if config.dtype not in _DTYPES:
    _fail("dtype", config.dtype, f"it must be one of {', '.join(_DTYPES)}")
  if not 8 <= config.seq_len <= config.max_position_embeddings:
    _fail("seq_len", config.seq_len,
          f"it must be between 8 and max_position_embeddings "
          f"({config.max_position_embeddings}), the size of the position table")
  if not 1 <= config.max_predictions_per_seq <= config.seq_len:
    _fail("max_predictions_per_seq", config.max_predictions_per_seq,
          f"it must be between 1 and seq_len ({config.seq_len})")
  for field in ("batch_size", "log_every_steps", "checkpoint_every_steps",
                "keep_checkpoints", "vocab_size"):
    if int(config[field]) < 1:
      _fail(field, config[field], "it must be a positive integer")
  if config.num_train_steps < 0:
    _fail("num_train_steps", config.num_train_steps, "it must not be negative")
  if config.warmup_steps < 0:
    _fail("warmup_steps", config.warmup_steps, "it must not be negative")
  if config.learning_rate <= 0:
    _fail("learning_rate", config.learning_rate, "it must be positive")
  if int(config.get("microbatches", 1)) < 1:
    _fail("microbatches", config.microbatches, "it must be a positive integer")
  if config.get("remat", "none") not in _REMAT:
    _fail("remat", config.remat, f"it must be one of {', '.join(_REMAT)}")
  attention.check_config(config)
  mixture.parse(config)  # its entries, before any data is read
  import jax
  from bertjax import sharding
  shape = dict(zip(sharding.MESH_AXES, sharding.parse_mesh_shape(
      config.mesh_shape, jax.device_count())))
  check_sharded_dims(config, shape)
  # Before any data is prepared: the same check as check_mesh, on the shape.
  _check_batch(config, shape["data"] * shape["fsdp"], shape)


# The config field behind each logical parameter axis, to name it in errors.
_AXIS_FIELDS = {"heads": "num_heads", "mlp": "mlp_dim", "vocab": "vocab_size",
                "embed": "hidden_size"}


def param_dims(config) -> dict[str, set[int]]:
  """The sizes each logical axis name takes in the model's parameters.

  Read from ``jax.eval_shape`` of the model's init: nothing is allocated.
  """
  import jax
  from flax import linen as nn
  from jax.sharding import PartitionSpec
  from bertjax import models
  from bertjax import state as state_lib
  model = models.get_model(config)
  rng = jax.random.key(0)
  boxed = jax.eval_shape(lambda: model.init(
      {"params": rng, "dropout": rng}, state_lib.dummy_inputs(config),
      deterministic=True)["params"])
  dims: dict[str, set[int]] = {}

  def collect(spec, leaf):
    for name, size in zip(spec, leaf.shape):
      if isinstance(name, str):
        dims.setdefault(name, set()).add(int(size))

  jax.tree_util.tree_map(collect, nn.get_partition_spec(boxed),
                         nn.meta.unbox(boxed),
                         is_leaf=lambda x: isinstance(x, PartitionSpec))
  return dims


def check_sharded_dims(config, mesh_shape: dict[str, int]) -> None:
  """Each parameter dimension the rules table splits over a mesh axis must be
  divisible by that axis's size (XLA refuses uneven parameter shardings).

  Args:
    config: the run's config.
    mesh_shape: mesh axis name -> size, resolved against the device count.
  """
  from bertjax import sharding
  split = {}  # mesh axes -> logical names they split
  for logical, axes in sharding.LOGICAL_RULES:
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    if axes and math.prod(mesh_shape[a] for a in axes) > 1:
      split.setdefault(axes, []).append(logical)
  if not split:
    return  # the common case: nothing is split, no need to trace the model
  dims = param_dims(config)
  devices = math.prod(mesh_shape.values())
  for axes, logicals in split.items():
    size = math.prod(mesh_shape[a] for a in axes)
    on_axis = [(name, d) for name in logicals for d in sorted(dims.get(name, ()))]
    bad = [(name, d) for name, d in on_axis if d % size]
    if not bad:
      continue
    good = [str(s) for s in range(1, devices + 1) if not devices % s and all(
        not d % s for _, d in on_axis)]
    what = " and ".join(f"{_AXIS_FIELDS.get(name, name)}={d} (logical axis "
                        f"{name!r})" for name, d in bad)
    axis = "x".join(axes)
    example = ""
    if len(axes) == 1 and axes[0] != "data":
      shape = {**mesh_shape, axes[0]: int(good[-1]), "data": -1}
      example = (", e.g. --config.mesh_shape="
                 + ",".join(str(shape[a]) for a in sharding.MESH_AXES))
    raise ValueError(
        f"config.mesh_shape={config.mesh_shape!r} splits {what} over {size} "
        f"devices on the {axis} axis, whose size must divide "
        f"{'it' if len(bad) == 1 else 'each'}; use a {axis} size "
        f"of {' or '.join(good)}{example}.")


def check_mesh(config, mesh) -> None:
  """The global batch must split evenly over the mesh's batch axes."""
  from bertjax import sharding
  _check_batch(config, sharding.batch_parallelism(mesh), dict(mesh.shape))


def _check_batch(config, ways: int, mesh_shape: dict[str, int]) -> None:
  import jax
  micro = int(config.get("microbatches", 1))
  if config.batch_size % (ways * micro) or config.batch_size % jax.process_count():
    _fail("batch_size", config.batch_size,
          f"the global batch must be divisible by microbatches ({micro}) times "
          f"the {ways} data-parallel devices (mesh {mesh_shape}), and by "
          f"the {jax.process_count()} hosts")


def check_prepared(config, prepared) -> None:
  """The prepared tokenizer must match the config's vocabulary size."""
  if prepared.vocab_size != config.vocab_size:
    raise ValueError(
        f"The tokenizer in {prepared.data_dir} has {prepared.vocab_size} tokens but "
        f"config.vocab_size is {config.vocab_size}; pass "
        f"--config.vocab_size={prepared.vocab_size} or a new --config.data_dir.")
  for split in (config.train_split, config.eval_split):
    if split not in prepared.splits:
      raise ValueError(
          f"The prepared data has no split {split!r} (it has "
          f"{', '.join(prepared.splits)}); set --config.train_split / "
          "--config.eval_split to one of those.")
