"""prepare() from public TFDS datasets: read where prepared, never downloaded,
and a copy that is missing or unreadable named with the tfds build fix."""

import os
import re
import tempfile
import types

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax.data import builders
from bertjax.data import prepare
from bertjax.data import python_docs
from bertjax.data import text_sources
from bertjax.data import units


def test_unprepared_public_dataset_is_not_downloaded(demo_config, tmp_path, monkeypatch):
  if builders.catalog_builder("imdb_reviews", None).is_prepared():
    pytest.skip("imdb_reviews is prepared on this machine")
  # TFDS makes an empty tmp*tfds directory for a catalog dataset that is not
  # prepared and leaves it; bertjax's builders of those remove it.
  system_tmp = tmp_path / "system-tmp"
  system_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
  config = demo_config.copy_and_resolve_references()
  config.dataset = "imdb_reviews"
  with pytest.raises(ValueError, match="not prepared.*bertjax never downloads"):
    prepare.prepare(config, str(tmp_path / "data"))
  assert not builders.catalog_builder("imdb_reviews", None).is_prepared()
  assert list(system_tmp.iterdir()) == []
  assert tempfile.gettempdir() == str(system_tmp)


class PublicTextStandIn(builders.OfflineBuilder):
  """A TFDS text dataset shaped like the public ones: {'text': Text}, train/test."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return builders.OfflineInfo(
        builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    docs = ["\n\n".join(paras) for _, paras in python_docs.topic_documents()]
    return {"train": self._generate_examples(docs[:60]),
            "test": self._generate_examples(docs[60:])}

  def _generate_examples(self, docs):
    for i, text in enumerate(docs):
      yield i, {"text": text}


def test_public_tfds_text_dataset(demo_config, tmp_path):
  PublicTextStandIn(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  config = demo_config.copy_and_resolve_references()
  config.update(dataset="public_text_stand_in", eval_split="test", vocab_size=600,
                text_feature="body")
  with pytest.raises(ValueError, match="no feature 'body'.*--config.text_feature"):
    prepare.prepare(config, str(tmp_path))
  assert not (tmp_path / "tokenizers").exists()
  config.text_feature = "text"
  prepared = prepare.prepare(config, str(tmp_path))
  n_topics = len(list(python_docs.topic_documents()))
  assert prepared.splits == {"train": 60, "test": n_topics - 60}
  tok = prepared.tokenizer()
  doc = prepared.source("test")[0]
  # Sentence-split on the fly: several sentences, each starting a word.
  assert len(doc["sentence_lengths"]) > 1
  assert doc["word_starts"][np.cumsum(doc["sentence_lengths"]) - doc["sentence_lengths"]].all()
  assert tok.decode(doc["tokens"]).count(" ") >= len(doc["tokens"]) // 4


@pytest.mark.parametrize("copy_in_data_dir", [True, False])
def test_an_unreadable_tfds_copy_is_told_to_be_rebuilt_where_the_run_looks(
    demo_config, tmp_path, monkeypatch, copy_in_data_dir):
  """A public dataset bertjax cannot open, or read by index (one prepared as
  tfrecord, say): the fix rebuilds it as array_record in the run's data_dir,
  where prepare looks first, replacing the copy there if that is the one (the
  hint named no data_dir, so its tfds build went to TFDS's default)."""
  data_dir = str(tmp_path / "data")
  if copy_in_data_dir:
    os.makedirs(os.path.join(data_dir, "stand_in"))
  config = demo_config.copy_and_resolve_references()
  config.update(dataset="stand_in", train_split="train", eval_split="")
  split = types.SimpleNamespace(num_examples=3, num_bytes=30)
  builder = types.SimpleNamespace(info=types.SimpleNamespace(splits={"train": split}),
                                  is_prepared=lambda: True)
  def unreadable(self):
    raise ValueError("tfrecord has no random access")
  monkeypatch.setattr(units.TextSource, "open", unreadable)
  monkeypatch.setattr(text_sources, "_tfds_builder", lambda name, tfds_dir: builder)
  fix = (rf"prepare it as array_record, .* in the run's data_dir {re.escape(data_dir)} "
         rf"\(tfds build stand_in --data_dir={re.escape(data_dir)}"
         + (" --overwrite" if copy_in_data_dir else "")
         + r" --file_format=array_record\)\.$")
  with pytest.raises(ValueError, match=(
      r"^Cannot read TFDS dataset 'stand_in' split 'train' \(tfrecord has no "
      r"random access\); " + fix)):
    text_sources.text_sources(config, data_dir, engine=None)
  def unopenable(name, tfds_dir):
    raise OSError("bad dataset_info.json")
  monkeypatch.setattr(text_sources, "_tfds_builder", unopenable)
  with pytest.raises(ValueError, match=(
      r"^Cannot open TFDS dataset 'stand_in' \(bad dataset_info\.json\); " + fix)):
    text_sources.check_dataset(config, data_dir)


def test_a_known_tfds_dataset_not_built_is_told_to_be_built(demo_config, tmp_path):
  """wikipedia is in TFDS's catalog but not registered by `import
  tensorflow_datasets`: it is named not prepared, with the tfds build fix.
  That fix builds it into the run's data_dir, where prepare looks first, and
  the message names that data_dir (it used to name only TFDS's default
  directory, and its tfds build command built there)."""
  config = demo_config.copy_and_resolve_references()
  config.dataset = "wikipedia/20230601.en"
  data_dir = str(tmp_path / "data")
  with pytest.raises(ValueError, match=(
      rf"^TFDS dataset 'wikipedia/20230601\.en' is not prepared in {re.escape(data_dir)} "
      r"\(nor in TFDS's default .*\); prepare it first \(tfds build "
      rf"wikipedia/20230601\.en --data_dir={re.escape(data_dir)} "
      r"--file_format=array_record\)")):
    prepare.prepare(config, data_dir)
  assert not (tmp_path / "data").exists()


def test_staged_units_of_a_public_dataset_name_the_sentence_splitter():
  # A public dataset's text is split into sentences by prepare, whose rule
  # changed (a lone "\r" ends a line): the plans of its staged units must
  # change with it, so an interrupted prepare of an older bertjax is redone,
  # while an own dataset's (split when written) keep the key they always had,
  # so that a staged tokenizer sample of an earlier version still resumes.
  import hashlib
  from bertjax.data import text_sources
  from bertjax.data import tokenizer_fit
  from bertjax.data import units
  fields = dict(path="wiki", split="train", data_dir="/d")
  public = units.TextSource(kind="public", **fields)
  own = units.TextSource(kind="own", **fields)
  assert own.plan_key() == str(own)
  assert "cr-lines" in public.plan_key()

  def earlier_sample_plan(source, threshold):  # the sample's key before the rule
    return hashlib.sha256(f"{source}|{threshold}|{tokenizer_fit._SAMPLE_SEED}".encode()
                          ).hexdigest()[:16]

  def sample_plan(source, threshold):
    return tokenizer_fit._plan([text_sources.Split(source, 10, 1000)], threshold)

  assert sample_plan(own, 7) == earlier_sample_plan(own, 7)
  assert sample_plan(public, 7) != earlier_sample_plan(public, 7)
