r"""Where the time of a jitted train step goes: bertjax beside HF Flax.

  JAX_PLATFORMS=cpu python bench/profile_step.py \
      --config=configs/bert.py:base --config.batch_size=8 --config.seq_len=128 \
      --config.max_predictions_per_seq=20 --config.dropout_rate=0 \
      --config.attention_dropout_rate=0 [--systems=bertjax,hf_flax]

(``JAX_PLATFORMS=cpu``: where libtpu is installed, its profiler plugin
crashes the CPU trace.) Each system's step (``bench/step_bench.py``) is timed
for a few steps, then traced under ``jax.profiler.trace``; every executed XLA
op is mapped back to its compiled HLO instruction and to the JAX operation
that produced it (the instruction's ``op_name`` metadata). Prints one JSON line
with, per system, the median step wall time and the op time split two ways,
with the same tool and the same categories for both systems:

  kind  what the op computes: ``dot`` (a matmul, alone or fused),
        ``transpose/copy`` (data movement only), ``reduce`` (a fused
        reduction: softmax, LayerNorm and loss statistics, norms),
        ``elementwise`` (loop fusions: activations, masks, adds, the
        optimizer's arithmetic), ``other``;
  part  where in the step it comes from: forward / backward of the encoder's
        attention, feed-forward and LayerNorms, the embeddings, the MLM head,
        the sentence head, the loss and metric reductions, the in-step
        corruption, the optimizer (norm, clipping, AdamW, apply) and the
        non-finite guard's selects (bertjax names these with
        ``jax.named_scope`` in ``bertjax/train.py``; in HF's step every op
        outside the model's module is the loss or the optimizer).

On a GPU the trace's events are kernels: an XLA fusion's kernel is found by
its instruction's name (identical fusions of different layers share the
first one's kernel, so their time lands on that one's op_name), cuDNN's
attention kernels count as ``attention kernel`` (forward or backward by the
kernel's name) and cuBLAS matmuls, which carry no HLO name, as ``dot`` of an
unknown part.

Also reported for bertjax: how many state buffers the compiled step donates
(aliases to its outputs) and the host->device time of one batch
(``train.to_global``), the parts of a real step outside the jitted function.
Op times of the CPU's threads overlap, so kind and part are shares of op
time, not of wall time.
"""

from __future__ import annotations

# Malloc tunables that reuse XLA:CPU's per-step buffers, as the binaries have
# them (bertjax/host_memory.py; BERTJAX_MALLOC_TUNABLES=0 to time without):
# restarts the process once, before anything below runs.
if __name__ == "__main__":
  from bertjax import host_memory
  host_memory.reexec_with_malloc_tunables()

import atexit
import collections
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

_DUMP = tempfile.mkdtemp(prefix="profile_step_hlo_")
atexit.register(shutil.rmtree, _DUMP, ignore_errors=True)
# HF's step is compiled inside step_bench; its optimised HLO is read from the
# dump. Must be set before the backend starts.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_dump_to={_DUMP} --xla_dump_hlo_as_text"
                           " --xla_dump_hlo_module_re=jit_(train_)?step")

import jax  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
# The benchmark's steps; importing it also defines the --config flag.
import step_bench  # noqa: E402
from bertjax import train  # noqa: E402

_SYSTEMS = flags.DEFINE_list("systems", ["bertjax", "hf_flax"],
                             "Which steps to profile: bertjax, hf_flax.")
_STEPS = flags.DEFINE_integer("profile_steps", 3, "Timed and traced steps.")
_TOP = flags.DEFINE_integer("top", 0, "Also list the N costliest ops "
                            "(instruction, kind, op_name, share).")
_RAW_TOP = flags.DEFINE_integer(
    "raw_top", 0, "Also list the N costliest trace events of any name, per "
    "trace line (on a GPU: the kernels, which need not carry HLO names), "
    "with each line's busy seconds per step.")
_SAVE_HLO = flags.DEFINE_string(
    "save_hlo", None, "Also write each system's optimised HLO text to "
    "SAVE_HLO.<system>.txt (for reading the fusions offline).")

# (part, pattern on the op_name), first match wins. Patterns match whole path
# components where a substring would mislead ("transpose" contains "nsp").
# bertjax's module names and HF's (LayerNorm, intermediate, output,
# cls/predictions) side by side.
_PARTS = (
    ("corrupt", r"(^|/)corrupt(/|$)"),
    ("nonfinite_guard", r"(^|/)nonfinite_guard(/|$)"),
    ("optimizer", r"(^|/)optimizer(/|$)"),
    ("mlm_head", r"(^|/)(mlm_head|predictions)(/|$)"),
    ("sentence_head", r"(^|/)(pooler|nsp|sop)(/|$)"),
    ("embeddings", r"(^|/)embeddings(/|$)"),
    ("layer_norm", r"_norm(/|$)|(^|/)LayerNorm(/|$)"),
    ("attention", r"(^|/)attention(/|$)"),
    ("feed_forward", r"(^|/)(mlp|intermediate)(/|$)|layer/\d+/output(/|$)"),
    ("loss+metrics", r"(^|/)loss(/|$)"),
    # cuBLAS kernels carry no HLO name: their part is unknown.
    ("library matmul (part unknown)", r"^library_matmul$"),
)
# An HF op outside its model module is the loss or the optimizer.
_HF_MODEL = "FlaxBertForMaskedLMModule"
_MOVES = {"transpose", "copy", "bitcast", "reshape", "parameter", "broadcast",
          "slice", "concatenate", "dynamic-slice", "dynamic-update-slice",
          "copy-start", "copy-done", "tuple", "get-tuple-element", "pad"}


def _instructions(hlo_text: str) -> dict[str, tuple[str, str]]:
  """HLO instruction name -> (kind, op_name) for the entry's instructions."""
  # Opcodes used in each computation (fusions' bodies).
  bodies: dict[str, set[str]] = {}
  current = None
  for line in hlo_text.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) [^=]*\{\s*$", line)
    if head:
      current = bodies.setdefault(head.group(1), set())
      continue
    op = re.match(r"^\s*(?:ROOT )?%?[\w.\-]+ = [^ ]+ ([\w\-]+)\(", line)
    if op and current is not None:
      current.add(op.group(1))
  out = {}
  # The shape is one token, or a tuple (multi-output fusions) with spaces.
  inst = re.compile(
      r"^\s*(?:ROOT )?%?([\w.\-]+) = (?:\([^=]*?\)|\S+) ([\w\-]+)\((.*)$", re.M)
  for m in inst.finditer(hlo_text):
    name, opcode, rest = m.groups()
    ops = {opcode}
    called = re.search(r"calls=%?([\w.\-]+)", rest)
    if called:
      ops = bodies.get(called.group(1), ops)
    meta = re.search(r'op_name="([^"]*)"', rest)
    out[name] = (_kind(ops, opcode, rest), meta.group(1) if meta else "")
  return out


def _kind(ops: set[str], opcode: str, rest: str) -> str:
  if "dot" in ops or "convolution" in ops or (
      opcode == "custom-call" and re.search(r"matmul|gemm|dot", rest, re.I)):
    return "dot"
  if "reduce" in ops or "reduce-window" in ops:
    return "reduce"
  if ops <= _MOVES:
    return "transpose/copy"
  if opcode in ("fusion", "select", "add", "multiply", "subtract", "divide",
                "exponential", "maximum", "compare", "convert"):
    return "elementwise"
  return "other"


def _part(op_name: str, system: str) -> str:
  direction = "bwd" if "transpose(" in op_name else "fwd"
  for part, pattern in _PARTS:
    if re.search(pattern, op_name):
      if part in ("corrupt", "optimizer", "nonfinite_guard",
                  "library matmul (part unknown)"):
        return part
      return f"{direction} {part}"
  if system == "hf_flax" and _HF_MODEL not in op_name:
    return "loss+optimizer (outside the model)"
  return f"{direction} other"


def _raw_summary(events: list[dict], steps: int, top: int) -> dict:
  """Busy seconds per step of each trace line and its costliest event names."""
  names = {}
  for e in events:
    if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
      key = (e.get("pid"),) if e["name"] == "process_name" else (e.get("pid"), e.get("tid"))
      names[key] = e.get("args", {}).get("name", "")
  lines: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for e in events:
    if e.get("ph") == "X":
      line = f"{names.get((e.get('pid'),), e.get('pid'))} | " \
             f"{names.get((e.get('pid'), e.get('tid')), e.get('tid'))}"
      lines[line][e.get("name", "")[:120]] += e.get("dur", 0) / 1e6 / steps
  out = {}
  for line, counter in sorted(lines.items(), key=lambda kv: -sum(kv[1].values())):
    out[line] = {"busy_s": round(sum(counter.values()), 5),
                 "top": [(n, round(t, 6)) for n, t in counter.most_common(top)]}
  return out


def _device_pids(events: list[dict]) -> set:
  """Trace processes that are accelerators (their events are kernels)."""
  return {e.get("pid") for e in events
          if e.get("ph") == "M" and e.get("name") == "process_name"
          and "/device:" in e.get("args", {}).get("name", "")}


def _library_kernel(name: str) -> tuple[str, str] | None:
  """(kind, pseudo op_name) of a GPU library kernel no HLO name matches: a
  cuBLAS / CUTLASS matmul, or cuDNN's fused attention (its direction from
  the kernel name); None for anything else (memsets)."""
  if "cudnn" in name:
    bwd = re.search(r"bprop|dq|dot_do_o", name)
    return "attention kernel", ("transpose(cudnn)/attention" if bwd else "attention")
  if re.search(r"nvjet|gemm|xmma|cutlass|cublas", name, re.I):
    return "dot", "library_matmul"
  return None


def _trace(run, steps: int) -> list[dict]:
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for _ in range(steps):
        run()
    path = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"),
                     recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)
  return events["traceEvents"] if isinstance(events, dict) else events


def _dumped_hlo(module: str) -> str:
  paths = sorted(glob.glob(os.path.join(
      _DUMP, f"*.{module}.*after_optimizations.txt")), key=os.path.getmtime)
  with open(paths[-1]) as f:
    return f.read()


def profile(config, system: str, steps: int = 3) -> dict:
  """Times and traces ``steps`` steps of ``system``; its record."""
  extra = {}
  if system == "bertjax":
    run, compile_s, compiled = step_bench.bertjax_step(config, return_compiled=True)
    hlo = compiled.as_text()
    extra["donated_buffers"] = hlo.count("may-alias") + hlo.count("must-alias")
    host = step_bench.synthetic_batch(config)
    transfer = []
    for _ in range(5):
      start = time.perf_counter()
      jax.block_until_ready(train.to_global(host, _mesh_of(config)))
      transfer.append(time.perf_counter() - start)
    extra["host_to_device_s"] = round(statistics.median(transfer), 6)
  else:
    run, compile_s = step_bench.hf_flax_step(config)
    hlo = _dumped_hlo("jit_step")
  if _SAVE_HLO.value:
    with open(f"{_SAVE_HLO.value}.{system}.txt", "w") as f:
      f.write(hlo)
  table = _instructions(hlo)
  for _ in range(2):
    run()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  by_kind: dict[str, float] = collections.Counter()
  by_part: dict[str, float] = collections.Counter()
  by_op: dict[str, float] = collections.Counter()
  by_part_kind: dict[tuple[str, str], float] = collections.Counter()
  events = _trace(run, steps)
  if _RAW_TOP.value:
    extra["raw"] = _raw_summary(events, steps, _RAW_TOP.value)
  # A GPU kernel is named after its fusion with '_' for '.'; identical
  # fusions of different layers share one kernel (the first one's name).
  kernels = {name.replace(".", "_"): entry for name, entry in table.items()}
  device = _device_pids(events)
  for event in events:
    if event.get("ph") != "X":
      continue
    name = event.get("name", "")
    entry = table.get(name) or kernels.get(name)
    if entry is None and event.get("pid") in device:
      entry = _library_kernel(name)
    if entry is not None:
      kind, op_name = entry
      seconds = event["dur"] / 1e6 / steps
      by_kind[kind] += seconds
      by_part[_part(op_name, system)] += seconds
      by_op[event["name"]] += seconds
      by_part_kind[_part(op_name, system), kind] += seconds
  total = sum(by_kind.values())
  share = lambda d: {k: round(v / total, 4) for k, v in sorted(
      d.items(), key=lambda kv: -kv[1])}
  return {"compile_s": round(compile_s, 2),
          "step_s_median": round(statistics.median(times), 4),
          "op_s_per_step": round(total, 4),
          "kind": share(by_kind), "part": share(by_part),
          "part_kind": {f"{p} | {k}": v for (p, k), v in share(by_part_kind).items()},
          **extra,
          **({"top": [(name, *table[name], round(t / total, 4))
                      for name, t in by_op.most_common(_TOP.value)]}
             if _TOP.value else {})}


def _mesh_of(config):
  from bertjax import sharding
  return sharding.make_mesh(config.mesh_shape)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = flags.FLAGS.config
  record = {"model": f"{config.model}-{config.model_size}",
            "batch_size": int(config.batch_size), "seq_len": int(config.seq_len),
            "devices": jax.device_count()}
  for system in _SYSTEMS.value:
    record[system] = profile(config, system, _STEPS.value)
  print(json.dumps(record))


if __name__ == "__main__":
  app.run(main)
