"""Tokenize once: text dataset -> sentencepiece tokenizer -> tokenized shards.

``prepare(config, data_dir)`` makes, under ``data_dir``, whatever is missing of

  <data_dir>/bertjax_python_docs/...        the text dataset (bertjax's own
  <data_dir>/bertjax_local_text/<cfg>/...   builders; public TFDS datasets are
                                            read where the user prepared them)
  <data_dir>/tokenizers/<source>.model      sentencepiece, trained on train_split
  <data_dir>/bertjax_tokenized/<source>/... shards of train_split and eval_split
  <data_dir>/bertjax_tokenized/<source>__knowledge/...  the same with phrase
                                            and entity starts, when
                                            config.knowledge_spans (ERNIE)
  <data_dir>/knowledge/<source>/            the fitted phrase and entity lists

and reuses (after checking) what is there, so a second call takes about a
second. It never deletes anything: when something on disk does not match the
config it raises a ValueError naming the mismatch and the fix, before any work.

Every dataset it builds gets a manifest of its shards (size, sha256, records;
``bertjax/data/shards.py``); reused shards are checked against their recorded
sizes, and reading a damaged one raises a one-line ``DamagedShardError``.
It logs the [UNK] rate of every split and warns above ``UNK_WARN_RATE``:
bertjax's own tokenizers fall back to bytes, so only an older or imported
tokenizer loses characters to [UNK].
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any, Callable, Iterable, Iterator

from absl import logging
import tensorflow_datasets as tfds

from bertjax.data import builders
from bertjax.data import knowledge
from bertjax.data import sentences as sentences_lib
from bertjax.data import shards
from bertjax.data import tokenizer as tokenizer_lib

OWN_DATASETS = ("bertjax_python_docs", "bertjax_local_text")
# Above this fraction of [UNK] tokens in a split, prepare warns: text is lost.
UNK_WARN_RATE = 0.001
_TF_EXTRA_HINT = ("install the tf extra (pip install -e '.[tf]') or prepare it as "
                  "array_record (tfds build {name} --file_format=array_record)")


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

  def tokenizer(self):
    """The tokenizer the shards were made with."""
    return _load_tokenizer(self.tokenizer_path)


def resolve_data_dir(config, workdir: str) -> str:
  """``config.data_dir`` if set, else ``<workdir>/data``."""
  return config.get("data_dir") or os.path.join(workdir, "data")


def _base_split(split: str) -> str:
  """'train[:10%]' -> 'train'."""
  return re.match(r"[\w-]*", split).group(0)


def _check_splits(dataset: str, available: Iterable[str], wanted: list[str]) -> None:
  available = sorted(available)
  for split in wanted:
    if _base_split(split) not in available:
      field = "train_split" if split == wanted[0] else "eval_split"
      raise ValueError(
          f"Dataset {dataset!r} has no split {split!r} (it has {available}); set "
          f"--config.{field} to one of them, or a slice such as 'train[:1%]'.")


def _own_text_builder(config, data_dir: str) -> tfds.core.DatasetBuilder:
  """Builds (if missing) and returns bertjax's own text dataset builder."""
  name, _, cfg = config.dataset.partition("/")
  kwargs = dict(data_dir=data_dir, file_format=builders.FILE_FORMAT)
  if name == "bertjax_python_docs":
    if cfg:
      raise ValueError(
          f"bertjax_python_docs has no config {cfg!r}; set "
          f"--config.dataset=bertjax_python_docs.")
    builder = builders.BertjaxPythonDocs(**kwargs)
  else:
    cfg = cfg or "files"
    known = [c.name for c in builders.BertjaxLocalText.BUILDER_CONFIGS]
    if cfg not in known:
      raise ValueError(
          f"bertjax_local_text has no config {cfg!r}; set --config.dataset to "
          f"{' or '.join('bertjax_local_text/' + k for k in known)}.")
    if not config.get("text_files"):
      raise ValueError(
          "bertjax_local_text needs input files; set --config.text_files to "
          "comma-separated paths or globs of UTF-8 text files.")
    builder = builders.BertjaxLocalText(config=cfg, text_files=config.text_files, **kwargs)
    if builder.is_prepared():
      stored = tfds.builder_from_directory(builder.data_path).info.metadata
      current = builders.files_fingerprint(builders.resolve_text_files(config.text_files))
      if stored.get("files_fingerprint") != current:
        raise ValueError(
            f"{builder.data_path} was built from other text files "
            f"({stored.get('text_files')!r}); point --config.data_dir at a new "
            f"directory to prepare {config.text_files!r}.")
  if builder.is_prepared():
    logging.info("Reusing text dataset %s.", builder.data_path)
  else:
    start = time.time()
    logging.info("Building text dataset %s in %s ...", config.dataset, data_dir)
    builder.download_and_prepare()
    shards.write_manifest(os.fspath(builder.data_path))
    logging.info("Built %s in %.1f s: %s", config.dataset, time.time() - start,
                 {k: v.num_examples for k, v in builder.info.splits.items()})
  return builder


def _own_documents(builder, split: str,
                   data_dir: str) -> Callable[[], Iterator[builders.Document]]:
  def documents():
    info = builder.info.splits[split]
    source = shards.CheckedSource(
        builder.as_data_source(split), [os.fspath(p) for p in info.filepaths],
        info.shard_lengths, data_dir)
    for i in range(len(source)):
      record = source[i]
      yield (record["id"].decode("utf-8"),
             [s.decode("utf-8") for s in record["sentences"]])
  return documents


def _public_data_dir(config, data_dir: str) -> str | None:
  """Where a public TFDS dataset lives: ``data_dir`` if it is there, else TFDS's default."""
  name = config.dataset.partition("/")[0].partition(":")[0]
  return data_dir if os.path.isdir(os.path.join(data_dir, name)) else None


def _public_documents(config, split: str, tfds_dir: str | None
                      ) -> Callable[[], Iterator[builders.Document]]:
  """Documents of a public TFDS text dataset, sentence-split on the fly."""
  name, feature = config.dataset, config.text_feature

  def to_document(index: int, record: dict[str, Any]) -> builders.Document:
    if feature not in record:
      raise ValueError(
          f"{name} has no feature {feature!r} (it has {sorted(record)}); set "
          f"--config.text_feature to the one holding the text.")
    text = record[feature]
    text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
    return str(index), sentences_lib.split_sentences(text)

  def documents():
    try:
      source = tfds.data_source(name, split=split, data_dir=tfds_dir, download=False)
      records = (source[i] for i in range(len(source)))
    except Exception as e:  # pylint: disable=broad-except
      try:
        # With TensorFlow installed, tfrecord datasets are read sequentially.
        records = tfds.as_numpy(
            tfds.load(name, split=split, data_dir=tfds_dir, download=False))
      except Exception:  # pylint: disable=broad-except
        raise ValueError(
            f"Cannot read TFDS dataset {name!r} split {split!r} ({e}); "
            + _TF_EXTRA_HINT.format(name=name) + ".") from e
    for index, record in enumerate(records):
      yield to_document(index, record)
  return documents


def _public_splits(config, tfds_dir: str | None) -> list[str]:
  """Split names of a prepared public TFDS dataset, or a ValueError with the fix."""
  name = config.dataset
  try:
    builder = tfds.builder(name, data_dir=tfds_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
        f"Unknown dataset {name!r}; set --config.dataset to bertjax_python_docs, "
        f"bertjax_local_text (with --config.text_files) or a TFDS text dataset "
        f"such as wikipedia/20230601.en.") from None
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"Cannot open TFDS dataset {name!r} ({e}); "
        + _TF_EXTRA_HINT.format(name=name) + ".") from e
  if not builder.is_prepared():
    raise ValueError(
        f"TFDS dataset {name!r} is not prepared in {builder.data_dir}; prepare it "
        f"first (tfds build {name} --file_format=array_record), bertjax never "
        f"downloads it.")
  return list(builder.info.splits)


def _text_sources(config, data_dir: str) -> dict[str, Callable[[], Iterator[builders.Document]]]:
  """split name -> callable giving that split's Documents (train split first)."""
  wanted = [config.train_split] + ([config.eval_split] if config.get("eval_split") else [])
  if config.dataset.partition("/")[0] in OWN_DATASETS:
    builder = _own_text_builder(config, data_dir)
    _check_splits(config.dataset, builder.info.splits, wanted)
    return {s: _own_documents(builder, s, data_dir) for s in wanted}
  tfds_dir = _public_data_dir(config, data_dir)
  _check_splits(config.dataset, _public_splits(config, tfds_dir), wanted)
  return {s: _public_documents(config, s, tfds_dir) for s in wanted}


def _load_tokenizer(path: str):
  """A sentencepiece model file, or an imported Hugging Face tokenizer directory."""
  if os.path.isdir(path):
    from bertjax.convert import hf_tokenizers
    return hf_tokenizers.HfTokenizer(path)
  return tokenizer_lib.Tokenizer(path)


def _tokenizer(config, data_dir: str, key: str, train_docs) -> tokenizer_lib.Tokenizer:
  """Loads and checks the tokenizer of this source, or trains it.

  ``config.tokenizer='hf'`` (set by ``python -m bertjax.convert``) uses the
  imported model's own tokenizer at ``config.tokenizer_path``, never retrained.
  """
  if config.tokenizer == "hf":
    path = config.get("tokenizer_path") or ""
    if not os.path.isdir(path):
      raise ValueError(
          f"config.tokenizer='hf' needs the imported tokenizer directory, but "
          f"config.tokenizer_path={path!r} is not one; point --config.tokenizer_path "
          "at <workdir>/tokenizer written by `python -m bertjax.convert`.")
    tok = _load_tokenizer(path)
    if tok.vocab_size != config.vocab_size:
      raise ValueError(
          f"Tokenizer {path} has vocab size {tok.vocab_size} but config.vocab_size "
          f"is {config.vocab_size}; set --config.vocab_size={tok.vocab_size}.")
    return tok
  path = os.path.join(data_dir, "tokenizers", f"{key}.model")
  if os.path.exists(path):
    tok = tokenizer_lib.Tokenizer(path)
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
    logging.info("Reusing tokenizer %s (vocab %d).", path, tok.vocab_size)
    return tok
  start = time.time()
  logging.info("Training a %s tokenizer (vocab %d) on %s %s ...", config.tokenizer,
               config.vocab_size, config.dataset, config.train_split)
  sentences = (s for _, sents in train_docs() for s in sents)
  tok = tokenizer_lib.train(sentences, path, config.vocab_size, config.tokenizer)
  logging.info("Trained tokenizer %s in %.1f s.", path, time.time() - start)
  return tok


def prepare(config, data_dir: str) -> PreparedData:
  """Makes (or checks and reuses) the text dataset, tokenizer and shards.

  Args:
    config: the run's ConfigDict (dataset, text_files, text_feature,
      train_split, eval_split, tokenizer, vocab_size; knowledge_spans and the
      ``ernie_*`` fields of bertjax/data/knowledge.py).
    data_dir: root directory of everything prepared (see module docstring).

  Returns:
    PreparedData describing the shards.
  """
  if not config.get("dataset"):
    raise ValueError("config.dataset is empty; set --config.dataset, e.g. bertjax_python_docs.")
  if not config.get("train_split"):
    raise ValueError("config.train_split is empty; set --config.train_split, e.g. train.")
  if config.tokenizer not in tokenizer_lib.MODEL_TYPES + ("hf",):
    raise ValueError(
        f"Unknown tokenizer type {config.tokenizer!r}; set --config.tokenizer to "
        f"one of {', '.join(tokenizer_lib.MODEL_TYPES)}.")
  spans = (knowledge.Settings.from_config(config)
           if config.get("knowledge_spans", False) else None)
  start = time.time()
  os.makedirs(data_dir, exist_ok=True)
  key = builders.source_key(config.dataset)
  sources = _text_sources(config, data_dir)
  tok = _tokenizer(config, data_dir, key, sources[config.train_split])

  name = key + (builders.KNOWLEDGE_SUFFIX if spans else "")
  builder = builders.BertjaxTokenized(
      data_dir=data_dir, config=tfds.core.BuilderConfig(name=name),
      file_format=builders.FILE_FORMAT, sources=sources, tokenizer=tok,
      source_name=config.dataset, knowledge=spans,
      fit_split=config.train_split,
      knowledge_dir=os.path.join(data_dir, "knowledge", key))
  if builder.is_prepared():
    stored = tfds.builder_from_directory(builder.data_path).info
    fingerprint = stored.metadata.get("tokenizer_fingerprint")
    if fingerprint != tok.fingerprint:
      raise ValueError(
          f"Shards in {builder.data_path} were made by tokenizer {fingerprint} but "
          f"{tok.path} is {tok.fingerprint}; point --config.data_dir at a new "
          f"directory (or restore the tokenizer the shards were made with).")
    missing = [s for s in sources if builders.split_key(s) not in stored.splits]
    if missing:
      raise ValueError(
          f"Shards in {builder.data_path} lack split(s) {missing}; point "
          f"--config.data_dir at a new directory to tokenize them.")
    if spans and stored.metadata.get("knowledge_fingerprint") != spans.fingerprint():
      raise ValueError(
          f"Shards in {builder.data_path} were marked with other phrase/entity "
          f"settings or another gazetteer; point --config.data_dir at a new "
          f"directory (or restore the ernie_* fields and gazetteer they were "
          f"made with).")
    # A stat per shard: truncation is refused here, before any device work.
    shards.check_sizes(os.fspath(builder.data_path), data_dir)
    logging.info("Reusing tokenized shards %s.", builder.data_path)
  else:
    tok_start = time.time()
    logging.info("Tokenizing %s into %s ...", list(sources), builder.data_path)
    builder.download_and_prepare()
    shards.write_manifest(os.fspath(builder.data_path))
    logging.info("Tokenized in %.1f s.", time.time() - tok_start)
    stored = builder.info

  splits = {s: stored.splits[builders.split_key(s)].num_examples for s in sources}
  num_tokens = {s: int(stored.metadata["num_tokens"][builders.split_key(s)])
                for s in sources}
  unk_rate = _report_unknown(tok, stored.metadata.get("num_unk", {}), num_tokens)
  logging.info("Prepared %s in %.1f s: %s documents, vocab %d.", config.dataset,
               time.time() - start, splits, tok.vocab_size)
  return PreparedData(
      data_dir=data_dir, tokenizer_path=tok.path, vocab_size=tok.vocab_size,
      fingerprint=tok.fingerprint, splits=splits,
      tokenized_dir=os.fspath(builder.data_path), num_tokens=num_tokens,
      unk_rate=unk_rate)


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
