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


def test_json_lines_resumed_at_a_step_drops_the_rows_after_it(tmp_path):
  import json
  rows = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.5},
          {"event": "started"}, {"step": 3, "loss": 2.0}, {"step": 4}]
  target = tmp_path / "metrics.jsonl"
  target.write_text("".join(json.dumps(r) + "\n" for r in rows)
                    + '{"step": 5, "lo')  # a row cut short by a kill
  writer = paths.JsonLines(str(target), drop_after_step=2)
  writer.write({"step": 3, "loss": 1.9})
  writer.close()
  lines = target.read_text().splitlines()
  assert [json.loads(l) for l in lines[:3]] == rows[:3]
  # The cut-short row stays, on its own line, and the new one follows.
  assert lines[3:] == ['{"step": 5, "lo', '{"step": 3, "loss": 1.9}']
  # Without a resume step nothing is dropped.
  paths.JsonLines(str(target)).close()
  assert target.read_text().splitlines() == lines
