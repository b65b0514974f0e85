r"""One encoder layer, forward and backward: bertjax's block beside HF Flax's.

  JAX_PLATFORMS=cpu python bench/layer_bench.py --size=base --batch_size=8 \
      --seq_len=128 --layer_variants=flat2d,heads_major --layer_rounds=30

Times ``jax.grad`` (parameters and input) of one post-LayerNorm block, no
dropout, all rows real, interleaved, medians: bertjax's
``layers.EncoderBlock``, Hugging Face's ``FlaxBertLayer`` with the same
sizes, and bertjax's block with the attention variants of
``bench/ab_step.py`` (``flat2d``, ``qkv_fused``, ``heads_major``,
``mask_bias``, ``dpa``, ``+``-joined). A layer is most of a BERT step's
time, and here it runs without the step's optimizer, head and copies
around it, so a few percent show through that a whole-step A/B cannot
resolve on a noisy machine. Each variant's gradients are checked against
the block's (max abs difference printed) before timing. Prints one JSON line.
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
from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(__file__))
import attention_variants  # noqa: E402
from bertjax.models import sizes  # noqa: E402
from bertjax.models import layers  # noqa: E402

_SIZE = flags.DEFINE_string("size", "base", "A row of bertjax.models.sizes.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Rows.")
_LENGTH = flags.DEFINE_integer("seq_len", 128, "Tokens a row.")
_LAYER_VARIANTS = flags.DEFINE_list(
    "layer_variants", [], "ab_step attention variants to time beside the block.")
_LAYER_ROUNDS = flags.DEFINE_integer("layer_rounds", 30, "Interleaved rounds.")


def _block_cls(variant: str | None):
  if not variant:
    return layers.EncoderBlock
  unknown = set(variant.split("+")) - set(attention_variants.ATTENTION_FEATURES)
  if unknown:
    raise app.UsageError(f"Unknown attention variant(s) {sorted(unknown)}; pick "
                         f"from {', '.join(attention_variants.ATTENTION_FEATURES)}.")
  attention = type("Attention", (attention_variants.VariantAttention,),
                   {"features": frozenset(variant.split("+"))})
  return type("EncoderBlock", (layers.EncoderBlock,), {
      "__annotations__": {"attention_cls": object}, "attention_cls": attention})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import transformers
  from transformers.models.bert import modeling_flax_bert

  size = sizes.get_size(_SIZE.value)
  b, n, h = _BATCH.value, _LENGTH.value, size.hidden_size
  x = jax.random.normal(jax.random.key(0), (b, n, h))
  cotangent = jax.random.normal(jax.random.key(1), (b, n, h))
  mask = layers.doc_attention_mask(jnp.ones((b, n), jnp.int32))

  def bertjax_grad(variant=None):
    block = _block_cls(variant)(num_heads=size.num_heads, mlp_dim=size.mlp_dim)
    params = block.init(jax.random.key(2), x, mask, True)
    loss = lambda p, x: jnp.sum(block.apply(p, x, mask, True) * cotangent)
    return jax.jit(jax.grad(loss, argnums=(0, 1))), params

  def hf_grad():
    config = transformers.BertConfig(
        hidden_size=h, num_attention_heads=size.num_heads,
        intermediate_size=size.mlp_dim, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12)
    layer = modeling_flax_bert.FlaxBertLayer(config)
    ones = jnp.ones((b, n), jnp.int32)
    params = layer.init(jax.random.key(2), x, ones, None, deterministic=True)
    loss = lambda p, x: jnp.sum(
        layer.apply(p, x, ones, None, deterministic=True)[0] * cotangent)
    return jax.jit(jax.grad(loss, argnums=(0, 1))), params

  systems = {"bertjax": bertjax_grad(), "hf_flax": hf_grad()}
  reference = systems["bertjax"][0](systems["bertjax"][1], x)
  grad_diff = {}
  for variant in _LAYER_VARIANTS.value:
    systems[variant] = bertjax_grad(variant)
    got = systems[variant][0](systems[variant][1], x)
    grad_diff[variant] = max(float(jnp.max(jnp.abs(a - c))) for a, c in zip(
        jax.tree.leaves(reference), jax.tree.leaves(got)))
  for fn, params in systems.values():  # compile and warm up
    jax.block_until_ready(fn(params, x))
  times = {name: [] for name in systems}
  for _ in range(_LAYER_ROUNDS.value):
    for name, (fn, params) in systems.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(params, x))
      times[name].append(time.perf_counter() - start)
  ref = times["bertjax"]
  print(json.dumps({
      "size": _SIZE.value, "batch_size": b, "seq_len": n,
      "rounds": _LAYER_ROUNDS.value, "reference": "bertjax",
      **{name: {"median_s": round(statistics.median(t), 4),
                "ratio_of_medians": round(statistics.median(t) /
                                          statistics.median(ref), 3),
                "median_round_ratio": round(statistics.median(
                    [a / r for a, r in zip(t, ref)]), 3),
                **({"max_grad_diff": grad_diff[name]} if name in grad_diff
                   else {})}
         for name, t in times.items()}}))


if __name__ == "__main__":
  app.run(main)
