"""bertjax.study (issue 16, item 5): objectives pretrained to the same FLOP
budget on the session's prepared demo data, evaluated and fine-tuned at two
budget points; the table and the plot; a rerun that trains nothing."""

import json
import os

import numpy as np
import pytest

from bertjax import flops
from bertjax.study import core
from bertjax.study import report

# Two objectives whose steps cost different FLOPs (ELECTRA's carries its
# generator), so each reaches the budget points in its own number of steps;
# a third (ALBERT until 2026-12-06) cost the suite about a minute and is
# driven by the same code.
OBJECTIVES = ["bert", "electra"]
# The tiny configs, smaller still: 8 x 32 tokens a step, one eval batch.
SHRINK = ["seq_len=32", "batch_size=8", "max_predictions_per_seq=5",
          "log_every_steps=1", "checkpoint_every_steps=100", "eval_max_batches=1",
          "shuffle_window=16"]
FINETUNE = ["seq_len=32", "batch_size=16", "max_train_examples=32",
            "max_eval_examples=48", "learning_rate=1e-3", "log_every_steps=100",
            "max_query_tokens=12", "doc_stride=8"]  # cloze_qa fits a 32-token row
POINTS = 2


def _configs(demo_data):
  return core.load_configs(OBJECTIVES, "tiny", SHRINK + [f"data_dir={demo_data.data_dir}"])


@pytest.fixture(scope="module")
def study(tmp_path_factory, demo_data):
  configs = _configs(demo_data)
  # Six steps of the shrunk BERT; the others get what that buys them.
  budget = 6.5 * flops.step_flops(configs["bert"])
  workdir = str(tmp_path_factory.mktemp("study"))
  record = core.run(configs, budget, workdir, points=POINTS, spacing="linear",
                    tasks=["coherence"], finetune_overrides=FINETUNE, finetune_epochs=1.0)
  return configs, budget, workdir, record


def test_every_objective_reaches_every_budget_point_within_one_step(study):
  configs, budget, workdir, record = study
  saved = json.loads(open(os.path.join(workdir, "study.json")).read())
  assert saved == json.loads(json.dumps(record))
  assert sorted(saved["objectives"]) == sorted(OBJECTIVES)
  points = [budget / 2, budget]
  np.testing.assert_allclose(saved["budgets"], points)
  for name, entry in saved["objectives"].items():
    per_step = flops.step_flops(configs[name])
    assert [pt["budget"] for pt in entry["points"]] == pytest.approx(points)
    for pt, b in zip(entry["points"], points):
      assert b - per_step < pt["flops"] <= b, (name, pt, b, per_step)
      assert pt["flops"] == pytest.approx(pt["step"] * per_step)
      assert 0.0 <= pt["heldout"]["mlm_accuracy"] <= 1.0
      assert 0.0 <= pt["finetune"]["coherence"]["score"] <= 1.0
    # The training log's cumulative FLOPs, one row per step (log_every_steps=1).
    rows = [json.loads(l) for l in
            open(os.path.join(workdir, name, "pretrain", "metrics.jsonl")).read().splitlines()]
    logged = {r["step"]: r["flops_total"] for r in rows if "flops_total" in r}
    assert sorted(logged) == list(range(1, entry["points"][-1]["step"] + 1))
    for step, total in logged.items():
      assert total == pytest.approx(step * per_step)
  # The same data_dir for all of them (one tokenizer kind): each shares with the others.
  for name, entry in saved["objectives"].items():
    assert sorted(entry["shares_data_with"]) == sorted(set(OBJECTIVES) - {name})


def test_table_has_a_row_per_objective_and_the_plot_its_panels(study):
  _, _, workdir, _ = study
  table = open(os.path.join(workdir, "study.md")).read()
  first = table.split("Along the way")[0]
  rows = [l for l in first.splitlines() if l.startswith("| ") and "---" not in l][1:]
  assert sorted(r.split("|")[1].strip() for r in rows) == sorted(OBJECTIVES)
  import matplotlib.image
  path = os.path.join(workdir, "study.png")
  assert os.path.getsize(path) > 0
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  pixels = matplotlib.image.imread(path)
  width, height = report.png_size(2)  # held-out MLM + coherence
  assert pixels.shape[:2] == (height, width)
  assert pixels[..., :3].std() > 0.05  # lines and text drawn, not a blank canvas


def test_rerun_trains_and_fine_tunes_nothing(study, monkeypatch):
  configs, budget, workdir, record = study
  from bertjax import finetune
  from bertjax import train

  def refuse(*args, **kwargs):
    raise AssertionError("the rerun trained again")

  monkeypatch.setattr(train, "train_and_evaluate", refuse)
  monkeypatch.setattr(finetune, "run", refuse)
  checkpoints = os.path.join(workdir, "bert", "pretrain", "checkpoints")
  before = {d: os.stat(os.path.join(checkpoints, d)).st_mtime_ns
            for d in os.listdir(checkpoints)}
  again = core.run(configs, budget, workdir, points=POINTS, spacing="linear",
                   tasks=["coherence"], finetune_overrides=FINETUNE, finetune_epochs=1.0)
  assert again == record
  assert {d: os.stat(os.path.join(checkpoints, d)).st_mtime_ns
          for d in os.listdir(checkpoints)} == before
  # A task added afterwards would need the first point's checkpoint, which the
  # run has gone past: refused, not fine-tuned from the wrong checkpoint.
  with pytest.raises(ValueError, match="past the unrecorded budget point"):
    core.run(configs, budget, workdir, points=POINTS, spacing="linear",
             tasks=["coherence", "cloze_qa"], finetune_overrides=FINETUNE,
             finetune_epochs=1.0)
  # Another budget in the same workdir is refused, not mixed in.
  with pytest.raises(ValueError, match="another plan"):
    core.run(configs, 2 * budget, workdir, points=POINTS, spacing="linear",
             tasks=["coherence"], finetune_overrides=FINETUNE, finetune_epochs=1.0)
  # So is another --set that leaves the steps alone: its figures would be
  # the old learning rate's.
  changed = {name: core.apply_overrides(c.copy_and_resolve_references(),
                                        ["learning_rate=0.5"])
             for name, c in configs.items()}
  with pytest.raises(ValueError, match=r"another plan: its pretraining config \(--size or "):
    core.run(changed, budget, workdir, points=POINTS, spacing="linear",
             tasks=["coherence"], finetune_overrides=FINETUNE, finetune_epochs=1.0)
  # A cadence field is not a change of plan.
  cadence = {name: core.apply_overrides(c.copy_and_resolve_references(),
                                        ["log_every_steps=7"])
             for name, c in configs.items()}
  assert core.run(cadence, budget, workdir, points=POINTS, spacing="linear",
                  tasks=["coherence"], finetune_overrides=FINETUNE,
                  finetune_epochs=1.0) == record


def test_budget_points_and_steps():
  assert core.budget_points(8.0, 4, "log") == [1.0, 2.0, 4.0, 8.0]
  assert core.budget_points(9.0, 3, "linear") == [3.0, 6.0, 9.0]
  assert core.steps_for(9.99, 1.0) == 9  # rounded down
  assert core.steps_for(0.5, 1.0) == 1  # at least one step
  with pytest.raises(ValueError, match="--flops"):
    core.budget_points(0.0, 3)
  with pytest.raises(ValueError, match="--spacing"):
    core.budget_points(1.0, 3, "cubic")


def test_bad_input_is_refused_before_training(demo_data, tmp_path):
  configs = _configs(demo_data)
  per_step = flops.step_flops(configs["bert"])
  with pytest.raises(ValueError, match="share a step"):
    core.run({"bert": configs["bert"]}, 1.5 * per_step, str(tmp_path / "a"), points=3)
  with pytest.raises(ValueError, match=r"did you mean --set=seq_len=\.\.\.\?$"):
    core.load_configs(["bert"], "tiny", ["seq_lenn=32"])
  with pytest.raises(ValueError, match="not of type int"):
    core.load_configs(["bert"], "tiny", ["seq_len=long"])
  with pytest.raises(ValueError, match="No config file"):
    core.load_configs(["bret"], "tiny")
  with pytest.raises(ValueError, match="twice"):
    core.load_configs(["bert", "configs/bert.py"], "tiny")
  with pytest.raises(ValueError, match="^--tasks names coherence twice"):
    core.run({"bert": configs["bert"]}, 4 * per_step, str(tmp_path / "a"), points=2,
             tasks=["coherence", "cloze_qa", "coherence"])
  # A field some objectives lack: one sentence naming who has it and who not.
  with pytest.raises(ValueError, match=r"^--set=sbo_max_offset=20 names a field of "
                     r"spanbert that bert has not, .* study of their own"):
    core.load_configs(["bert", "spanbert"], "tiny", ["sbo_max_offset=20"])
  # Tuple fields take comma-separated values of their items' type.
  unilm = core.load_configs(["unilm"], "tiny", ["unilm_mask_rates=0.5,0.5,0,0"])["unilm"]
  assert unilm.unilm_mask_rates == (0.5, 0.5, 0.0, 0.0)
  with pytest.raises(ValueError, match="comma-separated floats"):
    core.load_configs(["unilm"], "tiny", ["unilm_mask_rates=half,half,0,0"])
  with pytest.raises(ValueError, match="doc_stride 32 must be between 1 and the 12"):
    core.run({"bert": configs["bert"]}, 4 * per_step, str(tmp_path / "a"), points=2,
             tasks=["cloze_qa"], finetune_overrides=["seq_len=64", "max_query_tokens=48"])
  # Fine-tuning values are checked before any pretraining too (epochs 0 and
  # a metric the task lacks used to fail after it), and the fix names this
  # binary's flags, not bertjax.finetune's --config.
  for overrides, epochs, message in (
      ([], 0.0, r"^coherence: num_epochs 0.0 must be positive; fix --finetune_epochs\.$"),
      (["main_metric=acc"], None, r"^coherence: .*main_metric='acc'.* set --finetune_set="),
      (["learning_rate=-1"], None, r"set --finetune_set=learning_rate=\.\.\. accordingly"),
      (["seq_lenn=64"], None, r"did you mean --finetune_set=seq_len=\.\.\.\?$")):
    with pytest.raises(ValueError, match=message):
      core.run({"bert": configs["bert"]}, 4 * per_step, str(tmp_path / "a"), points=2,
               tasks=["coherence"], finetune_overrides=overrides, finetune_epochs=epochs)
  with pytest.raises(ValueError, match="'finetune', a fine-tuning config.*--tasks"):
    core.load_configs(["finetune"], "tiny")
  # A pretraining value: the objective named and its fix in --set (was
  # --config., nameless); a seq_len past the position table is said so, not
  # taken for a budget too small.
  for names, overrides, message in (
      (["bert", "xlnet"], ["seq_len=32", "max_predictions_per_seq=5"],
       r"^xlnet: max_predictions_per_seq=5 .*set --set=max_predictions_per_seq"),
      (["bert"], ["seq_len=9999"], r"^bert: config\.seq_len=9999 is invalid.*--set=seq_len=")):
    with pytest.raises(ValueError, match=message):
      core.run(core.load_configs(names, "tiny", overrides), 1e12, str(tmp_path / "a"),
               points=1, tasks=[])
  # One data_dir for two tokenizers: refused before the first prepares it.
  shared = core.load_configs(["bert", "roberta"], "tiny", [f"data_dir={tmp_path / 'd'}"])
  with pytest.raises(ValueError, match=r"^bert and roberta would share the data_dir "
                     r".*\(tokenizer differs\)"):
    core.run(shared, 1e12, str(tmp_path / "a"), points=1, tasks=[])
  assert not (tmp_path / "d").exists()
  assert not (tmp_path / "a").exists()
  (tmp_path / "afile").write_text("mine")
  with pytest.raises(ValueError, match=r"--workdir=.*afile is a file"):
    core.run({"bert": configs["bert"]}, 4 * per_step, str(tmp_path / "afile"),
             points=2)
  assert (tmp_path / "afile").read_text() == "mine"


def test_an_hf_tokenizer_is_refused_at_planning_in_the_study_flags(tmp_path):
  # --set=tokenizer=hf was refused by prepare, after the objectives before it
  # had prepared their data, naming bertjax.main's --config.tokenizer.
  configs = core.load_configs(["bert"], "tiny", ["tokenizer=hf"])
  with pytest.raises(ValueError, match=(
      r"^bert: config\.tokenizer='hf' names an imported model's own tokenizer .*"
      r"pass --set=tokenizer=unigram, bpe or bpe_bytes")) as refused:
    core.plan(configs, 1e12, str(tmp_path / "a"), points=1)
  assert "--config." not in str(refused.value)
  assert not (tmp_path / "a").exists()


def test_an_objective_that_cannot_be_fine_tuned_is_reported_so():
  # bertjax.finetune reads encoders by their Hugging Face mapping; every
  # shipped model has one now (SpanBERT's exports as BERT), so a model name
  # without one stands in for a future model that lacks it.
  from bertjax import config_files
  unmapped = config_files.shipped("bert").get_config("tiny")
  unmapped.model = "no_mapping_yet"
  assert "no_mapping_yet" in core.finetune_unavailable(unmapped)
  for name in ("bert", "spanbert", "albert", "electra"):
    assert core.finetune_unavailable(config_files.shipped(name).get_config("tiny")) is None
  point = {"budget": 2.0, "step": 2, "flops": 2.0, "over_budget": False,
           "heldout": {"mlm_accuracy": 0.1, "baseline_mlm_accuracy": 0.05},
           "finetune": {"coherence": {"unavailable": "no mapping."}}}
  record = {"budget": 2.0, "budgets": [2.0], "tasks": ["coherence"], "steps_rule": "r",
            "objectives": {"spanbert": {"model": "spanbert", "step_flops": 1.0,
                                        "tokenizer": "unigram", "shares_data_with": [],
                                        "points": [point]}}}
  table = report.markdown(record)
  row = next(l for l in table.splitlines() if l.startswith("| spanbert"))
  assert row.rstrip(" |").endswith("—") and "Not fine-tuned" in table
  assert report.plot_png(record)[:4] == b"\x89PNG"


def test_a_result_recorded_before_config_hashes_is_reused_with_a_warning(tmp_path, caplog):
  # Such a record cannot tell a changed --set from the old one: it is reused
  # (as before) but no longer silently.
  import logging
  import ml_collections
  config = ml_collections.ConfigDict({"learning_rate": 1e-3, "log_every_steps": 5})
  plan = core.Plan("bert", config, 1e9, [1e10], [10], str(tmp_path / "bert"), "key")
  old = {k: v for k, v in plan.describe().items() if k != "config_sha256"}
  path = tmp_path / "result.json"
  path.write_text(json.dumps({"plan": old, "finetuning": {}, "points": [{"step": 10}]}))
  caplog.set_level(logging.WARNING)
  result = core._load_result(plan, str(path), {})
  assert result["points"] == [{"step": 10}]
  assert "recorded before studies kept their config's hash" in caplog.text
  # A record with the hash says nothing of the kind.
  caplog.clear()
  path.write_text(json.dumps({"plan": plan.describe(), "finetuning": {}, "points": []}))
  assert core._load_result(plan, str(path), {})["points"] == []
  assert "config's hash" not in caplog.text


def test_a_study_killed_before_its_first_point_is_refused_another_plan(demo_data, tmp_path,
                                                                       monkeypatch):
  # Killed while its objective trains to its first point (nothing recorded
  # yet), then run again with another budget: refused as another plan before
  # anything is prepared, not resumed from the first plan's checkpoints (whose
  # warmup the new budget changes: refused in --config terms, after preparing).
  configs = {"bert": _configs(demo_data)["bert"]}
  per_step = flops.step_flops(configs["bert"])
  workdir = str(tmp_path / "study")

  def killed(p, step):
    raise RuntimeError("killed")

  monkeypatch.setattr(core, "_pretrain_to", killed)
  with pytest.raises(RuntimeError, match="killed"):
    core.run(configs, 4 * per_step, workdir, points=2, tasks=[])
  from bertjax.data import prepare
  monkeypatch.setattr(prepare, "prepare", killed)
  with pytest.raises(ValueError, match=r"another plan: its budgets \(\["):
    core.run(configs, 8 * per_step, workdir, points=2, tasks=[])


def test_a_pretraining_run_loads_with_its_tokenizer_moved(study, tmp_path):
  # A study's runs read the tokenizer from <study>/data (here the demo data);
  # moved (the study's directory copied elsewhere), bertjax.load takes where
  # it is now, and says so when it is not found.
  import shutil
  import bertjax
  configs, _, workdir, _ = study
  run = os.path.join(workdir, "bert", "pretrain")
  moved = tmp_path / "moved"
  shutil.copytree(os.path.join(configs["bert"].data_dir, "tokenizers"), moved / "tokenizers")
  model = bertjax.load(run, data_dir=str(moved))
  assert model.config["data_dir"] == str(moved)
  np.testing.assert_array_equal(model.tokenize(["A cat."])["tokens"],
                                bertjax.load(run).tokenize(["A cat."])["tokens"])
  with pytest.raises(ValueError, match=r"No tokenizer under .*gone/tokenizers; the run's "
                     r"data_dir moved .*bertjax\.load\(path, data_dir=\.\.\.\)"):
    bertjax.load(run, data_dir=str(tmp_path / "gone"))
  with pytest.raises(ValueError, match="is for a pretraining workdir's tokenizer"):
    bertjax.load(os.path.join(workdir, "bert", "finetune", "coherence", "step_6"),
                 data_dir=str(moved))


def test_a_rerun_with_fewer_objectives_keeps_the_earlier_ones_of_its_plan(tmp_path,
                                                                          monkeypatch):
  # First --configs=bert,roberta,..., then --configs=bert in the same directory:
  # study.json/.md/.png held bert alone, though roberta's result.json was kept.
  # Recorded results stand in for the first run; nothing is prepared or trained.
  from bertjax import finetune
  from bertjax import train
  from bertjax.data import prepare

  def refuse(*args, **kwargs):
    raise AssertionError("the rerun prepared or trained")

  monkeypatch.setattr(train, "train_and_evaluate", refuse)
  monkeypatch.setattr(finetune, "run", refuse)
  monkeypatch.setattr(prepare, "prepare", lambda *args: None)  # reuses what it made
  configs = core.load_configs(["bert", "roberta", "albert", "electra"], "tiny", SHRINK)
  budget = 4.5 * flops.step_flops(configs["bert"])
  root = tmp_path / "study"
  plans = {p.name: p for p in core.plan(configs, budget, str(root), points=2)}

  def recorded(name, plan=None, steps=None):
    p = plans[name]
    points = [{"budget": b, "step": s, "flops": s * p.step_flops, "over_budget": False,
               "heldout": {"mlm_accuracy": 0.1, "baseline_mlm_accuracy": 0.05},
               "finetune": {"coherence": {"main_metric": "accuracy", "score": 0.5}}}
              for b, s in zip(p.budgets, steps or p.steps)]
    (root / name).mkdir(parents=True)
    (root / name / "result.json").write_text(json.dumps({
        "plan": plan or p.describe(), "points": points,
        "finetuning": {"overrides": [], "epochs": None}}))

  recorded("bert")
  recorded("roberta")  # the same plan: kept
  recorded("albert", plan={**plans["albert"].describe(),
                           "budgets": [2 * b for b in plans["albert"].budgets]})
  recorded("electra", steps=plans["electra"].steps[:1])  # killed after its first point
  record = core.run({"bert": configs["bert"]}, budget, str(root), points=2, tasks=[],
                    size="tiny", overrides=SHRINK)
  assert list(record["objectives"]) == ["bert", "roberta"]
  assert record["objectives"]["roberta"]["points"][-1]["step"] == plans["roberta"].steps[-1]
  assert json.loads((root / "study.json").read_text()) == json.loads(json.dumps(record))
  table = (root / "study.md").read_text()
  first = table.split("Along the way")[0]
  assert [l.split("|")[1].strip() for l in first.splitlines()
          if l.startswith("| ") and "---" not in l][1:] == ["bert", "roberta"]
  assert ("Left out (recorded here by earlier runs): albert (its budgets differs), "
          "electra (unfinished); run them again") in table
  # With another --set, roberta's config is not the one its result was made
  # with; without --size (a library call), its config cannot be rebuilt.
  from bertjax.study import earlier
  finetuning = {"overrides": [], "epochs": None}
  kept, _, left_out = earlier.collect(str(root), ["bert"], finetuning, [], earlier.rebuilder(
      "tiny", SHRINK + ["learning_rate=0.5"], budget, str(root), 2, "log"))
  assert not kept
  assert "roberta (its pretraining config differs: another --size or --set)" in left_out
  assert ("roberta (this run was not given --size to rebuild its config)"
          in earlier.collect(str(root), ["bert"], finetuning, [], None)[2])
