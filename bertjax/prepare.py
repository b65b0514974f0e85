r"""Prepares a corpus once: text dataset, tokenizer and tokenized shards.

  python -m bertjax.prepare --config=configs/bert.py:tiny --workdir=/tmp/bertjax-demo

Everything goes to ``config.data_dir`` (default ``<workdir>/data``); running it
again checks and reuses what is there. Training (``bertjax.main``) calls the
same library function, so running this first is optional.

  ... --verify   checks every shard prepare made under the data_dir (sha256
                 and size against the manifest recorded at prepare time, and
                 every record read and decoded), and lists what the config
                 needs that is missing or unfinished (its text and tokenized
                 datasets, its tokenizer); changes nothing; exit status 1
                 when a shard is damaged or something is missing.
  ... --repair   the same check, then removes each damaged dataset and
                 prepares it again (shards are deterministic: the same records).

At scale the units of work run on ``config.prepare_workers`` local processes,
or on Apache Beam (the beam extra) with the same output:

  python -m bertjax.prepare --config=... --workdir=... --beam_runner=DirectRunner

A gs:// data_dir is prepared through a local mirror (bertjax/paths.py) by
local workers or DirectRunner; a distributed runner needs a data_dir on a
disk its workers share (its workers cannot read ArrayRecord from GCS).
"""

import errno
import sys

from absl import app
from absl import flags
from absl import logging
import tensorflow_datasets as tfds

from bertjax import cli
from bertjax import config_files
from bertjax import guards
from bertjax.data import layout
from bertjax.data import mixture
from bertjax.data import prepare
from bertjax.data import shards
from bertjax.data import text_sources

_CONFIG = config_files.define_config_flag(
    "Config file, e.g. configs/bert.py:tiny (bertjax's own if not found here).")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory; data goes to <workdir>/data unless --config.data_dir.")
_VERIFY = flags.DEFINE_bool(
    "verify", False, "Check every shard of the data_dir and report; prepares nothing.")
_REPAIR = flags.DEFINE_bool(
    "repair", False, "Check every shard, remove damaged datasets, prepare them again.")
_BEAM_RUNNER = flags.DEFINE_string(
    "beam_runner", "", "Run prepare's units on this Apache Beam runner "
    "(DirectRunner, DataflowRunner, SparkRunner, FlinkRunner); '' = local processes.")
_BEAM_OPTIONS = flags.DEFINE_list(
    "beam_options", [], "Beam pipeline options, comma-separated, e.g. "
    "--project=p,--region=r,--temp_location=gs://b/tmp.")
flags.mark_flags_as_required(["config", "workdir"])


def _verify(data_dir: str, *, required: bool) -> list[shards.Report]:
  """Prints one line per shard and a summary; returns the reports."""
  reports = shards.verify(data_dir)
  if not reports and not required:
    return reports
  if not reports:
    raise ValueError(
        f"No prepared shards under {data_dir}; run python -m bertjax.prepare "
        f"with the same --config and --workdir first.")
  for r in reports:
    print(f"{'ok' if r.problem is None else 'DAMAGED':<8} {r.shard.split:<11} "
          f"{r.shard.path}" + (f"  ({r.problem})" if r.problem else ""))
  damaged = sum(r.problem is not None for r in reports)
  unchecked = sum(not r.checksum for r in reports)
  how = ("read and decoded in full, sha256 compared" if not unchecked else
         f"read and decoded in full ({unchecked} without a recorded sha256)")
  print(f"{len(reports)} shards of {data_dir} {how}: "
        f"{len(reports) - damaged} ok, {damaged} damaged")
  return reports




def _no_space(error: BaseException) -> bool:
  return (isinstance(error, OSError) and error.errno == errno.ENOSPC) or (
      "No space left on device" in str(error))


def main(argv):
  try:
    # SIGTERM (a job's scheduler, a preempted VM) stops as Ctrl-C does: the
    # workers stopped, one line, status 75 (as bertjax.main's): rerun to go on.
    with guards.sigterm_raises():
      _main(argv)
  except guards.Terminated:
    # The pool's workers were stopped on the way up (prepare's clean-up).
    print("error: stopped by SIGTERM; run the same command again to go on from "
          "the units already prepared.", file=sys.stderr, flush=True)
    sys.exit(guards.EXIT_PREEMPTED)
  except (OSError, RuntimeError) as e:
    if not _no_space(e):
      raise
    where = getattr(e, "filename", None) or prepare.resolve_data_dir(
        _CONFIG.value, _WORKDIR.value)
    print(f"error: no space left on the device while writing {where}; free "
          f"space there (or point --config.data_dir at a disk with room) and "
          f"run the same command again to resume.", file=sys.stderr, flush=True)
    sys.exit(guards.EXIT_PREEMPTED)


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  # prepare logs each step and its duration; TFDS's progress bars only add noise.
  tfds.disable_progress_bar()
  config = _CONFIG.value
  data_dir = prepare.resolve_data_dir(config, _WORKDIR.value)
  if _VERIFY.value and _REPAIR.value:
    raise app.UsageError("Pass --verify (report only) or --repair, not both.")
  try:
    # Before anything is read or written: a file where a directory should be.
    layout.check_directories(config, _WORKDIR.value)
    if _VERIFY.value:
      missing = prepare.unprepared(config, data_dir)
      damaged = any(r.problem for r in _verify(data_dir, required=not missing))
      for line in prepare.missing_lines(data_dir, missing):
        print(line)
      if damaged:
        print("re-prepare the damaged shards with the same command and --repair "
              "instead of --verify", file=sys.stderr)
      if missing:
        print("finish preparing what is missing: run the same command without "
              "--verify (it resumes what was staged)", file=sys.stderr)
      sys.exit(1 if damaged or missing else 0)
    if _REPAIR.value:
      # The config's own refusals (a vocab_size the tokenizer lacks, text
      # files gone) before a damaged shard is removed, not after.
      prepare.check_inputs(config, data_dir, _WORKDIR.value)
      reports = _verify(data_dir, required=False)
      for dataset_dir in sorted({r.shard.dataset_dir for r in reports if r.problem}):
        text_sources.check_rebuildable(dataset_dir)  # before anything is removed
      for removed in shards.remove_damaged(reports):
        print(f"removed damaged {removed}; preparing it again")
    prepared = prepare.prepare(config, data_dir, beam_runner=_BEAM_RUNNER.value,
                               beam_options=_BEAM_OPTIONS.value)
  except ValueError as e:
    # Bad input gets its one sentence, not a traceback, and status 2 as in
    # the other binaries (1 is --verify's "damaged").
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  mixed = isinstance(prepared, mixture.MixedData)
  what = mixture.describe(prepared.corpora) if mixed else config.dataset
  # A gs:// data_dir is prepared in its local mirror and uploaded: name the bucket.
  mirror = "" if prepared.data_dir == data_dir else f" (local mirror {prepared.data_dir})"
  print(f"Prepared {what} in {data_dir}{mirror}")
  tokenizer_path = prepared.tokenizer_path.replace(prepared.data_dir, data_dir, 1)
  print(f"  tokenizer: {tokenizer_path} ({config.tokenizer}, vocab "
        f"{prepared.vocab_size}, sha256 {prepared.fingerprint[:12]})")
  for split, docs in prepared.splits.items():
    unknown = prepared.unk_rate.get(split)
    print(f"  {split}: {docs} documents, {prepared.num_tokens.get(split, 0)} tokens"
          + ("" if unknown is None else f", {100 * unknown:.2f}% [UNK]"))
  if mixed:
    train_tokens = max(prepared.num_tokens.get(config.train_split, 0), 1)
    for label, corpus, part, count, weight in zip(
        prepared.labels(), prepared.corpora, prepared.parts, prepared.train_counts(),
        prepared.weights()):
      # Tokens at the corpus's mean document length (exact for whole copies).
      docs = part.splits[corpus.train_split]
      tokens = count / max(docs, 1) * part.num_tokens.get(corpus.train_split, 0)
      # Named as the metrics name it (<label>/mlm_loss), with its dataset.
      print(f"    {label} ({corpus.dataset}) x{weight:.3g}: {count} documents a pass from its "
            f"{docs} in {corpus.train_split}, ~{100 * tokens / train_tokens:.1f}% of "
            f"the pass's tokens")


if __name__ == "__main__":
  # cli.run, as every binary: an unreachable object store (a gs:// workdir or
  # data_dir) is one line and status 1, not gcsfs's tracebacks.
  cli.run(main)
