"""gs:// paths as users type them, and this machine's mirror of a gs://
data_dir (bertjax/mirror.py), against the local GCS endpoint of test_gcs."""

import os

import pytest

import test_gcs
from test_gcs import config_for

gcs = test_gcs.gcs  # the module's bucket, as a fixture of this module too


def test_duplicate_slashes_in_a_gs_path_name_the_same_objects(gcs, tmp_path):
  """``gs://b//dir`` and ``gs://b/dir//x`` (strings joined by hand) name what
  ``gs://b/dir`` does for every operation: the same objects written, listed
  and stamped, and the same local mirror (gcsfs kept the empty segment, so a
  resumed run's listing and mirror missed what the first run had put there)."""
  from bertjax import mirror
  from bertjax import paths
  single = f"gs://{gcs.bucket}/slashes/data"
  made = tmp_path / "made"
  for rel in ("a/dataset_info.json", "a/shard-00000", "tokenizers/t.model"):
    (made / rel).parent.mkdir(parents=True, exist_ok=True)
    (made / rel).write_text(rel)
  assert mirror.push(made, f"gs://{gcs.bucket}//slashes//data/") == 3
  assert [n for n in gcs.object_names() if "slashes" in n] == [
      "slashes/data/a/dataset_info.json", "slashes/data/a/shard-00000",
      "slashes/data/tokenizers/t.model"]
  for spelling in (f"gs://{gcs.bucket}//slashes/data", f"gs://{gcs.bucket}/slashes//data/"):
    assert paths.absolute(spelling) == single
    assert mirror.local_mirror(spelling) == mirror.local_mirror(single)
    assert mirror.push(made, spelling) == 0  # the listing finds every object
    assert paths.file_stamp(f"{spelling}//a/shard-00000") == paths.file_stamp(
        f"{single}/a/shard-00000")
  assert mirror.pull(f"gs://{gcs.bucket}/slashes//data", tmp_path / "mirror") == 3
  assert (tmp_path / "mirror" / "a" / "shard-00000").read_text() == "a/shard-00000"


def test_verify_names_what_an_interrupted_prepare_of_a_gs_data_dir_staged(
    gcs, demo_config, tmp_path):
  """``prepare --verify`` marks a missing item of a gs:// data_dir
  "(unfinished ...)" as it does a local one's: its staging lies in this
  machine's mirror (or, Beam's, in the bucket), where the hint never looked
  (it asked the local disk about the gs:// path itself)."""
  from bertjax import mirror
  from bertjax import paths
  from bertjax.data import prepare
  lines = {}
  for name, data_dir in (("local", str(tmp_path / "data")),
                         ("gs", f"gs://{gcs.bucket}/unfinished")):
    missing = prepare.unprepared(demo_config, data_dir)
    assert [w for w, _ in missing] == ["text dataset bertjax_python_docs",
                                       "tokenizer", "tokenized dataset"]
    assert not any(prepare.unfinished(data_dir, where) for _, where in missing)
    text, model, tokenized = [where for _, where in missing]
    if name == "gs":  # Beam's units in the bucket, the rest in the mirror
      paths.write_text(f"{text}/.staging/unit-00000.json", "{}")
      local = mirror.local_mirror(data_dir)
      model, tokenized = (os.path.join(local, p[len(data_dir) + 1:])
                          for p in (model, tokenized))
    else:
      os.makedirs(os.path.join(text, ".staging"))
    os.makedirs(f"{model}.sample")
    os.makedirs(os.path.join(tokenized, ".staging"))
    lines[name] = prepare.missing_lines(data_dir, missing)
  assert lines["gs"][-1].endswith(f"prepared in gs://{gcs.bucket}/unfinished")
  for local, remote in zip(lines["local"][:-1], lines["gs"][:-1], strict=True):
    assert local.split()[:2] == remote.split()[:2]
    assert local.endswith("(unfinished: its finished units wait in .staging)"), local
    assert remote.endswith("(unfinished: its finished units wait in .staging)"), remote


def test_a_same_size_overwrite_of_a_gs_text_file_changes_its_stamp(gcs):
  """The stamp that decides whether an interrupted prepare's staged text is
  reused comes from the object's metadata (its generation), not its size or
  its whole-second mtime, and reads no content."""
  from bertjax import paths
  text = f"gs://{gcs.bucket}/stamps/a.txt"
  paths.write_text(text, "The same size. One sentence.")
  before = paths.file_stamp(text)
  assert paths.file_stamp(text) == before
  paths.write_text(text, "The SAME size. One sentence.")
  assert paths.file_stamp(text) != before


def test_a_warm_mirror_of_a_gs_data_dir_is_not_fetched_again(gcs, tmp_path):
  """A resumed run's pull of an unchanged gs:// data_dir downloads nothing
  (its small records and markers used to be fetched on every start, by every
  process), and process 0's push uploads nothing; a small file rewritten to
  the same size in the bucket is still fetched, alone."""
  from bertjax import mirror
  from bertjax import paths
  remote = f"gs://{gcs.bucket}/warm"
  made = tmp_path / "made"
  for rel, text in (("a/dataset_info.json", '{"n": 1}'), ("a/metadata.json", "{}"),
                    ("a/shard-00000", "x" * 70_000), ("tokenizers/t.model", "model")):
    (made / rel).parent.mkdir(parents=True, exist_ok=True)
    (made / rel).write_text(text)
  assert mirror.push(made, remote) == 4
  local = str(tmp_path / "mirror")
  gcs.requests.clear()
  assert mirror.pull(remote, local) == 4
  assert len(gcs.downloads()) == 4

  gcs.requests.clear()
  assert mirror.pull(remote, local) == 0
  assert mirror.push(local, remote) == 0
  assert gcs.downloads() == []
  assert [m for m, _ in gcs.requests if m != "GET"] == []  # no upload

  paths.write_text(f"{remote}/a/dataset_info.json", '{"n": 2}')
  gcs.requests.clear()
  assert mirror.pull(remote, local) == 1
  assert gcs.downloads() == ["warm/a/dataset_info.json"]
  assert (tmp_path / "mirror" / "a" / "dataset_info.json").read_text() == '{"n": 2}'


def test_a_second_prepare_of_a_gs_data_dir_on_one_machine_is_refused(
    gcs, demo_config):
  """Both would write this machine's mirror of the bucket at once (the
  second failed midway with TFDS's FileExistsError): refused as a second
  prepare of a local data_dir is, naming the bucket; nothing is written."""
  from bertjax import mirror
  from bertjax import workdir_lock
  from bertjax.data import prepare
  data_dir = f"gs://{gcs.bucket}/busy"
  first = workdir_lock.DataDirLock(mirror.local_mirror(data_dir)).acquire()
  try:
    with pytest.raises(workdir_lock.WorkdirBusy,
                       match=rf"^Another bertjax prepare \(pid {os.getpid()} .*\) is "
                       rf"writing the data_dir {data_dir} through this machine's mirror"):
      prepare.prepare(config_for(demo_config, data_dir), data_dir)
  finally:
    first.release()
  assert not [n for n in gcs.object_names() if n.startswith("busy/")]
  assert os.listdir(mirror.local_mirror(data_dir)) == [workdir_lock.DATA_LOCK_FILE]


def test_a_mirror_copy_cut_short_leaves_nothing_that_travels(gcs, tmp_path, monkeypatch):
  """A pull that fails midway (a full disk) removes its partial file, and a
  temporary file a killed process left in the mirror is never uploaded to
  the bucket (other hosts would pull it), nor one in the bucket pulled."""
  import errno
  from etils import epath
  from bertjax import mirror
  from bertjax import paths
  remote = f"gs://{gcs.bucket}/leftovers"
  made = tmp_path / "made"
  made.mkdir()
  (made / "features.json").write_text("{}")
  (made / ".features.json.tmp-123-456").write_text("{")
  (made / "unit-00000.train.array_record.tmp-99").write_text("partial")
  assert mirror.push(made, remote) == 1
  assert [n for n in gcs.object_names() if n.startswith("leftovers/")] == [
      "leftovers/features.json"]
  paths.write_text(f"{remote}/.dataset_info.json.tmp-7-8", "{")

  def full(self, dst, overwrite=False):
    open(dst, "w").write("par")
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(type(epath.Path(remote)), "copy", full)
  local = tmp_path / "mirror"
  with pytest.raises(OSError):
    mirror.pull(remote, local)
  assert [p.name for p in local.rglob("*") if p.is_file()] == []
  monkeypatch.undo()
  assert mirror.pull(remote, local) == 1
  assert sorted(p.name for p in local.iterdir()) == ["features.json"]
