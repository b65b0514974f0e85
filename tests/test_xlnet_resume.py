"""XLNet: a killed run resumes to the identical result (the permutation
orders are keyed by example and step, so a resumed run draws the same ones).
Apart from tests/test_xlnet.py to keep each file short."""

import json
import os

import numpy as np

from bertjax import train
from test_xlnet import small  # noqa: F401  (the shared fixture)


def test_killed_run_resumes_to_identical_result(small, tmp_path):
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "resumed")
  ref = train.train_and_evaluate(small, ref_dir)
  assert np.isfinite(ref["mlm_accuracy"]) and ref["num_predictions"] > 0
  assert train.train_and_evaluate(small, workdir, stop_at_step=3) is None
  assert train.train_and_evaluate(small, workdir) == ref

  def losses(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
      return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}

  assert losses(workdir)[6] == losses(ref_dir)[6]
