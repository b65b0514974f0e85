r"""Where the time of the jitted bertjax train step goes, by part of the model.

  python bench/profile_step.py --config=configs/bert.py:mini \
      --config.vocab_size=30522 --config.batch_size=32 \
      --config.dropout_rate=0 --config.attention_dropout_rate=0

Times a few steps under ``jax.profiler.trace`` (with a Perfetto trace), maps
every executed XLA op back to the JAX operation that produced it (the
``op_name`` metadata of the compiled HLO) and prints one JSON line: the step's
median wall time and the op time per part -- forward or backward of the
encoder's attention, feed-forward and LayerNorms, the embeddings, the MLM head
and loss, the sentence head, the optimizer and the in-step corruption. Op
times of the two CPU threads overlap, so they are shares, not wall time.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

import jax
from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(__file__))
# The benchmark's step; importing it also defines the --config flag.
import step_bench  # noqa: E402

# (part, pattern on the op_name), first match wins.
# Patterns match whole path components where a substring would mislead
# ("transpose" contains "nsp").
_PARTS = (
    ("corrupt", r"corrupt|threefry|random_bits|top_k|(^|/)sort"),
    ("optimizer", r"adam|lamb|optax|clip|apply_updates|global_norm|scale_by"),
    ("mlm_head+loss", r"mlm|log_softmax|take_along_axis|logsumexp"),
    ("sentence_head", r"(^|/)(pooler|nsp|sop)(/|$)"),
    ("embeddings", r"(^|/)embeddings(/|$)"),
    ("layer_norm", r"_norm(/|$)|layer_norm"),
    ("attention", r"(^|/)attention(/|$)"),
    ("feed_forward", r"(^|/)mlp(/|$)"),
)


def _op_names(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> the JAX op_name it came from."""
  pattern = re.compile(
      r'^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?metadata=\{op_name="([^"]*)"', re.M)
  return {m.group(1): m.group(2) for m in pattern.finditer(hlo_text)}


def _part(op_name: str) -> str:
  direction = "bwd" if "transpose(" in op_name else "fwd"
  for part, pattern in _PARTS:
    if re.search(pattern, op_name, re.I):
      return part if part in ("corrupt", "optimizer") else f"{direction} {part}"
  return f"{direction} other"


def profile(config, steps: int = 3) -> dict:
  """Runs and traces ``steps`` steps; returns the record printed as JSON."""
  run, compile_s, compiled = step_bench.bertjax_step(config, return_compiled=True)
  names = _op_names(compiled.as_text())
  for _ in range(2):
    run()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(steps):
        run()
    path = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"),
                     recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  per_part: dict[str, float] = collections.Counter()
  for event in events:
    if event.get("ph") == "X" and event.get("name") in names:
      per_part[_part(names[event["name"]])] += event["dur"] / 1e6 / steps
  total = sum(per_part.values())
  return {
      "model": f"{config.model}-{config.model_size}",
      "batch_size": int(config.batch_size), "seq_len": int(config.seq_len),
      "compile_s": round(compile_s, 2),
      "step_s_median": round(statistics.median(times), 4),
      "op_s_per_step": round(total, 4),
      "share": {k: round(v / total, 4) for k, v in sorted(
          per_part.items(), key=lambda kv: -kv[1])},
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  print(json.dumps(profile(flags.FLAGS.config)))


if __name__ == "__main__":
  app.run(main)
