"""A small rule-based sentence splitter, for English prose first.

BERT's sentence-level objectives (NSP, SOP) and the packing layouts need
documents as lists of sentences. This splitter is deliberately simple and
deterministic (no model, no nltk): text is cut into paragraphs at blank lines,
and a paragraph is cut after ``.``, ``!`` or ``?`` (optionally followed by
closing quotes or brackets) when whitespace and then an upper-case letter
(Latin, Greek, Cyrillic), a letter of a caseless script, a digit or an
opening quote/bracket follow, unless the word before the full stop is a known
abbreviation (``e.g.``, ``Mr.``, ``etc.``) or a single initial; and after the
sentence ends of Chinese and Japanese (``。！？``), Arabic (``؟``), Urdu (``۔``)
and Hindi (``।``), which need no space after them.
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

# What can start a sentence after ". ": an upper-case Latin, Greek or
# Cyrillic letter, a digit, or a letter of a script without case (Hebrew,
# Arabic, Devanagari, kana, CJK ideographs, Hangul).
_STARTS = ("A-Z0-9\u0391-\u03a9\u0400-\u042f\u05d0-\u05ea\u0620-\u064a"
           "\u0900-\u0939\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7a3")
# A candidate boundary: terminal punctuation, optional closers, whitespace,
# then something that can start a sentence; or a full-width (CJK) or Arabic,
# Urdu or Devanagari sentence end, which needs no space after it.
_BOUNDARY = re.compile(
    r"""[.!?]+["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]?[""" + _STARTS + r"""])"""
    r"""|[\u3002\uff01\uff1f\u061f\u06d4\u0964\u0965]+"""
    r"""["'\u201d\u2019)\]\u300d\u300f\uff09]*\s*(?=\S)""")
# A blank line: two line ends with only spaces or tabs between them. A line
# ends as in Python's universal newlines: "\r\n" (Windows), "\r" alone (old
# Mac OS) or "\n". Text files are read as bytes, so no reader has already
# turned "\r" into "\n" here.
# (A "\r" before "\n" is never a line end of its own.)
_LINE_END = r"(?:\r\n|\r(?!\n)|\n)"
_PARAGRAPH = re.compile(_LINE_END + r"[^\S\r\n]*" + _LINE_END + r"\s*")
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
