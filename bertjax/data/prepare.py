"""Tokenize once: text dataset -> sentencepiece tokenizer -> tokenized shards.

``prepare(config, data_dir)`` makes, under ``data_dir``, whatever is missing of

  <data_dir>/bertjax_python_docs/...        the text dataset (bertjax's own
  <data_dir>/bertjax_local_text/<cfg>/...   builders; public TFDS datasets are
                                            read where the user prepared them)
  <data_dir>/tokenizers/<source>.model      sentencepiece, trained on a uniform
                                            sample of train_split's sentences
  <data_dir>/bertjax_tokenized/<source>/... shards of train_split and eval_split
  <data_dir>/bertjax_tokenized/<source>__knowledge/...  the same with phrase
                                            and entity starts, when
                                            config.knowledge_spans (ERNIE)
  <data_dir>/knowledge/<source>/            the fitted phrase and entity lists

and reuses (after checking) what is there, so a second call takes about a
second. It never deletes anything: when something on disk does not match the
config it raises a ValueError naming the mismatch and the fix, before any work.

At scale: every stage streams. The work is cut into units of about
``config.prepare_block_mb`` of text (bertjax/data/units.py), run by
``config.prepare_workers`` processes (0 = all cores) or by an Apache Beam
runner, each writing its own shard (bertjax/data/staged.py); memory is bounded
by a unit, the shards are the same whatever runs them, and a killed prepare
resumes with the units it had not finished. The tokenizer trains on a
uniform sample of about ``config.tokenizer_sample_sentences`` sentences;
ERNIE's phrase and entity lists are fitted on ``config.knowledge_fit_documents``
evenly spaced train documents.

Every dataset it builds gets a manifest of its shards (size, sha256, records;
``bertjax/data/shards.py``); reused shards are checked against their recorded
sizes, and reading a damaged one raises a one-line ``DamagedShardError``.
It logs the [UNK] rate of every split and warns above
``tokenized.UNK_WARN_RATE`` (the tokenized shards are made and reused in
bertjax/data/tokenized.py).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Sequence

from absl import logging

from bertjax import mirror
from bertjax import paths
from bertjax import workdir_lock
from bertjax.data import bucket_units
from bertjax.data import builders
from bertjax.data import knowledge
from bertjax.data import layout
from bertjax.data import mixture
from bertjax.data import staged
from bertjax.data import text_sources
from bertjax.data import tokenized
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data import tokenizer_fit
from bertjax.data import workers

# What ``prepare`` returns (of a mixture, ``mixture.MixedData``), made in
# bertjax/data/tokenized.py.
PreparedData = tokenized.PreparedData

# ``config.data_dir`` if set, else ``<workdir>/data`` (bertjax/data/layout.py).
resolve_data_dir = layout.resolve_data_dir


def engine_of(config, beam_runner: str = "",
              beam_options: Sequence[str] = ()) -> text_sources.Engine:
  """How prepare runs its units, from config.prepare_* and the Beam flags."""
  block_mb = config.get("prepare_block_mb", 8)
  if not 0 < block_mb < math.inf:  # NaN fails too (was int(nan)'s ValueError)
    raise ValueError(
        f"config.prepare_block_mb={block_mb} must be positive; set it to the "
        f"MB of text per unit of work, e.g. 8.")
  # Checked before any text is read: they only matter once the tokenizer
  # trains (0 sentences read as an empty corpus, 0 threads was
  # sentencepiece's traceback).
  sample = config.get("tokenizer_sample_sentences", 1)
  if int(sample) < 1:
    raise ValueError(
        f"config.tokenizer_sample_sentences={sample} must be positive; set it "
        f"to the number of sentences the tokenizer trains on, e.g. 500000.")
  threads = config.get("tokenizer_train_threads", 1)
  if not 1 <= int(threads) <= 1024:
    raise ValueError(
        f"config.tokenizer_train_threads={threads} must be between 1 and 1024 "
        f"(sentencepiece's limit); set it to e.g. 8.")
  return text_sources.Engine(
      workers=workers.resolve_workers(config.get("prepare_workers", 0)),
      block_bytes=int(block_mb * (1 << 20)), beam_runner=beam_runner,
      beam_options=tuple(beam_options))


def prepare(config, data_dir: str, *, beam_runner: str = "",
            beam_options: Sequence[str] = ()) -> PreparedData:
  """Makes (or checks and reuses) the text dataset, tokenizer and shards.

  Args:
    config: the run's ConfigDict (dataset, text_files, text_feature,
      train_split, eval_split, tokenizer, vocab_size, prepare_workers,
      prepare_block_mb, tokenizer_sample_sentences, tokenizer_train_threads;
      knowledge_spans, knowledge_fit_documents and the ``ernie_*`` fields of
      bertjax/data/knowledge.py).
    data_dir: root directory of everything prepared (see module docstring).
    beam_runner: run the units on this Apache Beam runner instead of local
      worker processes ('' = local).
    beam_options: further Beam pipeline options ('--project=...', ...).

  Returns:
    PreparedData describing the shards.
  """
  engine = engine_of(config, beam_runner, beam_options)
  if paths.is_remote(data_dir):  # the clearer message for local text files
    _check_beam_inputs(config, data_dir, engine)
  check_inputs(config, data_dir)
  # A file where a directory is to be written is refused before any write.
  layout.check_data_dir(config, data_dir)
  spans = (knowledge.Settings.from_config(config)
           if config.get("knowledge_spans", False) else None)
  # A data_dir is locked while this writes it (a gs:// one through this
  # machine's mirror of it, which two prepares would write at once); a run
  # whose data is all there only reads, and takes no lock
  # (bertjax/workdir_lock.py).
  locks = []
  try:
    if unprepared(config, data_dir):
      if paths.is_remote(data_dir):
        locks.append(_MirrorLock(data_dir).acquire())
        if data_dir.startswith("gs://"):  # against other machines' prepares
          locks.append(_bucket_lock(data_dir).acquire())
      else:
        locks.append(workdir_lock.DataDirLock(data_dir).acquire())
    if paths.is_remote(data_dir):
      return _prepare_mirrored(config, data_dir, spans, engine)
    return _prepare(config, data_dir, spans, engine)
  finally:
    workers.shutdown()
    for lock in reversed(locks):
      lock.release()


def _bucket_lock(data_dir: str):
  """A lease on ``<data_dir>/.bertjax-prepare.lock`` in the bucket
  (bertjax/gcs_lease.py), refusing a prepare from another machine."""
  from bertjax import gcs_lease  # pylint: disable=g-import-not-at-top
  remote = paths.absolute(data_dir)
  return gcs_lease.GcsLease(
      remote + "/" + workdir_lock.DATA_LOCK_FILE,
      lambda holder: (f"Another bertjax prepare ({holder}) is writing the "
                      f"data_dir {remote}; wait for it to end and run this "
                      "command again (it then reuses what that one prepared), "
                      "or point --config.data_dir at another directory."))


class _MirrorLock(workdir_lock.DataDirLock):
  """``DataDirLock`` on this machine's mirror of the gs:// data_dir ``remote``
  (mirror.local_mirror), named by the bucket: a second prepare into the same
  mirror failed midway (FileExistsError from TFDS's rename, one of them)."""

  flag = "BERTJAX_CACHE_DIR"

  def __init__(self, remote: str):
    super().__init__(mirror.local_mirror(remote))
    self.remote = paths.absolute(remote)
    self.what = f"the local mirror of {self.remote}"

  def _busy(self, holder: str) -> str:
    return (f"Another bertjax prepare ({holder}) is writing the data_dir "
            f"{self.remote} through this machine's mirror of it ({self.workdir}); "
            "wait for it to end and run this command again (it then reuses "
            "what that one prepared), or point --config.data_dir at another "
            "directory.")


def needed(config, data_dir: str) -> list[tuple[str, str]]:
  """(what, directory or file) of each thing ``prepare`` makes under
  ``data_dir`` for ``config``: bertjax's own text datasets, the tokenizer
  (none for an imported one) and the tokenized datasets. Reads nothing."""
  spans = bool(config.get("knowledge_spans", False))
  corpora = mixture.parse(config)
  items = []
  texts = ([(c.dataset, mixture.text_dir(data_dir, c) if c.is_local_text() else data_dir)
            for c in corpora] or [(config.dataset, data_dir)])
  for dataset, root in texts:
    name = dataset.partition("/")[0]
    if name == "bertjax_local_text":
      items.append((f"text dataset {dataset}",
                    text_sources.local_text_dir(root, dataset)))
    elif name == "bertjax_python_docs":
      items.append((f"text dataset {dataset}", os.fspath(
          builders.BertjaxPythonDocs(data_dir=root).data_path)))
  key = _source_key(config)
  if config.tokenizer != "hf":
    items.append(("tokenizer", tokenizer_path(config, data_dir)))
  names = ([mixture.shards_name(config, c) for c in corpora] if corpora else
           [key + (builders.KNOWLEDGE_SUFFIX if spans else "")])
  for n in names:
    items.append(("tokenized dataset", os.path.join(
        data_dir, "bertjax_tokenized", n, tokenized.VERSION)))
  return items


def tokenizer_path(config, data_dir: str) -> str:
  """Where prepare stores (or finds) the tokenizer it trains for ``config``:
  ``<data_dir>/tokenizers/<source or mixture key>.model``."""
  return tokenizer_fit.stored_path(data_dir, _source_key(config))


def _source_key(config) -> str:
  """The name of the config's source (a mixture's joint name) for its
  tokenizer and tokenized shards."""
  corpora = mixture.parse(config)
  return mixture.name(corpora) if corpora else builders.source_key(config.dataset)


def unprepared(config, data_dir: str) -> list[tuple[str, str]]:
  """The items of ``needed`` that are missing or unfinished (a dataset
  without its published record: still in, or not yet in, ``.staging``)."""
  return [(what, where) for what, where in needed(config, data_dir)
          if not (paths.exists(where) if what == "tokenizer"
                  else staged.is_published(where))]


def unfinished(data_dir: str, where: str) -> bool:
  """Whether an interrupted prepare left work staged for ``where`` (an item
  of ``unprepared`` under ``data_dir``): a dataset's finished units in its
  ``.staging``, or a tokenizer's sample beside it. A gs:// data_dir is
  prepared in this machine's mirror of it (``mirror.local_mirror``), whose
  staging is never uploaded, and Beam's workers stage in the bucket: both
  are looked in."""
  places = [where]
  if paths.is_remote(data_dir):
    remote = paths.absolute(data_dir)
    rel = paths.absolute(where)[len(remote):].lstrip("/")
    places.append(os.path.join(mirror.local_mirror(remote), rel))
  return any(paths.isdir(paths.join(p, staged.STAGING)) or paths.isdir(f"{p}.sample")
             for p in places)


def missing_lines(data_dir: str, missing: list[tuple[str, str]]) -> list[str]:
  """``prepare --verify``'s report: a line for each item of ``unprepared``
  (marked when an interrupted prepare left work staged for it) and a
  summary; none when nothing is missing."""
  if not missing:
    return []
  lines = [f"{'MISSING':<8} {what:<11} {where}"
           + ("  (unfinished: its finished units wait in .staging)"
              if unfinished(data_dir, where) else "")
           for what, where in missing]
  lines.append(f"{len(missing)} of what the config needs "
               f"{'is' if len(missing) == 1 else 'are'} not (fully) prepared in {data_dir}")
  return lines


def check_inputs(config, data_dir: str | None = None, workdir: str | None = None) -> None:
  """Refuses, reading only and before any directory is made, a dataset,
  split or tokenizer that is not set or not known, local text files that
  match nothing (each input of a mixture too) unless ``data_dir`` holds the
  text prepared from them, or whose directories hold the workdir or data_dir,
  and a vocab_size (or tokenizer type) that a tokenizer already there, stored
  in ``data_dir`` or imported, does not have."""
  if not config.get("dataset"):
    raise ValueError("config.dataset is empty; set --config.dataset, e.g. bertjax_python_docs.")
  if not config.get("train_split"):
    raise ValueError("config.train_split is empty; set --config.train_split, e.g. train.")
  if config.tokenizer not in tokenizer_lib.MODEL_TYPES + ("hf",):
    raise ValueError(
        f"Unknown tokenizer type {config.tokenizer!r}; set --config.tokenizer to "
        f"one of {', '.join(tokenizer_lib.MODEL_TYPES)}.")
  tokenizer_fit.check_imported(config)
  outputs = tuple(p for p in (workdir, data_dir) if p)
  corpora = mixture.parse(config)
  inputs = [(c.dataset, c.text_files,
             mixture.text_dir(data_dir, c) if data_dir else None) for c in corpora] or [
      (config.dataset, config.get("text_files", ""), data_dir)]
  if data_dir is not None:  # every dataset name, before any corpus is built
    for c in corpora:
      text_sources.check_dataset(mixture.corpus_config(config, c), data_dir, c.entry)
    if not corpora:
      text_sources.check_dataset(config, data_dir)
  read = {}  # what decides a local-text corpus, its files resolved -> its entry
  for k, (dataset, text_files, root) in enumerate(inputs):
    if dataset.partition("/")[0] == "bertjax_local_text":
      found = text_sources.local_text_files(dataset, text_files, root, outputs)
      if corpora and found:
        c = corpora[k]
        same = (dataset, frozenset(paths.absolute(f) for f in found),
                c.train_split, c.eval_split)
        if same in read:
          raise ValueError(
              f"config.mixture entry {c.entry!r} reads the same files as "
              f"{read[same]!r} ({len(found)} files); list each corpus once and "
              f"give it a weight instead.")
        read[same] = c.entry
  if data_dir is not None:  # a tokenizer already there fixes vocab_size
    tokenizer_fit.check_existing(config, tokenizer_path(config, data_dir))


def _prepare_mirrored(config, data_dir: str, spans,
                      engine: text_sources.Engine) -> PreparedData:
  """``_prepare`` for a remote (gs://) data_dir, through a local mirror.

  ArrayRecord reads and writes local files only (bertjax/paths.py), so the
  remote data_dir is copied to a local mirror (what it lacks only), prepared
  there (reusing whatever the remote already held), and what was made is
  uploaded back by process 0, markers last, so that a cut-short upload is
  never taken for a dataset. The shards are then read from the mirror.
  """
  import jax  # only here: Beam workers import this module without devices
  remote = paths.absolute(data_dir)
  local = mirror.local_mirror(remote)
  start = time.time()
  fetched = mirror.pull(remote, local)
  logging.info("Mirrored %s to %s (%d files fetched, %.1f s).", remote, local,
               fetched, time.time() - start)
  if engine.beam_runner:
    # Beam's workers read and write the bucket (bertjax/data/bucket_units.py);
    # the units a killed run finished there are not redone.
    bucket_units.resume(local, remote)
    engine = dataclasses.replace(engine, bucket=(local, remote))
  try:
    prepared = _prepare(config, local, spans, engine)
  except ValueError as e:
    # Name the bucket the user gave, not this machine's mirror of it.
    raise ValueError(str(e).replace(local, remote)) from None
  if jax.process_index() == 0:
    start = time.time()
    sent = mirror.push(local, remote)
    logging.info("Uploaded %d prepared files to %s (%.1f s).", sent, remote,
                 time.time() - start)
    if engine.beam_runner:
      bucket_units.clean(remote)
  return prepared


def _check_beam_inputs(config, data_dir: str, engine: text_sources.Engine) -> None:
  """Refuses, before any work, inputs a distributed Beam runner's workers
  cannot read: local text files (the data_dir being a bucket, they have no
  disk in common with this machine)."""
  if engine.beam_runner in ("", "DirectRunner"):
    return
  inputs = [(c.dataset, c.text_files) for c in mixture.parse(config)] or [
      (config.dataset, config.get("text_files", ""))]
  for dataset, text_files in inputs:
    if not (dataset.startswith("bertjax_local_text") and text_files):
      continue
    local = [p for p in text_files.split(",")
             if p.strip() and not paths.is_remote(p.strip())]
    if local:
      raise ValueError(
          f"--beam_runner={engine.beam_runner} workers cannot read the local "
          f"text files {local[0]!r} of a gs:// data_dir ({data_dir}); copy them "
          f"to a bucket and pass gs:// paths in --config.text_files.")


def _prepare(config, data_dir: str, spans, engine: text_sources.Engine) -> PreparedData:
  start = time.time()
  os.makedirs(data_dir, exist_ok=True)
  if mixture.is_mixture(config):
    return _prepare_mixture(config, data_dir, engine, start)
  key = builders.source_key(config.dataset)
  sources = text_sources.text_sources(config, data_dir, engine)
  tok = tokenizer_fit.tokenizer_for(
      config, data_dir, key, [sources[config.train_split]], engine,
      f"{config.dataset} {config.train_split}")
  name = key + (builders.KNOWLEDGE_SUFFIX if spans else "")
  prepared = tokenized.prepare_shards(config, data_dir, name, tok, sources, spans,
                                      os.path.join(data_dir, "knowledge", key), engine)
  logging.info("Prepared %s in %.1f s: %s documents, vocab %d.", config.dataset,
               time.time() - start, prepared.splits, tok.vocab_size)
  return prepared


def _prepare_mixture(config, data_dir: str, engine: text_sources.Engine,
                     start: float) -> mixture.MixedData:
  """Every corpus of ``config.mixture``: its text, one tokenizer trained on
  all their training sentences, each corpus's shards (bertjax/data/mixture.py)."""
  corpora = mixture.parse(config)
  key = mixture.name(corpora)
  configs = [mixture.corpus_config(config, c) for c in corpora]
  sources = [text_sources.text_sources(
      cfg, mixture.text_dir(data_dir, c) if c.is_local_text() else data_dir, engine)
      for cfg, c in zip(configs, corpora)]
  trains = [s[c.train_split] for s, c in zip(sources, corpora)]
  tok = tokenizer_fit.tokenizer_for(config, data_dir, key, trains, engine,
                                    mixture.describe(corpora))
  names = [mixture.shards_name(config, c) for c in corpora]
  spans = (knowledge.Settings.from_config(config)
           if config.get("knowledge_spans", False) else None)
  knowledge_dir = os.path.join(data_dir, "knowledge", key)
  if spans and not all(staged.is_published(os.path.join(
      data_dir, "bertjax_tokenized", n, tokenized.VERSION)) for n in names):
    # One set of phrase and entity lists, fitted on all the corpora.
    tokenized.fit_knowledge(config, spans, tok, trains, knowledge_dir)
  parts = [tokenized.prepare_shards(cfg, data_dir, n, tok, s, spans, knowledge_dir, engine,
                                    fit_on=())
           for cfg, n, s in zip(configs, names, sources)]
  mixed = mixture.MixedData(corpora, parts, train_split=config.train_split,
                            eval_split=config.get("eval_split", ""), data_dir=data_dir)
  # Keyed as the metrics name each corpus (two local texts apart).
  logging.info("Prepared the mixture %s in %.1f s: %s documents per pass, vocab %d.",
               mixture.describe(corpora), time.time() - start,
               dict(zip(mixed.labels(), mixed.train_counts())), tok.vocab_size)
  return mixed
