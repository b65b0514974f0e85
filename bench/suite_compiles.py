r"""Where the test suite's compile time goes, from a logged run.

  BERTJAX_TEST_COMPILES=/tmp/cl pytest
  python bench/suite_compiles.py /tmp/cl

`tests/conftest.py` logs every trace, lowering, XLA compile and
compilation-cache hit with the test that caused it (one JSON line each, a
file per test process). This sums them: seconds of tracing, lowering and
backend compiling (hits included, which cost only the cache read), the count
of cache misses and hits, the test files and jitted functions with the most
compile time, and per function the compiles the cache missed (a compile
counts as a hit when the cache event just before it in the same process is
a hit). Prints one JSON object. A measurement, not a test.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_COMPILE = "/jax/core/compile/backend_compile_duration"
_MISS = "/jax/compilation_cache/cache_misses"
_HIT = "/jax/compilation_cache/cache_hits"
_SAVED = "/jax/compilation_cache/compile_time_saved_sec"


def _top(counter, n=15):
  return [[k, round(v, 1)] for k, v in counter.most_common(n)]


def summarize(records):
  """Totals and the heaviest files and functions over RECORDS."""
  secs = collections.Counter()
  counts = collections.Counter()
  by_file = collections.Counter()
  by_fun = collections.Counter()
  fun_count = collections.Counter()
  missed = collections.Counter()
  missed_s = collections.Counter()
  last_cache_event = None
  for r in records:
    event = r["event"]
    counts[event] += 1
    secs[event] += r["secs"]
    if event in (_HIT, _MISS):
      last_cache_event = event
    if event == _COMPILE:
      by_file[r["test"].split("::")[0] or "(outside a test)"] += r["secs"]
      by_fun[r["fun"]] += r["secs"]
      fun_count[r["fun"]] += 1
      if last_cache_event != _HIT:
        missed[r["fun"]] += 1
        missed_s[r["fun"]] += r["secs"]
      last_cache_event = None
  return {
      "trace_s": round(secs[_TRACE], 1),
      "lower_s": round(secs[_LOWER], 1),
      "compile_s": round(secs[_COMPILE], 1),
      "compiles": counts[_COMPILE],
      "cache_misses": counts[_MISS],
      "cache_hits": counts[_HIT],
      "saved_by_hits_s": round(secs[_SAVED], 1),
      "compile_s_by_file": _top(by_file),
      "compile_s_by_function": _top(by_fun),
      "compiles_by_function": fun_count.most_common(15),
      "misses_by_function": [[f, missed[f], round(t, 1)] for f, t in missed_s.most_common(15)],
  }


def main(argv):
  if len(argv) != 2:
    sys.exit("usage: python bench/suite_compiles.py DIR (the BERTJAX_TEST_COMPILES directory)")
  records = []  # one process's file after another, so each stays in order
  for path in sorted(glob.glob(os.path.join(argv[1], "*.jsonl"))):
    with open(path) as f:
      records.extend(json.loads(line) for line in f if line.strip())
  if not records:
    sys.exit(f"No compile records under {argv[1]}; run the tests with BERTJAX_TEST_COMPILES={argv[1]} first.")
  print(json.dumps(summarize(records)))


if __name__ == "__main__":
  main(sys.argv)
