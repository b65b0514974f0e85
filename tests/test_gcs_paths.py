"""gs:// paths as users type them, against the local GCS endpoint of test_gcs."""

import test_gcs

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
  import os
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
