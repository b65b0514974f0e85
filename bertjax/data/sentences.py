"""A small rule-based sentence splitter for English prose.

BERT's sentence-level objectives (NSP, SOP) and the packing layouts need
documents as lists of sentences. This splitter is deliberately simple and
deterministic (no model, no nltk): text is cut into paragraphs at blank lines,
and a paragraph is cut after ``.``, ``!`` or ``?`` (optionally followed by
closing quotes or brackets) when whitespace and then an upper-case letter, a
digit or an opening quote/bracket follow, unless the word before the full stop
is a known abbreviation (``e.g.``, ``Mr.``, ``etc.``) or a single initial.
Decimals (``3.14``) and dotted names (``os.path``) never split because no
whitespace follows their dot.
"""

from __future__ import annotations

import re

# Lower-cased abbreviations (without their final dot) after which a full stop
# does not end a sentence. "etc." usually ends a clause inside a sentence in
# technical prose, so it is treated the same way.
ABBREVIATIONS = frozenset({
    "e.g", "i.e", "etc", "cf", "vs", "viz", "al", "approx", "ca", "fig",
    "figs", "eq", "eqs", "no", "nos", "vol", "vols", "ch", "sec", "p", "pp",
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "inc", "ltd",
    "co", "corp", "dept", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
    "sep", "sept", "oct", "nov", "dec", "u.s", "u.k", "ph.d", "a.m", "p.m",
})

# A candidate boundary: terminal punctuation, optional closers, whitespace,
# then something that can start a sentence.
_BOUNDARY = re.compile(r"""[.!?]+["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
_PARAGRAPH = re.compile(r"\n[ \t]*\n\s*")
_WHITESPACE = re.compile(r"\s+")
_LAST_WORD = re.compile(r"(\S+)$")


def split_paragraphs(text: str) -> list[str]:
  """Splits text at blank lines; returns non-empty paragraphs, whitespace collapsed."""
  out = []
  for block in _PARAGRAPH.split(text):
    block = _WHITESPACE.sub(" ", block).strip()
    if block:
      out.append(block)
  return out


def _ends_with_abbreviation(prefix: str) -> bool:
  """True if ``prefix`` (text up to and including a full stop) ends in an abbreviation."""
  match = _LAST_WORD.search(prefix)
  if not match:
    return False
  word = match.group(1).lstrip("\"'(\u201c\u2018[").rstrip(".").lower()
  if word in ABBREVIATIONS:
    return True
  # A single initial such as the "J." of "J. Smith".
  return len(word) == 1 and word.isalpha()


def split_paragraph(paragraph: str) -> list[str]:
  """Splits one paragraph (whitespace already collapsed) into sentences."""
  sentences = []
  start = 0
  for match in _BOUNDARY.finditer(paragraph):
    punct = match.group(0).rstrip()
    # Only a lone full stop can belong to an abbreviation; "!" and "?" always end.
    if punct.rstrip("\"'\u201d\u2019)]") == ".":
      if _ends_with_abbreviation(paragraph[start:match.start() + 1]):
        continue
    sentence = paragraph[start:match.end()].strip()
    if sentence:
      sentences.append(sentence)
    start = match.end()
  tail = paragraph[start:].strip()
  if tail:
    sentences.append(tail)
  return sentences


def split_sentences(text: str) -> list[str]:
  """Splits text into sentences: paragraphs at blank lines, then sentence ends.

  Args:
    text: any amount of prose; newlines inside a paragraph are treated as spaces.

  Returns:
    The sentences in order, each stripped and with whitespace collapsed.
  """
  out = []
  for paragraph in split_paragraphs(text):
    out.extend(split_paragraph(paragraph))
  return out
