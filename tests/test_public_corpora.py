"""The README's public-corpora recipe on small stand-ins with the real names and schemas.

TFDS's ``wikipedia/20230601.en`` and ``pg19`` are written (three articles,
two books) as TFDS would leave them after ``tfds build ... --file_format=
array_record``, in one data_dir; ``prepare`` reads both there, never
downloading, and tokenizes each beside the other with its own tokenizer.
"""

import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax.data import builders
from bertjax.data import prepare
from bertjax.data import python_docs
from bertjax.data import staged

_WIKIPEDIA_FEATURES = {"title": tfds.features.Text(), "text": tfds.features.Text()}


def _write(data_dir, name, directory, features, records_by_split):
  features = tfds.features.FeaturesDict(features)
  serialize = staged.Serializer(features)
  stage = staged.Stage(str(data_dir / directory), name, "stand-in")
  for i, (split, records) in enumerate(records_by_split.items()):
    stage.write_unit(i, {split: [serialize(r) for r in records]}, {})
  stage.publish(len(records_by_split), list(records_by_split), features, {},
                f"stand-in for {name}")


@pytest.fixture(scope="module")
def public_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("public")
  topics = [" ".join(paras) for _, paras in python_docs.topic_documents()]
  articles = [{"title": f"Article {i}", "text": t} for i, t in enumerate(topics[:60])]
  _write(data_dir, "wikipedia", "wikipedia/20230601.en/1.0.0", _WIKIPEDIA_FEATURES,
         {"train": articles})
  # pg19 is registered with TFDS: its stand-in has TFDS's own schema.
  pg19 = builders.catalog_builder("pg19", str(tmp_path_factory.mktemp("unused")))
  books = {}
  for split, chunk in (("train", topics[60:70]), ("validation", topics[70:73])):
    books[split] = [{"book_title": f"Book {i}", "book_id": i, "publication_date": "1900",
                     "book_link": "", "book_text": "\n\n".join(chunk[i:i + 5])}
                    for i in range(0, len(chunk), 5)]
  _write(data_dir, "pg19", f"pg19/{pg19.version}", dict(pg19.info.features), books)
  return data_dir


def test_wikipedia_and_pg19_share_one_data_dir(public_dir, demo_config):
  config = demo_config.copy_and_resolve_references()
  config.vocab_size = 1000
  config.dataset = "wikipedia/20230601.en"
  config.train_split, config.eval_split = "train[:90%]", "train[90%:]"
  wiki = prepare.prepare(config, str(public_dir))
  assert wiki.splits == {"train[:90%]": 54, "train[90%:]": 6}

  config.dataset, config.text_feature = "pg19", "book_text"
  config.train_split, config.eval_split = "train", "validation"
  books = prepare.prepare(config, str(public_dir))
  assert books.splits == {"train": 2, "validation": 1}
  assert wiki.tokenized_dir != books.tokenized_dir
  assert wiki.tokenizer_path != books.tokenizer_path

  # The tokens are the books' text: decoded back, the first sentence is there.
  book = books.source("train")[0]
  text = books.tokenizer().decode(book["tokens"][:book["sentence_lengths"][0]])
  first = tfds.data_source("pg19", split="train", data_dir=str(public_dir))[0]
  assert text.strip() and text.strip()[:40] in " ".join(
      first["book_text"].decode().split())
  assert np.sum(book["sentence_lengths"]) == book["tokens"].size


def test_wrong_text_feature_names_the_features(public_dir, demo_config, tmp_path):
  config = demo_config.copy_and_resolve_references()
  config.dataset, config.text_feature = "pg19", "text"
  config.vocab_size = 1000
  shutil.copytree(public_dir / "pg19", tmp_path / "pg19")
  with pytest.raises(ValueError, match="book_text.*--config.text_feature"):
    prepare.prepare(config, str(tmp_path))


def test_wikipedia_and_pg19_as_one_mixture(public_dir, demo_config):
  """The README's mixture recipe: both corpora, one tokenizer, books x2."""
  config = demo_config.copy_and_resolve_references()
  config.vocab_size = 1000
  config.mixture = ("wikipedia/20230601.en train_split=train[:90%] eval_split=train[90%:]; "
                    "pg19 text_feature=book_text weight=2")
  mixed = prepare.prepare(config, str(public_dir))
  wiki, books = mixed.parts
  assert wiki.splits == {"train[:90%]": 54, "train[90%:]": 6}
  assert books.splits == {"train": 2, "validation": 1}
  assert wiki.tokenizer_path == books.tokenizer_path == mixed.tokenizer_path
  # Not the one-corpus runs' tokenizers or shards (those may sit beside it).
  assert "mixture_" in mixed.tokenizer_path
  assert mixed.splits == {"train": 54 + 2 * 2, "validation": 6 + 1}
  # The books' text comes through the shared tokenizer: the first sentence of
  # the first book, decoded, is in the book.
  train = mixed.source("train")
  corpus, doc = train.locate(54)
  assert (corpus, doc) == (1, 0)
  book = train[54]
  text = mixed.tokenizer().decode(book["tokens"][:book["sentence_lengths"][0]])
  first = tfds.data_source("pg19", split="train", data_dir=str(public_dir))[0]
  assert text.strip() and text.strip()[:40] in " ".join(
      first["book_text"].decode().split())
