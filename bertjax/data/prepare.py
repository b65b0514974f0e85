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
It logs the [UNK] rate of every split and warns above ``UNK_WARN_RATE``:
bertjax's own tokenizers fall back to bytes, so only an older or imported
tokenizer loses characters to [UNK].
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from typing import Any, Sequence

from absl import logging
import numpy as np
import tensorflow_datasets as tfds

from bertjax import paths
from bertjax import workdir_lock
from bertjax.data import bucket_units
from bertjax.data import builders
from bertjax.data import knowledge
from bertjax.data import layout
from bertjax.data import mixture
from bertjax.data import shards
from bertjax.data import staged
from bertjax.data import text_sources
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data import tokenizer_fit
from bertjax.data import units
from bertjax.data import workers

# Above this fraction of [UNK] tokens in a split, prepare warns: text is lost.
UNK_WARN_RATE = 0.001
_TOKENIZED_VERSION = "1.0.0"


@dataclasses.dataclass(frozen=True)
class PreparedData:
  """What ``prepare`` made: where the shards and tokenizer are, and their sizes.

  Attributes:
    data_dir: the root directory passed to ``prepare``.
    tokenizer_path: the sentencepiece ``.model`` file.
    vocab_size: number of token ids (special tokens included).
    fingerprint: sha256 of the tokenizer file, as recorded in the shards.
    splits: split name (as in the config) -> number of tokenized documents.
    tokenized_dir: the TFDS directory of the shards (bertjax_tokenized/<source>/<version>).
    num_tokens: split name -> number of tokens in its documents.
    unk_rate: split name -> fraction of its tokens that are [UNK] (absent
      for shards prepared before it was recorded).
  """
  data_dir: str
  tokenizer_path: str
  vocab_size: int
  fingerprint: str
  splits: dict[str, int]
  tokenized_dir: str = ""
  num_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
  unk_rate: dict[str, float] = dataclasses.field(default_factory=dict)

  def source(self, split: str):
    """Random access (``len``, ``[i]``) to a split's tokenized documents.

    Each item is a dict of numpy arrays: tokens int32 [n], word_starts bool [n],
    sentence_lengths int32 [s] with ``sum(sentence_lengths) == n``; shards
    prepared with ``config.knowledge_spans`` add phrase_starts and
    entity_starts bool [n]. A record that cannot be read raises
    ``shards.DamagedShardError`` naming its shard.
    """
    if split not in self.splits:
      raise ValueError(
          f"Split {split!r} was not prepared (have {sorted(self.splits)}); set "
          f"--config.train_split/eval_split to one of them or prepare it.")
    builder = tfds.builder_from_directory(self.tokenized_dir)
    key = builders.split_key(split)
    info = builder.info.splits[key]
    return shards.CheckedSource(
        builder.as_data_source(key), [os.fspath(p) for p in info.filepaths],
        info.shard_lengths, self.data_dir)

  def eval_sources(self, split: str) -> list[tuple[str, Any]]:
    """(label, source) of each corpus scored apart: one corpus, no label
    (a mixture's, bertjax/data/mixture.py, has one per corpus)."""
    return [("", self.source(split))]

  def tokenizer(self):
    """The tokenizer the shards were made with."""
    return units.load_tokenizer(self.tokenizer_path)


# ``config.data_dir`` if set, else ``<workdir>/data`` (bertjax/data/layout.py).
resolve_data_dir = layout.resolve_data_dir


def _fit_knowledge(config, spans: knowledge.Settings, tok,
                   trains: Sequence[text_sources.Split], directory: str) -> None:
  """Fits ERNIE's phrase and entity lists on evenly spaced train documents
  of ``trains`` (one split, or every corpus of a mixture).

  The sample is bounded (config.knowledge_fit_documents documents, shared
  among the splits by their sizes, of which at most
  knowledge.MAX_FIT_SENTENCES sentences are counted) and deterministic; the
  splits' picks are read interleaved by their place in their split, so that
  the sentence bound cuts every corpus alike. The lists are written to
  ``directory`` for the workers.
  """
  limit = config.get("knowledge_fit_documents", 50_000)
  total = sum(t.num_docs for t in trains)
  picks = []  # (place in its split, split, document)
  for k, train in enumerate(trains):
    share = max(1, round(limit * train.num_docs / total))
    for i in np.unique(np.linspace(0, train.num_docs - 1,
                                   min(train.num_docs, share)).astype(int)):
      picks.append((i / train.num_docs, k, int(i)))
  picks.sort()
  sources = [t.source.open() for t in trains]
  docs = (trains[k].source.document(i, sources[k][i]) for _, k, i in picks)
  marker = knowledge.fit((ex for _, ex in builders.tokenize_documents(docs, tok)),
                         knowledge.WordReader(tok), spans)
  logging.info("Knowledge units from %d documents: %d phrases, %d entities (lists "
               "in %s).", len(picks), len(marker.phrases), len(marker.entities),
               directory)
  marker.write(directory)


def _tokenize(config, data_dir: str, name: str, tok, sources, spans,
              knowledge_dir: str, engine: text_sources.Engine,
              fit_on: Sequence[text_sources.Split] | None = None) -> str:
  """Tokenizes every split into the published dataset bertjax_tokenized/<name>.

  With ``spans``, the knowledge lists are fitted first on ``fit_on`` (None:
  the train split; empty: already fitted by the caller)."""
  dataset_dir = os.path.join(data_dir, "bertjax_tokenized", name, _TOKENIZED_VERSION)
  plan = hashlib.sha256("|".join(
      [tok.fingerprint, spans.fingerprint() if spans else "", str(engine.block_bytes)]
      + [f"{s}={v.source}" for s, v in sources.items()]).encode()).hexdigest()[:16]
  stage = staged.Stage(dataset_dir, "bertjax_tokenized", plan)
  stage.clear_other_plans()
  tok_path = tok.path
  tasks = []
  for split, sized in sources.items():
    for a, b in units.ranges(sized.num_docs, sized.num_bytes, engine.block_bytes):
      tasks.append(units.TokenizeTask(
          len(tasks), sized.source, builders.split_key(split), a, b, tok_path,
          knowledge_dir if spans else "", dataset_dir, "bertjax_tokenized", plan))
  if spans and any(stage.receipt(t.index) is None for t in tasks):
    fit_on = [sources[config.train_split]] if fit_on is None else fit_on
    if fit_on:
      _fit_knowledge(config, spans, tok, fit_on, knowledge_dir)
  todo = [t for t in tasks if stage.receipt(t.index) is None]
  logging.info("Tokenizing %s into %s: %d units, %d to do ...", list(sources),
               dataset_dir, len(tasks), len(todo))
  total = sum(s.num_bytes for s in sources.values())
  engine.run(units.run_tokenize, todo, workers.Progress("tokenize", total, len(todo),
                                                        counted_in_total=False))
  receipts = [stage.receipt(t.index) for t in tasks]
  num_tokens, num_unk = {}, {}
  for split in sources:
    mine = [r for t, r in zip(tasks, receipts)
            if t.split_key == builders.split_key(split)]
    if not sum(r["stats"]["documents"] for r in mine):
      raise ValueError(
          f"Split {split!r} of {config.dataset} has no document with 2 or more "
          f"tokens; add text to it or choose another --config.eval_split/train_split.")
    num_tokens[builders.split_key(split)] = sum(r["stats"]["tokens"] for r in mine)
    num_unk[builders.split_key(split)] = sum(r["stats"]["unk"] for r in mine)
  metadata = dict(
      tokenizer_fingerprint=tok.fingerprint, vocab_size=tok.vocab_size,
      source=config.dataset,
      split_names={builders.split_key(s): s for s in sources},
      num_tokens=num_tokens, num_unk=num_unk)
  if spans:
    metadata["knowledge_fingerprint"] = spans.fingerprint()
  stage.publish(len(tasks), [builders.split_key(s) for s in sources],
                builders.tokenized_features(spans is not None), metadata,
                "Tokenized documents: ids, word starts, sentence lengths.")
  return dataset_dir


def engine_of(config, beam_runner: str = "",
              beam_options: Sequence[str] = ()) -> text_sources.Engine:
  """How prepare runs its units, from config.prepare_* and the Beam flags."""
  block_mb = config.get("prepare_block_mb", 8)
  if block_mb <= 0:
    raise ValueError(
        f"config.prepare_block_mb={block_mb} must be positive; set it to the "
        f"MB of text per unit of work, e.g. 8.")
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
  # A local data_dir is locked while this writes it; a run whose data is all
  # there only reads, and takes no lock (bertjax/workdir_lock.py).
  lock = None
  if not paths.is_remote(data_dir) and unprepared(config, data_dir):
    lock = workdir_lock.DataDirLock(data_dir).acquire()
  try:
    if paths.is_remote(data_dir):
      return _prepare_mirrored(config, data_dir, spans, engine)
    return _prepare(config, data_dir, spans, engine)
  finally:
    workers.shutdown()
    if lock is not None:
      lock.release()


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
  key = mixture.name(corpora) if corpora else builders.source_key(config.dataset)
  if config.tokenizer != "hf":
    items.append(("tokenizer", os.path.join(data_dir, "tokenizers", f"{key}.model")))
  names = ([mixture.shards_name(config, c) for c in corpora] if corpora else
           [key + (builders.KNOWLEDGE_SUFFIX if spans else "")])
  for n in names:
    items.append(("tokenized dataset", os.path.join(
        data_dir, "bertjax_tokenized", n, _TOKENIZED_VERSION)))
  return items


def unprepared(config, data_dir: str) -> list[tuple[str, str]]:
  """The items of ``needed`` that are missing or unfinished (a dataset
  without its published record: still in, or not yet in, ``.staging``)."""
  return [(what, where) for what, where in needed(config, data_dir)
          if not (os.path.exists(where) if what == "tokenizer"
                  else staged.is_published(where))]


def check_inputs(config, data_dir: str | None = None, workdir: str | None = None) -> None:
  """Refuses, reading only and before any directory is made, a dataset,
  split or tokenizer that is not set or not known, or local text files that
  match nothing (each input of a mixture too) unless ``data_dir`` holds the
  text prepared from them, or whose directories hold the workdir or data_dir."""
  if not config.get("dataset"):
    raise ValueError("config.dataset is empty; set --config.dataset, e.g. bertjax_python_docs.")
  if not config.get("train_split"):
    raise ValueError("config.train_split is empty; set --config.train_split, e.g. train.")
  if config.tokenizer not in tokenizer_lib.MODEL_TYPES + ("hf",):
    raise ValueError(
        f"Unknown tokenizer type {config.tokenizer!r}; set --config.tokenizer to "
        f"one of {', '.join(tokenizer_lib.MODEL_TYPES)}.")
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
  local = paths.local_mirror(remote)
  start = time.time()
  fetched = paths.pull(remote, local)
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
    sent = paths.push(local, remote)
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
  prepared = _shards(config, data_dir, name, tok, sources, spans,
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
      data_dir, "bertjax_tokenized", n, _TOKENIZED_VERSION)) for n in names):
    # One set of phrase and entity lists, fitted on all the corpora.
    _fit_knowledge(config, spans, tok, trains, knowledge_dir)
  parts = [_shards(cfg, data_dir, n, tok, s, spans, knowledge_dir, engine, fit_on=())
           for cfg, n, s in zip(configs, names, sources)]
  mixed = mixture.MixedData(corpora, parts, train_split=config.train_split,
                            eval_split=config.get("eval_split", ""), data_dir=data_dir)
  # Keyed as the metrics name each corpus (two local texts apart).
  logging.info("Prepared the mixture %s in %.1f s: %s documents per pass, vocab %d.",
               mixture.describe(corpora), time.time() - start,
               dict(zip(mixed.labels(), mixed.train_counts())), tok.vocab_size)
  return mixed


def _shards(config, data_dir: str, name: str, tok, sources, spans,
            knowledge_dir: str, engine: text_sources.Engine,
            fit_on: Sequence[text_sources.Split] | None = None) -> PreparedData:
  """Checks and reuses the shards bertjax_tokenized/<name>, or makes them."""
  dataset_dir = os.path.join(data_dir, "bertjax_tokenized", name, _TOKENIZED_VERSION)
  if staged.is_published(dataset_dir):
    stored = tfds.builder_from_directory(dataset_dir).info
    fingerprint = stored.metadata.get("tokenizer_fingerprint")
    if fingerprint != tok.fingerprint:
      raise ValueError(
          f"Shards in {dataset_dir} were made by tokenizer {fingerprint} but "
          f"{tok.path} is {tok.fingerprint}; point --config.data_dir at a new "
          f"directory (or restore the tokenizer the shards were made with).")
    missing = [s for s in sources if builders.split_key(s) not in stored.splits]
    if missing:
      raise ValueError(
          f"Shards in {dataset_dir} lack split(s) {missing}; point "
          f"--config.data_dir at a new directory to tokenize them.")
    if spans and stored.metadata.get("knowledge_fingerprint") != spans.fingerprint():
      raise ValueError(
          f"Shards in {dataset_dir} were marked with other phrase/entity "
          f"settings or another gazetteer; point --config.data_dir at a new "
          f"directory (or restore the ernie_* fields and gazetteer they were "
          f"made with).")
    # A stat per shard: truncation is refused here, before any device work.
    shards.check_sizes(dataset_dir, data_dir)
    logging.info("Reusing tokenized shards %s.", dataset_dir)
  else:
    tok_start = time.time()
    _tokenize(config, data_dir, name, tok, sources, spans, knowledge_dir, engine,
              fit_on)
    logging.info("Tokenized in %.1f s.", time.time() - tok_start)
    stored = tfds.builder_from_directory(dataset_dir).info

  splits = {s: stored.splits[builders.split_key(s)].num_examples for s in sources}
  num_tokens = {s: int(stored.metadata["num_tokens"][builders.split_key(s)])
                for s in sources}
  unk_rate = _report_unknown(tok, stored.metadata.get("num_unk", {}), num_tokens)
  return PreparedData(
      data_dir=data_dir, tokenizer_path=tok.path, vocab_size=tok.vocab_size,
      fingerprint=tok.fingerprint, splits=splits, tokenized_dir=dataset_dir,
      num_tokens=num_tokens, unk_rate=unk_rate)


def _report_unknown(tok, num_unk: dict[str, int], num_tokens: dict[str, int]
                    ) -> dict[str, float]:
  """Logs each split's [UNK] rate, warns above UNK_WARN_RATE; split -> rate."""
  rates = {}
  for split, tokens in num_tokens.items():
    unknown = num_unk.get(builders.split_key(split))
    if unknown is None:  # shards prepared before [UNK] counts were recorded
      continue
    rates[split] = rate = int(unknown) / max(tokens, 1)
    logging.info("split %s: %.2f%% [UNK] of %d tokens", split, 100 * rate, tokens)
    if rate > UNK_WARN_RATE:
      logging.warning(
          "split %s is %.2f%% [UNK] (%d of %d tokens), text the model never "
          "sees: %s", split, 100 * rate, unknown, tokens, _unknown_cause(tok))
  return rates


def _unknown_cause(tok) -> str:
  """Why a tokenizer yields [UNK], and the fix, for the warning."""
  if getattr(tok, "byte_fallback", None) is False:
    return (f"tokenizer {tok.path} predates byte fallback; point "
            f"--config.data_dir at a new directory so that prepare trains one "
            f"that has it.")
  if isinstance(tok, tokenizer_lib.Tokenizer):
    return f"tokenizer {tok.path} lacks pieces for some characters."
  return (f"the imported tokenizer {tok.path} has no byte fallback; train on "
          f"text its vocabulary covers.")
