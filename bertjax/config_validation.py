"""Checks a config before any device work, with errors that say what to do.

Each check raises ValueError with one sentence naming the field and the fix.
Objectives and models validate their own specialised fields when built; this
module covers the fields the loop itself relies on.
"""

from __future__ import annotations

import math
import os

import numpy as np
from absl import logging

from bertjax import optim
from bertjax.data import mixture
from bertjax.data import packing
from bertjax.models import attention
from bertjax.models import layers
from bertjax.models import sizes

_DTYPES = ("float32", "bfloat16")
_MASKING = ("static", "dynamic")
_REMAT = ("none", "full", "dots")


def _fail(field: str, value, want: str) -> None:
  raise ValueError(f"config.{field}={value!r} is invalid: {want}; set "
                   f"--config.{field}=... accordingly.")


def slot_shortfall(config) -> str | None:
  """A warning when ``max_predictions_per_seq`` cannot hold the tokens
  ``mask_rate`` chooses in a full row (masking is then capped at the slots:
  e.g. a 512-token row with the 20 slots meant for 128 is masked at 3.9%),
  else None. BERT's own 20 slots for 128 tokens (15% is 19.2) pass."""
  if "mask_rate" not in config or "partial_prediction_k" in config:
    return None
  slots, seq_len = int(config.max_predictions_per_seq), int(config.seq_len)
  want = math.floor(float(config.mask_rate) * seq_len)
  if not 1 <= slots < want:
    return None
  return (f"max_predictions_per_seq={slots} holds {100 * slots / seq_len:.1f}% of a "
          f"{seq_len}-token row, fewer than the {want} tokens mask_rate="
          f"{config.mask_rate:g} chooses: full rows are masked at that lower rate; "
          f"set --config.max_predictions_per_seq={math.ceil(config.mask_rate * seq_len)} "
          "to mask at mask_rate.")


def warmup_shortfall(config) -> str | None:
  """A warning when the run ends before its warmup does (the learning rate
  never reaches its peak, e.g. BERT-base's 10,000 warmup steps left in a
  1,000-step run), else None."""
  steps, warmup = int(config.num_train_steps), int(config.warmup_steps)
  if not 0 < steps < warmup:
    return None
  return (f"warmup_steps={warmup} is longer than the run (num_train_steps="
          f"{steps}): the learning rate rises to only {steps / warmup:.0%} of "
          f"learning_rate={config.learning_rate:g} and never decays; set "
          f"--config.warmup_steps below {steps}, e.g. "
          f"--config.warmup_steps={max(steps // 10, 1)}.")


def validate(config, *, variant: bool = True, devices: int | None = None,
             hosts: int | None = None) -> None:
  """Range and choice checks on the loop's config fields, and a mesh_shape
  that fits the devices and divides the model's sharded dimensions; with
  ``variant``, the objective's and model's own fields too (``check_variant``;
  training runs that after comparing the config with the workdir's).
  ``devices`` and ``hosts`` (default: JAX's) check it for another machine,
  e.g. the TPU slice the launcher is about to create."""
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
  if not 0 < config.get("initializer_range", 0.02) < math.inf:
    _fail("initializer_range", config.initializer_range,
          "it must be a positive number")
  if config.get("optimizer", "adamw") not in optim.OPTIMIZERS:
    _fail("optimizer", config.optimizer,
          f"it must be one of {', '.join(optim.OPTIMIZERS)}")
  if config.dtype not in _DTYPES:
    _fail("dtype", config.dtype, f"it must be one of {', '.join(_DTYPES)}")
  _check_seq_len(config)
  if not 1 <= config.max_predictions_per_seq <= config.seq_len:
    # What the shipped configs give: XLNet 1/K of the row, the others the
    # masked share of it (an import's slots follow its 512 positions, so a
    # shorter --config.seq_len needs fewer).
    if "partial_prediction_k" in config:
      slots = -(-config.seq_len // max(1, int(config.partial_prediction_k)))
    else:
      slots = math.ceil(float(config.get("mask_rate", 0.15)) * config.seq_len)
    slots = min(max(1, slots), config.seq_len)
    raise ValueError(
        f"config.max_predictions_per_seq={config.max_predictions_per_seq!r} is "
        f"invalid: it must be between 1 and seq_len ({config.seq_len}); set "
        f"--config.max_predictions_per_seq={slots} (enough for the masked "
        "share of seq_len) or another value in that range.")
  shortfall = slot_shortfall(config)
  if shortfall:
    logging.warning("%s", shortfall)
  for field in ("batch_size", "log_every_steps", "checkpoint_every_steps",
                "keep_checkpoints", "vocab_size", "max_position_embeddings"):
    if int(config[field]) < 1:
      _fail(field, config[field], "it must be a positive integer")
  if int(config.get("type_vocab_size", 2)) < 0:
    _fail("type_vocab_size", config.type_vocab_size,
          "it must be 0 (no segment table), 1 (one segment) or more")
  if config.num_train_steps < 0:
    _fail("num_train_steps", config.num_train_steps, "it must not be negative")
  if config.warmup_steps < 0:
    _fail("warmup_steps", config.warmup_steps, "it must not be negative")
  short = warmup_shortfall(config)
  if short:
    logging.warning("%s", short)
  if not 0 < config.learning_rate < math.inf:  # also refuses NaN
    _fail("learning_rate", config.learning_rate, "it must be a positive number")
  check_optimizer_numbers(config)
  for field in ("eval_every_steps", "eval_max_batches"):
    if field in config and not int(config[field]) >= 0:
      _fail(field, config[field], "it must not be negative")
  check_seeds(config)
  if "shuffle_window" in config and int(config.shuffle_window) < 1:
    _fail("shuffle_window", config.shuffle_window,
          "it must be a positive integer (1 reads the examples in order)")
  if devices is None and hosts is None:  # this host trains (not a launcher's)
    _check_shuffle_memory(config)
  if ("short_seq_prob" in config
      and not 0.0 <= float(config.short_seq_prob) <= 1.0):
    _fail("short_seq_prob", config.short_seq_prob,
          "it is a probability and must lie in [0, 1]")
  _check_layout(config)
  if "pair_chunking" in config and config.pair_chunking not in packing.PAIR_CHUNKING:
    _fail("pair_chunking", config.pair_chunking,  # refused when the first row was packed
          f"it must be one of {', '.join(packing.PAIR_CHUNKING)}")
  if config.get("pair_separators", 1) not in (1, 2):  # data/packing.py
    _fail("pair_separators", config.pair_separators,
          "a sentence pair has 1 ([CLS] A [SEP] B) or 2 (RoBERTa's <s> A </s></s> B) "
          "separators between its segments")
  check_guards(config)
  if int(config.get("microbatches", 1)) < 1:
    _fail("microbatches", config.microbatches, "it must be a positive integer")
  if config.get("remat", "none") not in _REMAT:
    _fail("remat", config.remat, f"it must be one of {', '.join(_REMAT)}")
  attention.check_config(config)
  if variant:
    check_variant(config)
  mixture.parse(config)  # its entries, before any data is read
  _check_text_files(config)
  # prepare's own fields (block size, workers, the tokenizer's sample and
  # threads), which prepare refused only after the workdir was locked.
  from bertjax.data import prepare
  prepare.engine_of(config)
  import jax
  from bertjax import sharding
  shape = dict(zip(sharding.MESH_AXES, sharding.parse_mesh_shape(
      config.mesh_shape, jax.device_count() if devices is None else devices)))
  check_sharded_dims(config, shape)
  # Before any data is prepared: the same check as check_mesh, on the shape.
  _check_batch(config, shape["data"] * shape["fsdp"], shape, hosts)


def _check_layout(config) -> None:
  """A known packing layout (with an objective that takes any, an unknown one
  failed when the first row was packed, after the workdir was written), and
  for ``sentence_pairs`` the ``short_seq_prob`` it draws pair lengths with:
  configs that train on single segments (RoBERTa, SpanBERT, DeBERTa, XLNet)
  drop it, and the pipeline failed with an AttributeError traceback."""
  names = list(packing.LAYOUTS) + list(packing.CROSS_DOCUMENT_LAYOUTS)
  layout = config.get("layout")
  if layout not in names:
    _fail("layout", layout, f"it must be one of {', '.join(names)}")
  if layout == "sentence_pairs" and "short_seq_prob" not in config:
    others = ", ".join(n for n in names if n != layout)
    raise ValueError(
        "config.layout='sentence_pairs' needs the field short_seq_prob (the "
        "share of pairs packed shorter), which this config does not have: its "
        f"system trains on single segments; set --config.layout to one of "
        f"{others}, or start from a config of sentence pairs such as "
        f"--config=configs/bert.py:{config.get('model_size', 'tiny')}.")


def _check_text_files(config) -> None:
  """``text_files`` is read by the bertjax_local_text dataset only (and is a
  default of a mixture's entries): with another dataset it was ignored, and
  the run trained on that dataset (the demo corpus by default) instead."""
  files = str(config.get("text_files", "") or "")
  dataset = str(config.get("dataset", ""))
  if (not files or config.get("mixture", "")
      or dataset.partition("/")[0] == "bertjax_local_text"):
    return
  raise ValueError(
      f"config.text_files={files!r} is read only by the dataset "
      f"bertjax_local_text, but config.dataset is {dataset!r}, which the run "
      "would train on instead; set --config.dataset=bertjax_local_text (or "
      "bertjax_local_text/paragraphs) to train on the files, or "
      "--config.text_files='' to train on that dataset.")


def _check_seq_len(config) -> None:
  """At least 8 tokens; at most the absolute position table's rows where the
  model has one. XLNet and DeBERTa without absolute positions have none:
  their rows are bounded by memory alone (attention is [seq_len, seq_len])."""
  from bertjax import models
  rows = models.position_table_rows(config)
  if rows is None:
    if config.seq_len < 8:
      _fail("seq_len", config.seq_len,
            f"it must be at least 8 (model {config.model!r} has no absolute "
            "position table, so max_position_embeddings does not bound it)")
  elif not 8 <= config.seq_len <= rows:
    _fail("seq_len", config.seq_len,
          f"it must be between 8 and max_position_embeddings "
          f"({rows}), the size of the position table")


def _check_shuffle_memory(config) -> None:
  """The training pipeline fills its shuffle window, ``shuffle_window`` packed
  rows held in host memory, before it emits the first (data/pipeline.py): a
  window that cannot fit filled for ever (10**9 rows of 128 tokens: 4.5 GB
  and growing, no step after minutes). It may take half of this host's memory."""
  if "shuffle_window" not in config or config.get("layout") == "stream":
    return  # the stream layout has no window
  try:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, OSError, ValueError):
    return  # not a POSIX host: nothing to measure against
  from bertjax import batch as batch_lib
  seq_len = int(config.seq_len)
  # The row's arrays (counted, not allocated) plus about 1 KiB of Python
  # objects around them.
  row = 1024 + sum(
      math.prod(batch_lib.field_shape(name, 1, seq_len)) * np.dtype(dtype).itemsize
      for name, (dtype, _) in batch_lib.FIELDS.items())
  most = memory // 2 // row
  if most < 1:
    _fail("seq_len", seq_len, f"one packed row of it (~{row} bytes) is more than "
          f"half of this host's {memory / 2**30:.0f} GiB")
  if int(config.shuffle_window) > most:
    _fail("shuffle_window", config.shuffle_window,
          f"the training pipeline holds that many packed rows (~{row} bytes "
          f"each at seq_len {seq_len}) in host memory before its first batch, "
          f"more than half of this host's {memory / 2**30:.0f} GiB; it must be "
          f"at most {most} (1024 already shuffles well)")


def check_variant(config) -> None:
  """The objective's and the model's own fields (span lengths, ERNIE's level
  rates, ALBERT's sharing, DeBERTa's attention terms, XLNet's mem_len ...),
  which are checked when they are built: built here (milliseconds, no
  parameters), before any data is prepared or the workdir is written to.

  Raises:
    ValueError: a bad field, or one the objective needs that the config
      lacks (an objective set on another system's config).
  """
  from bertjax import models
  from bertjax import objectives
  try:
    objectives.get_objective(config)
    model = models.get_model(config)
  except (AttributeError, KeyError) as e:
    field = str(e).strip("\"'").split("'")[0]
    if not field or field in config:
      raise  # not a field the config lacks: no user mistake to name
    raise ValueError(
        f"config.objective={config.get('objective')!r} needs the config field "
        f"{field!r}, which this config does not have; start from the shipped "
        f"config of that system (e.g. --config=configs/{config.get('objective')}.py:"
        f"{config.get('model_size', 'base')}).") from None
  _check_model(config, model)
  _check_knowledge(config)


def _check_model(config, model) -> None:
  """The objective must be able to train the model (``model_mismatch``): an
  ELECTRA step on a BERT failed only after data, init and the workdir."""
  from bertjax import objectives
  reason = objectives.model_mismatch(config.objective, config.model, model)
  if reason is None:
    return
  if "sentence head" in reason:
    fix = "set --config.sentence_head=True, or --config.objective=mlm_only"
  else:
    wanted = objectives.models_for(config.objective)[0]
    size = config.get("model_size", "base")
    fix = (f"set --config.model={wanted}, or start from the shipped config of "
           f"model {config.model!r} (e.g. --config=configs/{config.model}.py:"
           f"{size if size != 'custom' else 'base'})")
  raise ValueError(f"config.objective={config.objective!r} cannot train "
                   f"config.model={config.model!r}: {reason}; {fix}.")


def check_optimizer_numbers(config) -> None:
  """Adam's moments, epsilon, weight decay, clipping and dropout: values that
  would train on (as gradient ascent, a frozen model or NaN) instead of failing.
  Fields a config lacks are skipped (fine-tuning's checks call it too)."""
  for field in ("adam_b1", "adam_b2"):
    if field in config and not 0 <= config[field] < 1:
      _fail(field, config[field], "it must lie in [0, 1)")
  if "adam_eps" in config and not 0 < config.adam_eps < math.inf:
    _fail("adam_eps", config.adam_eps, "it must be a positive number (Adam "
          "divides by it where a gradient is zero)")
  if "weight_decay" in config and not 0 <= config.weight_decay < math.inf:
    _fail("weight_decay", config.weight_decay, "it must not be negative")
  if "grad_clip_norm" in config and not 0 < config.grad_clip_norm < math.inf:
    _fail("grad_clip_norm", config.grad_clip_norm,
          "it must be a positive number (0 would zero every update and a "
          "negative one reverse it; a large value such as 1e9 never clips)")
  for field in ("dropout_rate", "attention_dropout_rate"):
    if field in config and not 0 <= config[field] < 1:
      _fail(field, config[field], "it must lie in [0, 1)")


def check_seeds(config) -> None:
  """``seed`` and ``eval_seed`` lie in [0, 2**32): jax.random.key keeps a
  seed's low 32 bits, so 2**32 drew seed 0's init and masks, and 2**63
  failed with an OverflowError after the data was prepared. Fine-tuning
  calls it too."""
  for field in ("seed", "eval_seed"):
    if field in config and not 0 <= int(config[field]) < 2**32:
      _fail(field, config[field], "it must not be negative, and below 2**32 "
            "(JAX keeps a seed's low 32 bits: a larger one repeats a smaller "
            "one's draws)")


def check_guards(config) -> None:
  """The NaN/Inf guard's fields (bertjax/guards.py), which the loop reads only
  when its first step runs: an unknown ``nonfinite`` failed after the data
  was prepared and the workdir written, ``max_consecutive_skips`` <= 0 acted
  as 1 and ``debug_nan_step`` < -1 as -1 (never). Fine-tuning calls it too."""
  from bertjax import guards
  if config.get("nonfinite", "stop") not in guards.NONFINITE_MODES:
    _fail("nonfinite", config.nonfinite,
          f"it must be one of {', '.join(guards.NONFINITE_MODES)}")
  if int(config.get("max_consecutive_skips", 1)) < 1:
    _fail("max_consecutive_skips", config.max_consecutive_skips,
          "it must be a positive integer (the skipped updates in a row after "
          "which nonfinite='skip' stops the run)")
  if int(config.get("debug_nan_step", -1)) < -1:
    _fail("debug_nan_step", config.debug_nan_step,
          "it must be -1 (never) or the step, from 0, whose loss is made NaN")


def _check_knowledge(config) -> None:
  """ERNIE's prepare-time fields (bertjax/data/knowledge.py), checked at
  prepare otherwise: after the workdir had been set up for the run."""
  if not config.get("knowledge_spans", False):
    return
  from bertjax.data import knowledge
  knowledge.Settings.from_config(config)  # phrase/entity counts, gazetteer
  if not math.isfinite(float(config.get("ernie_phrase_min_pmi", 3.0))):
    _fail("ernie_phrase_min_pmi", config.ernie_phrase_min_pmi,
          "it must be a number (nats; ERNIE's default is 3)")
  if int(config.get("knowledge_fit_documents", 50_000)) < 1:
    _fail("knowledge_fit_documents", config.knowledge_fit_documents,
          "it must be a positive number of documents to fit phrases and "
          "entities on")


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


def _check_batch(config, ways: int, mesh_shape: dict[str, int],
                 hosts: int | None = None) -> None:
  import jax
  hosts = jax.process_count() if hosts is None else hosts
  micro = int(config.get("microbatches", 1))
  if config.batch_size % (ways * micro) or config.batch_size % hosts:
    unit = math.lcm(ways * micro, hosts)
    raise ValueError(
        f"config.batch_size={config.batch_size!r} is invalid: the global batch "
        f"must be divisible by microbatches ({micro}) times the {ways} "
        f"data-parallel devices (mesh {mesh_shape}), and by the "
        f"{hosts} hosts; set --config.batch_size to a multiple "
        f"of {unit}, e.g. --config.batch_size={-(-config.batch_size // unit) * unit}.")


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
