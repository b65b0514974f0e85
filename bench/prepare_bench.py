r"""Benchmark of ``python -m bertjax.prepare`` on corpora of 10 MB, 100 MB and 1 GB.

  python bench/prepare_bench.py                     # every size, 1 and 2 workers
  python bench/prepare_bench.py --sizes_mb=10,100 --workers=1,2 --beam_mb=100

The corpora are assembled from text that ships with this Python environment:
paragraphs of the ``.md``/``.rst``/``.txt`` files and of the docstrings in
site-packages and the standard library, de-duplicated. Each corpus is a
directory of files of about 40 KB, one document each, whose paragraphs are
drawn at random (fixed seed) from that pool: no two documents are the same,
though paragraphs recur in the larger corpora. Corpora are cached under
``--corpus_dir``.

Each run is a fresh ``python -m bertjax.prepare`` process (bert.py:tiny with
``bertjax_local_text`` and the paper sizes' 16 tokenizer threads) in a new data_dir; it reports wall time, MB/s, MB/s per
core used, and peak RSS: of the whole process tree (main process plus
workers, summed, sampled every 0.1 s) and of its largest process. Prints one
JSON object per run, then a summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time

import psutil

_PARAGRAPH = re.compile(r"\n[ \t]*\n")
_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)
_DOC_BYTES = 40_000


def _prose(block: str) -> str | None:
  """A paragraph that reads as prose, whitespace collapsed, or None."""
  text = " ".join(block.split())
  if len(text) < 120 or text.count(" ") < 15:
    return None
  letters = sum(c.isalpha() or c == " " for c in text)
  if letters < 0.85 * len(text) or any(m in text for m in ("{", "}", "==", "::", ">>>", "|")):
    return None
  return text


def paragraph_pool(limit_bytes: int = 120_000_000) -> list[str]:
  """Unique prose paragraphs from the environment's docs and docstrings."""
  roots = sorted(set(site.getsitepackages() + [sysconfig.get_paths()["stdlib"],
                                                "/usr/share/doc"]))
  seen, pool, total = set(), [], 0
  for root in roots:
    for dirpath, dirnames, filenames in os.walk(root):
      dirnames.sort()
      for name in sorted(filenames):
        ext = os.path.splitext(name)[1]
        if ext not in (".py", ".md", ".rst", ".txt"):
          continue
        try:
          with open(os.path.join(dirpath, name), encoding="utf-8") as f:
            text = f.read(2_000_000)
        except (OSError, UnicodeDecodeError):
          continue
        chunks = _DOCSTRING.findall(text) if ext == ".py" else [text]
        for chunk in chunks:
          for block in _PARAGRAPH.split(chunk):
            para = _prose(block)
            if para is None:
              continue
            digest = hashlib.blake2b(para.encode(), digest_size=8).digest()
            if digest in seen:
              continue
            seen.add(digest)
            pool.append(para)
            total += len(para) + 2
            if total >= limit_bytes:
              return pool
  return pool


def make_corpus(directory: str, size_mb: int, pool: list[str], seed: int = 0) -> str:
  """Writes (once) a corpus of ``size_mb`` MB of documents into ``directory``."""
  done = os.path.join(directory, ".complete")
  if os.path.exists(done):
    return directory
  shutil.rmtree(directory, ignore_errors=True)
  os.makedirs(directory)
  rng = random.Random(seed)
  written, index = 0, 0
  while written < size_mb * 1_000_000:
    paragraphs, size = [], 0
    while size < _DOC_BYTES:
      para = pool[rng.randrange(len(pool))]
      paragraphs.append(para)
      size += len(para) + 2
    sub = os.path.join(directory, f"{index // 1000:04d}")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f"doc{index:07d}.txt"), "w", encoding="utf-8") as f:
      f.write("\n\n".join(paragraphs) + "\n")
    written += size
    index += 1
  open(done, "w").close()
  return directory


def _tree_rss(proc: psutil.Process) -> tuple[int, int]:
  """(sum, max) RSS in bytes over a process and its descendants."""
  sizes = []
  for p in [proc] + proc.children(recursive=True):
    try:
      sizes.append(p.memory_info().rss)
    except psutil.Error:
      pass
  return sum(sizes), max(sizes, default=0)


def run_prepare(corpus: str, workers: int, beam_runner: str = "",
                extra: tuple[str, ...] = ()) -> dict:
  """One fresh prepare of ``corpus``; returns its measurements."""
  workdir = tempfile.mkdtemp(prefix="bertjax-prepare-bench-")
  cmd = [sys.executable, "-m", "bertjax.prepare", "--config=bert.py:tiny",
         f"--workdir={workdir}", "--config.dataset=bertjax_local_text",
         f"--config.text_files={corpus}", f"--config.prepare_workers={workers}",
         # The paper sizes' tokenizer settings (tiny keeps the demo's 1 thread).
         "--config.tokenizer_train_threads=16", *extra]
  if beam_runner:
    cmd += [f"--beam_runner={beam_runner}",
            f"--beam_options=--direct_num_workers={workers},"
            "--direct_running_mode=multi_threading"]
  start = time.time()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=tempfile.gettempdir())
  ps = psutil.Process(proc.pid)
  peak_sum = peak_max = 0
  while proc.poll() is None:
    total, largest = _tree_rss(ps)
    peak_sum, peak_max = max(peak_sum, total), max(peak_max, largest)
    time.sleep(0.1)
  wall = time.time() - start
  out, err = proc.communicate()
  if proc.returncode:
    raise RuntimeError(f"prepare failed ({proc.returncode}): {err[-2000:]}")
  timings = dict(re.findall(r"(Trained tokenizer|Tokenized|Built)\b.*? in ([\d.]+) s", err))
  shutil.rmtree(workdir)
  mb = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(corpus)
           for f in fs if f.endswith(".txt")) / 1e6
  return {"corpus_mb": round(mb, 1), "workers": workers, "engine": beam_runner or "local",
          "wall_s": round(wall, 1), "mb_per_s": round(mb / wall, 3),
          "mb_per_s_per_core": round(mb / wall / min(workers, os.cpu_count() or 1), 3),
          "peak_rss_tree_gb": round(peak_sum / 2**30, 3),
          "peak_rss_process_gb": round(peak_max / 2**30, 3),
          # The per-core rate of everything but the (fixed-size) tokenizer training:
          # what scales with the corpus and the cores.
          "streaming_mb_per_s_per_core": round(
              mb / (wall - float(timings.get("Trained tokenizer", 0)))
              / min(workers, os.cpu_count() or 1), 3),
          "text_s": float(timings.get("Built", "nan")),
          "tokenizer_s": float(timings.get("Trained tokenizer", "nan")),
          "tokenize_s": float(timings.get("Tokenized", "nan"))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes_mb", default="10,100,1000")
  parser.add_argument("--workers", default="1,2")
  parser.add_argument("--beam_mb", type=int, default=100,
                      help="corpus size for the Beam DirectRunner run (0 = none)")
  parser.add_argument("--corpus_dir", default=os.path.join(
      tempfile.gettempdir(), "bertjax-bench-corpora"))
  parser.add_argument("--extra", default="", help="comma-separated extra flags")
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes_mb.split(",") if s]
  worker_counts = [int(w) for w in args.workers.split(",") if w]
  extra = tuple(e for e in args.extra.split(",") if e)
  pool = None
  corpora = {}
  for size in sorted(set(sizes + ([args.beam_mb] if args.beam_mb else []))):
    path = os.path.join(args.corpus_dir, f"{size}mb")
    if not os.path.exists(os.path.join(path, ".complete")):
      pool = pool or paragraph_pool()
    corpora[size] = make_corpus(path, size, pool)
  results = []
  for size in sizes:
    for workers in worker_counts:
      result = run_prepare(corpora[size], workers, extra=extra)
      print(json.dumps(result), flush=True)
      results.append(result)
  if args.beam_mb:
    result = run_prepare(corpora[args.beam_mb], max(worker_counts), "DirectRunner", extra)
    print(json.dumps(result), flush=True)
    results.append(result)
  local = [r for r in results if r["engine"] == "local"]
  speedup = {}
  for size in sizes:
    by_workers = {r["workers"]: r["wall_s"] for r in local if r["corpus_mb"] and
                  abs(r["corpus_mb"] - size) < 0.2 * size}
    if 1 in by_workers and len(by_workers) > 1:
      most = max(by_workers)
      speedup[f"{size}mb_{most}w_over_1w"] = round(by_workers[1] / by_workers[most], 2)
  print(json.dumps({"summary": {
      "peak_rss_tree_gb_by_size": {r["corpus_mb"]: r["peak_rss_tree_gb"] for r in local},
      "speedup": speedup}}))


if __name__ == "__main__":
  main()
