"""A fine-tuning run after its last step: started again with other settings,
it keeps its own record."""

import json

from bertjax.finetune import loop

import test_finetune_inputs
from test_finetune_inputs import _TINY, _finetune_config

inits = test_finetune_inputs.inits  # the module-scoped fixture: a 1-step encoder


def _files(workdir, names):
  return {n: (workdir / n).read_bytes() for n in names}


def test_a_finished_run_started_with_other_settings_keeps_its_own_record(inits, tmp_path):
  workdir = tmp_path / "ft"
  cfg = lambda **kw: _finetune_config("coherence", **{**_TINY, **kw})
  loop.run(cfg(), inits(2), str(workdir))
  own = _files(workdir, ("eval_2.json", "predictions_validation.jsonl", "metrics.jsonl"))
  assert json.loads(own["eval_2.json"])["num_examples"] == 16
  # A safe change, accepted on a finished run: its evaluation goes beside.
  again = loop.run(cfg(max_eval_examples=8), inits(2), str(workdir))
  assert _files(workdir, own) == own
  beside = json.loads((workdir / "eval_2-2.json").read_text())
  assert beside == {k: v for k, v in again.items() if k not in ("skipped_steps", "best")}
  assert beside["num_examples"] == 8
  assert beside["config_changes"] == {"max_eval_examples": [16, 8]}
  assert len((workdir / "predictions_validation-2.jsonl").read_text().splitlines()) == 8
  # The same settings again: the run's own files, rewritten as they were.
  loop.run(cfg(), inits(2), str(workdir))
  assert _files(workdir, own) == own
  assert not (workdir / "eval_2-3.json").exists()
