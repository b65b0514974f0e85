"""The path layer's own checks."""

import os

import pytest

from bertjax import paths


def test_require_directory_names_the_file_in_the_way(tmp_path):
  blocker = tmp_path / "afile"
  blocker.write_text("keep me")
  with pytest.raises(ValueError, match=r"--workdir=.*afile is a file"):
    paths.require_directory(str(blocker), "--workdir")
  with pytest.raises(ValueError, match=r"lies under the file .*afile"):
    paths.require_directory(str(blocker / "sub" / "deeper"), "--data_dir")
  assert blocker.read_text() == "keep me"


def test_require_directory_accepts_new_existing_and_remote_paths(tmp_path):
  paths.require_directory(str(tmp_path), "--workdir")
  paths.require_directory(str(tmp_path / "not" / "yet"), "--workdir")
  paths.require_directory("gs://bucket/run", "--workdir")
  assert not os.path.exists(tmp_path / "not")
