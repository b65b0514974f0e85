"""The embedded demo corpus: English prose from Python's own documentation.

Every CPython ships two sources of real, offline English text:

* ``pydoc_data.topics.topics``: the language reference rendered as plain text,
  one document per help topic (``topic:<name>``);
* the docstrings of the standard library, one document per module
  (``module:<dotted.name>``), read by parsing the source files with ``ast`` in
  sorted order. Modules are never imported, because importing some of them has
  side effects (``antigravity`` opens a browser, ``this`` prints).

Both are cleaned into prose paragraphs: code blocks (``>>>`` sessions, indented
code, grammar productions), reST headings/directives and inline markup are
dropped, so that a tokenizer and a language model see sentences rather than
code. The result is about 1.4 MB of text (~460 documents on Python 3.11) and
is identical on every run of the same Python version.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import os
import re
import sysconfig
from typing import Iterator

from bertjax.data import sentences as sentences_lib

# Fraction of documents held out for validation (by hash of their name): 10%
# rather than 5% so that the held-out split has a few dozen documents (~30).
VALIDATION_FRACTION = 0.1

# Directories of the stdlib that hold tests, tools, generated tables or
# third-party packages rather than library prose.
_SKIP_DIRS = frozenset({
    "test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo",
    "ensurepip", "encodings", "pydoc_data", "__pycache__", "lib-dynload",
    "__phello__",
})
# Single modules whose docstrings are not prose (rot13 text, generated tables).
_SKIP_MODULES = frozenset({"this", "antigravity", "__hello__", "stringprep"})

_HEADING_RULE = re.compile(r"^\s*([*=\-~^#+])\1{2,}\s*$")
_CODE_PROMPT = re.compile(r"^\s*(>>>|\.\.\.|\$ |% |In \[)")
_BULLET = re.compile(r"^\s*([*\-+\u2022]|\d+\.|\(\d+\)|[a-z]\))\s+")
_ROLE = re.compile(r":[\w:.+-]+:`~?([^`<]*?)(?:\s*<[^`>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]*>`_{1,2}")
_LITERAL = re.compile(r"``([^`]+)``|`([^`]+)`_?")
_EMPHASIS = re.compile(r"\*\*([^*]+)\*\*|(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])")
_FOOTNOTE = re.compile(r"\s*\[\d+\]_?")
_WORD = re.compile(r"[A-Za-z]{2,}")
_PROSE_END = re.compile(r"[.!?:][\"')\]]*$")


def stdlib_dir() -> str:
  """The directory of this interpreter's standard library source."""
  return sysconfig.get_paths()["stdlib"]


def strip_markup(text: str) -> str:
  """Removes reST inline markup (roles, links, literals, emphasis) from prose."""
  text = _ROLE.sub(lambda m: m.group(1), text)
  text = _LINK.sub(lambda m: m.group(1), text)
  text = _LITERAL.sub(lambda m: m.group(1) or m.group(2), text)
  text = _EMPHASIS.sub(lambda m: m.group(1) or m.group(2), text)
  text = _FOOTNOTE.sub("", text)
  return re.sub(r"\s+", " ", text).strip()


def _prose_paragraph(lines: list[str]) -> str | None:
  """The paragraph's text if its raw lines read as prose, else None (code/markup)."""
  if any(_CODE_PROMPT.match(l) or _HEADING_RULE.match(l) for l in lines):
    return None
  first = lines[0]
  if first.lstrip().startswith(".. ") or "::=" in "".join(lines):
    return None
  # Prose lines share one indentation (a bullet's continuation lines may sit
  # under its text); code has nested indentation.
  indents = {len(l) - len(l.lstrip()) for l in lines[1:]}
  bullet = _BULLET.match(first)
  allowed = {len(first) - len(first.lstrip())}
  if bullet:
    allowed.add(bullet.end())
    first = first[bullet.end():]
  if not indents <= allowed:
    return None
  text = strip_markup(" ".join(l.strip() for l in [first] + lines[1:]))
  if len(_WORD.findall(text)) < 5 or not _PROSE_END.search(text):
    return None
  letters = sum(map(str.isalpha, text)) + text.count(" ")
  return text if letters >= 0.85 * len(text) else None


def clean_text(text: str) -> list[str]:
  """Turns documentation text into prose paragraphs.

  Args:
    text: plain text or reST-flavoured docstring text.

  Returns:
    The paragraphs that read as prose, markup removed, whitespace collapsed.
  """
  text = inspect.cleandoc(text.expandtabs())
  out = []
  for block in re.split(r"\n[ \t]*\n", text):
    lines = [l for l in block.split("\n") if l.strip()]
    if not lines:
      continue
    # A paragraph that introduces a literal block ("...::") keeps its prose.
    if lines[-1].rstrip().endswith("::"):
      lines[-1] = lines[-1].rstrip()[:-1]
    paragraph = _prose_paragraph(lines)
    if paragraph:
      out.append(paragraph)
  return out


def _module_name(relpath: str) -> str:
  parts = relpath[:-len(".py")].split(os.sep)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


# The fields of a node that hold statements (``except`` handlers and ``case``
# blocks hold them in turn): classes and functions are statements, so they
# are found without visiting a single expression (ast.walk visits every node,
# about ten times as many, and took half of the corpus's parse).
_STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")
_DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _definitions(node: ast.AST) -> Iterator[ast.AST]:
  """Every class and function defined anywhere under ``node``."""
  for field in _STATEMENT_FIELDS:
    for child in getattr(node, field, ()):
      if isinstance(child, _DEFINITIONS):
        yield child
      yield from _definitions(child)


def _docstrings(tree: ast.Module) -> Iterator[str]:
  """Docstrings of a module, then of its classes and functions in source order."""
  nodes = [tree] + sorted(_definitions(tree), key=lambda n: (n.lineno, n.col_offset))
  for node in nodes:
    doc = ast.get_docstring(node, clean=False)
    if doc:
      yield doc


def module_files(root: str | None = None) -> list[tuple[str, str]]:
  """(module name, path) of the stdlib source files used, sorted by module name."""
  root = root or stdlib_dir()
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames
                         if d not in _SKIP_DIRS and not d.startswith(("test", "config-")))
    for filename in filenames:
      if not filename.endswith(".py") or filename.startswith(("test_", "_sysconfigdata")):
        continue
      path = os.path.join(dirpath, filename)
      name = _module_name(os.path.relpath(path, root))
      if name and name not in _SKIP_MODULES:
        out.append((name, path))
  return sorted(out)


def topic_documents() -> Iterator[tuple[str, list[str]]]:
  """(``topic:<name>``, paragraphs) for every pydoc help topic, sorted by name."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  for name in sorted(topics.topics):
    paragraphs = clean_text(topics.topics[name])
    if paragraphs:
      yield f"topic:{name}", paragraphs


def module_documents(root: str | None = None) -> Iterator[tuple[str, list[str]]]:
  """(``module:<name>``, paragraphs) from stdlib docstrings, sorted by module."""
  for name, path in module_files(root):
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError):
      # A file that this interpreter cannot parse has no prose for us.
      continue
    paragraphs = []
    for doc in _docstrings(tree):
      paragraphs.extend(clean_text(doc))
    if paragraphs:
      yield f"module:{name}", paragraphs


def is_validation(name: str, fraction: float = VALIDATION_FRACTION) -> bool:
  """Stable hold-out decision for a document name (same on every machine)."""
  digest = hashlib.sha256(name.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") < fraction * 2**64


@functools.lru_cache(maxsize=1)
def _all_documents() -> tuple[tuple[str, tuple[str, ...]], ...]:
  """Every (document id, sentences) of the corpus, parsed once per process:
  reading the stdlib's docstrings takes seconds, and preparing, the fine-tuning
  demo tasks and the tests all read the corpus. Immutable, so that the cached
  copy stays as read."""
  out = []
  for name, paragraphs in (*topic_documents(), *module_documents()):
    sents = tuple(s for p in paragraphs for s in sentences_lib.split_paragraph(p))
    if sents:
      out.append((name, sents))
  return tuple(out)


def documents(split: str | None = None) -> Iterator[tuple[str, list[str]]]:
  """(document id, sentences) of the demo corpus in a fixed order.

  Args:
    split: 'train', 'validation', or None for both.

  Yields:
    The document id (``topic:...`` / ``module:...``) and its sentences (a
    fresh list each time).
  """
  if split not in (None, "train", "validation"):
    raise ValueError(f"Unknown split {split!r} of the demo corpus; use 'train' or 'validation'.")
  for name, sents in _all_documents():
    if split is not None and is_validation(name) != (split == "validation"):
      continue
    yield name, list(sents)
