"""prepare(): shard invariants, idempotence, local text files and every bad-input
error (public TFDS datasets: tests/test_prepare_public.py)."""

import hashlib
import logging
import os
import re
import time

import numpy as np
import pytest
import tensorflow_datasets as tfds

from bertjax import batch
import corpus_files
from bertjax.data import bad_text_files
from bertjax.data import builders
from bertjax.data import prepare
from bertjax.data import python_docs
from bertjax.data import text_sources
from bertjax.data import tokenized
from bertjax.data import tokenizer as tokenizer_lib
from bertjax.data import units

_FORBIDDEN_IDS = [batch.PAD_ID, batch.CLS_ID, batch.SEP_ID, batch.MASK_ID]


def _snapshot(root):
  """path -> (size, mtime_ns) of every file under root."""
  out = {}
  for dirpath, _, files in os.walk(root):
    for f in files:
      st = os.stat(os.path.join(dirpath, f))
      out[os.path.join(dirpath, f)] = (st.st_size, st.st_mtime_ns)
  return out


def _local_config(demo_config, text_files, **overrides):
  config = demo_config.copy_and_resolve_references()
  config.dataset = "bertjax_local_text"
  config.text_files = text_files
  config.vocab_size = 400
  for k, v in overrides.items():
    config[k] = v
  return config


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
  """The pydoc topics as one UTF-8 file each (~300 KB), blank lines between paragraphs."""
  root = tmp_path_factory.mktemp("texts")
  corpus_files.write_topic_files(root)
  return root


def test_shard_invariants(demo_data):
  tok = demo_data.tokenizer()
  assert set(demo_data.splits) == {"train", "validation"}
  total_tokens = unk = 0
  for split, n_docs in demo_data.splits.items():
    source = demo_data.source(split)
    assert len(source) == n_docs > 0
    n_tokens = 0
    for i in range(len(source)):
      doc = source[i]
      tokens, starts, lengths = doc["tokens"], doc["word_starts"], doc["sentence_lengths"]
      assert tokens.dtype == np.int32 and starts.dtype == np.bool_
      assert lengths.dtype == np.int32
      assert tokens.shape == starts.shape and tokens.size >= 2
      assert lengths.sum() == tokens.size and (lengths > 0).all()
      assert ((tokens >= 0) & (tokens < demo_data.vocab_size)).all()
      assert not np.isin(tokens, _FORBIDDEN_IDS).any()
      assert (starts == tok.word_starts(tokens)).all()
      # Every sentence starts a new word.
      assert starts[np.cumsum(lengths) - lengths].all()
      n_tokens += tokens.size
      unk += int((tokens == batch.UNK_ID).sum())
    assert demo_data.num_tokens[split] == n_tokens
    total_tokens += n_tokens
  assert unk <= 0.005 * total_tokens


def test_shards_record_the_tokenizer(demo_data):
  with open(demo_data.tokenizer_path, "rb") as f:
    want = hashlib.sha256(f.read()).hexdigest()
  metadata = tfds.builder_from_directory(demo_data.tokenized_dir).info.metadata
  assert metadata["tokenizer_fingerprint"] == want == demo_data.fingerprint
  assert metadata["vocab_size"] == demo_data.vocab_size == 8000
  assert metadata["source"] == "bertjax_python_docs"


def test_prepare_is_idempotent(demo_config, demo_data):
  before = _snapshot(demo_data.data_dir)
  start = time.time()
  again = prepare.prepare(demo_config, demo_data.data_dir)
  assert time.time() - start < 2.0
  assert again == demo_data
  assert _snapshot(demo_data.data_dir) == before


def test_the_tokenized_stage_reuses_the_shards_prepare_made(demo_config, demo_data):
  # Moved out of prepare.py (bertjax/data/tokenized.py); called alone, it
  # checks and reuses the demo's shards, writing nothing.
  before = _snapshot(demo_data.data_dir)
  engine = prepare.engine_of(demo_config)
  sources = text_sources.text_sources(demo_config, demo_data.data_dir, engine)
  again = tokenized.prepare_shards(demo_config, demo_data.data_dir, "bertjax_python_docs",
                                   demo_data.tokenizer(), sources, None, "", engine)
  assert again == demo_data and isinstance(again, prepare.PreparedData)
  assert _snapshot(demo_data.data_dir) == before


def test_resolve_data_dir(demo_config):
  config = demo_config.copy_and_resolve_references()
  config.data_dir = ""
  assert prepare.resolve_data_dir(config, "/w") == os.path.join("/w", "data")
  config.data_dir = "/elsewhere"
  assert prepare.resolve_data_dir(config, "/w") == "/elsewhere"


@pytest.mark.parametrize("field, value, match", [
    ("vocab_size", 500, "vocab size 8000 but config.vocab_size is 500"),
    ("tokenizer", "bpe", "unigram model but config.tokenizer is 'bpe'"),
    ("eval_split", "test", "no split 'test'.*--config.eval_split"),
    ("dataset", "no_such_dataset_xyz", "Unknown dataset 'no_such_dataset_xyz'"),
    # An empty slice was blamed on the file format (tfds build ... array_record).
    ("train_split", "train[:0%]", r"^Split 'train\[:0%\]' of .* selects no documents "
     r"\(the split has \d+\); widen the slice, e\.g\. --config\.train_split=train\.$"),
    ("eval_split", "validation[:1%]", r"^Split 'validation\[:1%\]' of .* selects no "
     r".*--config\.eval_split=validation\.$"),
])
def test_config_mismatch_errors_keep_everything(demo_config, demo_data, field, value, match):
  config = demo_config.copy_and_resolve_references()
  config[field] = value
  before = _snapshot(demo_data.data_dir)
  with pytest.raises(ValueError, match=match):
    prepare.prepare(config, demo_data.data_dir)
  assert _snapshot(demo_data.data_dir) == before


def test_local_text_skips_bad_files(demo_config, text_dir, tmp_path, caplog):
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "empty.txt").write_text("")
  (bad / "binary.txt").write_bytes(b"Some text\x00\x01\x02 more")
  (bad / "latin1.txt").write_bytes("Caf\xe9 au lait est tr\xe8s bon.".encode("latin-1"))
  (bad / "utf16.txt").write_bytes("Some text. More text.".encode("utf-16"))
  config = _local_config(demo_config, f"{text_dir}/*.txt,{bad}")
  data_dir = str(tmp_path / "data")
  with caplog.at_level(logging.WARNING):
    prepared = prepare.prepare(config, data_dir)
  warnings = "\n".join(r.getMessage() for r in caplog.records)
  for reason, name in [("empty", "empty.txt"), ("binary", "binary.txt"),
                       ("not UTF-8", "latin1.txt"), ("UTF-16, not UTF-8", "utf16.txt")]:
    assert f"Skipped 1 {reason}" in warnings and name in warnings
  n_files = len(list(text_dir.glob("*.txt")))
  assert sum(prepared.splits.values()) == n_files
  assert 1 <= prepared.splits["validation"] < 0.2 * n_files
  assert prepared.vocab_size == prepared.tokenizer().vocab_size == 400

  # Same inputs: reused. Other inputs in the same data_dir: refused, nothing lost.
  before = _snapshot(data_dir)
  assert prepare.prepare(config, data_dir) == prepared
  with pytest.raises(ValueError, match="was prepared from --config.text_files="):
    prepare.prepare(_local_config(demo_config, f"{text_dir}/a*.txt"), data_dir)
  assert _snapshot(data_dir) == before


def _one_line(seed, size):
  """~``size`` bytes of sentences on one line (no whitespace to cut at but spaces)."""
  rng = np.random.default_rng(seed)
  words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
  line = " ".join(" ".join(rng.choice(words, 7)).capitalize() + "."
                  for _ in range(size // 40))
  return line.encode()


def test_a_bad_byte_skips_its_file_whole_whatever_the_block_size(demo_config, tmp_path,
                                                                   caplog):
  """prepare_block_mb is a performance knob: a 100 KB one-line file with one
  bad byte near its end is left out whole (not just its last piece) at a
  block that reads it in one piece and at one that cuts it in four, with the
  same warning naming the offset of its first bad byte."""
  texts = tmp_path / "texts"
  texts.mkdir()
  for i in range(4):
    (texts / f"good{i}.txt").write_bytes(_one_line(i, 2000))
  latin = bytearray(_one_line(10, 100_000))
  latin[-50] = 0xE9  # a Latin-1 'é'
  (texts / "latin.txt").write_bytes(bytes(latin))
  # An invalid byte in the first piece, a NUL in the last: binary, as one piece says.
  binary = bytearray(_one_line(11, 100_000))
  binary[10], binary[-30] = 0xFF, 0
  (texts / "binary.txt").write_bytes(bytes(binary))
  config = _local_config(demo_config, str(texts / "*.txt"))
  outcome = {}
  for block in (1 << 20, 1 << 15):
    caplog.clear()
    data_dir = str(tmp_path / f"data{block}")
    with caplog.at_level(logging.WARNING):
      dataset_dir = text_sources._local_text(
          config, data_dir, text_sources.Engine(workers=1, block_bytes=block))
    ids = sorted(doc_id for split in ("train", "validation")
                 for _, (doc_id, _) in _documents(dataset_dir, data_dir, split))
    outcome[block] = ids, [r.getMessage() for r in caplog.records
                           if r.levelno == logging.WARNING]
  assert outcome[1 << 20] == outcome[1 << 15]
  ids, warnings = outcome[1 << 15]
  assert ids == [f"good{i}.txt" for i in range(4)]
  fix = ", then prepare into a new --config.data_dir to include them."
  assert warnings == [
      f"Skipped 1 binary (NUL bytes) text file(s) whole: {texts}/binary.txt (first bad "
      f"byte at offset {len(binary) - 30}); leave them out of --config.text_files, or "
      f"remove the NUL bytes if they are text" + fix,
      f"Skipped 1 not UTF-8 text file(s) whole: {texts}/latin.txt (first bad byte at "
      f"offset {len(latin) - 50}); re-encode them as UTF-8 (e.g. iconv -f latin1 -t "
      f"utf-8) or remove the bad bytes" + fix]


def test_a_bad_file_reruns_only_the_units_that_made_its_text_and_once():
  piece = lambda name, start: units.Piece(f"/t/{name}", name, start, start + 10, 30)
  task = lambda i, *pieces: units.TextTask(i, pieces, False, "/d", "n", "plan")
  tasks = [task(0, piece("a", 0), piece("a", 10)), task(1, piece("a", 20), piece("b", 0)),
           task(2, piece("c", 0))]
  stats = lambda bad=(), blank=(): {"stats": {"bad": dict(bad), "blank": list(blank),
                                              "excluded": []}}
  receipts = [stats(), stats(bad={"a": ["not UTF-8", 25]}), stats(blank=["c"])]
  tasks, todo = bad_text_files.exclude(tasks, receipts)
  assert [(t.index, t.excluded) for t in todo] == [(0, ("a",))]
  assert [t.excluded for t in tasks] == [("a",), (), ()]
  receipts[0]["stats"]["excluded"] = ["a"]  # what the rerun's receipt says
  assert bad_text_files.exclude(tasks, receipts)[1] == []  # a resumed prepare: nothing


def _documents(dataset_dir, data_dir, split):
  source = units.TextSource("own", dataset_dir, split, data_dir)
  return source.documents(0, len(source.open()))


def test_local_text_paragraph_documents(demo_config, text_dir, tmp_path):
  config = _local_config(demo_config, str(text_dir / "*.txt"),
                         dataset="bertjax_local_text/paragraphs")
  prepared = prepare.prepare(config, str(tmp_path))
  n_paragraphs = sum(len(paras) for _, paras in python_docs.topic_documents())
  # Paragraphs of fewer than 2 tokens are dropped; prose paragraphs have more.
  assert sum(prepared.splits.values()) == n_paragraphs
  # The 5% hold-out by hash: binomial std ~0.5 points at ~2000 documents.
  assert 0.03 <= prepared.splits["validation"] / n_paragraphs <= 0.07


def test_fingerprint_mismatch_is_refused(demo_config, text_dir, tmp_path):
  config = _local_config(demo_config, str(text_dir / "*.txt"))
  data_dir = str(tmp_path)
  prepared = prepare.prepare(config, data_dir)
  # Someone replaces the tokenizer with another one of the same size.
  other = [p for _, paras in python_docs.topic_documents() for p in paras][::2]
  tokenizer_lib.train(other, prepared.tokenizer_path, 400)
  before = _snapshot(data_dir)
  with pytest.raises(ValueError, match="were made by tokenizer"):
    prepare.prepare(config, data_dir)
  assert _snapshot(data_dir) == before


@pytest.mark.parametrize("files, match", [
    ({"a.txt": b"", "b.txt": b"  \n\n"}, r"None of the 2 files .*2 empty"),
    ({"a.bin": b"\x00\x01", "b.txt": b"\xff\xfe bad"},
     r"None of the 2 files .*binary.*a\.bin.*not UTF-8.*b\.txt"),
    ({"one.txt": b"Only one document here. It has two sentences."},
     "need at least 2"),
])
def test_unusable_local_text_is_an_error(demo_config, tmp_path, files, match):
  for name, data in files.items():
    (tmp_path / name).write_bytes(data)
  with pytest.raises(ValueError, match=match):
    prepare.prepare(_local_config(demo_config, ",".join(str(tmp_path / f) for f in files)),
                    str(tmp_path / "data"))
  assert sorted(os.listdir(tmp_path)) == sorted([*files, "data"])


def test_no_matching_files_is_an_error(demo_config, tmp_path):
  with pytest.raises(ValueError, match="matches no files"):
    prepare.prepare(_local_config(demo_config, str(tmp_path / "*.txt")), str(tmp_path))
  with pytest.raises(ValueError, match="--config.text_files"):
    prepare.prepare(_local_config(demo_config, ""), str(tmp_path))


def test_prepared_text_outlives_its_files_and_names_what_changed(
    demo_config, text_dir, tmp_path, caplog):
  """A workdir prepared from files that are gone since resumes and evaluates
  on its data; files that changed are refused naming the change, and a text
  directory holding the run's own outputs is refused before anything is read."""
  src = tmp_path / "src"
  src.mkdir()
  for path in sorted(text_dir.glob("*.txt"))[:6]:
    (src / path.name).write_bytes(path.read_bytes())
  config = _local_config(demo_config, f"{src}/*.txt")
  data_dir = str(tmp_path / "data")
  prepared = prepare.prepare(config, data_dir)
  before = _snapshot(data_dir)

  first = sorted(src.glob("*.txt"))[0]
  kept = first.read_bytes()
  first.write_bytes(kept + b" One more sentence.")
  with pytest.raises(ValueError, match=rf"have changed since .*1 resized \({first}\)"):
    prepare.prepare(config, data_dir)
  first.write_bytes(kept)
  (src / "zz_new.txt").write_text("A new file. It was not there before.")
  with pytest.raises(ValueError, match=r"1 added .*zz_new\.txt.*put them back"):
    prepare.prepare(config, data_dir)
  (src / "zz_new.txt").unlink()
  # Edited in place to the same size: the prepared text is used, with a warning.
  stat = first.stat()
  os.utime(first, (stat.st_atime, stat.st_mtime + 100))
  with caplog.at_level(logging.WARNING):
    assert prepare.prepare(config, data_dir) == prepared
  assert "1 of the text files were modified after" in caplog.text
  assert str(first) in caplog.text
  caplog.clear()
  assert _snapshot(data_dir) == before

  src.rename(tmp_path / "moved")
  prepare.check_inputs(config, data_dir)
  with caplog.at_level(logging.WARNING):
    assert prepare.prepare(config, data_dir) == prepared
  assert "matches no files now" in caplog.text
  assert _snapshot(data_dir) == before
  with pytest.raises(ValueError, match="matches no files"):  # nothing prepared there
    prepare.check_inputs(config, str(tmp_path / "other"))

  # A directory or glob that names the run's workdir or data_dir, made or not.
  moved = tmp_path / "moved"
  for text_files, workdir in [(moved, moved / "run"), (f"{moved}/*", moved / "run"),
                              (f"{moved}/**", moved / "a" / "run")]:
    with pytest.raises(ValueError, match=r"reads every file under .*run.*\*\.txt"):
      prepare.check_inputs(_local_config(demo_config, str(text_files)),
                           str(workdir / "data"), str(workdir))
  prepare.check_inputs(_local_config(demo_config, f"{moved}/*.txt"),
                       str(moved / "run" / "data"), str(moved / "run"))
  prepare.check_inputs(_local_config(demo_config, str(moved)), data_dir, str(tmp_path / "run"))


def test_split_keys_are_distinct_tfds_names():
  names = ["train", "validation", "train[:80%]", "train[80%:]", "train[:1shard]"]
  keys = [builders.split_key(n) for n in names]
  assert keys[:2] == ["train", "validation"]
  assert len(set(keys)) == len(keys)
  assert all(re.fullmatch(r"\w+", k) for k in keys)


def _mixed_corpus(root, text_dir):
  """The English pydoc topics plus one file of paragraphs mixing in Chinese and Arabic.

  Chinese comes from 300 Zipf-weighted characters plus two characters per
  paragraph drawn from 20,000, which the tokenizer cannot all hold.
  """
  rng = np.random.default_rng(0)
  common = np.arange(0x4E00, 0x4E00 + 300)
  weights = 1 / np.arange(1, 301)
  rare = np.arange(0x5000, 0x9FA5)
  arabic = np.arange(0x0627, 0x064B)
  paragraphs = []
  for i in range(200):
    han = [chr(c) for c in rng.choice(common, 20, p=weights / weights.sum())]
    han[10:10] = [chr(c) for c in rng.choice(rare, 2)]
    words = [''.join(chr(c) for c in rng.choice(arabic, rng.integers(3, 7)))
             for _ in range(6)]
    paragraphs.append(f"Mixed paragraph {i} follows. {''.join(han)}。 "
                      f"{' '.join(words)}. That is all.")
  (root / "mixed.txt").write_text("\n\n".join(paragraphs) + "\n")
  return f"{text_dir}/*.txt,{root}/mixed.txt"


def test_mixed_scripts_lose_no_text_and_unk_rate_is_reported(
    demo_config, text_dir, tmp_path, caplog):
  config = _local_config(demo_config, _mixed_corpus(tmp_path, text_dir),
                         dataset="bertjax_local_text/paragraphs", vocab_size=1000)
  with caplog.at_level(logging.INFO):
    prepared = prepare.prepare(config, str(tmp_path / "data"))
  source, tok = prepared.source("validation"), prepared.tokenizer()
  texts = [tok.decode(source[i]["tokens"]) for i in range(len(source))]
  # The hold-out holds Chinese (and rare characters the vocab lacks) and Arabic.
  han = "".join(t for t in texts if "。" in t)
  assert sum("\u0627" <= ch <= "\u064a" for ch in han) > 100
  assert sum(tok.piece_to_id(ch) == batch.UNK_ID for ch in han if ch >= "\u5000") >= 10
  unknown = sum(int((source[i]["tokens"] == batch.UNK_ID).sum())
                for i in range(len(source)))
  assert unknown == 0 and prepared.unk_rate == {"train": 0.0, "validation": 0.0}
  logged = [r.getMessage() for r in caplog.records]
  assert (f"split validation: 0.00% [UNK] of {prepared.num_tokens['validation']} "
          f"tokens") in logged
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING
              and "[UNK]" in r.getMessage()]


def test_tokenizer_without_byte_fallback_warns_of_unk(demo_config, text_dir, tmp_path,
                                                      caplog):
  """A tokenizer trained before byte fallback (English only) is reused, with a warning."""
  import sentencepiece as spm  # only to make a tokenizer the old way
  data_dir = tmp_path / "data"
  (data_dir / "tokenizers").mkdir(parents=True)
  spm.SentencePieceTrainer.train(
      sentence_iterator=(p for _, paras in python_docs.topic_documents() for p in paras),
      model_prefix=str(data_dir / "tokenizers" / "bertjax_local_text_paragraphs"),
      vocab_size=1000, pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]",
      bos_id=-1, eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
      num_threads=1, minloglevel=2)
  config = _local_config(demo_config, _mixed_corpus(tmp_path, text_dir),
                         dataset="bertjax_local_text/paragraphs", vocab_size=1000)
  with caplog.at_level(logging.WARNING):
    prepared = prepare.prepare(config, str(data_dir))
  assert prepared.unk_rate["validation"] > tokenized.UNK_WARN_RATE
  warned = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
  assert any(w.startswith("split validation is ") and "predates byte fallback" in w
             and "--config.data_dir" in w and "\n" not in w for w in warned)


def test_a_data_dir_being_prepared_is_refused_to_a_second_prepare(
    demo_config, demo_data, text_dir, tmp_path):
  """A second prepare of a data_dir another one is writing is refused, naming
  it; a run whose data is all prepared there only reads, and is not blocked."""
  from bertjax import workdir_lock
  config = _local_config(demo_config, f"{text_dir}/*.txt")
  data_dir = str(tmp_path / "data")
  with workdir_lock.DataDirLock(data_dir):
    before = _snapshot(data_dir)
    with pytest.raises(ValueError, match=(
        r"^Another bertjax prepare \(pid \d+ on host .*\) is writing the data_dir "
        r".*; wait for it to end and run this command again")):
      prepare.prepare(config, data_dir)
    assert _snapshot(data_dir) == before
  assert prepare.prepare(config, data_dir).splits  # free again
  with workdir_lock.DataDirLock(demo_data.data_dir):
    assert prepare.prepare(demo_config, demo_data.data_dir) == demo_data


def test_a_dangling_link_or_a_named_pipe_among_text_files_is_named(tmp_path):
  # A dangling link was refused as "permission denied"; a named pipe in a
  # directory of text files hung prepare's reader for ever.
  for kind in ("link", "pipe"):
    corpus = tmp_path / kind
    corpus.mkdir()
    (corpus / "a.txt").write_text("Some text. More text.")
    if kind == "link":
      os.symlink(tmp_path / "gone.txt", corpus / "b.txt")
      match = r"b\.txt, one of --config\.text_files, is a broken symbolic link \(to "
    else:
      os.mkfifo(corpus / "b.txt")
      match = r"b\.txt, one of --config\.text_files, is a named pipe, not a regular file"
    with pytest.raises(ValueError, match=match):
      builders.resolve_text_files(str(corpus))
    with pytest.raises(ValueError, match=match):
      builders.resolve_text_files(str(corpus / "*.txt"))
    (corpus / "b.txt").unlink()
    assert builders.resolve_text_files(str(corpus)) == [str(corpus / "a.txt")]


def test_a_file_named_twice_is_read_once(tmp_path, monkeypatch):
  # 'corpus,/abs/corpus' listed every file twice: each became two documents
  # with the same id.
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for name in ("a.txt", "b.txt"):
    (corpus / name).write_text("Some text. More text.")
  monkeypatch.chdir(tmp_path)
  found = builders.resolve_text_files(
      f"corpus,{corpus},{corpus}/./a.txt,corpus/b.txt")
  assert found == ["corpus/a.txt", "corpus/b.txt"]


@pytest.mark.parametrize("field, value, match", [
    ("tokenizer_sample_sentences", 0, r"^config\.tokenizer_sample_sentences=0 must be positive"),
    ("tokenizer_train_threads", 0, r"^config\.tokenizer_train_threads=0 must be between 1 and 1024"),
    # NaN passed "<= 0" and died as int(nan)'s "cannot convert float NaN to
    # integer", naming no field; inf as an OverflowError.
    ("prepare_block_mb", float("nan"), r"^config\.prepare_block_mb=nan must be positive"),
    ("prepare_block_mb", float("inf"), r"^config\.prepare_block_mb=inf must be positive"),
])
def test_tokenizer_settings_are_checked_before_any_text_is_read(demo_config, tmp_path,
                                                                field, value, match):
  # Found only when the tokenizer trained, after the text was prepared: 0
  # sentences as "the training corpus is empty", 0 threads as a traceback.
  config = demo_config.copy_and_resolve_references()
  config[field] = value
  with pytest.raises(ValueError, match=match):
    prepare.prepare(config, str(tmp_path / "data"))
  assert not (tmp_path / "data").exists()
