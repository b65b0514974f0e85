"""gs:// paths as users type them, against the local GCS endpoint of test_gcs."""

import test_gcs

gcs = test_gcs.gcs  # the module's bucket, as a fixture of this module too


def test_duplicate_slashes_in_a_gs_path_name_the_same_objects(gcs, tmp_path):
  """``gs://b//dir`` and ``gs://b/dir//x`` (strings joined by hand) name what
  ``gs://b/dir`` does for every operation: the same objects written, listed
  and stamped, and the same local mirror (gcsfs kept the empty segment, so a
  resumed run's listing and mirror missed what the first run had put there)."""
  from bertjax import paths
  single = f"gs://{gcs.bucket}/slashes/data"
  made = tmp_path / "made"
  for rel in ("a/dataset_info.json", "a/shard-00000", "tokenizers/t.model"):
    (made / rel).parent.mkdir(parents=True, exist_ok=True)
    (made / rel).write_text(rel)
  assert paths.push(made, f"gs://{gcs.bucket}//slashes//data/") == 3
  assert [n for n in gcs.object_names() if "slashes" in n] == [
      "slashes/data/a/dataset_info.json", "slashes/data/a/shard-00000",
      "slashes/data/tokenizers/t.model"]
  for spelling in (f"gs://{gcs.bucket}//slashes/data", f"gs://{gcs.bucket}/slashes//data/"):
    assert paths.absolute(spelling) == single
    assert paths.local_mirror(spelling) == paths.local_mirror(single)
    assert paths.push(made, spelling) == 0  # the listing finds every object
    assert paths.file_stamp(f"{spelling}//a/shard-00000") == paths.file_stamp(
        f"{single}/a/shard-00000")
  assert paths.pull(f"gs://{gcs.bucket}/slashes//data", tmp_path / "mirror") == 3
  assert (tmp_path / "mirror" / "a" / "shard-00000").read_text() == "a/shard-00000"
