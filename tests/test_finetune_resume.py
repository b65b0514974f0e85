"""What a fine-tuning workdir run again is told: a resume with a changed
config names only flags the user sets (with their saved values) and, for
values the run derives, what derived them. The check functions only: no model."""

import re

import pytest

from bertjax import compat
from bertjax import config_files
from bertjax.finetune import checks
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

