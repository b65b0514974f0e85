"""Unknown ``--config.FIELD`` always gets one line (issue 18.4): the closest
field when there is one, else the fields of that section."""

import os
import subprocess
import sys

import ml_collections

from bertjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_unknown_field_without_a_close_name_lists_the_fields(tmp_path):
  workdir = tmp_path / "never"
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=configs/bert.py:tiny",
       "--config.not_a_field=1", f"--workdir={workdir}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines[-1].startswith(
      "error: Unknown config field 'not_a_field'; the fields of config are: "
      "adam_b1, adam_b2, adam_eps, ")
  assert "seq_len" in lines[-1] and "Traceback" not in proc.stderr
  assert not workdir.exists()


def test_nested_sections_and_values():
  config = ml_collections.ConfigDict(
      {"seq_len": 128, "model": {"hidden_size": 64, "num_heads": 2}})
  assert cli.unknown_field(config, "model.hiden_size") == (
      "Unknown config field 'model.hiden_size'; did you mean "
      "--config.model.hidden_size? Run with --helpfull to list the flags.")
  assert cli.unknown_field(config, "model.zzz") == (
      "Unknown config field 'model.zzz'; the fields of config.model are: "
      "hidden_size, num_heads.")
  assert "config.seq_len is a value, not a section" in cli.unknown_field(
      config, "seq_len.x")
  assert cli.unknown_field(config, "model.num_heads") is None


def test_unknown_field_with_a_shipped_config_from_another_directory(tmp_path):
  # "bert:tiny" names the shipped config; from a directory without configs/
  # the override check must load the same file the binary does.
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.main", "--config=bert:tiny",
       "--config.zzz_field=8", f"--workdir={tmp_path / 'never'}"],
      cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
  assert last.startswith("error: Unknown config field 'zzz_field'; the fields "
                         "of config are: adam_b1, ")
  assert not (tmp_path / "never").exists()
