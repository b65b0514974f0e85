"""Fine-tuning end to end on the demo tasks (issue 16, items 1-2): a tiny BERT
pretrained here, then fine-tuned on sentence coherence and cloze QA; exact
resume; the non-finite guard; bad input. (all-MiniLM-L6-v2 against a random
model of its size is in test_finetune_minilm.py.)"""

import json
import os
import tempfile

import numpy as np
import pytest

from bertjax import config_files
from bertjax.finetune import loop


def _finetune_config(task, **overrides):
  c = config_files.shipped("finetune").get_config(task)
  c.log_every_steps = 1000
  c.checkpoint_every_steps = 1000
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, demo_config, demo_data):
  """A tiny BERT pretrained briefly on the demo corpus (a bertjax workdir)."""
  from bertjax import train
  config = demo_config.copy_and_resolve_references()
  config.data_dir = demo_data.data_dir
  config.seq_len = 64
  config.max_predictions_per_seq = 10
  config.num_train_steps = 60
  config.checkpoint_every_steps = 60
  config.log_every_steps = 60
  config.eval_max_batches = 1
  workdir = tmp_path_factory.mktemp("pretrained")
  train.train_and_evaluate(config, str(workdir))
  return str(workdir)


def test_coherence_beats_chance_by_a_clear_margin(pretrained, tmp_path):
  # Mean pooling reads every token's state, where the overlap between A and
  # B shows; the first token alone learned it less reliably at this size
  # (held-out 0.55-0.59 over seeds, against 0.57-0.59 for mean).
  result = loop.run(_finetune_config("coherence", seq_len=64, learning_rate=1e-3,
                                     pooling="mean"),
                    pretrained, str(tmp_path / "coherence"))
  preds = [json.loads(l) for l in
           (tmp_path / "coherence" / "predictions_validation.jsonl").read_text().splitlines()]
  labels = [p["label"] == "continuation" for p in preds]
  # The record is the last epoch's (not the best epoch's): no selection on
  # the held-out pairs. Every passage A appears once with each label, so chance, and any answer
  # that ignores B, is exactly 0.5. The standard error of an accuracy near
  # 0.5 over n pairs is sqrt(0.25 / n): 0.016 for the 1032 held-out pairs.
  n = len(preds)
  assert n > 1000 and sum(labels) * 2 == n
  assert result["accuracy"] == np.mean([p["label"] == p["prediction"] for p in preds])
  assert result["accuracy"] > 0.5 + 3 * np.sqrt(0.25 / n), result


def test_cloze_qa_trains_above_the_untrained_model(pretrained, tmp_path):
  common = dict(seq_len=64, max_query_tokens=24, doc_stride=16, max_eval_examples=300,
                learning_rate=1e-3)
  # The untrained model: the same encoder and head, learning rate 0.
  untrained = loop.run(_finetune_config("cloze_qa", num_epochs=1.0, max_train_examples=32,
                                        **{**common, "learning_rate": 0.0}),
                       pretrained, str(tmp_path / "untrained"))
  trained = loop.run(_finetune_config("cloze_qa", num_epochs=3.0, **common),
                     pretrained, str(tmp_path / "trained"))
  # Both decode alike: spans inside one word of the context (cloze answers
  # are one word), so F1 is not partial credit for long spans. Exact match
  # near 4% over 300 questions has a standard error of about
  # sqrt(0.04 * 0.96 / 300) = 1.1 points; the untrained model is near 1.
  # Demand a lead of 2 points in both.
  assert trained["exact_match"] > untrained["exact_match"] + 2.0, (trained, untrained)
  assert trained["f1"] > untrained["f1"] + 2.0, (trained, untrained)
  assert 0.0 <= trained["f1"] <= 100.0 and trained["f1"] >= trained["exact_match"]
  preds = [json.loads(l) for l in
           (tmp_path / "trained" / "predictions_validation.jsonl").read_text().splitlines()]
  assert len(preds) == 300 and all(p["prediction"] for p in preds)
  assert (tmp_path / "trained" / "best_checkpoint" / "best.json").exists()


def test_resume_is_exact(pretrained, tmp_path, monkeypatch):
  kw = dict(seq_len=32, batch_size=16, num_epochs=2.0, max_train_examples=48,
            max_eval_examples=32, learning_rate=1e-3, log_every_steps=1)
  built, real_predict_step = [], loop.predict_step
  monkeypatch.setattr(loop, "predict_step",
                      lambda *a: built.append(real_predict_step(*a)) or built[-1])
  whole = loop.run(_finetune_config("coherence", **kw), pretrained, str(tmp_path / "whole"))
  # Two evaluations (one an epoch) through one prediction step, traced once.
  assert len(list(tmp_path.glob("whole/eval_*.json"))) == 2
  assert len(built) == 1 and built[0]._cache_size() == 1
  # The stopped run's workdir spelled as users type it: ~ is expanded.
  monkeypatch.setenv("HOME", str(tmp_path))
  assert loop.run(_finetune_config("coherence", **kw), pretrained, "~/cut",
                  stop_at_step=4) is None  # stopped mid-epoch, after an epoch's evaluation
  resumed = loop.run(_finetune_config("coherence", **kw), pretrained, str(tmp_path / "cut"))
  assert resumed == whole
  assert not os.path.exists("~")  # nothing under a directory named "~" here

  def losses(workdir):
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["task_loss"] for r in rows if "task_loss" in r}

  assert losses(tmp_path / "cut") == losses(tmp_path / "whole")
  assert len(losses(tmp_path / "whole")) == 6  # 3 steps per epoch, 2 epochs
  for name in ("whole", "cut"):
    assert (tmp_path / name / "predictions_validation.jsonl").exists()
  assert ((tmp_path / "cut" / "predictions_validation.jsonl").read_text()
          == (tmp_path / "whole" / "predictions_validation.jsonl").read_text())

  # SIGTERM or Ctrl-C at an epoch's end (step 3 of 3 a epoch): a checkpoint
  # of that step and no evaluation; the resumed run evaluates it first, and
  # ends as the uninterrupted one.
  from bertjax import guards
  real = guards.PreemptionWatcher.should_stop
  monkeypatch.setattr(guards.PreemptionWatcher, "should_stop",
                      lambda self, step: step == 3)
  with pytest.raises(guards.Preempted, match="at step 3; a checkpoint of that step"):
    loop.run(_finetune_config("coherence", **kw), pretrained, str(tmp_path / "stopped"))
  assert not (tmp_path / "stopped" / "eval_3.json").exists()
  monkeypatch.setattr(guards.PreemptionWatcher, "should_stop", real)
  assert loop.run(_finetune_config("coherence", **kw), pretrained,
                  str(tmp_path / "stopped")) == whole
  assert losses(tmp_path / "stopped") == losses(tmp_path / "whole")
  assert ((tmp_path / "stopped" / "eval_3.json").read_text()
          == (tmp_path / "whole" / "eval_3.json").read_text())


def _saved_params(workdir, step):
  """The parameters saved at ``step``, read as ``bertjax.load`` reads them."""
  from bertjax.finetune import inference
  return inference.read(str(workdir), step).params


def test_nonfinite_update_is_skipped_counted_or_stops_the_run(pretrained, tmp_path):
  import jax
  from bertjax import guards
  kw = dict(seq_len=32, batch_size=16, num_epochs=1.0, max_train_examples=48,
            max_eval_examples=16, learning_rate=1e-3)
  # Step 2 (state.step 1) gets a NaN loss; 'skip' leaves its update out.
  clean = tmp_path / "clean"
  assert loop.run(_finetune_config("coherence", **kw), pretrained, str(clean),
                  stop_at_step=1) is None
  poisoned = tmp_path / "poisoned"
  whole = loop.run(_finetune_config("coherence", nonfinite="skip", debug_nan_step=1,
                                    checkpoint_every_steps=1, **kw),
                   pretrained, str(poisoned))
  before, after = _saved_params(clean, 1), _saved_params(poisoned, 2)
  assert jax.tree.all(jax.tree.map(np.array_equal, before, after))
  assert not jax.tree.all(jax.tree.map(np.array_equal, after, _saved_params(poisoned, 3)))
  assert whole["skipped_steps"] == 1 and np.isfinite(whole["accuracy"])
  rows = [json.loads(l) for l in (poisoned / "metrics.jsonl").read_text().splitlines()]
  assert any(r.get("skipped", 0) > 0 for r in rows), rows  # the log shows it too
  # 'stop' (the default) ends the run at the bad step and saves nothing after it.
  with pytest.raises(guards.NonFiniteLoss, match="step 2"):
    loop.run(_finetune_config("coherence", debug_nan_step=1, **kw), pretrained,
             str(tmp_path / "stop"))
  assert not list((tmp_path / "stop" / "checkpoints").glob("[0-9]*"))
  # 'skip' gives up after max_consecutive_skips bad updates in a row (here 1).
  with pytest.raises(guards.NonFiniteLoss, match="in a row"):
    loop.run(_finetune_config("coherence", nonfinite="skip", max_consecutive_skips=1,
                              debug_nan_step=0, **kw), pretrained, str(tmp_path / "give_up"))


def test_a_run_whose_lock_was_taken_over_stops_writing(pretrained, tmp_path,
                                                       monkeypatch):
  # As in pretraining (tests/test_resilience.py): a gs:// lease another run
  # took over stops the run before its next step or checkpoint.
  from bertjax import workdir_lock
  asked = []

  class TakenOverAfterOneStep:
    def check(self):
      asked.append(1)
      if len(asked) > 2:  # step 1, its checkpoint, then step 2: taken
        raise workdir_lock.WorkdirLost("The lock was taken over by another run.")

    def release(self):
      pass
  monkeypatch.setattr(workdir_lock, "hold", lambda *a: TakenOverAfterOneStep())
  kw = dict(seq_len=32, batch_size=16, num_epochs=1.0, max_train_examples=48,
            max_eval_examples=16, learning_rate=1e-3, checkpoint_every_steps=1)
  with pytest.raises(workdir_lock.WorkdirLost, match="taken over"):
    loop.run(_finetune_config("coherence", **kw), pretrained, str(tmp_path / "ft"))
  steps = sorted(int(p.name) for p in (tmp_path / "ft" / "checkpoints").glob("[0-9]*"))
  assert steps == [1] and len(asked) == 3


def test_bad_task_input_is_refused_before_the_init_is_read(tmp_path, monkeypatch):
  # The init does not exist: each refusal names the task's problem, so the
  # task was checked first, and no workdir was created -- nor any of the
  # empty tmp*tfds directories TFDS leaves for a dataset not prepared.
  system_tmp = tmp_path / "system-tmp"
  system_tmp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
  init = str(tmp_path / "no-such-init")
  with pytest.raises(ValueError, match="train_files"):
    loop.run(_finetune_config("local"), init, str(tmp_path / "a"))
  train = tmp_path / "train.csv"
  train.write_text("text,label\nok,pos\n")
  with pytest.raises(ValueError, match="no column 'sentence'"):
    loop.run(_finetune_config("local", train_files=str(train), eval_files=str(train)),
             init, str(tmp_path / "b"))
  with pytest.raises(ValueError, match="not prepared"):
    loop.run(_finetune_config("glue/cola", tfds_data_dir=str(tmp_path / "tfds")),
             init, str(tmp_path / "c"))
  with pytest.raises(ValueError, match="pooling"):
    loop.run(_finetune_config("coherence", pooling="max"), init, str(tmp_path / "d"))
  with pytest.raises(ValueError, match="neither a bertjax workdir"):
    loop.run(_finetune_config("coherence"), init, str(tmp_path / "e"))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["system-tmp", "train.csv"]
  assert list(system_tmp.iterdir()) == []


def test_fill_mask_places_masks_and_ranks_fillings(pretrained):
  import bertjax
  from bertjax import batch as batch_lib
  from bertjax import fill_mask
  model = bertjax.load(pretrained)
  inputs, where = fill_mask.mask_inputs(model, "The [MASK] statement returns [MASK].")
  enc = lambda t: [int(i) for i in model.tokenizer.encode_batch([t])[0]]
  want = ([batch_lib.CLS_ID] + enc("The") + [batch_lib.MASK_ID] + enc("statement returns")
          + [batch_lib.MASK_ID] + enc(".") + [batch_lib.SEP_ID])
  assert inputs["tokens"][0].tolist() == want
  assert where.tolist() == [i for i, t in enumerate(want) if t == batch_lib.MASK_ID]
  fillings = model.fill_mask("The [MASK] statement returns [MASK].", top_k=4)
  assert [len(f) for f in fillings] == [4, 4]
  logits = model.run(inputs)["mlm_logits"][0]
  for options, pos in zip(fillings, where):
    probs = [o["score"] for o in options]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
    # The best filling is the arg-max of the MLM logits over non-special ids.
    row = logits[pos].copy()
    row[:batch_lib.NUM_SPECIAL_TOKENS] = -np.inf
    assert options[0]["token_id"] == int(np.argmax(row))
  with pytest.raises(ValueError, match=r"has no \[MASK\]"):
    model.fill_mask("nothing to fill")


def test_local_csv_and_conll_files_learn_a_visible_rule(pretrained, tmp_path):
  """Labels that a rule on the words decides (an 'error' word makes a row
  'bad'; numbers are B-NUM): fine-tuning from local files must find it."""
  import csv
  import random
  rng = random.Random(0)
  words = "the a module function value list string file class method returns".split()
  for split, n in (("train", 256), ("dev", 128)):
    with open(tmp_path / f"{split}.csv", "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["sentence", "label"])
      for _ in range(n):
        ws = [rng.choice(words) for _ in range(8)]
        bad = rng.random() < 0.5
        if bad:
          ws[rng.randrange(8)] = "error"
        w.writerow([" ".join(ws), "bad" if bad else "ok"])
    with open(tmp_path / f"{split}.conll", "w") as f:
      for _ in range(n):
        for _ in range(8):
          f.write(f"{rng.randrange(100)} B-NUM\n" if rng.random() < 0.2
                  else f"{rng.choice(words)} O\n")
        f.write("\n")
  # 8 epochs, 64 steps: 24 steps (3 epochs) left the classifier at chance
  # from two of three inits (the fixture's pretraining with seeds 0, 1, 2 on
  # the demo's tokenizer of 2026-12-07; 6 epochs learned the rule from all
  # three) and tagging's recall at 0.25 from an init pretrained with other
  # NSP negatives: a brittle budget.
  kw = dict(seq_len=32, learning_rate=1e-3, num_epochs=8.0)
  table = loop.run(_finetune_config("local", train_files=str(tmp_path / "train.csv"),
                                    eval_files=str(tmp_path / "dev.csv"), **kw),
                   pretrained, str(tmp_path / "csv"))
  tags = loop.run(_finetune_config("local", train_files=str(tmp_path / "train.conll"),
                                   eval_files=str(tmp_path / "dev.conll"), **kw),
                  pretrained, str(tmp_path / "conll"))
  # 128 balanced rows: chance is 0.5, 0.9 is 9 standard errors above it.
  assert table["accuracy"] > 0.9, table
  assert tags["entity_f1"] > 0.9, tags
  first = json.loads((tmp_path / "conll" / "predictions_validation.jsonl")
                     .read_text().splitlines()[0])
  assert len(first["prediction"]) == len(first["words"]) == 8

  # Run again, finished, with new unlabelled files to predict: no training,
  # predictions by the rule's standard. The rows without a label column:
  with open(tmp_path / "dev.csv") as f:
    rows = list(csv.DictReader(f))
  (tmp_path / "new.csv").write_text(
      "sentence\n" + "".join(r["sentence"] + "\n" for r in rows))
  (tmp_path / "new.conll").write_text("".join(
      "".join(line.split()[0] + "\n" for line in block.splitlines()) + "\n"
      for block in (tmp_path / "dev.conll").read_text().split("\n\n") if block.strip()))
  for name, kind, source in (("csv", "csv", "new.csv"), ("conll", "conll", "new.conll")):
    steps = sorted(p.name for p in (tmp_path / name / "checkpoints").iterdir())
    logged = (tmp_path / name / "metrics.jsonl").read_text()
    again = loop.run(_finetune_config("local", train_files=str(tmp_path / f"train.{kind}"),
                                      eval_files=str(tmp_path / f"dev.{kind}"),
                                      predict_files=str(tmp_path / source), **kw),
                     # No --init: the workdir remembers its own.
                     pretrained if kind == "conll" else None, str(tmp_path / name))
    assert again["predicted"] == {"new": len(rows)}
    assert sorted(p.name for p in (tmp_path / name / "checkpoints").iterdir()) == steps
    assert (tmp_path / name / "metrics.jsonl").read_text() == logged  # nothing trained
  preds = [json.loads(l) for l in (tmp_path / "csv" / "predict_new.jsonl").read_text()
           .splitlines()]
  assert [p["text_a"] for p in preds] == [r["sentence"] for r in rows]
  assert all("label" not in p and abs(sum(p["probabilities"].values()) - 1) < 1e-5
             for p in preds)
  right = np.mean([p["prediction"] == ("bad" if "error" in p["text_a"].split() else "ok")
                   for p in preds])
  assert right > 0.9, right
  tagged = [json.loads(l) for l in (tmp_path / "conll" / "predict_new.jsonl").read_text()
            .splitlines()]
  assert len(tagged) == len(rows) and all("tags" not in t for t in tagged)
  pairs = [(w.isdigit(), t == "B-NUM") for p in tagged for w, t in zip(p["words"],
                                                                        p["prediction"])]
  assert np.mean([a == b for a, b in pairs]) > 0.95
  # bertjax.load on the workdirs predicts what the files got, from Python.
  import bertjax
  tagger = bertjax.load(str(tmp_path / "conll"))
  assert [r["prediction"] for r in tagger.predict([p["words"] for p in tagged[:16]])] == \
      [p["prediction"] for p in tagged[:16]]
  classifier = bertjax.load(str(tmp_path / "csv"))
  got = classifier.predict([p["text_a"] for p in preds[:16]])
  assert [r["prediction"] for r in got] == [p["prediction"] for p in preds[:16]]
  assert got[0]["probabilities"] == pytest.approx(preds[0]["probabilities"], abs=1e-5)


def test_tokenizer_offsets_point_at_each_piece(pretrained):
  import bertjax
  tok = bertjax.load(pretrained).tokenizer
  text = "The  quick-brown fox said: na\u00efve \u65e5\u672c text."
  ids, offsets = tok.encode_with_offsets(text)
  assert ids.tolist() == tok.encode(text)[0].tolist()
  assert np.all(np.diff(offsets[:, 0]) >= 0) and offsets.max() <= len(text)
  for i, (a, b) in zip(ids, offsets):
    piece = tok.id_to_piece(i)
    if not piece.startswith("<0x"):  # byte pieces: checked through the characters below
      assert text[a:b] == piece.lstrip("\u2581"), (piece, text[a:b])
  covered = "".join(text[a:b] for a, b in offsets)
  assert covered == "".join(text.split())  # every non-space character, once, in order
