"""A fine-tuning run after its last step: started again with other settings,
it keeps its own record; stopped by SIGTERM while it evaluates or predicts,
it says so and exits 75, and a rerun writes what is missing."""

import json

import pytest

from bertjax import guards
from bertjax.finetune import loop

import test_finetune_inputs
from test_finetune_inputs import _TINY, _finetune_config

inits = test_finetune_inputs.inits  # the module-scoped fixture: a 1-step encoder


def _files(workdir, names):
  return {n: (workdir / n).read_bytes() for n in names}


def _inode(path):
  return path.stat().st_ino  # predict.write replaces a file: a rewrite changes it


def test_a_finished_run_started_with_other_settings_keeps_its_own_record(inits, tmp_path):
  (tmp_path / "new.csv").write_text("sentence\na cat sat on the mat\n")
  workdir = tmp_path / "ft"
  cfg = lambda **kw: _finetune_config(
      "coherence", predict_files=str(tmp_path / "new.csv"), **{**_TINY, **kw})
  loop.run(cfg(), inits(2), str(workdir))
  own = _files(workdir, ("eval_2.json", "predictions_validation.jsonl", "metrics.jsonl",
                         "predict_new.jsonl"))
  assert json.loads(own["eval_2.json"])["num_examples"] == 16
  own_predict = _inode(workdir / "predict_new.jsonl")
  # A safe change, accepted on a finished run: its evaluation goes beside,
  # and so do its predictions of the predict files.
  again = loop.run(cfg(max_eval_examples=8), inits(2), str(workdir))
  assert _files(workdir, own) == own
  assert _inode(workdir / "predict_new.jsonl") == own_predict
  beside = json.loads((workdir / "eval_2-2.json").read_text())
  assert beside == {k: v for k, v in again.items() if k not in ("skipped_steps", "best", "predicted")}
  assert beside["num_examples"] == 8
  assert beside["config_changes"] == {"max_eval_examples": [16, 8]}
  assert len((workdir / "predictions_validation-2.jsonl").read_text().splitlines()) == 8
  assert again["predicted"] == {"new": 1}
  assert (workdir / "predict_new-2.jsonl").read_bytes() == own["predict_new.jsonl"]
  # The same settings again: the run's own files, rewritten as they were.
  loop.run(cfg(), inits(2), str(workdir))
  assert _files(workdir, own) == own
  assert _inode(workdir / "predict_new.jsonl") != own_predict  # rewritten in place
  assert not (workdir / "eval_2-3.json").exists()
  assert not (workdir / "predict_new-3.jsonl").exists()


def _sigterm_at_call(monkeypatch, n):
  """loop.predict, with SIGTERM's flag raised (as its handler does) at the
  n-th call: the last step's evaluation is the first, a predict file next."""
  real, calls = loop.predict, []

  def hooked(*args, **kwargs):
    calls.append(1)
    if len(calls) == n:
      guards._SIGTERM.set()
    return real(*args, **kwargs)

  monkeypatch.setattr(loop, "predict", hooked)


def test_sigterm_while_finishing_exits_75_and_a_rerun_writes_what_is_missing(
    inits, tmp_path, monkeypatch):
  (tmp_path / "new.csv").write_text("sentence\na cat sat on the mat\n")
  cfg = lambda: _finetune_config("coherence", predict_files=str(tmp_path / "new.csv"),
                                 **_TINY)
  workdir = tmp_path / "ft"
  for n, says in ((1, "Preempted during the final evaluation; the checkpoint of step 2 "
                      "is saved, run the same command again to evaluate it."),
                  (2, "Preempted while predicting the predict files; the checkpoint of "
                      "step 2 is saved, run the same command again to predict them.")):
    _sigterm_at_call(monkeypatch, n)
    try:
      with pytest.raises(guards.Preempted) as e:
        loop.run(cfg(), inits(2), str(workdir))
    finally:
      guards._SIGTERM.clear()  # the flag a run that failed to stop leaves set
    assert str(e.value) == says and e.value.exit_status == guards.EXIT_PREEMPTED == 75
    assert (workdir / "eval_2.json").exists() == (n == 2)
    assert not (workdir / "predict_new.jsonl").exists()
  monkeypatch.undo()
  record = loop.run(cfg(), inits(2), str(workdir))
  assert record["predicted"] == {"new": 1} and (workdir / "predict_new.jsonl").exists()
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "eval_accuracy" in r] == [2]


def test_sigterm_during_an_epochs_evaluation_stops_there_and_the_rerun_evaluates_it(
    inits, tmp_path, monkeypatch):
  # Two epochs of 2 steps: the first epoch's evaluation (at step 2) used to
  # run to its end after a SIGTERM, however long the eval split.
  cfg = lambda: _finetune_config("coherence", **{**_TINY, "num_epochs": 2.0})
  workdir = tmp_path / "ft"
  _sigterm_at_call(monkeypatch, 1)
  try:
    with pytest.raises(guards.Preempted) as e:
      loop.run(cfg(), inits(2), str(workdir))
  finally:
    guards._SIGTERM.clear()
  assert str(e.value) == ("Preempted while evaluating the epoch that ended at step 2; "
                          "its checkpoint is saved, run the same command again to "
                          "evaluate it and go on.")
  assert e.value.exit_status == 75
  assert not list(workdir.glob("eval_*.json"))  # nothing of the abandoned evaluation
  assert (workdir / "checkpoints" / "2").is_dir()
  monkeypatch.undo()
  record = loop.run(cfg(), inits(2), str(workdir))
  assert record["step"] == 4 and sorted(p.name for p in workdir.glob("eval_*.json")) == [
      "eval_2.json", "eval_4.json"]
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "eval_accuracy" in r] == [2, 4]
  assert [r["step"] for r in rows if "task_loss" in r] == [1, 2, 3, 4]  # none redone
