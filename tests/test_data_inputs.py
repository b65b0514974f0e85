"""prepare's refusals of bad inputs: empty corpora, files where directories
belong, a tokenizer sample too small for the vocabulary; and its ETA line."""

import logging
import os
import subprocess
import sys

import pytest

import corpus_files
from bertjax.data import layout
from bertjax.data import prepare
from bertjax.data import python_docs
from bertjax.data import workers

from test_prepare import _local_config


def _snapshot(root):
  """path -> (size, mtime_ns) of everything under root (directories included)."""
  out = {}
  for dirpath, dirs, files in os.walk(root):
    for name in dirs + files:
      st = os.stat(os.path.join(dirpath, name))
      out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
  return out


@pytest.mark.parametrize("seconds, want", [
    (0, "00:00:00"), (-5, "00:00:00"), (61.4, "00:01:01"), (3723, "01:02:03"),
    (100 * 3600 + 59, "100:00:59"),  # past a day: counted on, not wrapped
    (float("inf"), "unknown"), (float("nan"), "unknown"),
])
def test_format_eta(seconds, want):
  assert workers.format_eta(seconds) == want


def test_progress_of_text_read_back_from_shards_shows_no_smaller_total(caplog):
  # The sample and tokenize stages count the text they read (2.4 MB) against
  # the shards' compressed size (0.6 MB): "2.4/0.6 MB" read as more than done.
  progress = workers.Progress("sample", total_bytes=600_000, num_units=2,
                              counted_in_total=False)
  with caplog.at_level(logging.INFO):
    progress.update(docs=7, num_bytes=1_200_000)
    progress.update(docs=7, num_bytes=1_200_000)
  assert "sample: 2/2 units, 14 documents, 2.4 MB read" in caplog.text
  assert "/0.6 MB" not in caplog.text and "ETA 00:00:00" in caplog.text


def test_progress_of_zero_bytes_logs_an_unknown_eta(caplog):
  progress = workers.Progress("text", total_bytes=10, num_units=2)
  with caplog.at_level(logging.INFO):
    progress.update(docs=0, num_bytes=0)  # no bytes yet: no rate
    progress.update(docs=0, num_bytes=0)
  assert "ETA unknown" in caplog.text
  done = workers.Progress("text", total_bytes=0, num_units=1)
  with caplog.at_level(logging.INFO):
    done.update(docs=0, num_bytes=0)  # nothing left: no wait
  assert "ETA 00:00:00" in caplog.text


def test_zero_byte_files_are_refused_in_one_sentence(demo_config, tmp_path):
  corpus = tmp_path / "empty"
  corpus.mkdir()
  (corpus / "a.txt").write_bytes(b"")
  (corpus / "b.txt").write_bytes(b"")
  config = _local_config(demo_config, str(corpus / "*"))
  with pytest.raises(ValueError, match=r"None of the 2 files .*\(2 empty: "):
    prepare.prepare(config, str(tmp_path / "data"))
  assert sorted(os.listdir(corpus)) == ["a.txt", "b.txt"]
  assert not os.listdir(tmp_path / "data" / "bertjax_local_text" / "files" / "1.0.0")


def test_files_where_directories_belong_are_refused(demo_config, tmp_path):
  blocker = tmp_path / "afile"
  blocker.write_text("not a directory")
  config = demo_config.copy_and_resolve_references()
  with pytest.raises(ValueError, match=r"--workdir=.*afile is a file"):
    layout.check_directories(config, str(blocker))
  config.data_dir = str(blocker)
  with pytest.raises(ValueError, match=r"--config.data_dir=.*afile is a file"):
    layout.check_directories(config, str(tmp_path / "work"))
  config.data_dir = str(blocker / "data")
  with pytest.raises(ValueError, match=r"--config.data_dir=.*lies under the file"):
    prepare.prepare(config, config.data_dir)
  # The default data_dir (<workdir>/data) taken by a file.
  workdir = tmp_path / "work"
  workdir.mkdir()
  (workdir / "data").write_text("")
  with pytest.raises(ValueError, match=r"work/data is a file.*--config.data_dir"):
    layout.check_directories(demo_config, str(workdir))
  # A file where prepare writes a directory inside the data_dir.
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  (data_dir / "tokenizers").write_text("")
  before = _snapshot(tmp_path)
  with pytest.raises(ValueError, match=r"tokenizers is a file where prepare writes"):
    prepare.prepare(demo_config, str(data_dir))
  assert _snapshot(tmp_path) == before


def test_prepare_binary_refuses_a_file_as_workdir(tmp_path):
  blocker = tmp_path / "afile"
  blocker.write_text("kept")
  result = subprocess.run(
      [sys.executable, "-m", "bertjax.prepare", "--config=configs/bert.py:tiny",
       f"--workdir={blocker}"], capture_output=True, text=True, timeout=300,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert result.returncode == 2  # as the other binaries' bad input; 1 is --verify's
  assert "Traceback" not in result.stderr
  assert f"error: --workdir={blocker} is a file, not a directory" in result.stderr
  assert blocker.read_text() == "kept"


@pytest.fixture(scope="module")
def topic_files(tmp_path_factory):
  """The pydoc topics, one UTF-8 file each (~300 KB)."""
  root = tmp_path_factory.mktemp("topics")
  corpus_files.write_topic_files(root)
  return str(root / "*.txt")


def test_a_small_tokenizer_sample_is_named_as_the_limit(demo_config, topic_files,
                                                        tmp_path):
  config = _local_config(demo_config, topic_files, vocab_size=1500,
                         tokenizer_sample_sentences=40)
  with pytest.raises(ValueError, match=(
      r"sample of about 40 of the ~\d+ train sentences is too small .*raise "
      r"--config.tokenizer_sample_sentences .*--config.vocab_size to at most \d+")):
    prepare.prepare(config, str(tmp_path / "data"))


def test_a_small_corpus_is_named_as_the_limit(demo_config, tmp_path):
  # Every sentence is in the sample: the corpus is what limits, not the sample.
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  paragraphs = [p for _, paras in python_docs.topic_documents() for p in paras]
  for i in range(2):
    (corpus / f"{i}.txt").write_text("\n\n".join(paragraphs[i * 10:(i + 1) * 10]))
  config = _local_config(demo_config, str(corpus / "*.txt"), vocab_size=1500,
                         tokenizer_sample_sentences=10**6)
  with pytest.raises(ValueError, match="training corpus is too small") as e:
    prepare.prepare(config, str(tmp_path / "data"))
  assert "tokenizer_sample_sentences" not in str(e.value)


def test_training_refuses_a_file_as_data_dir_before_touching_the_workdir(
    tmp_path, demo_config):
  from bertjax import train
  blocker = tmp_path / "afile"
  blocker.write_text("mine")
  config = demo_config.copy_and_resolve_references()
  config.data_dir = str(blocker)
  with pytest.raises(ValueError, match=r"--config\.data_dir=.*afile is a file"):
    train.train_and_evaluate(config, str(tmp_path / "work"))
  assert not (tmp_path / "work").exists() and blocker.read_text() == "mine"


def test_the_demo_builder_says_it_prepares_and_downloads_nothing(tmp_path, capfd, caplog):
  """TFDS prints 'Downloading and preparing dataset' around every build; for
  bertjax's offline builders that line would be untrue."""
  import logging
  from bertjax.data import builders
  builder = builders.BertjaxPythonDocs(data_dir=str(tmp_path),
                                       file_format=builders.FILE_FORMAT)
  with caplog.at_level(logging.INFO):
    builder.download_and_prepare()
  printed = capfd.readouterr().out
  assert builder.is_prepared()
  assert "ownloading" not in printed and "downloaded" not in printed
  assert "bertjax_python_docs" in caplog.text and "download nothing" in caplog.text


def test_symlinked_directories_a_named_directory_skips_are_named_once(tmp_path, caplog):
  # A directory in text_files is walked without following links: its
  # symlinked subdirectories were left out without a word. What is read stays
  # (prepared corpora keep their fingerprint); the warning names them and the fix.
  from bertjax.data import builders
  corpus, elsewhere = tmp_path / "corpus", tmp_path / "elsewhere"
  corpus.mkdir()
  elsewhere.mkdir()
  (corpus / "a.txt").write_text("Read. Text.")
  (elsewhere / "b.txt").write_text("Linked. Text.")
  os.symlink(elsewhere, corpus / "linked")
  with caplog.at_level(logging.WARNING):
    assert builders.resolve_text_files(str(corpus)) == [str(corpus / "a.txt")]
    builders.resolve_text_files(str(corpus))  # prepare resolves several times
  warned = [r.getMessage() for r in caplog.records if "symlinked" in r.getMessage()]
  assert len(warned) == 1, warned
  assert str(corpus / "linked") in warned[0]
  assert f"'{corpus}/**'" in warned[0] and "after a comma" in warned[0]
  # Either fix reads the linked files, and then nothing is said.
  caplog.clear()
  other = tmp_path / "other"
  other.mkdir()
  (other / "c.txt").write_text("More. Text.")
  os.symlink(elsewhere, other / "linked")
  with caplog.at_level(logging.WARNING):
    assert builders.resolve_text_files(f"{other}/**") == [
        str(other / "c.txt"), str(other / "linked" / "b.txt")]
    assert builders.resolve_text_files(f"{other},{other}/linked") == [
        str(other / "c.txt"), str(other / "linked" / "b.txt")]
  assert not [r for r in caplog.records if "symlinked" in r.getMessage()]


def test_an_hf_tokenizer_for_pretraining_from_scratch_is_refused_before_any_text(
    demo_config, tmp_path):
  # 'hf' is an import's tokenizer; bertjax trains none. A shipped config with
  # --config.tokenizer=hf prepared the whole text dataset, then asked for
  # --config.tokenizer_path, a field no shipped config has.
  config = demo_config.copy_and_resolve_references()
  config.tokenizer = "hf"
  with pytest.raises(ValueError, match=(
      r"^config\.tokenizer='hf' names an imported model's own tokenizer .* and bertjax "
      r"trains none; to pretrain from scratch pass --config\.tokenizer=unigram, bpe "
      r"or bpe_bytes")):
    prepare.prepare(config, str(tmp_path / "data"))
  assert not (tmp_path / "data").exists()


def test_pairs_are_packed_as_an_hf_tokenizer_joins_them_or_refused(demo_config, tmp_path,
                                                                  caplog):
  # A config naming an HF tokenizer directory (tokenizer_path) whose files
  # join a pair with two separators packed its sentence pairs with one unless
  # pair_separators was set, while encode and fine-tuning read two.
  import json
  tok = tmp_path / "tokenizer"
  tok.mkdir()
  (tok / "tokenizer.json").write_text(json.dumps({"post_processor": {
      "type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}}))
  config = demo_config.copy_and_resolve_references()
  assert config.layout == "sentence_pairs"
  config.tokenizer, config.tokenizer_path = "hf", str(tok)
  with pytest.raises(ValueError, match=(
      r"^The tokenizer in .*tokenizer joins a pair with 2 separators \(its files\) but "
      r"this config, which does not set pair_separators, packs sentence pairs with 1; "
      r"add pair_separators = 2 to the config file")):
    prepare.check_inputs(config)
  config.pair_separators = 2  # what an import records
  with caplog.at_level(logging.WARNING):
    prepare.check_inputs(config)
  assert "separator" not in caplog.text
  # An import from before imports recorded it keeps the one it trained with.
  del config["pair_separators"]
  config.hf_special_ids = [1, 3, 0, 2, 50264]
  with caplog.at_level(logging.WARNING):
    prepare.check_inputs(config)
  assert "packed with 1 separator(s) (config.pair_separators, unset: an import" in caplog.text
  # No pairs, nothing to agree on; bertjax's own tokenizers are not read.
  config.layout = "full_sentences"
  del config["hf_special_ids"]
  prepare.check_inputs(config)
