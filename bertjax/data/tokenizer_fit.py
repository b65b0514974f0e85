"""The tokenizer prepare uses: an imported one, the one stored, or one trained.

``tokenizer_for(config, data_dir, key, trains, engine, label)`` returns the
tokenizer of the source ``key`` under ``<data_dir>/tokenizers/<key>.model``,
training it first on a uniform sample of the sentences of ``trains`` (one
split, or every corpus's training split of a mixture, bertjax/data/mixture.py)
when it is missing. A stored tokenizer that does not fit the config is
refused, never replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from typing import Sequence

from absl import logging
import numpy as np

from bertjax import batch as batch_lib
from bertjax import mirror
from bertjax import paths
from bertjax.data import staged
from bertjax.data import text_sources
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data import units
from bertjax.data import workers

# Documents read to estimate a split's sentences when the dataset did not count them.
_ESTIMATE_DOCS = 1000
# The smallest vocabulary sentencepiece trains with byte fallback: the
# specials, the 256 byte pieces and at least one character of the corpus.
MIN_TRAINED_VOCAB = batch_lib.NUM_SPECIAL_TOKENS + 256 + 1
# Seed of the tokenizer's sentence sample: fixed, so a corpus has one sample.
_SAMPLE_SEED = 0


def check_tokenizer(config, tok, path: str) -> None:
  """Refuses a stored tokenizer that does not fit the config."""
  if tok.vocab_size != config.vocab_size:
    raise ValueError(
        f"Tokenizer {path} has vocab size {tok.vocab_size} but "
        f"config.vocab_size is {config.vocab_size}; set "
        f"--config.vocab_size={tok.vocab_size} or point --config.data_dir at a "
        f"new directory.")
  model_type = tokenizer_lib.model_type_of(path)
  if not tokenizer_lib.fits_config(model_type, config.tokenizer):
    # 'unigram_bytes' is not a config value: every trained unigram has bytes.
    fits = model_type if model_type in tokenizer_lib.MODEL_TYPES else (
        model_type.removesuffix("_bytes"))
    raise ValueError(
        f"Tokenizer {path} is a {fits} model but config.tokenizer is "
        f"{config.tokenizer!r}; set --config.tokenizer={fits} or point "
        f"--config.data_dir at a new directory.")


def sentences_in(split: text_sources.Split) -> int:
  """The split's sentence count: recorded, else estimated from evenly spaced documents."""
  if split.num_sentences is not None:
    return split.num_sentences
  source = split.source.open()
  picks = np.unique(np.linspace(0, split.num_docs - 1,
                                min(split.num_docs, _ESTIMATE_DOCS)).astype(int))
  seen = sum(len(split.source.document(int(i), source[int(i)])[1]) for i in picks)
  return int(seen * split.num_docs / max(len(picks), 1))


def _plan(trains: Sequence[text_sources.Split], threshold: int) -> str:
  """The sample's identity. One split of an own dataset hashes as it always
  has, so a sample staged by an earlier version is resumed, not redone."""
  described = "|".join(t.source.plan_key() for t in trains)
  return hashlib.sha256(f"{described}|{threshold}|{_SAMPLE_SEED}".encode()
                        ).hexdigest()[:16]


def train_tokenizer(config, path: str, trains: Sequence[text_sources.Split],
                    engine: text_sources.Engine, label: str) -> tokenizer_lib.Tokenizer:
  """Trains on a uniform sample of about tokenizer_sample_sentences sentences
  of ``trains`` together (``label`` names them in logs).

  Every sentence is kept when its key (units.sentence_keys) falls below
  2**64 * sample / total, so each has the same chance and the sample does not
  depend on the workers; below ``sample`` sentences, all are kept. The sample
  is staged beside the tokenizer and read back in corpus order.
  """
  wanted = config.get("tokenizer_sample_sentences", 500_000)
  total = sum(sentences_in(t) for t in trains)
  threshold = 1 << 64 if total <= wanted else int(wanted / total * 2.0**64)
  plan = _plan(trains, threshold)
  stage = staged.Stage(f"{path}.sample", "sample", plan)
  stage.clear_other_plans()
  tasks = []
  for train in trains:
    for a, b in units.ranges(train.num_docs, train.num_bytes, engine.block_bytes):
      tasks.append(units.SampleTask(len(tasks), train.source, a, b, threshold,
                                    _SAMPLE_SEED, os.fspath(stage.dataset_dir), plan))
  todo = [t for t in tasks if stage.receipt(t.index) is None]
  logging.info("Sampling about %d of ~%d sentences of %s for the tokenizer ...",
               min(wanted, total), total, label)
  engine.run(units.run_sample, todo, workers.Progress(
      "sample", sum(t.num_bytes for t in trains), len(todo), counted_in_total=False))

  def sample():
    for task in tasks:
      for record in stage.records(task.index, "sample"):
        yield record.decode("utf-8")

  start = time.time()
  threads = config.get("tokenizer_train_threads", 1)
  # sentencepiece >= 0.2 sizes its suffix arrays itself (its old
  # train_extremely_large_corpus flag is ignored), so any sample size trains.
  try:
    tok = tokenizer_lib.train(sample(), path, config.vocab_size, config.tokenizer,
                              num_threads=threads)
  except tokenizer_lib.VocabTooLargeError as e:
    if total <= wanted:  # every sentence was used: the corpus is what limits
      raise
    raise ValueError(
        f"The tokenizer's sample of about {wanted} of the ~{total} train "
        f"sentences is too small for a {config.tokenizer} vocabulary of "
        f"{config.vocab_size}; raise --config.tokenizer_sample_sentences (up "
        f"to the corpus's ~{total}) or set --config.vocab_size to at most "
        f"{e.max_vocab}.") from None
  stage.remove()
  # The sample's now empty directory too: tokenizers/ keeps only the models.
  with contextlib.suppress(OSError):
    os.rmdir(f"{path}.sample")
  logging.info("Trained tokenizer %s (%d threads) in %.1f s.", path, threads,
               time.time() - start)
  return tok


def _imported_dir(config) -> str:
  """config.tokenizer_path of a ``tokenizer='hf'`` config; ValueError with the
  fix where it names no directory."""
  path = config.get("tokenizer_path") or ""
  if not path or not paths.isdir(path):  # a gs:// import's too
    raise ValueError(
        f"config.tokenizer='hf' needs the imported tokenizer directory, but "
        f"config.tokenizer_path={path!r} is not one; point --config.tokenizer_path "
        "at <workdir>/tokenizer written by `python -m bertjax.convert`.")
  return path


def check_imported(config) -> None:
  """Refuses, reading only, a ``tokenizer='hf'`` config without a tokenizer
  to read, or whose sentence pairs would be packed with other separators than
  that tokenizer joins a pair with (bertjax/convert/pair_format.py), which
  ``bertjax.load(...).encode``, fine-tuning and an export follow.

  'hf' names an imported model's own tokenizer, which its config records in
  ``tokenizer_path`` with ``pair_separators`` read from the same files;
  bertjax trains no 'hf' tokenizer, so a config without tokenizer_path (every
  shipped pretraining config) is refused. A tokenizer_path without
  pair_separators whose files say two is refused too, except in an import
  from before imports recorded it (kept at one, as it trained, with a
  warning); a pair_separators the config sets is its choice (a warning).
  """
  if config.get("tokenizer") != "hf":
    return
  if "tokenizer_path" not in config:
    raise ValueError(
        "config.tokenizer='hf' names an imported model's own tokenizer (python -m "
        "bertjax.convert --from_hf, then --config=configs/hf.py:WORKDIR) and bertjax "
        "trains none; to pretrain from scratch pass --config.tokenizer=unigram, "
        "bpe or bpe_bytes (a byte-level BPE, as RoBERTa's).")
  path = _imported_dir(config)
  if config.get("layout") != "sentence_pairs":
    return  # no pairs are packed
  from bertjax import compat
  from bertjax.convert import pair_format
  said = pair_format.files_say(mirror.fetched(path))
  packed = int(config.get("pair_separators", 1))
  if said is None or said == packed:
    return
  if "pair_separators" not in config and not compat.is_import(config):
    raise ValueError(
        f"The tokenizer in {path} joins a pair with {said} separators (its files) "
        f"but this config, which does not set pair_separators, packs sentence pairs "
        f"with {packed}; add pair_separators = {said} to the config file (or "
        f"pair_separators = {packed} to keep a run that trained with {packed}).")
  logging.warning(
      "Sentence pairs are packed with %d separator(s) (config.pair_separators%s) but "
      "the tokenizer in %s joins a pair with %d, as bertjax.load(...).encode, "
      "fine-tuning and an export will; import the model again into a new workdir to "
      "pretrain with its template.", packed,
      "" if "pair_separators" in config else ", unset: an import from before it was "
      "recorded", path, said)


def _check_imported_size(config, tok, path: str) -> None:
  if tok.vocab_size != config.vocab_size:
    raise ValueError(
        f"Tokenizer {path} has vocab size {tok.vocab_size} but config.vocab_size "
        f"is {config.vocab_size}; set --config.vocab_size={tok.vocab_size}.")


def check_existing(config, stored_path: str | None) -> None:
  """Refuses, reading only, a config that does not fit a tokenizer that is
  already there (its vocab size or type): the imported one of
  ``tokenizer='hf'``, or the one stored at ``stored_path`` by an earlier
  prepare. So a run stops before it locks its workdir or prepares anything,
  not in the middle of prepare; a tokenizer still to be trained is checked
  as it trains (``tokenizer_lib.train``).
  """
  if config.tokenizer == "hf":
    path = _imported_dir(config)
    _check_imported_size(config, units.load_tokenizer(path), path)
  elif stored_path and paths.exists(stored_path):
    check_tokenizer(config, tokenizer_lib.Tokenizer(stored_path), stored_path)
  elif int(config.vocab_size) < MIN_TRAINED_VOCAB:
    raise ValueError(
        f"--config.vocab_size={config.vocab_size} cannot hold the "
        f"{batch_lib.NUM_SPECIAL_TOKENS} special tokens, 256 byte pieces and "
        f"the corpus's characters a trained tokenizer needs; set "
        f"--config.vocab_size to at least {MIN_TRAINED_VOCAB} (more for a "
        f"corpus of many scripts).")


def stored_path(data_dir: str, key: str) -> str:
  """Where prepare stores the tokenizer it trains for the source ``key``."""
  return os.path.join(data_dir, "tokenizers", f"{key}.model")


def tokenizer_for(config, data_dir: str, key: str,
                  trains: Sequence[text_sources.Split],
                  engine: text_sources.Engine, label: str):
  """Loads and checks the tokenizer of the source ``key``, or trains it.

  ``config.tokenizer='hf'`` (set by ``python -m bertjax.convert``) uses the
  imported model's own tokenizer at ``config.tokenizer_path``, never retrained.
  """
  if config.tokenizer == "hf":
    path = _imported_dir(config)
    tok = units.load_tokenizer(path)
    _check_imported_size(config, tok, path)
    return tok
  path = stored_path(data_dir, key)
  if os.path.exists(path):
    tok = tokenizer_lib.Tokenizer(path)
    check_tokenizer(config, tok, path)
    logging.info("Reusing tokenizer %s (vocab %d).", path, tok.vocab_size)
    return tok
  logging.info("Training a %s tokenizer (vocab %d) on %s ...", config.tokenizer,
               config.vocab_size, label)
  return train_tokenizer(config, path, trains, engine, label)
