"""The sentence splitter and the embedded demo corpus (Python's documentation)."""

import os
import sys

import pytest
import tensorflow_datasets as tfds

from bertjax.data import python_docs
from bertjax.data import sentences


@pytest.mark.parametrize("text, want", [
    ("It works. Then it stops.", ["It works.", "Then it stops."]),
    ("Use a list, e.g. a stack. Or a queue.", ["Use a list, e.g. a stack.", "Or a queue."]),
    ("Sort it, i.e. Order it. Done.", ["Sort it, i.e. Order it.", "Done."]),
    ("Mr. Smith wrote it. Dr. Jones read it.", ["Mr. Smith wrote it.", "Dr. Jones read it."]),
    ("Lists, tuples, etc. Are sequences.", ["Lists, tuples, etc. Are sequences."]),
    ("Pi is 3.14 and e is 2.71. Both are irrational.",
     ["Pi is 3.14 and e is 2.71.", "Both are irrational."]),
    ("Python 3.11 added it. See os.path.join for paths.",
     ["Python 3.11 added it.", "See os.path.join for paths."]),
    ("Really? Yes! It is.", ["Really?", "Yes!", "It is."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("It ends with x. lower case continues.", ["It ends with x. lower case continues."]),
    ("Written by J. Smith in 1999. The end.", ["Written by J. Smith in 1999.", "The end."]),
    ("First paragraph\nwraps here.\n\nSecond one.",
     ["First paragraph wraps here.", "Second one."]),
    ("   \n\n  ", []),
    # Scripts whose sentences start without an ASCII capital, or end without a space.
    ("Это первое. Это второе! А третье?", ["Это первое.", "Это второе!", "А третье?"]),
    ("机器学习是一个分支。它研究算法！真的吗？", ["机器学习是一个分支。", "它研究算法！", "真的吗？"]),
    ("هذه جملة. وهذه أخرى؟ نعم", ["هذه جملة.", "وهذه أخرى؟", "نعم"]),
    ("यह पहला वाक्य है। यह दूसरा है।", ["यह पहला वाक्य है।", "यह दूसरा है।"]),
])
def test_split_sentences(text, want):
  assert sentences.split_sentences(text) == want


def test_split_paragraphs_collapses_whitespace():
  assert sentences.split_paragraphs("a  b\n c\n\n\n\td  e\n") == ["a b c", "d e"]
  # Windows line ends: a blank line is still a paragraph break.
  assert sentences.split_paragraphs("a b\r\n c\r\n\r\nd e\r\n \r\nf\r\n") == [
      "a b c", "d e", "f"]


def test_clean_text_keeps_prose_and_drops_code_and_markup():
  text = """
    Heading
    *******

    The :func:`len` function returns the ``length`` of a **container**
    such as a list.

    >>> len([1, 2])
    2

       if_stmt ::= "if" expression ":" suite

       def f(x):
           return x + 1

    .. note:: directive text that is not prose at all here.

    * A bullet item that reads as a full English sentence here.
    """
  assert python_docs.clean_text(text) == [
      "The len function returns the length of a container such as a list.",
      "A bullet item that reads as a full English sentence here.",
  ]


@pytest.fixture(scope="module")
def corpus():
  """The demo corpus generated afresh (independently of the demo_data build)."""
  return list(python_docs.documents())


def test_corpus_does_not_import_stdlib_modules(corpus):
  # antigravity opens a web browser when imported; nothing else imports it.
  assert corpus and "antigravity" not in sys.modules


def test_corpus_size_and_content(corpus):
  text_bytes = sum(len(s.encode("utf-8")) + 1 for _, sents in corpus for s in sents)
  assert 500_000 <= text_bytes <= 2_000_000
  ids = [doc_id for doc_id, _ in corpus]
  assert len(ids) == len(set(ids))
  assert any(i.startswith("topic:") for i in ids)
  assert any(i.startswith("module:") for i in ids)
  assert not any(i.startswith(("module:test.", "module:idlelib", "module:lib2to3"))
                 for i in ids)
  all_sentences = [s for _, sents in corpus for s in sents]
  # Code, grammar and reST markup were cleaned away.
  assert not [s for s in all_sentences if ">>>" in s or "::=" in s or ":func:`" in s]
  # Most sentences look like sentences: a capital or digit first, punctuation last.
  proper = sum(s[0].isupper() and s[-1] in ".!?:)\"'" for s in all_sentences)
  assert proper >= 0.85 * len(all_sentences)


def test_demo_dataset_is_deterministic_and_split_disjoint(corpus, demo_data):
  """The TFDS build of the session fixture equals a fresh, independent build."""
  builder = tfds.builder_from_directory(
      os.path.join(demo_data.data_dir, "bertjax_python_docs", "1.0.0"))
  built = {}
  for split in ("train", "validation"):
    source = builder.as_data_source(split)
    docs = {}
    for i in range(len(source)):
      record = source[i]
      docs[record["id"].decode()] = [s.decode() for s in record["sentences"]]
    built[split] = docs
  assert not set(built["train"]) & set(built["validation"])
  assert {**built["train"], **built["validation"]} == dict(corpus)
  n_val, n_all = len(built["validation"]), len(corpus)
  # ~10% held out by hash; binomial std at n~460 is ~1.4 points, so 5..15% is >3 sigma.
  assert 0.05 * n_all <= n_val <= 0.15 * n_all
  assert n_val >= 24
  # The hold-out is a function of the document name alone.
  assert all(python_docs.is_validation(i) for i in built["validation"])


def test_corpus_is_parsed_once_per_process_and_served_as_fresh_lists(corpus, monkeypatch):
  first = list(python_docs.documents())  # the cached copy (the fixture parsed it)
  parsed, real_parse = [], python_docs.ast.parse
  monkeypatch.setattr(python_docs.ast, "parse",
                      lambda *a, **k: parsed.append(a) or real_parse(*a, **k))
  again = list(python_docs.documents())
  assert again == first == corpus and not parsed
  again[0][1].append("A sentence added by the caller.")
  assert list(python_docs.documents())[0] == corpus[0]
  train = [n for n, _ in python_docs.documents("train")]
  held_out = [n for n, _ in python_docs.documents("validation")]
  assert sorted(train + held_out) == sorted(n for n, _ in corpus) and not parsed
  assert all(python_docs.is_validation(n) for n in held_out)
