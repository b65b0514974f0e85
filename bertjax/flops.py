"""Useful model FLOPs per train step, the hardware peak, and MFU.

Useful FLOPs count only the matrix multiplications the model needs, forward
and backward (backward = 2 x forward), 2 FLOPs per multiply-add:

  step_flops = 6 * N_layers * T                 (encoder weight matmuls)
             + 12 * L * H * S * T               (bidirectional attention)
             + 6 * (H*H + H*V) * P              (MLM head at predicted slots)
             + 6 * (H*H + 2*H) * B              (pooler + NSP head, if any)

ELECTRA (``config.model='electra'``) counts both encoders with the same
terms, each tower's E -> H projection where its width H differs from the
embedding width E (``6 * E * H * T``), the generator's MLM head at the
predicted slots (``6 * (H_g * E + E * V) * P``) and the discriminator's
per-token head (``6 * (H*H + H) * T``), and no pooler.

With ``config.sparse_last_layer`` (BERT's encoder, scanned or not) the last layer
computes its queries, output projection, feed-forward and attention only at
the R = B * (max_predictions_per_seq + 1 if there is a sentence head else
+ 0) rows the heads read, so the T - R other rows are not counted:

             - (6 * (2*H*H + 2*H*F) + 12 * H * S) * (T - R)

with T = B * S tokens per step (global batch B, sequence length S), L layers,
hidden size H, feed-forward size F, vocabulary V, and P = B *
max_predictions_per_seq prediction slots (the model computes logits only
there, see ``BertForPretraining.mlm_logits``). N_layers = L * (4*H*H + 2*H*F)
is the non-embedding matmul weights: the Q, K, V and output projections and
the two feed-forward matrices. The attention term is the QK^T and
probabilities x V products: 2 * 2*S*H FLOPs per token per layer forward, x3.
DeBERTa (``config.model == 'deberta'``) runs L + E layer passes (E =
``emd_layers``: the enhanced mask decoder re-runs the last layer), each with
its weight matmuls and attention as above, and adds per pass and position
term (c2p, p2c; n_terms of them)

             + 6 * T * R * H                    (content x R relative rows)
             + 6 * R * H * H                    (projecting the R rows)

where R is the number of relative-table rows a row of S tokens reads
(``disentangled.relative_index``: at most 2S - 1); the gathers are free.
XLNet (``config.model == 'xlnet'``) has two streams through every layer:
the content stream as above (its Q, K, V and output projections, feed-forward
and attention over T tokens), and the query stream at the P prediction slots
(Q and output projections, feed-forward, attention over S keys), plus per
layer the relative-position scores of both streams against the R = 2S - 1
sinusoid rows, the rows' projection, and the relative-segment scores of both
streams against the layer's two ``seg_embed`` rows:

             + 6 * (2*H*H + 2*H*F) * P + 12 * H * S * P   (query stream)
             + 6 * (T + P) * R * H + 4 * R * H * H        (relative positions)
             + 6 * (T + P) * 2 * H                        (relative segments)

The loss reads the query stream alone, so of the last layer's content stream
only its keys and values are useful work (the query stream reads them); its
queries, scores, output projection and feed-forward are not counted (XLA
drops them from the step as dead code):

             - 6 * (2*H*H + 2*H*F) * T - 12 * H * (S + M) * T - 6 * T * (R + 2) * H

The rows' projection is 4x, not 6x, its forward: the sinusoid table is a
constant, so the backward pass needs the kernel's gradient only, not the
input's. The query stream runs at the P = B * max_predictions_per_seq slots
of the target mapping (``XLNetForPretraining``), whether or not a slot's
weight is 1, and the LM head is the tied decoder alone (``6 * H * V * P``,
no transform). With a segment memory of M positions per row (``mem_len``;
M = 0 above), each layer also projects the memory's keys and values
(``8 * H * H * M`` per row: stop-gradient, so no input gradient), both
streams attend over M more keys (``12 * H * M * (T + P)``), and
R = M + 2S - 1.
Embedding lookups, biases, LayerNorm, softmax and GELU are not counted, nor is
rematerialisation's recomputation: MFU measures useful work, so remat lowers
it honestly.

The peak is the chip's datasheet dense bfloat16 figure on TPU and GPU, and on
CPU a float32 matmul throughput measured once in this process (all cores of
the host together, however many fake devices XLA shows).
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp

from bertjax.models import sizes

# Datasheet dense bfloat16 FLOP/s per chip, keyed by a substring of
# ``device.device_kind`` (first match wins, so longer names come first).
DATASHEET_PEAK: tuple[tuple[str, float], ...] = (
    ("TPU v6 lite", 918e12),  # v6e (Trillium)
    ("TPU v6e", 918e12),
    ("TPU v5 lite", 197e12),  # v5e
    ("TPU v5e", 197e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),  # v5p reports itself as "TPU v5"
    ("TPU v4", 275e12),
    ("TPU v3", 123e12),
    ("TPU v2", 45e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L4", 121e12),
    ("A10", 125e12),
    ("V100", 125e12),
)


def step_flops(config) -> float:
  """Useful FLOPs of one train step of ``config`` (formula in the module doc).

  Args:
    config: uses model_size (or explicit sizes), vocab_size, batch_size,
      seq_len, max_predictions_per_seq and sentence_head (default True).
  """
  size = sizes.resolve(config)
  h = size.hidden_size
  b, s = int(config.batch_size), int(config.seq_len)
  tokens = b * s
  predictions = b * int(config.max_predictions_per_seq)
  if config.get("model") == "electra":
    return _electra_flops(config, size, s, tokens, predictions)
  if config.get("model") == "xlnet":
    return _xlnet_flops(config, size, s, tokens, predictions)
  total = encoder_flops(size, s, tokens)
  if config.get("model", "bert") == "bert" and config.get("sparse_last_layer", False):
    rows = predictions + b * int(bool(config.get("sentence_head", True)))
    f = size.mlp_dim
    total -= (6.0 * (2 * h * h + 2 * h * f) + 12.0 * h * s) * (tokens - rows)
  if config.get("model") == "deberta":
    # The enhanced mask decoder re-runs the last layer emd_layers times, and
    # every layer pass adds the disentangled position terms.
    passes = size.num_layers + int(config.get("emd_layers", 0))
    total *= passes / size.num_layers
    total += passes * _disentangled_flops(config, h, s, tokens)
  total += 6.0 * (h * h + h * int(config.vocab_size)) * predictions
  if config.get("sentence_head", True) and config.get("objective", "bert") != "mlm_only":
    total += 6.0 * (h * h + 2 * h) * b
  return total


def _disentangled_flops(config, h: int, s: int, tokens: int) -> float:
  """Forward + backward FLOPs of one layer pass's position terms (module doc)."""
  from bertjax.models import deberta
  from bertjax.models import disentangled
  terms = len(deberta.position_terms(config.get("pos_att_type", "p2c|c2p")))
  buckets = int(config.get("position_buckets", -1))
  max_distance = int(config.get("max_relative_positions", -1))
  if max_distance <= 0:
    max_distance = int(config.max_position_embeddings)
  span = disentangled.table_span(buckets, max_distance)
  index, _ = disentangled.relative_index(s, span, buckets, max_distance)
  rows = int(index.max()) + 1
  return terms * (6.0 * tokens * rows * h + 6.0 * rows * h * h)


def encoder_flops(size: sizes.Size, seq_len: int, tokens: int) -> float:
  """Weight matmuls and attention of one encoder stack, forward + backward."""
  h, f, layers = size.hidden_size, size.mlp_dim, size.num_layers
  return (6.0 * layers * (4 * h * h + 2 * h * f) * tokens
          + 12.0 * layers * h * seq_len * tokens)


def _electra_flops(config, size: sizes.Size, seq_len: int, tokens: int,
                   predictions: int) -> float:
  """ELECTRA (module docstring): both encoders, their E -> H projections
  where E differs, the generator's MLM head at the predicted slots and the
  discriminator's per-token head, forward + backward."""
  from bertjax.models import electra
  gen = electra.generator_size(config)
  e, h, g = int(config.embedding_size), size.hidden_size, gen.hidden_size
  total = encoder_flops(size, seq_len, tokens) + encoder_flops(gen, seq_len, tokens)
  total += 6.0 * e * (h * (e != h) + g * (e != g)) * tokens
  total += 6.0 * (g * e + e * int(config.vocab_size)) * predictions
  total += 6.0 * (h * h + h) * tokens
  return total


def _xlnet_flops(config, size: sizes.Size, seq_len: int, tokens: int,
                 predictions: int) -> float:
  """XLNet (module docstring): content and query streams, relative
  positions and segments, the tied LM head at the prediction slots,
  forward + backward."""
  h, f, layers = size.hidden_size, size.mlp_dim, size.num_layers
  memory = int(config.get("mem_len", 0) or 0)
  rows = memory + 2 * seq_len - 1
  queries = tokens + predictions  # both streams' query rows
  per_layer = (6.0 * (2 * h * h + 2 * h * f) * predictions
               + 12.0 * h * seq_len * predictions
               + 6.0 * queries * rows * h + 4.0 * rows * h * h
               + 6.0 * queries * 2 * h
               + 8.0 * h * h * memory * (tokens // seq_len)
               + 12.0 * h * memory * queries)
  # The loss reads only the query stream: of the last layer's content stream
  # only the keys and values (which the query stream reads) are work.
  unused = (6.0 * (2 * h * h + 2 * h * f) * tokens
            + 12.0 * h * (seq_len + memory) * tokens
            + 6.0 * tokens * (rows + 2) * h)
  return (encoder_flops(size, seq_len, tokens) + layers * per_layer - unused
          + 6.0 * h * int(config.vocab_size) * predictions)


def _datasheet_peak(device_kind: str) -> float | None:
  for name, peak in DATASHEET_PEAK:
    if name.lower() in device_kind.lower():
      return peak
  return None


@functools.lru_cache(maxsize=None)
def _matmul_chain(n: int) -> tuple[Callable[[], jax.Array], float]:
  """(a jitted chain of 8 float32 [n, n] matmuls, compiled; its FLOPs)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32) / n ** 0.5

  @jax.jit
  def chain(x, w):
    for _ in range(8):
      x = x @ w
    return x

  chain(a, b).block_until_ready()  # compiled and warm
  return (lambda: chain(a, b)), 8 * 2.0 * n ** 3


def matmul_flops_per_second(n: int = 1024, repeats: int = 10) -> float:
  """Best float32 [n, n] x [n, n] matmul FLOP/s of the default device, now.

  Best of ``repeats`` timed runs of a chain of 8 matmuls (compiled once per
  process). Not cached: a benchmark on a shared host samples it between its
  rounds and keeps the best (``bench/step_bench.py``).
  """
  run, chain_flops = _matmul_chain(n)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    run().block_until_ready()
    best = min(best, time.perf_counter() - start)
  return chain_flops / best


@functools.lru_cache(maxsize=None)
def measured_matmul_peak(n: int = 1024, repeats: int = 10) -> float:
  """``matmul_flops_per_second``, measured once per process (cached)."""
  return matmul_flops_per_second(n, repeats)


def peak_flops_per_second(devices: list[jax.Device] | None = None) -> float:
  """Peak FLOP/s of ``devices`` together (default: all devices).

  TPU/GPU: datasheet per chip times the chip count. CPU: the measured matmul
  peak of the host, once, whatever the number of (fake) CPU devices.

  Raises:
    ValueError: for an accelerator whose device_kind has no datasheet entry.
  """
  devices = list(jax.devices() if devices is None else devices)
  if devices[0].platform == "cpu":
    return measured_matmul_peak()
  kind = devices[0].device_kind
  peak = _datasheet_peak(kind)
  if peak is None:
    raise ValueError(
        f"No datasheet peak for device kind {kind!r}; add it to "
        "bertjax.flops.DATASHEET_PEAK.")
  return peak * len(devices)


def mfu(config, steps_per_second: float, peak: float) -> float:
  """Model FLOP utilisation: useful FLOP/s over ``peak`` FLOP/s (0..1)."""
  return step_flops(config) * steps_per_second / peak
