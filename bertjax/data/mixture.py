"""Pretraining on a weighted mixture of corpora (``config.mixture``).

BERT was pretrained on Wikipedia and BooksCorpus together; RoBERTa on five
corpora. ``--config.mixture`` names the corpora and how much of each a pass
over the training data holds, one entry per corpus, entries separated by
``;``; an entry is a dataset name (as ``config.dataset`` takes it) followed
by ``key=value`` options separated by spaces:

  --config.mixture="wikipedia/20230601.en weight=3 train_split=train[:99%]
                    eval_split=train[99%:]; pg19 text_feature=book_text"

``weight`` (default 1) is how many times each of the corpus's training
documents appears in one pass over the mixture: 3 repeats every Wikipedia
article three times per pass (each copy packed and masked with its own seed,
as ``dupe_factor``'s copies are), 0.5 takes a fixed, evenly spread half of
the corpus's documents (every other one, the same in every pass).

``share`` sets a corpus's part of a pass's *tokens* instead: with
``wikipedia/20230601.en share=0.7; pg19 share=0.3`` seven tenths of the
tokens a pass trains on are Wikipedia's, however long each corpus's
documents are. Shares are given to every entry or to none, and are
normalised to sum to 1 (``share=7`` and ``share=3`` say the same). A pass
holds as many tokens as all the corpora together (the pass of weights 1),
so each corpus's weight comes out as its share of those tokens over its own
tokens (``weights``): a corpus smaller than its share is repeated, a larger
one subsampled. Whole copies hold their share exactly; a fraction of a
copy takes evenly spread documents, so its tokens are off by as much as
their mean length is from the corpus's (for the pydoc topics halved into
two corpora, shares 1:3 gave 24.1% instead of 25%).
``text_feature``, ``text_files``, ``train_split`` and ``eval_split`` default
to the config's own fields; ``config.dataset`` and those fields are
otherwise not used when a mixture is set.

All corpora share one tokenizer, trained on a uniform sample of all their
training sentences together (the weights do not enter it, so re-weighting a
mixture reuses its tokenizer and shards). Evaluation scores every corpus's
``eval_split`` as a pass of its own (``MixedData.eval_sources``; a corpus
with ``eval_split=`` empty has none), and reports the figures of all of them
and of each, under the corpus's ``labels`` name (its dataset; local text's
the name of its files). Each corpus is tokenized into its own shards
(``bertjax_tokenized/<mixture>__<corpus>``); ``MixedData`` puts them together
behind the interface of ``prepare.PreparedData``, so training, evaluation,
resume and the checkpoints' tokenizer check see one corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from typing import Any, Sequence

import numpy as np

from bertjax import paths
from bertjax.data import builders

# Options an entry may set; the rest of the config is shared by all corpora.
OPTIONS = ("weight", "share", "text_feature", "text_files", "train_split", "eval_split")


@dataclasses.dataclass(frozen=True)
class Corpus:
  """One entry of ``config.mixture``, its options filled from the config."""
  dataset: str
  weight: float
  text_feature: str
  text_files: str
  train_split: str
  eval_split: str
  share: float = 0.0  # of a pass's tokens; 0 where the entry gives a weight
  # The entry as written, for messages.
  entry: str = dataclasses.field(default="", compare=False)

  def text(self) -> str:
    """What decides the corpus's text."""
    return "|".join([self.dataset, self.text_files, self.text_feature])

  def identity(self) -> str:
    """What decides the corpus's shards (not its weight)."""
    return "|".join([self.text(), self.train_split, self.eval_split])

  def key(self) -> str:
    """A file-name-safe name of the corpus's shards, unique within its mixture."""
    return _keyed(self.dataset, self.identity())

  def text_key(self) -> str:
    """A file-name-safe name of the corpus's text."""
    return _keyed(self.dataset, self.text())

  def is_local_text(self) -> bool:
    return self.dataset.partition("/")[0] == "bertjax_local_text"


_GLOB = re.compile(r"[*?[]")


def _path_name(path: str) -> str:
  """A readable key of one text_files path: the file's stem, or the nearest
  directory above its glob ('corpora/legal/*.txt' -> 'legal'); '' if none."""
  parts = [p for p in re.split(r"[/\\]+", path.strip())
           if p not in ("", ".", "..", "~") and not p.endswith(":")]  # gs:, C:
  for i in reversed(range(len(parts))):
    if _GLOB.search(parts[i]):
      continue
    key = builders.source_key(os.path.splitext(parts[i])[0] if i == len(parts) - 1
                              else parts[i])
    if key:
      return key
  return ""


def _base_label(corpus: Corpus) -> str:
  """A corpus's metric name before disambiguation: local text is named by its
  files (the dataset name alone says nothing of which), the rest by dataset."""
  if corpus.is_local_text():
    names = list(dict.fromkeys(n for n in map(_path_name, corpus.text_files.split(","))
                               if n))
    if names:
      more = f"_and_{len(names) - 2}_more" if len(names) > 2 else ""
      return "_".join(names[:2]) + more
  return builders.source_key(corpus.dataset)


def labels(corpora: Sequence[Corpus]) -> list[str]:
  """Each corpus's name in the metrics (``<label>/mlm_loss``): readable
  (``pg19``, ``legal`` for ``text_files=corpora/legal/*.txt``), and suffixed
  with the digest of ``key`` only where two would be the same. Made from the
  mixture's text alone, so a resumed run writes the same names; not part of
  ``key`` or ``identity``, so prepared shards are found as before."""
  names = [_base_label(c) for c in corpora]
  return [name if names.count(name) == 1 else
          f"{name}_{hashlib.sha256(c.identity().encode()).hexdigest()[:8]}"
          for name, c in zip(names, corpora)]


def _keyed(dataset: str, identity: str) -> str:
  digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
  return f"{builders.source_key(dataset)}_{digest}"


def _bad(entry: str, why: str, fix: str) -> ValueError:
  return ValueError(f"config.mixture entry {entry!r} {why}; {fix}.")


def _positive(entry: str, option: str, text: str, fix: str) -> float:
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not (math.isfinite(value) and value > 0):
    raise _bad(entry, f"has {option}={text!r}", fix)
  return value


def _weight(entry: str, text: str) -> float:
  return _positive(entry, "weight", text,
                   "give a positive number of copies of the corpus per pass, e.g. "
                   "weight=2 or weight=0.5")


def _corpus(entry: str, config) -> Corpus:
  """Parses one entry (``dataset key=value ...``)."""
  dataset, *options = entry.split()
  if "=" in dataset:
    raise _bad(entry, "does not start with a dataset name",
               "begin each entry with the dataset, e.g. 'pg19 weight=2'")
  values = {"weight": "1", "text_feature": config.get("text_feature", "text"),
            "text_files": config.get("text_files", ""),
            "train_split": config.get("train_split", "train"),
            "eval_split": config.get("eval_split", "")}
  given = set()
  for option in options:
    name, sep, value = option.partition("=")
    if not sep or name not in OPTIONS:
      raise _bad(entry, f"has the option {option!r}",
                 f"write options as key=value with key one of {', '.join(OPTIONS)}")
    if name in given:
      raise _bad(entry, f"gives {name} twice ({name}={values[name]} and {option})",
                 f"keep one {name}=")
    values[name] = value
    given.add(name)
  share = 0.0
  if "share" in given:
    if "weight" in given:
      raise _bad(entry, "gives both a weight and a share",
                 "keep one: weight counts documents, share the pass's tokens")
    share = _positive(entry, "share", values["share"],
                      "give the corpus's positive part of a pass's tokens, e.g. "
                      "share=0.3 (shares are normalised to sum to 1)")
  if not values["train_split"]:
    raise _bad(entry, "has an empty train_split", "name the split to train on")
  if dataset.partition("/")[0] == "bertjax_local_text" and "text_feature" in given:
    raise _bad(entry, "sets text_feature on local text, which has none (its "
               "documents are the files' text)", "drop text_feature= from the entry")
  if dataset.partition("/")[0] == "bertjax_local_text" and not values["text_files"]:
    raise _bad(entry, "reads local text but has no text_files",
               "add text_files=<comma-separated paths or globs> to the entry")
  return Corpus(dataset, _weight(entry, values["weight"]), values["text_feature"],
                values["text_files"], values["train_split"], values["eval_split"],
                share, entry)


def parse(config) -> list[Corpus]:
  """The corpora of ``config.mixture`` ([] when it is empty).

  Raises:
    ValueError: one sentence naming the entry at fault and the fix.
  """
  text = str(config.get("mixture", "") or "").strip()
  if not text:
    return []
  entries = [e.strip() for e in text.split(";")]
  if not all(entries):
    raise ValueError(
        f"config.mixture={text!r} has an empty entry; separate the corpora "
        f"with single ';', e.g. 'wikipedia/20230601.en; pg19 weight=2'.")
  corpora = [_corpus(e, config) for e in entries]
  seen = {}
  for entry, corpus in zip(entries, corpora):
    if corpus.identity() in seen:
      raise _bad(entry, f"reads the same text as {seen[corpus.identity()]!r}",
                 "list each corpus once and give it a weight instead")
    seen[corpus.identity()] = entry
  with_share = [e for e, c in zip(entries, corpora) if c.share]
  if with_share and len(with_share) < len(corpora):
    without = next(e for e, c in zip(entries, corpora) if not c.share)
    raise _bad(without, f"has no share while {with_share[0]!r} has one",
               "give every corpus a share (of a pass's tokens) or none "
               "(and weights, of its documents)")
  return corpora


def weights(corpora: Sequence[Corpus], tokens: Sequence[int]) -> list[float]:
  """Copies of each corpus's training documents in one pass (``tokens``: its
  training tokens): the entries' weights, or where they give shares, the
  weights that give each corpus its share of a pass as large as all the
  corpora's tokens together.

  Raises:
    ValueError: a corpus with a share has no training tokens.
  """
  if not corpora[0].share:
    return [c.weight for c in corpora]
  for corpus, count in zip(corpora, tokens):
    if count <= 0:
      raise ValueError(
          f"config.mixture's {corpus.dataset} has no tokens in {corpus.train_split}, so "
          f"it cannot make share={corpus.share:g} of a pass; drop it or fix its split.")
  total, shares = sum(tokens), sum(c.share for c in corpora)
  return [c.share / shares * total / count for c, count in zip(corpora, tokens)]


def corpus_config(config, corpus: Corpus):
  """``config`` as a one-corpus run of ``corpus`` would have it (for prepare)."""
  import ml_collections
  one = ml_collections.ConfigDict(config.to_dict())
  one.update(dataset=corpus.dataset, text_feature=corpus.text_feature,
             text_files=corpus.text_files, train_split=corpus.train_split,
             eval_split=corpus.eval_split, mixture="")
  return one


def name(corpora: Sequence[Corpus]) -> str:
  """The mixture's key: its tokenizer's file name and its shards' prefix.

  It depends on what the tokenizer is trained on, the corpora's training
  texts: not on their weights, order or eval splits.
  """
  ids = sorted(f"{c.text()}|{c.train_split}" for c in corpora)
  return "mixture_" + hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12]


def shards_name(config, corpus: Corpus) -> str:
  """The directory under bertjax_tokenized/ of a corpus of ``config``'s mixture."""
  spans = bool(config.get("knowledge_spans", False))
  return (f"{name(parse(config))}__{corpus.key()}"
          + (builders.KNOWLEDGE_SUFFIX if spans else ""))


def describe(corpora: Sequence[Corpus]) -> str:
  """'wikipedia/20230601.en x3 + pg19 x1' (or 'share 0.7 + ...'), for logs;
  local text is named with its files ("bertjax_local_text['notes/*.txt']")."""
  def named(c: Corpus) -> str:
    return f"{c.dataset}[{c.text_files!r}]" if c.is_local_text() else c.dataset

  if corpora[0].share:
    total = sum(c.share for c in corpora)
    return " + ".join(f"{named(c)} share {c.share / total:.3g}" for c in corpora)
  return " + ".join(f"{named(c)} x{c.weight:g}" for c in corpora)


def text_dir(data_dir: str, corpus: Corpus) -> str:
  """Where a local-text corpus's text dataset is built: a directory of its
  own, so that two such corpora (or a one-corpus run's) never collide."""
  return paths.join(data_dir, "bertjax_mixture_text", corpus.text_key())


def copies(num_docs: int, weight: float) -> int:
  """Documents of a corpus in one pass over the mixture: round(weight * n),
  at least 1."""
  return max(1, int(round(weight * num_docs)))


class MixedSource:
  """Random access (``len``, ``[i]``) to the documents of a mixture's pass.

  Corpus k contributes ``counts[k] = q * n + r`` consecutive indices (n its
  documents): its first q * n are its documents q times over, in order; the
  last r (a fraction of a copy) are r documents evenly spread over the
  corpus, the t-th being document ``(2t + 1) * n // (2r)``. The order within
  a pass does not matter to training, which shuffles documents every epoch;
  evaluation reads each corpus's split once (counts = sizes), in order.
  """

  def __init__(self, sources: Sequence[Any], counts: Sequence[int]):
    if len(sources) != len(counts) or not sources:
      raise ValueError("MixedSource needs one count per source, and a source.")
    self._sources = list(sources)
    self._sizes = [len(s) for s in sources]
    self._counts = [int(c) for c in counts]
    self._ends = np.cumsum(self._counts)

  def __len__(self) -> int:
    return int(self._ends[-1])

  def corpora(self, indices: np.ndarray) -> np.ndarray:
    """The corpus of each mixture index (int64, ``indices``' shape)."""
    return np.searchsorted(self._ends, np.asarray(indices), side="right")

  def locate(self, index: int) -> tuple[int, int]:
    """(corpus, document within it) of mixture index ``index``."""
    if not 0 <= index < len(self):
      raise IndexError(f"index {index} is outside the mixture's {len(self)} documents")
    k = int(np.searchsorted(self._ends, index, side="right"))
    j = index - (int(self._ends[k - 1]) if k else 0)
    n, count = self._sizes[k], self._counts[k]
    whole = count // n * n
    if j < whole:
      return k, j % n
    r = count - whole
    return k, (2 * (j - whole) + 1) * n // (2 * r)

  def __getitem__(self, index: int) -> Any:
    k, doc = self.locate(int(index))
    return self._sources[k][doc]


class MixedData:
  """A prepared mixture, with ``prepare.PreparedData``'s interface.

  ``parts`` are the corpora's own PreparedData (split names as each corpus
  names them); ``splits`` and ``source`` use the config's train_split and
  eval_split names for the mixture's two splits.
  """

  def __init__(self, corpora: Sequence[Corpus], parts: Sequence[Any], *,
               train_split: str, eval_split: str, data_dir: str):
    first = parts[0]
    self.corpora, self.parts = list(corpora), list(parts)
    self.data_dir = data_dir
    self.tokenizer_path = first.tokenizer_path
    self.vocab_size = first.vocab_size
    self.fingerprint = first.fingerprint
    self.tokenized_dir = first.tokenized_dir
    self._train, self._eval = train_split, eval_split
    counts = self.train_counts()
    self.splits = {train_split: sum(counts)}
    # Tokens of a pass: exact for whole copies, the corpus's mean document
    # length for a fraction of one.
    self.num_tokens = {train_split: int(sum(
        c / p.splits[k.train_split] * p.num_tokens.get(k.train_split, 0)
        for c, p, k in zip(counts, self.parts, self.corpora)))}
    if eval_split and self._eval_parts():
      self.splits[eval_split] = sum(p.splits[k.eval_split] for k, p in self._eval_parts())
      self.num_tokens[eval_split] = sum(p.num_tokens.get(k.eval_split, 0)
                                        for k, p in self._eval_parts())
    # [UNK] rates as the tokens of a pass weigh them (absent where a corpus's
    # shards predate the counts).
    self.unk_rate = {}
    for split, pairs in ((train_split, zip(counts, self.corpora, self.parts)),
                         (eval_split, [(p.splits[k.eval_split], k, p)
                                       for k, p in self._eval_parts()])):
      pairs = [(c, k.train_split if split == train_split else k.eval_split, p)
               for c, k, p in pairs]
      if split in self.num_tokens and all(s in p.unk_rate for _, s, p in pairs):
        unknown = sum(c / p.splits[s] * p.num_tokens.get(s, 0) * p.unk_rate[s]
                      for c, s, p in pairs)
        self.unk_rate[split] = unknown / max(self.num_tokens[split], 1)

  def _eval_parts(self) -> list[tuple[Corpus, Any]]:
    return [(k, p) for k, p in zip(self.corpora, self.parts) if k.eval_split]

  def weights(self) -> list[float]:
    """Copies of each corpus's documents in a pass (``weights``)."""
    return weights(self.corpora, [p.num_tokens.get(k.train_split, 0)
                                  for k, p in zip(self.corpora, self.parts)])

  def train_counts(self) -> list[int]:
    """Documents of each corpus in one pass over the mixture."""
    return [copies(p.splits[k.train_split], w)
            for k, p, w in zip(self.corpora, self.parts, self.weights())]

  def source(self, split: str):
    """The mixture's pass (train split) or its corpora's eval splits in turn."""
    if split == self._train:
      return MixedSource([p.source(k.train_split) for k, p in zip(self.corpora, self.parts)],
                         self.train_counts())
    if split == self._eval and split in self.splits:
      parts = self._eval_parts()
      return MixedSource([p.source(k.eval_split) for k, p in parts],
                         [p.splits[k.eval_split] for k, p in parts])
    raise self._unprepared(split)

  def _unprepared(self, split: str) -> ValueError:
    return ValueError(
        f"Split {split!r} was not prepared (have {sorted(self.splits)}); set "
        f"--config.train_split/eval_split to one of them or prepare it.")

  def eval_sources(self, split: str) -> list[tuple[str, Any]]:
    """(label, eval split) of each corpus that has one, for per-corpus
    figures (``split``: the config's eval_split), labelled as ``labels``."""
    if split != self._eval or split not in self.splits:
      raise self._unprepared(split)
    return [(label, p.source(k.eval_split))
            for label, k, p in zip(self.labels(), self.corpora, self.parts) if k.eval_split]

  def labels(self) -> list[str]:
    """A label per corpus (``labels``), the same in training and evaluation."""
    return labels(self.corpora)

  def tokenizer(self):
    return self.parts[0].tokenizer()


def is_mixture(config) -> bool:
  return bool(str(config.get("mixture", "") or "").strip())

