"""ERNIE's knowledge units, marked once at prepare time: phrases and entities.

ERNIE 1.0 masks whole phrases and whole named entities as well as single
words. Which tokens form a phrase or an entity is decided here, on the host,
once per corpus; the shards then carry two boundary arrays next to
``word_starts`` (see ``bertjax/batch.py``):

  phrase_starts  bool [n]  True at the first token of every phrase and of
                           every word outside a phrase.
  entity_starts  bool [n]  the same for entities.

So a phrase or an entity is simply a "word" of several words, and every
whole-word masking rule works on it unchanged. Which units get masked is
decided on device (``bertjax/objectives/ernie.py``).

Words. A word is a run of tokens from one ``word_starts`` to the next, read
back as text with the tokenizer (so any tokenizer works) and normalised to its
core: the text without leading and trailing punctuation. A word whose core is
empty (pure punctuation) belongs to no unit, and a unit never runs across
punctuation that was stripped between two words ("York, New" is no name) nor
across a sentence boundary.

Phrases (the chunker): word n-gram collocations, n = 2..max_phrase_words, of
the train split, case-insensitive. An n-gram is a phrase when it occurs at
least ``phrase_min_count`` times and is cohesive at every split point: for
each way of cutting it into a left and a right part,
``log(c(g) * N / (c(left) * c(right))) >= phrase_min_pmi`` (pointwise mutual
information of the two parts, natural log, N = number of words). Requiring
every cut to be cohesive keeps "the return value" out when "return value" is
a phrase but "the" is merely frequent. The ``NUM_FUNCTION_WORDS`` most
frequent words of the split may sit inside a phrase ("point of view") but
never open or close one ("a list of" is no phrase), a corpus-driven stand-in
for a stop-word list.

Entities: a user gazetteer (``config.ernie_gazetteer``: a UTF-8 file, one
entity per line, '#' comments and blank lines ignored; matched
case-sensitively, on word cores). Without one, a small default is built from
the train split: maximal runs of 2 to ``MAX_ENTITY_WORDS`` capitalised words
that occur at least ``entity_min_count`` times (a sentence's first word joins
a run only if, away from sentence and clause starts, the corpus writes it
capitalised more often than not, so "Return" is dropped and "Python" kept).
One-word entities are allowed in a gazetteer but change nothing: a single
word is already a unit at every level.

Marking: phrases, and separately entities, are matched greedily, longest first,
left to right in every sentence; matches never overlap within one kind.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
import os
import re
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

from bertjax import paths

# A word's text split into (leading punctuation, core, trailing punctuation).
_CORE = re.compile(r"^(\W*)(.*?)(\W*)$", re.S)
# Longest default entity, in words.
MAX_ENTITY_WORDS = 6
# The most frequent words of the train split ("the", "of", "is"...) may sit
# inside a phrase but never open or close one.
NUM_FUNCTION_WORDS = 50
# Sentences of the train split read to fit the chunker: n-gram counts of more
# text need more memory than a prepare step should take.
MAX_FIT_SENTENCES = 200_000


@dataclasses.dataclass(frozen=True)
class Settings:
  """The knowledge-marking fields of a config, validated.

  Attributes:
    max_phrase_words: longest phrase, in words (2..8).
    phrase_min_count: fewest occurrences of a phrase in the train split.
    phrase_min_pmi: smallest PMI (nats) at every cut of a phrase.
    entity_min_count: fewest occurrences of a default (corpus-built) entity.
    gazetteer: path of the user's entity list, '' for the default.
  """
  max_phrase_words: int = 4
  phrase_min_count: int = 5
  phrase_min_pmi: float = 3.0
  entity_min_count: int = 3
  gazetteer: str = ""

  @classmethod
  def from_config(cls, config: Any) -> "Settings":
    """Reads the ``ernie_*`` fields; raises ValueError naming a bad one."""
    settings = cls(
        max_phrase_words=int(config.get("ernie_max_phrase_words", 4)),
        phrase_min_count=int(config.get("ernie_phrase_min_count", 5)),
        phrase_min_pmi=float(config.get("ernie_phrase_min_pmi", 3.0)),
        entity_min_count=int(config.get("ernie_entity_min_count", 3)),
        gazetteer=str(config.get("ernie_gazetteer", "") or ""))
    if not 2 <= settings.max_phrase_words <= 8:
      raise ValueError(
          f"ernie_max_phrase_words={settings.max_phrase_words} must be in "
          f"[2, 8]; fix --config.ernie_max_phrase_words.")
    for name in ("phrase_min_count", "entity_min_count"):
      if getattr(settings, name) < 1:
        raise ValueError(
            f"ernie_{name}={getattr(settings, name)} must be at least 1; fix "
            f"--config.ernie_{name}.")
    if settings.gazetteer and not os.path.isfile(settings.gazetteer):
      raise ValueError(
          f"Gazetteer {settings.gazetteer!r} does not exist; point "
          f"--config.ernie_gazetteer at a text file with one entity per line, "
          f"or set it to '' for the default built from the corpus.")
    return settings

  def fingerprint(self) -> str:
    """sha256 of the settings and the gazetteer's content: shards record it."""
    fields = dataclasses.astuple(dataclasses.replace(self, gazetteer=""))
    digest = hashlib.sha256(repr(fields).encode())
    if self.gazetteer:  # the list's content, not its path, makes the units
      with open(self.gazetteer, "rb") as f:
        digest.update(b"gazetteer\n" + f.read())
    return digest.hexdigest()


class Word(NamedTuple):
  """One word of a sentence: its first token and normalised text.

  ``open_left`` / ``open_right``: no punctuation was stripped on that side,
  so a unit may continue through it.
  """
  start: int
  core: str
  open_left: bool
  open_right: bool


def split_core(text: str) -> tuple[str, bool, bool]:
  """'(York,' -> ('York', False, False): core, open_left, open_right."""
  lead, core, trail = _CORE.match(text.strip()).groups()
  return core, not lead, not trail


class WordReader:
  """Reads the words of tokenized sentences back as text (cached per word)."""

  def __init__(self, tokenizer: Any):
    self._tok = tokenizer
    self._cache: dict[bytes, tuple[str, bool, bool]] = {}

  def sentences(self, doc: Mapping[str, np.ndarray]) -> Iterable[list[Word]]:
    """The words of each sentence of a tokenized document.

    Args:
      doc: tokens int32 [n], word_starts bool [n], sentence_lengths int32 [s].

    Yields:
      per sentence, its words in order (``start`` indexes the document).
    """
    tokens = np.asarray(doc["tokens"])
    word_starts = np.asarray(doc["word_starts"], bool)
    lo = 0
    for hi in np.cumsum(doc["sentence_lengths"]).tolist():
      if hi == lo:
        continue
      # A sentence opens a word even if its first piece does not say so.
      bounds = (lo + np.flatnonzero(word_starts[lo + 1:hi]) + 1).tolist()
      words = []
      for a, b in zip([lo] + bounds, bounds + [hi]):
        ids = tokens[a:b]
        key = ids.tobytes()
        parts = self._cache.get(key)
        if parts is None:
          parts = self._cache[key] = split_core(self._tok.decode(ids))
        words.append(Word(a, *parts))
      yield words
      lo = hi


def _links(words: list[Word]) -> list[bool]:
  """links[k]: a unit may contain both word k and word k + 1."""
  return [bool(a.core and b.core and a.open_right and b.open_left)
          for a, b in zip(words[:-1], words[1:])]


def _chains(words: list[Word], max_words: int) -> Iterable[tuple[int, int]]:
  """Every (i, j), 2 <= j - i <= max_words, whose words may form one unit."""
  links = _links(words)
  for i in range(len(words)):
    j = i + 1
    while j < len(words) and j - i < max_words and links[j - 1]:
      j += 1
      yield i, j


def match(words: list[Word], table: frozenset, max_words: int,
          lower: bool) -> list[tuple[int, int]]:
  """Greedy longest-first, left-to-right matches of ``table`` in a sentence.

  Returns:
    non-overlapping (i, j): words i..j-1 form an entry of ``table`` (tuples
    of cores, lower-cased when ``lower``).
  """
  links = _links(words)
  out, i = [], 0
  while i < len(words):
    j = i + 1
    while j < len(words) and j - i < max_words and links[j - 1]:
      j += 1
    for k in range(j, i + 1, -1):
      key = tuple(w.core.lower() if lower else w.core for w in words[i:k])
      if key in table:
        out.append((i, k))
        i = k
        break
    else:
      i += 1
  return out


def read_gazetteer(path: str) -> list[tuple[str, ...]]:
  """Entity lines of a gazetteer file as tuples of word cores."""
  out = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if line and not line.startswith("#"):
        cores = tuple(split_core(w)[0] for w in line.split())
        if all(cores):
          out.append(cores)
  return out


@dataclasses.dataclass(frozen=True)
class Marker:
  """A fitted chunker and gazetteer: marks phrase and entity starts.

  Attributes:
    phrases: lower-cased word-core tuples, 2 words or more.
    entities: case-sensitive word-core tuples.
  """
  phrases: frozenset
  entities: frozenset

  def mark(self, doc: Mapping[str, np.ndarray],
           reader: WordReader) -> dict[str, np.ndarray]:
    """The knowledge boundaries of one tokenized document.

    Args:
      doc: tokens int32 [n], word_starts bool [n], sentence_lengths int32 [s].
      reader: the WordReader of the tokenizer that made ``doc``.

    Returns:
      phrase_starts, entity_starts bool [n]: ``word_starts`` with the starts
      of the second and later words of every match cleared.
    """
    word_starts = np.asarray(doc["word_starts"], bool)
    out = {"phrase_starts": word_starts.copy(),
           "entity_starts": word_starts.copy()}
    kinds = [(name, table, max((len(u) for u in table), default=1), lower)
             for name, table, lower in (("phrase_starts", self.phrases, True),
                                        ("entity_starts", self.entities, False))]
    for words in reader.sentences(doc):
      for name, table, longest, lower in kinds:
        for i, j in match(words, table, longest, lower):
          out[name][[w.start for w in words[i + 1:j]]] = False
    return out

  @classmethod
  def read(cls, directory: str) -> "Marker":
    """The Marker that ``write`` wrote to ``directory``."""
    units = {}
    for name in ("phrases", "entities"):
      # A Beam worker of a gs:// data_dir reads them from the bucket.
      text = paths.read_text(paths.join(directory, f"{name}.txt"))
      units[name] = frozenset(tuple(line.split()) for line in text.splitlines()
                              if line.strip())
    return cls(phrases=units["phrases"], entities=units["entities"])

  def write(self, directory: str) -> None:
    """Writes phrases.txt and entities.txt (one unit a line); ``read`` loads them."""
    os.makedirs(directory, exist_ok=True)
    for name, units in (("phrases", self.phrases), ("entities", self.entities)):
      with open(os.path.join(directory, f"{name}.txt"), "w", encoding="utf-8") as f:
        f.writelines(" ".join(u) + "\n" for u in sorted(units))


def fit(docs: Iterable[Mapping[str, np.ndarray]], reader: WordReader,
        settings: Settings) -> Marker:
  """Fits the phrase chunker (and default entities) on tokenized documents.

  Args:
    docs: tokenized train documents (tokens, word_starts, sentence_lengths);
      at most ``MAX_FIT_SENTENCES`` sentences are read.
    reader: the WordReader of their tokenizer.
    settings: thresholds and gazetteer.

  Returns:
    The Marker to apply to every split.
  """
  grams: collections.Counter = collections.Counter()  # lower-cased, n >= 1
  cased: collections.Counter = collections.Counter()  # single words as written
  runs: collections.Counter = collections.Counter()  # capitalised runs
  sentences = 0
  for doc in docs:
    for words in reader.sentences(doc):
      lowered = [w.core.lower() for w in words]
      grams.update((c,) for c in lowered if c)
      # Capitalisation means something only away from a clause's start.
      links = _links(words)
      cased.update(w.core for w, linked in zip(words[1:], links) if linked)
      for i, j in _chains(words, settings.max_phrase_words):
        grams[tuple(lowered[i:j])] += 1
      if not settings.gazetteer:
        runs.update(_capitalised_runs(words))
      sentences += 1
    if sentences >= MAX_FIT_SENTENCES:
      break
  total = sum(c for g, c in grams.items() if len(g) == 1)
  by_count = sorted((c, g) for g, c in grams.items() if len(g) == 1)
  function = {g[0] for _, g in by_count[-NUM_FUNCTION_WORDS:]}
  phrases = frozenset(
      g for g, c in grams.items()
      if len(g) >= 2 and c >= settings.phrase_min_count
      and g[0] not in function and g[-1] not in function and min(
          math.log(c * total / (grams[g[:k]] * grams[g[k:]]))
          for k in range(1, len(g))) >= settings.phrase_min_pmi)
  if settings.gazetteer:
    entities = frozenset(read_gazetteer(settings.gazetteer))
  else:
    entities = frozenset(_default_entities(runs, cased, settings.entity_min_count))
  return Marker(phrases=phrases, entities=entities)


def _capitalised(core: str) -> bool:
  return bool(core) and core[0].isupper()


def _capitalised_runs(words: list[Word]) -> Iterable[tuple[tuple[str, ...], bool]]:
  """Maximal linked runs of 2+ capitalised words: (cores, opens a clause).

  A run opens a clause when it starts the sentence or follows punctuation.
  """
  links = _links(words)
  i = 0
  while i < len(words):
    j = i
    while j < len(words) and _capitalised(words[j].core) and (
        j == i or links[j - 1]):
      j += 1
    if j - i >= 2:
      yield tuple(w.core for w in words[i:j]), i == 0 or not links[i - 1]
    i = max(j, i + 1)


def _default_entities(runs: Mapping[tuple[tuple[str, ...], bool], int],
                      cased: Mapping[str, int], min_count: int) -> list[tuple[str, ...]]:
  """Recurring capitalised names; a clause-initial word must be a name too."""
  counts: collections.Counter = collections.Counter()
  for (cores, opens), c in runs.items():
    if opens and cased.get(cores[0], 0) <= cased.get(cores[0].lower(), 0):
      cores = cores[1:]  # 'The', 'Return': capitalised only by position
    if 2 <= len(cores) <= MAX_ENTITY_WORDS:
      counts[cores] += c
  return [e for e, c in counts.items() if c >= min_count]


def unit_starts(doc: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The unit boundaries the packers carry: word_starts and the knowledge ones.

  Args:
    doc: a tokenized document; phrase_starts / entity_starts may be absent
      (shards prepared without ``knowledge_spans``).

  Returns:
    word_starts, phrase_starts, entity_starts bool [n]; an absent field is
    word_starts (every word its own unit), so other variants are unchanged.
  """
  word_starts = np.asarray(doc["word_starts"], bool)
  out = {"word_starts": word_starts}
  for name in ("phrase_starts", "entity_starts"):
    out[name] = np.asarray(doc[name], bool) if name in doc else word_starts
  return out
