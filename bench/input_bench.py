r"""Host-side throughput of the input pipeline, per layout, reading prepared shards.

  python bench/input_bench.py --config=configs/bert.py:tiny --workdir=/tmp/bertjax-demo

Prepares the config's corpus under ``<workdir>/data`` if needed (or reads
``config.data_dir``), then for each layout of ``--layouts`` (sequence length
from ``--seq_lens``, e.g. sentence_pairs at 128 and doc_sentences at 512)
builds the training iterator, skips ``--warmup`` batches, and times
``--batches`` batches. Prints one JSON line per layout with sequences/s and
tokens/s per wall second and per CPU second of this process (the per-core
figure: pipeline threads are counted by the CPU time they use). Tokens are
the batch's slots (batch x seq_len); ``real_tokens`` counts non-padding ones.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from absl import app
from absl import flags

from bertjax import batch as batch_lib
from bertjax import config_files
from bertjax.data import pipeline
from bertjax.data import prepare

_CONFIG = config_files.define_config_flag("Train config file, e.g. configs/bert.py:tiny.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/bertjax-input-bench",
                               "Where the corpus is prepared unless config.data_dir.")
_LAYOUTS = flags.DEFINE_list("layouts", ["sentence_pairs", "doc_sentences"],
                             "Packing layouts to time.")
_SEQ_LENS = flags.DEFINE_list("seq_lens", ["128", "512"],
                              "Sequence length per layout (same order).")
_BATCHES = flags.DEFINE_integer("batches", 50, "Timed batches per layout.")
_WARMUP = flags.DEFINE_integer("warmup", 5, "Untimed batches first.")


def measure(config, prepared, layout: str, seq_len: int, *, batches: int,
            warmup: int) -> dict[str, Any]:
  """Times ``batches`` host batches of ``layout`` at ``seq_len``."""
  config = config.copy_and_resolve_references()
  config.layout = layout
  config.seq_len = seq_len
  it = pipeline.make_train_iterator(config, prepared.source(config.train_split),
                                    local_batch_size=config.batch_size)
  for _ in range(warmup):
    next(it)
  real = 0
  wall0, cpu0 = time.perf_counter(), time.process_time()
  for _ in range(batches):
    batch = next(it)
    real += int((batch["tokens"] != batch_lib.PAD_ID).sum())
  wall = time.perf_counter() - wall0
  cpu = max(time.process_time() - cpu0, 1e-9)
  sequences = batches * config.batch_size
  tokens = sequences * seq_len
  return {
      "layout": layout, "seq_len": seq_len, "batch_size": int(config.batch_size),
      "batches": batches, "host_cores": os.cpu_count(),
      "sequences_per_s": round(sequences / wall, 1),
      "tokens_per_s": round(tokens / wall, 1),
      "tokens_per_cpu_s": round(tokens / cpu, 1),
      "sequences_per_cpu_s": round(sequences / cpu, 1),
      "real_token_fraction": round(real / tokens, 4),
  }


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if len(_SEQ_LENS.value) != len(_LAYOUTS.value):
    raise app.UsageError("--seq_lens needs one length per entry of --layouts.")
  prepared = prepare.prepare(
      config, prepare.resolve_data_dir(config, os.path.abspath(_WORKDIR.value)))
  for layout, seq_len in zip(_LAYOUTS.value, _SEQ_LENS.value):
    record = measure(config, prepared, layout, int(seq_len),
                     batches=_BATCHES.value, warmup=_WARMUP.value)
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  app.run(main)
