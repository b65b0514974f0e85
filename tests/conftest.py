"""Test set-up: 8 fake CPU devices (before JAX is imported) and shared fixtures."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def demo_config():
  """The tiny BERT config, as `configs/bert.py:tiny` gives it."""
  from bertjax import config_files
  return config_files.shipped("bert").get_config("tiny")


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory, demo_config):
  """The demo corpus prepared once for the whole session (PreparedData)."""
  from bertjax.data import prepare
  data_dir = tmp_path_factory.mktemp("demo_data")
  return prepare.prepare(demo_config, str(data_dir))
