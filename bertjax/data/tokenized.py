"""The tokenized shards of ``prepare`` (bertjax/data/prepare.py): a text
dataset's splits tokenized unit by unit into ``bertjax_tokenized/<name>``
(bertjax/data/units.py, staged.py), or those shards checked and reused, and
``PreparedData``, what training reads them through.

With ``config.knowledge_spans`` (ERNIE) the phrase and entity lists are
fitted first and every document is marked with them. Every split's [UNK]
rate is logged, with a warning above ``UNK_WARN_RATE``: bertjax's own
tokenizers fall back to bytes, so only an older or imported tokenizer loses
characters to [UNK].
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

from bertjax.data import builders
from bertjax.data import knowledge
from bertjax.data import shards
from bertjax.data import staged
from bertjax.data import text_sources
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data import units
from bertjax.data import workers

# Above this fraction of [UNK] tokens in a split, prepare warns: text is lost.
UNK_WARN_RATE = 0.001
# The TFDS version directory of every tokenized dataset.
VERSION = "1.0.0"


def sentence_prefix(tok) -> str:
  """What the tokenizer puts before a document's non-initial sentences
  (HfTokenizer.sentence_prefix). Shards record it when it is not "": those of
  a byte-level BPE tokenized before it existed glued each sentence to the one
  before and are refused, not reused (their tokenizer fingerprint is the same,
  and is kept so that converted checkpoints still match). Shards of the
  tokenizers with "" (WordPiece, sentencepiece, bertjax's own) are unchanged
  by it and stay valid, so VERSION is not bumped."""
  return getattr(tok, "sentence_prefix", "")


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


def fit_knowledge(config, spans: knowledge.Settings, tok,
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
  dataset_dir = os.path.join(data_dir, "bertjax_tokenized", name, VERSION)
  plan = hashlib.sha256("|".join(
      [tok.fingerprint, spans.fingerprint() if spans else "", str(engine.block_bytes)]
      + [f"{s}={v.source.plan_key()}" for s, v in sources.items()]
      # Staged units of the old sentence-by-sentence BPE encoding are redone.
      + ([f"sentence_prefix={sentence_prefix(tok)!r}"] if sentence_prefix(tok) else [])
      ).encode()).hexdigest()[:16]
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
      fit_knowledge(config, spans, tok, fit_on, knowledge_dir)
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
  if sentence_prefix(tok):
    metadata["sentence_prefix"] = sentence_prefix(tok)
  stage.publish(len(tasks), [builders.split_key(s) for s in sources],
                builders.tokenized_features(spans is not None), metadata,
                "Tokenized documents: ids, word starts, sentence lengths.")
  return dataset_dir


def prepare_shards(config, data_dir: str, name: str, tok, sources, spans,
            knowledge_dir: str, engine: text_sources.Engine,
            fit_on: Sequence[text_sources.Split] | None = None) -> PreparedData:
  """Checks and reuses the shards bertjax_tokenized/<name>, or makes them."""
  dataset_dir = os.path.join(data_dir, "bertjax_tokenized", name, VERSION)
  if staged.is_published(dataset_dir):
    stored = tfds.builder_from_directory(dataset_dir).info
    fingerprint = stored.metadata.get("tokenizer_fingerprint")
    if fingerprint != tok.fingerprint:
      raise ValueError(
          f"Shards in {dataset_dir} were made by tokenizer {fingerprint} but "
          f"{tok.path} is {tok.fingerprint}; point --config.data_dir at a new "
          f"directory (or restore the tokenizer the shards were made with).")
    if stored.metadata.get("sentence_prefix", "") != sentence_prefix(tok):
      raise ValueError(
          f"Shards in {dataset_dir} were tokenized by an older bertjax that "
          f"encoded each sentence of {tok.path}'s byte-level BPE without the "
          f"space before it (sentences glued, their first words not word "
          f"starts); point --config.data_dir at a new directory to tokenize "
          f"them again.")
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
