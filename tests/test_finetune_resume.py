"""What a fine-tuning workdir run again is told: a resume with a changed
config names only flags the user sets (with their saved values) and, for
values the run derives, what derived them; a finished workdir predicts from
an init that has trained further. The check functions only: no model."""

import json
import re

import numpy as np
import pytest

from bertjax import compat
from bertjax import config_files
from bertjax.finetune import checks
from bertjax.finetune import encoder_init
from bertjax.finetune import loop
from bertjax.finetune import tasks as tasks_lib

WHERE = "The checkpoint at step 24 in /ft/checkpoints"


def _run_config(rows=384, labels=("bad", "ok"), kind="classification", **flags):
  c = config_files.shipped("finetune").get_config("local")
  for k, v in {"num_epochs": 2.0, **flags}.items():
    setattr(c, k, v)
  return loop.run_config(c, tasks_lib.Task(kind, [{}] * rows, [], labels), rows)


@pytest.mark.parametrize("flags, rows, task, says", [
    ({"num_epochs": 3.0}, 384, {}, "with num_epochs=2.0 but this run says num_epochs=3.0"),
    ({}, 480, {}, "the training data gives 480 rows now (15 steps of 32 per epoch), "
                  "where it gave 12 steps per epoch"),
    ({"train_files": "b.csv"}, 480, {}, "train_files='' but this run says"),
    ({}, 384, {"labels": ("a", "bad", "ok")}, "labels are a, bad, ok now, where they were bad, ok"),
    # As many labels, other names: every row of the head would mean another class.
    ({}, 384, {"labels": ("bad", "good")}, "labels are bad, good now, where they were bad, ok"),
    ({}, 384, {"kind": "tagging", "labels": ("O", "B-X")}, "make a tagging task now"),
    ({"task_kind": "regression"}, 384, {"kind": "regression"},
     "keep --config.task_kind=classification to resume"),
])
def test_a_refused_resume_names_only_what_the_user_can_do(flags, rows, task, says):
  saved = compat.as_json(_run_config())
  with pytest.raises(ValueError) as e:
    checks.check_resume(saved, _run_config(rows, **task, **flags), WHERE, rows)
  message = str(e.value)
  assert says in message, message
  assert message.endswith("or pass a new --workdir to fine-tune with the change."), message
  # Every flag it asks for is a field of configs/finetune.py, at its saved value.
  fields = config_files.shipped("finetune").get_config("local")
  for field, value in re.findall(r"--config\.(\w+)=(\S*)", message):
    assert field in fields and field not in checks.DERIVED, message
    assert value == str(saved[field]) or value == "''", message
  assert "allow_changes" not in message
  # A safe change (new files to predict) resumes.
  checks.check_resume(saved, _run_config(predict_files="test.csv"), WHERE, 384)


def test_a_finished_workdir_predicts_from_an_init_that_trained_further(tmp_path, monkeypatch):
  init, workdir = str(tmp_path / "init"), tmp_path / "ft"
  fields = {"model": "bert", "hidden_size": 4, "num_train_steps": 60}
  weights = lambda v: {"w": np.full((4, 4), v, np.float32)}
  encoder_init.write(str(workdir), encoder_init.identify(init, fields, weights(0), 60))
  data = workdir / "checkpoints" / "2" / "data"
  data.mkdir(parents=True)
  (data / "metadata").write_text(json.dumps({"tokenizer_fingerprint": "tok-a"}))
  newest = {"step": 2}  # of the fine-tuning, whose last step is 2
  monkeypatch.setattr(encoder_init.checkpointing, "newest_saved_config",
                      lambda w: (newest["step"], {"num_train_steps": 2}, "ckpt"))
  # The init pretrained on to step 70: the finished workdir predicts ...
  moved = encoder_init.identify(init, {**fields, "num_train_steps": 70}, weights(1), 70)
  encoder_init.check(str(workdir), moved, "tok-a")
  # ... unless the init's architecture or tokenizer is no longer the same.
  wider = encoder_init.identify(init, {**fields, "hidden_size": 8}, weights(1), 70)
  with pytest.raises(ValueError, match=r"has another architecture now.*pass a new --workdir"):
    encoder_init.check(str(workdir), wider, "tok-a")
  with pytest.raises(ValueError, match=r"fine-tuned with tokenizer tok-a but its --init="
                                       r".* has tokenizer tok-b now"):
    encoder_init.check(str(workdir), moved, "tok-b")
  # Another init is refused, with the way back to this one's predictions.
  other = encoder_init.identify(str(tmp_path / "other"), fields, weights(1), 60)
  with pytest.raises(ValueError, match=r"pass a new --workdir .* or leave --init out"):
    encoder_init.check(str(workdir), other, "tok-a")
  # Unfinished: refused, saying what moved and giving a fix that works.
  newest["step"] = 1
  with pytest.raises(ValueError) as e:
    encoder_init.check(str(workdir), moved, "tok-a")
  assert (f"{init}'s newest checkpoint is now step 70, not 60" in str(e.value)
          and str(e.value).endswith("pass a new --workdir to fine-tune from step 70 "
                                    "(--init reads a bertjax workdir's newest checkpoint).")
          and f"pass --init={init}" not in str(e.value)), e.value


def test_a_workdir_of_the_other_program_is_named_as_such_before_any_work(tmp_path, monkeypatch):
  from bertjax import checkpointing
  from bertjax import train
  pretraining = config_files.shipped("bert").get_config("tiny")
  finetuning = _run_config()
  pretrained, finetuned = str(tmp_path / "pre"), str(tmp_path / "ft")
  newest = {pretrained: (30, compat.as_json(pretraining), WHERE),
            finetuned: (24, compat.as_json(finetuning), WHERE)}
  monkeypatch.setattr(checkpointing, "newest_saved_config", lambda w: newest.get(w))
  # Fine-tuning on a pretraining workdir: refused before the task or the
  # init (which does not exist) is read.
  with pytest.raises(ValueError) as e:
    loop.run(_run_config(), str(tmp_path / "no-such-init"), pretrained)
  assert str(e.value) == (
      f"{pretrained} is a pretraining workdir (its newest checkpoint, step 30, was "
      "pretrained or imported, not fine-tuned); pass a new --workdir for fine-tuning "
      f"(and {pretrained} as --init to start from it)."), e.value
  # Pretraining, or bertjax.evaluate, on a fine-tuning workdir.
  with pytest.raises(ValueError) as e:
    train.train_and_evaluate(pretraining, finetuned)
  assert str(e.value) == (
      f"{finetuned} is a fine-tuning workdir (task 'local', step 24); use "
      "bertjax.finetune to resume it or bertjax.load to predict, or pass a new "
      "--workdir to pretrain."), e.value
  with pytest.raises(ValueError, match=r"fine-tuning workdir .* run bertjax.finetune "
                                       r"on it again to evaluate it or bertjax.load"):
    compat.check_workdir_kind(newest[finetuned], pretraining, finetuned, evaluating=True)
  # Each kind on its own workdir, or a new one, is not refused here.
  compat.check_workdir_kind(newest[pretrained], pretraining, pretrained)
  compat.check_workdir_kind(newest[finetuned], finetuning, finetuned)
  compat.check_workdir_kind(None, finetuning, finetuned)
  assert not (tmp_path / "pre").exists() and not (tmp_path / "ft").exists()
