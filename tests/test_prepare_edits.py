"""Text files edited between an interrupted prepare and its rerun, and a
damaged dataset of bertjax's own: what the rerun makes, and what it says."""

import hashlib
import json
import logging
import os

import pytest

import corpus_files
from bertjax.data import shards
from bertjax.data import text_sources
from bertjax.data import units

_ENGINE = text_sources.Engine(workers=1, block_bytes=30_000)  # ~10 units


def _config(demo_config, text_files):
  config = demo_config.copy_and_resolve_references()
  config.dataset = "bertjax_local_text"
  config.text_files = text_files
  return config


def _shards(dataset_dir):
  """name -> sha256 of every published shard of a text dataset."""
  out = {}
  for name in sorted(os.listdir(dataset_dir)):
    if ".array_record-" in name:
      with open(os.path.join(dataset_dir, name), "rb") as f:
        out[name] = hashlib.sha256(f.read()).hexdigest()
  return out


class _Stop(Exception):
  """Stands for the SIGTERM that stops prepare between two units."""


def _prepare_stopped_after_three_units(demo_config, tmp_path, monkeypatch):
  """Topic files under tmp_path/src, and a text prepare of them into
  tmp_path/data stopped after its first three units; returns (src, config,
  data_dir) with units.run_text restored."""
  src = tmp_path / "src"
  src.mkdir()
  corpus_files.write_topic_files(src)
  config = _config(demo_config, f"{src}/*.txt")
  data_dir = str(tmp_path / "data")
  run_text, done = units.run_text, []

  def stopped_after_three(task):
    if len(done) == 3:
      raise _Stop
    done.append(task.index)
    return run_text(task)

  monkeypatch.setattr(units, "run_text", stopped_after_three)
  with pytest.raises(_Stop):
    text_sources.text_sources(config, data_dir, _ENGINE)
  monkeypatch.setattr(units, "run_text", run_text)
  assert done == [0, 1, 2]
  return src, config, data_dir


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_a_same_size_edit_after_an_interrupted_prepare_is_read_from_the_start(
    demo_config, tmp_path, monkeypatch, caplog, keep_mtime):
  """The units staged before the stop were read from the old text: the rerun
  reuses none of them and names the file, so that the dataset is the one a
  clean prepare of the edited files makes (also when the edit put the file's
  mtime back, as rsync -t or cp -p do)."""
  src, config, data_dir = _prepare_stopped_after_three_units(
      demo_config, tmp_path, monkeypatch)
  dataset_dir = text_sources.local_text_dir(data_dir, config.dataset)

  # The first file is in unit 0, staged before the stop.
  first = sorted(src.glob("*.txt"))[0]
  old, stat = first.read_bytes(), first.stat()
  new = old.replace(b"the ", b"THE ", 1)
  assert new != old and len(new) == len(old)
  first.write_bytes(new)
  if keep_mtime:
    os.utime(first, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  assert "1 of the text files changed since an interrupted prepare" in caplog.text
  assert str(first) in caplog.text
  resumed = _shards(dataset_dir)

  clean_dir = str(tmp_path / "clean")
  text_sources.text_sources(config, clean_dir, _ENGINE)
  assert resumed == _shards(text_sources.local_text_dir(clean_dir, config.dataset))


def test_an_unchanged_rerun_reuses_the_units_staged_before_the_stop(
    demo_config, tmp_path, monkeypatch, caplog):
  """The stamps cost no work when nothing changed: the staged units are kept."""
  _, config, data_dir = _prepare_stopped_after_three_units(
      demo_config, tmp_path, monkeypatch)
  run_text, ran = units.run_text, []
  monkeypatch.setattr(units, "run_text", lambda task: ran.append(task.index) or run_text(task))
  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  assert ran and not {0, 1, 2} & set(ran)
  assert "changed since an interrupted prepare" not in caplog.text


def _garbled(dataset_dir):
  with open(os.path.join(dataset_dir, "dataset_info.json"), "w") as f:
    f.write('{"name": "bertjax_local_text", "splits": [')  # cut short


def _bad_template(dataset_dir):
  # Still JSON, but its shards cannot be named: it fails only when a split is opened.
  path = os.path.join(dataset_dir, "dataset_info.json")
  with open(path) as f:
    info = json.load(f)
  for split in info["splits"]:
    split["filepathTemplate"] = "{UNKNOWN}"
  with open(path, "w") as f:
    json.dump(info, f)


def _prepared_topics(demo_config, tmp_path):
  """(source folder, config, data_dir) of the topic files' text dataset,
  prepared to the end."""
  src = tmp_path / "src"
  src.mkdir()
  corpus_files.write_topic_files(src)
  config = _config(demo_config, f"{src}/*.txt")
  data_dir = str(tmp_path / "data")
  text_sources.text_sources(config, data_dir, _ENGINE)
  return src, config, data_dir


@pytest.mark.parametrize("damage", [_garbled, _bad_template])
def test_a_damaged_text_dataset_names_repair_which_makes_it_again(
    demo_config, tmp_path, damage):
  """bertjax's own dataset is made again by prepare --repair, never by
  `tfds build` (which the message used to name, and which cannot make it)."""
  src, config, data_dir = _prepared_topics(demo_config, tmp_path)
  dataset_dir = text_sources.local_text_dir(data_dir, config.dataset)
  before = _shards(dataset_dir)

  damage(dataset_dir)
  with pytest.raises(ValueError) as refused:
    text_sources.text_sources(config, data_dir, _ENGINE)
  message = str(refused.value)
  assert message.startswith(f"The prepared dataset {dataset_dir} cannot be read (")
  assert "`python -m bertjax.prepare --repair` and the same --config and --workdir" in message
  assert "tfds build" not in message and "\n" not in message

  # What --repair does (bertjax/prepare.py): the check finds it, it is
  # removed, and prepare makes the same shards again.
  reports = shards.verify(data_dir)
  assert {r.shard.dataset_dir for r in reports if r.problem} == {dataset_dir}
  text_sources.check_rebuildable(dataset_dir)
  assert shards.remove_damaged(reports) == [dataset_dir]
  text_sources.text_sources(config, data_dir, _ENGINE)
  assert _shards(dataset_dir) == before


def test_a_damaged_demo_dataset_names_repair_which_makes_it_again(demo_config, tmp_path):
  data_dir = str(tmp_path / "data")
  text_sources.text_sources(demo_config, data_dir, _ENGINE)
  (dataset_dir,) = shards.own_dataset_dirs(data_dir)
  before = _shards(dataset_dir)
  _garbled(dataset_dir)
  with pytest.raises(ValueError, match=r"^The prepared dataset .*bertjax_python_docs "
                     r"cannot be read \(.*\); re-prepare it with `python -m "
                     r"bertjax.prepare --repair`"):
    text_sources.text_sources(demo_config, data_dir, _ENGINE)
  reports = shards.verify(data_dir)
  assert [r.shard.split for r in reports if r.problem] == ["(record)"]
  assert shards.remove_damaged(reports) == [dataset_dir]
  text_sources.text_sources(demo_config, data_dir, _ENGINE)
  assert _shards(dataset_dir) == before


def _same_size_edit_keeping_mtime(path):
  """Edits ``path`` in place to the same size and puts its mtime back to the
  nanosecond, as `touch -r`, rsync -t or an edit in the same second do."""
  old, stat = path.read_bytes(), path.stat()
  new = old.replace(b"the ", b"THE ", 1)
  assert new != old and len(new) == len(old)
  path.write_bytes(new)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert path.stat().st_mtime_ns == stat.st_mtime_ns


@pytest.mark.parametrize("ctime_margin", ["default", "zero"])
def test_a_same_size_edit_keeping_the_mtime_of_a_prepared_text_is_warned(
    demo_config, tmp_path, monkeypatch, caplog, ctime_margin):
  """A finished text dataset reused after an edit that kept size and mtime:
  the warning that names edited files comes, as for any same-size edit.
  'zero' makes every recorded ctime usable, as it is for files older than
  the prepare by two seconds; 'default' files were written just now."""
  from bertjax import paths
  if ctime_margin == "zero":
    monkeypatch.setattr(paths, "_CTIME_MARGIN_NS", 0)
  src, config, data_dir = _prepared_topics(demo_config, tmp_path)
  dataset_dir = text_sources.local_text_dir(data_dir, config.dataset)
  before = _shards(dataset_dir)

  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  assert "were modified after" not in caplog.text
  first = sorted(src.glob("*.txt"))[0]
  _same_size_edit_keeping_mtime(first)
  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  assert "1 of the text files were modified after" in caplog.text
  assert str(first) in caplog.text
  assert _shards(dataset_dir) == before


def test_an_unchanged_prepared_text_is_checked_without_reading_old_files(
    demo_config, tmp_path, monkeypatch, caplog):
  """Files whose ctime predates the prepare are not read again on reuse
  while their size, mtime and ctime are unchanged (one stat each)."""
  from bertjax import paths
  monkeypatch.setattr(paths, "_CTIME_MARGIN_NS", 0)
  src, config, data_dir = _prepared_topics(demo_config, tmp_path)
  stamp, stamped = paths.file_stamp, []
  monkeypatch.setattr(paths, "file_stamp", lambda p: stamped.append(p) or stamp(p))
  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  assert stamped == [] and "were modified after" not in caplog.text


def test_a_text_dataset_prepared_before_stamps_keeps_the_mtime_check(
    demo_config, tmp_path, caplog):
  """A dataset whose record lists (path, size, mtime) only, as bertjax made
  before content stamps: reused with no warning while unchanged, warned of
  a later mtime as before (an edit that keeps the mtime goes unseen)."""
  src, config, data_dir = _prepared_topics(demo_config, tmp_path)
  dataset_dir = text_sources.local_text_dir(data_dir, config.dataset)
  record = os.path.join(dataset_dir, "metadata.json")
  with open(record) as f:
    metadata = json.load(f)
  assert all(len(f) == 5 for f in metadata["files"])
  metadata["files"] = [f[:3] for f in metadata["files"]]
  with open(record, "w") as f:
    json.dump(metadata, f)

  first = sorted(src.glob("*.txt"))[0]
  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  _same_size_edit_keeping_mtime(first)
  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  assert "were modified after" not in caplog.text
  stat = first.stat()
  os.utime(first, (stat.st_atime, stat.st_mtime + 100))
  with caplog.at_level(logging.WARNING):
    text_sources.text_sources(config, data_dir, _ENGINE)
  assert "1 of the text files were modified after" in caplog.text
