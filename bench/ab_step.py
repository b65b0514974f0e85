r"""Interleaved A/B of bertjax train-step variants, robust to a shared machine.

  JAX_PLATFORMS=cpu python bench/ab_step.py --config=configs/bert.py:base \
      --config.batch_size=8 --config.seq_len=128 \
      --config.max_predictions_per_seq=20 --config.dropout_rate=0 \
      --config.attention_dropout_rate=0 --variants=baseline,guard_where

Each variant's step is compiled apart (the variant is a patch active only
while its step is traced), then the steps run interleaved, A, B, A, B, ...,
so that load from other processes hits all variants alike. Prints one JSON
line: per variant the median step seconds, and against the first variant
the ratio of medians and the median of the per-round ratios (a ratio < 1 is
faster). Before timing, the first step's loss, parameters and optimizer
moments of each variant are compared with the first variant's (same init,
same batch; ``loss_rel_diff``, ``params_max_rel_diff``,
``moments_max_rel_diff``, and ``first_step_identical`` when all three are
bit-identical), so a faster variant that computes something else is caught.
The moments are what carries the gradient: under the configs' linear warmup
the first step's learning rate is 0, so its parameters equal the initial
ones in every variant (before 2026-11-28 only the loss and the parameters
were compared, which caught forward differences but no gradient's).

A variant is a ``+``-joined set of features (``qkv_fused+heads_major``); the
features, and what each one changes, are listed in bench/README.md.

A variant that does not compile (an option this XLA does not know) is
reported with its error and left out of the timing; once
``--compile_budget_s`` has passed, the variants not yet compiled are left
out the same way, so that a run on lent time still times what it built.
"""

from __future__ import annotations

# Malloc tunables that reuse XLA:CPU's per-step buffers, as the binaries have
# them (bertjax/host_memory.py; BERTJAX_MALLOC_TUNABLES=0 to time without):
# restarts the process once, before anything below runs.
if __name__ == "__main__":
  from bertjax import host_memory
  host_memory.reexec_with_malloc_tunables()

import contextlib
import hashlib
import json
import os
import statistics
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import optax
from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(__file__))
# The benchmark's batch; importing it also defines the --config flag.
import attention_variants  # noqa: E402
import pointwise_vjp  # noqa: E402
import unordered_grads  # noqa: E402
import step_bench  # noqa: E402
from bertjax import guards  # noqa: E402
from bertjax import models  # noqa: E402
from bertjax import objectives  # noqa: E402
from bertjax import optim  # noqa: E402
from bertjax import sharding  # noqa: E402
from bertjax import state as state_lib  # noqa: E402
from bertjax import train  # noqa: E402
from bertjax.models import attention as attention_lib  # noqa: E402
from bertjax.models import bert as bert_model  # noqa: E402
from bertjax.models import layers  # noqa: E402
from bertjax.models import projection  # noqa: E402

_VARIANTS = flags.DEFINE_list("variants", ["baseline", "guard_where"],
                              "Variants to compare; the first is the reference.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 9, "Interleaved timed rounds (0: only the first-step check).")
_COMPILE_BUDGET = flags.DEFINE_float(
    "compile_budget_s", 0.0,
    "Seconds after which no further variant is compiled (0: no limit).")
_WARMUP = flags.DEFINE_integer("ab_warmup", 2, "Untimed steps per variant.")

# XLA:CPU compile options for the step alone (the same program, compiled
# otherwise): YNNPACK's library dot fusions off (Eigen runs every dot), and
# fast math with NaN, Inf and division semantics kept (the non-finite guard
# must still see a NaN).
_COMPILER_OPTIONS = {
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    # The dots through oneDNN's or XNNPACK's library fusions instead.
    "onednn_dot": {"xla_cpu_experimental_ynn_fusion_type": "",
                   "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "xnn_dot": {"xla_cpu_experimental_ynn_fusion_type": "",
                "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "fast_math": {"xla_cpu_enable_fast_math": True,
                  "xla_cpu_fast_math_honor_nans": True,
                  "xla_cpu_fast_math_honor_infs": True,
                  "xla_cpu_fast_math_honor_division": True,
                  "xla_cpu_fast_math_honor_functions": False},
    # XLA:GPU: cuBLASLt, whose epilogues can take the bias adds; every matmul
    # on cuBLAS instead of Triton's gemm fusions; no CUDA-graph command
    # buffers (each kernel launched alone).
    "cublaslt": {"xla_gpu_enable_cublaslt": True},
    "no_triton_gemm": {"xla_gpu_enable_triton_gemm": False},
    "no_command_buffer": {"xla_gpu_enable_command_buffer": ""},
    # XLA:GPU fusion choices that could take the memory-bound work between
    # the matmuls: Triton gemm fusions for any gemm the autotuner finds
    # faster (elementwise producers fused into the gemm); cuDNN's LayerNorm
    # kernels; Triton block-level fusions for the reductions.
    "triton_gemm_any": {"xla_gpu_triton_gemm_any": True},
    "cudnn_layer_norm": {"xla_gpu_enable_cudnn_layer_norm": True},
    "block_level": {"xla_gpu_experimental_enable_fusion_block_level_rewriter": True},
}
_FEATURES = (("baseline", "guard_cond", "guard_where", "optax_clip", "scale_queries", "bias_core",
              "wgrad_autodiff", "wgrad_heads_autodiff", "wgrad_all_transposed", "wgrad_split",
              "wide_transposed", "unordered_grads",
              "heads_flat", "heads_transposed",
              "dx_3d",
               "embed_gather", "word_bf16",
              "full_last_layer", "gelu_saved", "gelu_erfc", "ln_saved",
              "pointwise_remat", "gelu_vjp", "ln_vjp")
             + attention_variants.ATTENTION_FEATURES + tuple(_COMPILER_OPTIONS))


def _input_gradient_3d(g, kernel, count, precision=None):
  """``projection.input_gradient`` on the kernel's own axes, as autodiff
  writes it (variant dx_3d)."""
  out_axes = kernel.ndim - count
  return lax.dot_general(
      g, kernel, ((tuple(range(g.ndim - out_axes, g.ndim)),
                   tuple(range(count, kernel.ndim))), ((), ())),
      precision=precision)


def _vjp_layer_norm(dtype, name, eps=layers.LAYER_NORM_EPS):
  """``layers.layer_norm`` with the hand-written backward pass (variant
  ln_vjp): the same parameters and initializers."""
  return pointwise_vjp.LayerNorm(
      epsilon=eps, dtype=dtype, param_dtype=jnp.float32,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                              ("embed",)),
      bias_init=layers.zeros_init("embed"), name=name)


def _attend_scaling_queries(q, k, v, mask, **kwargs):
  """``attention.attend`` with its xla path's 1/sqrt(d) on the queries
  before q k^T, as before 2026-11-27, rather than on the float32 scores."""
  impl = attention_lib.resolve(
      kwargs.get("impl", "xla"), platform=attention_lib.compile_platform(),
      has_segments=kwargs.get("segment_ids") is not None, length=q.shape[1],
      dropout=kwargs.get("dropout_rate", 0.0) > 0 and not kwargs.get(
          "deterministic", True), dtype=kwargs.get("dtype", jnp.float32))
  if impl != "xla":
    return _ATTEND(q, k, v, mask, **kwargs)
  dtype = kwargs.get("dtype", jnp.float32)
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
  return attention_lib.softmax_values(logits, mask, v, kwargs.get("dropout_rate", 0.0),
                                      kwargs.get("deterministic", True), dtype)


_ATTEND = attention_lib.attend


@contextlib.contextmanager
def _patched(variant: str):
  """Patches in the features of ``variant`` while its step is traced."""
  features = set(variant.split("+"))
  unknown = features - set(_FEATURES)
  if unknown:
    raise ValueError(f"Unknown variant feature(s) {sorted(unknown)}; pick from "
                     f"{', '.join(_FEATURES)}.")
  saved = (guards.update_if_finite, layers.MultiHeadAttention, layers.combine_masks)
  saved_lookup = bert_model._one_hot_lookup
  saved_rows = layers.embed_rows
  saved_activation = layers.remat_activation
  saved_gelu = layers.ACTIVATIONS["gelu"]
  saved_norm = layers._RematLayerNorm
  saved_pointwise = layers.remat_pointwise
  saved_layer_norm = layers.layer_norm
  saved_plain_activation = layers.activation
  saved_clip = optim.clip_by_global_norm
  saved_attend = attention_lib.attend
  saved_softmax_values = attention_lib.softmax_values
  saved_projection = projection.enabled
  saved_pays = projection.transpose_pays
  saved_transposed = projection.transposed
  saved_input_gradient = projection.input_gradient
  saved_flat_heads = projection.flat_heads
  saved_unordered = None
  try:
    if "heads_flat" in features:
      projection.flat_heads = lambda: True
    if features & {"heads_transposed", "wgrad_heads_autodiff", "wgrad_all_transposed"}:
      projection.flat_heads = lambda: False
    if "wgrad_autodiff" in features:
      projection.enabled = lambda: False
    if "wgrad_heads_autodiff" in features:
      projection.transpose_pays = (
          lambda kernel, count: kernel.ndim == 2 and saved_pays(kernel, count))
    if features & {"wgrad_all_transposed", "wide_transposed"}:
      projection.transpose_pays = lambda kernel, count: True
    if "unordered_grads" in features:
      saved_unordered = unordered_grads.patch()
    if "dx_3d" in features:
      projection.input_gradient = _input_gradient_3d
    if "wgrad_split" in features:
      projection.transposed = lambda x: lax.optimization_barrier(
          lax.optimization_barrier(x).T)
    if "bias_core" in features:
      attention_lib.softmax_values = attention_variants.softmax_values_by_bias
    if "scale_queries" in features:
      attention_lib.attend = _attend_scaling_queries
    if "optax_clip" in features:
      optim.clip_by_global_norm = optax.clip_by_global_norm
    if "pointwise_remat" in features:
      layers.remat_pointwise = lambda: True
    if "ln_vjp" in features:
      layers.layer_norm = _vjp_layer_norm
    if "gelu_vjp" in features:
      layers.activation = layers.remat_activation = (
          lambda name: pointwise_vjp.gelu if name == "gelu"
          else saved_plain_activation(name))
    if "ln_saved" in features:
      layers._RematLayerNorm = nn.LayerNorm
    if "gelu_saved" in features:
      layers.remat_activation = layers.activation
    if "gelu_erfc" in features:
      layers.ACTIVATIONS["gelu"] = lambda x: nn.gelu(x, approximate=False)
    if "guard_where" in features:
      guards.update_if_finite = guards.update_by_select
    if "guard_cond" in features:
      guards.update_if_finite = guards.update_by_cond
    attention = features & set(attention_variants.ATTENTION_FEATURES)
    if attention:
      cls = type("Attention_" + "_".join(sorted(attention)),
                 (attention_variants.VariantAttention,), {"features": frozenset(attention)})
      # The models name their attention class when they build it
      # (``functools.partial(layers.MultiHeadAttention, impl=...)``), so the
      # class itself is what the variant replaces.
      layers.MultiHeadAttention = cls
    if "mask_bias" in features:
      layers.combine_masks = attention_variants.bias_masks
    if "embed_gather" in features:
      bert_model._one_hot_lookup = lambda table, ids, dtype: table(ids)
    if "word_bf16" in features:
      layers.embed_rows = lambda table, ids, dtype: table(ids)
    yield
  finally:
    guards.update_if_finite, layers.MultiHeadAttention, layers.combine_masks = saved
    bert_model._one_hot_lookup = saved_lookup
    layers.embed_rows = saved_rows
    layers.remat_activation = saved_activation
    layers.ACTIVATIONS["gelu"] = saved_gelu
    layers._RematLayerNorm = saved_norm
    layers.remat_pointwise = saved_pointwise
    layers.layer_norm = saved_layer_norm
    layers.activation = saved_plain_activation
    optim.clip_by_global_norm = saved_clip
    attention_lib.attend = saved_attend
    attention_lib.softmax_values = saved_softmax_values
    projection.enabled = saved_projection
    projection.transpose_pays = saved_pays
    projection.transposed = saved_transposed
    projection.input_gradient = saved_input_gradient
    projection.flat_heads = saved_flat_heads
    if saved_unordered is not None:
      unordered_grads.restore(saved_unordered)


def _build(config, variant: str):
  """(run one step, first step's (loss, params)) of ``variant``."""
  mesh = sharding.make_mesh(config.mesh_shape)
  if "full_last_layer" in variant.split("+"):
    config = config.copy_and_resolve_references()
    config.sparse_last_layer = False
  with _patched(variant):
    model = models.get_model(config)
    objective = objectives.get_objective(config)
    tx = optim.make_optimizer(config)
    state, shardings = state_lib.create_train_state(model, tx, config, mesh)
    step_fn = train.make_train_step(model, objective, tx, shardings, mesh)
    batch = train.to_global(step_bench.synthetic_batch(config), mesh)
    rng = jax.random.key(config.seed)
    options = {}
    for feature in variant.split("+"):
      options.update(_COMPILER_OPTIONS.get(feature, {}))
    lowered = step_fn.lower(state, batch, rng)
    program = hashlib.sha256(lowered.as_text().encode()).hexdigest()
    compiled = lowered.compile(compiler_options=options or None)
    if options:  # the same program, compiled otherwise
      program += repr(sorted(options.items()))
  state, metrics = compiled(state, batch, rng)
  loss = float(metrics["loss"][0] / metrics["loss"][1])
  # The first step's learning rate is 0 under a linear warmup (every shipped
  # config has one), so its parameters are the initial ones whatever the
  # variant computes; the optimizer's moments after it hold the first
  # gradient (Adam's first moment is (1 - b1) times the clipped gradient).
  first = (loss, jax.device_get(state.params), jax.device_get(state.opt_state), program)
  box = {"state": state}

  def run():
    box["state"], m = compiled(box["state"], batch, rng)
    jax.block_until_ready(m)

  return run, first


def _diff(a, b) -> tuple[float, str | None]:
  """(max |a - b| over every float leaf over max |b| over every float leaf,
  the path of the leaf with the largest |a - b|, None when bit-identical).
  Relative to the whole tree's scale, not each leaf's, because some
  gradients are zero but for rounding (the attention key's bias: softmax
  ignores a constant added to a row), and rounding noise against rounding
  noise says nothing."""
  diffs, scale = {}, 0.0
  for (path, y), x in zip(jax.tree_util.tree_leaves_with_path(b), jax.tree.leaves(a)):
    if np.issubdtype(np.asarray(y).dtype, np.floating) and np.size(y):
      diffs[jax.tree_util.keystr(path)] = float(np.max(np.abs(x - y)))
      scale = max(scale, float(np.max(np.abs(y))))
  worst = max(diffs, key=diffs.get, default=None)
  if worst is None or diffs[worst] == 0:
    return 0.0, None
  return diffs[worst] / (scale + 1e-30), worst


def _identical(a, b) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _build_all(config, variants: list[str], budget_s: float):
  """({variant: built}, {variant: why it was left out})."""
  built, left_out = {}, {}
  start = time.perf_counter()
  for v in variants:
    if budget_s and time.perf_counter() - start > budget_s:
      left_out[v] = f"not compiled: the {budget_s:.0f} s compile budget had passed"
      continue
    began = time.perf_counter()
    try:
      built[v] = _build(config, v)
    except Exception as e:  # pylint: disable=broad-except
      if v == variants[0]:
        raise
      left_out[v] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    print(f"{v}: {time.perf_counter() - began:.1f} s to build", file=sys.stderr, flush=True)
  return built, left_out


def compare(config, variants: list[str], rounds: int, warmup: int,
            budget_s: float = 0.0) -> dict:
  """Runs the A/B; returns the record printed as JSON (module doc)."""
  built, left_out = _build_all(config, variants, budget_s)
  ref_loss, ref_params, ref_opt, ref_program = built[variants[0]][1]
  record: dict[str, Any] = {
      "model": f"{config.model}-{config.model_size}",
      "batch_size": int(config.batch_size), "seq_len": int(config.seq_len),
      "rounds": rounds, "reference": variants[0]}
  record.update({v: {"left_out": why} for v, why in left_out.items()})
  variants = [v for v in variants if v in built]
  for v in variants:
    loss, params, opt, program = built[v][1]
    if jax.tree.structure(opt) != jax.tree.structure(ref_opt):
      raise ValueError(f"Variant {v!r} changes the optimizer state's structure; "
                       "compare it against a reference with the same optimizer.")
    moments = _diff(opt, ref_opt)
    record[v] = {"first_loss": loss,
                 "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
                 "params_max_rel_diff": _diff(params, ref_params)[0],
                 "moments_max_rel_diff": moments[0],
                 "moments_worst_leaf": moments[1],
                 "first_step_identical": (loss == ref_loss and _identical(params, ref_params)
                                          and _identical(opt, ref_opt)),
                 # True for a variant that changed nothing (a patch that no
                 # longer reaches the step): its timing is the noise floor.
                 "same_program": program == ref_program}
  if rounds <= 0:  # the first-step check alone
    return record
  for v in variants:
    built[v] = built[v][0]  # drop the copied state
    for _ in range(warmup):
      built[v]()
  times = {v: [] for v in variants}
  for _ in range(rounds):
    for v in variants:
      start = time.perf_counter()
      built[v]()
      times[v].append(time.perf_counter() - start)
  ref = times[variants[0]]
  for v in variants:
    record[v]["step_s_median"] = round(statistics.median(times[v]), 4)
    record[v]["ratio_of_medians"] = round(
        statistics.median(times[v]) / statistics.median(ref), 4)
    record[v]["median_round_ratio"] = round(statistics.median(
        [t / r for t, r in zip(times[v], ref)]), 4)
  return record


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  print(json.dumps(compare(flags.FLAGS.config, _VARIANTS.value, _ROUNDS.value,
                           _WARMUP.value, _COMPILE_BUDGET.value)), flush=True)


if __name__ == "__main__":
  app.run(main)
