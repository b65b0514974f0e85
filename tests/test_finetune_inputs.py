"""Fine-tuning inputs that a user sweep found mishandled: an init with a
one-row segment table (RoBERTa, SpanBERT), a workdir resumed with another
--init, a pretraining config given to the fine-tuning binary, words in a
regression label column, and a file where --workdir should be."""

import json
import re

import jax
import numpy as np
import pytest

from bertjax import config_files
from bertjax.finetune import encoder_init
from bertjax.finetune import features as features_lib
from bertjax.finetune import loop
from bertjax.finetune import predict as predict_lib
from bertjax.finetune import tasks as tasks_lib

from test_finetune import _finetune_config as _shipped_finetune_config


def _finetune_config(task, **overrides):
  return _shipped_finetune_config(task, **{"log_every_steps": 1, **overrides})


_TINY = dict(seq_len=32, batch_size=16, num_epochs=1.0, max_train_examples=32,
             max_eval_examples=16, learning_rate=1e-3)


@pytest.fixture(scope="module")
def inits(tmp_path_factory, demo_config, demo_data):
  """``inits(type_vocab_size)``: the workdir of a tiny MLM-only encoder
  pretrained for one step, with a segment table of that many rows (1 as
  configs/roberta.py and configs/spanbert.py give, 2 as BERT); each built once."""
  from bertjax import train
  built = {}

  def make(type_vocab: int) -> str:
    if type_vocab not in built:
      c = demo_config.copy_and_resolve_references()
      c.objective, c.sentence_head, c.layout = "mlm_only", False, "full_sentences"
      del c.nsp_negative_rate, c.short_seq_prob
      c.type_vocab_size = type_vocab
      c.data_dir = demo_data.data_dir
      c.seq_len, c.batch_size, c.max_predictions_per_seq = 32, 8, 5
      c.num_train_steps = c.checkpoint_every_steps = c.log_every_steps = 1
      c.eval_max_batches = 1
      workdir = tmp_path_factory.mktemp(f"init_tv{type_vocab}")
      train.train_and_evaluate(c, str(workdir))
      built[type_vocab] = str(workdir)
    return built[type_vocab]

  return make


@pytest.mark.parametrize("type_vocab", [1, 2])
def test_pair_task_from_an_init_of_either_segment_table_is_finite(inits, type_vocab, tmp_path):
  path = inits(type_vocab)
  fields, _, tokenizer = encoder_init.load_init(path)
  separators, single = encoder_init.encoder_layout(fields, tokenizer)
  encoder = features_lib.Encoder(tokenizer, 32, pair_separators=separators,
                                 single_segment=single)
  pairs = encoder.pairs([{"text_a": "one two", "text_b": "three four", "label": 0}],
                        "classification")
  # Segment ids never exceed the table: passage B gets 1 only with 2 rows.
  assert pairs["segment_ids"].max() == type_vocab - 1
  qa = encoder.qa([{"context": "the answer is here", "question": "where is it",
                    "answers": ["here"], "answer_start": 14}],
                  doc_stride=8, max_query_tokens=8)
  assert qa["segment_ids"].max() == type_vocab - 1
  # A pair task (coherence) trains with a finite loss at every step (the
  # default nonfinite='stop' would raise at the first NaN).
  result = loop.run(_finetune_config("coherence", **_TINY), path, str(tmp_path / "ft"))
  rows = [json.loads(l) for l in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
  losses = [r["task_loss"] for r in rows if "task_loss" in r]
  assert len(losses) == 2 and np.all(np.isfinite(losses)), rows
  assert result["skipped_steps"] == 0 and np.isfinite(result["accuracy"])


def test_a_workdir_resumed_with_another_init_is_refused(inits, tmp_path):
  # Two inits of different encoders (segment tables of 1 and 2 rows).
  path, other = inits(1), inits(2)
  workdir = tmp_path / "ft"
  cfg = lambda: _finetune_config("coherence", **_TINY)
  assert loop.run(cfg(), path, str(workdir), stop_at_step=1) is None
  record = json.loads((workdir / encoder_init.RECORD).read_text())
  assert record["init"] == path and record["step"] == 1
  listing = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  with pytest.raises(ValueError, match=r"was started from --init=.*pass a new --workdir"):
    loop.run(cfg(), other, str(workdir))
  # A workdir from before the record: the restore failure names --init.
  (workdir / encoder_init.RECORD).unlink()
  with pytest.raises(ValueError, match=r"do not fit the encoder that --init=.* builds"):
    loop.run(cfg(), other, str(workdir))
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == listing
  # The init it was started from resumes and finishes.
  assert loop.run(cfg(), path, str(workdir))["step"] == 2


def test_the_head_draws_the_same_numbers_with_or_without_the_encoders_draws(
    inits, tmp_path, monkeypatch):
  # With an init only the head is drawn (the encoder's draws are never
  # compiled); random_init draws the whole tree. The head must not notice.
  made = []
  original = loop._initial_state
  monkeypatch.setattr(loop, "_initial_state",
                      lambda *a, **k: made.append(original(*a, **k)) or made[-1])
  for name, random_init in (("init", False), ("random", True)):
    cfg = _finetune_config("coherence", random_init=random_init, **_TINY)
    assert loop.run(cfg, inits(2), str(tmp_path / name), stop_at_step=0) is None
  (loaded, drawn) = (jax.device_get(s.params) for s in made)
  assert sorted(loaded) == sorted(drawn) and "encoder" in loaded and len(loaded) > 1
  for key in set(loaded) - {"encoder"}:
    for a, b in zip(jax.tree.leaves(loaded[key]), jax.tree.leaves(drawn[key])):
      np.testing.assert_array_equal(a, b)
  # ... while the encoders differ: one is the init's, the other drawn.
  assert any(not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(loaded["encoder"]), jax.tree.leaves(drawn["encoder"])))


def test_a_fine_tuned_workdir_loads_with_its_inits_weights_gone(inits, tmp_path):
  # bertjax.load (and the export) of a fine-tuned workdir take the encoder's
  # weights from that workdir's checkpoint: of the init they read the config
  # and the tokenizer only (encoder_init.load_architecture). With the init's
  # weights deleted after fine-tuning, the model predicts as before.
  import shutil
  import bertjax
  init = tmp_path / "init"
  shutil.copytree(inits(2), init)
  fields, _, tokenizer = encoder_init.load_init(str(init))
  workdir = str(tmp_path / "ft")
  loop.run(_finetune_config("coherence", **_TINY), str(init), workdir)
  pairs = [("one two", "three four"), ("the cat sat", "on the mat")]
  before = bertjax.load(workdir).predict(pairs)
  states = list(init.glob("checkpoints/*/state"))
  assert states
  for state in states:
    shutil.rmtree(state)
  with pytest.raises(Exception):  # the init's weights are unreadable now
    encoder_init.load_init(str(init))
  got_fields, got_tokenizer = encoder_init.load_architecture(str(init))
  assert got_fields == fields
  text = "the quick brown fox, twice: the quick brown fox"
  for a, b in zip(got_tokenizer.encode(text), tokenizer.encode(text)):
    np.testing.assert_array_equal(a, b)
  assert bertjax.load(workdir).predict(pairs) == before


def test_the_init_record_tells_weights_apart():
  params = {"encoder": {"w": np.arange(10_000, dtype=np.float32).reshape(100, 100)}}
  nudged = {"encoder": {"w": params["encoder"]["w"].copy()}}
  nudged["encoder"]["w"][50, 0] += 1e-3  # a sampled value (every 2nd of 10000)
  a = encoder_init.identify("/a", {"model": "bert"}, params, 4)
  assert a == encoder_init.identify("/a", {"model": "bert"}, params, 4)
  assert a["weights_sha256"] != encoder_init.identify("/a", {"model": "bert"}, nudged, 4)[
      "weights_sha256"]
  assert a["config_sha256"] != encoder_init.identify("/a", {"model": "albert"}, params, 4)[
      "config_sha256"]


def test_bad_inputs_get_one_sentence_before_any_work(tmp_path):
  init = str(tmp_path / "no-such-init")
  # A pretraining config given to the fine-tuning binary.
  with pytest.raises(ValueError, match=r"not a fine-tuning config.*configs/finetune\.py:<task>"):
    loop.run(config_files.shipped("bert").get_config("tiny"), init, str(tmp_path / "a"))
  # A file where --workdir (or a parent of it) should be.
  blocker = tmp_path / "blocker"
  blocker.write_text("keep me")
  for workdir in (blocker, blocker / "sub"):
    with pytest.raises(ValueError, match=r"--workdir=.*not a directory"):
      loop.run(_finetune_config("coherence"), init, str(workdir))
  with pytest.raises(ValueError, match=r"--config.tfds_data_dir=.*not a directory"):
    loop.run(_finetune_config("glue/cola", tfds_data_dir=str(blocker)), init,
             str(tmp_path / "b"))
  with pytest.raises(ValueError, match=r"--init=.*is a file, not a directory"):
    loop.run(_finetune_config("coherence"), str(blocker), str(tmp_path / "b"))
  assert blocker.read_text() == "keep me"
  # Words in the label column of a regression task: the file, the column,
  # the value and the fix.
  numbers, words = tmp_path / "numbers.csv", tmp_path / "words.csv"
  numbers.write_text("sentence,score\nfine,1.5\nok,2\n")
  words.write_text("sentence,score\nfine,1\nnot fine,no\n")
  config = _finetune_config("local", train_files=f"{numbers},{words}",
                            eval_files=str(numbers), label_field="score",
                            task_kind="regression")
  with pytest.raises(ValueError, match=(rf"^{re.escape(str(words))} has the label 'no' in "
                                        r"column 'score'.*task_kind=classification")):
    loop.run(config, init, str(tmp_path / "c"))
  config.train_files = str(numbers)
  task = tasks_lib.load(config)
  assert [ex["label"] for ex in task.train] == [1.5, 2.0]
  assert all(set(ex) == {"text_a", "label"} for ex in task.train)
  with pytest.raises(ValueError, match="task_kind 'tagging'"):
    tasks_lib.load(_finetune_config("local", train_files=str(numbers),
                                    eval_files=str(numbers), task_kind="tagging"))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "numbers.csv", "words.csv"]


@pytest.mark.parametrize("kind,module,package", [
    ("classification", "sklearn", "scikit-learn"), ("regression", "scipy", "scipy"),
    ("tagging", "seqeval", "seqeval")])
def test_a_missing_metrics_library_is_named_before_the_init_is_read(
    tmp_path, monkeypatch, kind, module, package):
  # The metrics' libraries are the finetune extra; without one, the run
  # stopped at its first evaluation, an epoch of training lost.
  import importlib.util
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == module else find_spec(name, *a))
  if kind == "tagging":  # a CoNLL file
    rows = "the O\ncat B-ANIMAL\n\n"
    config = _local(tmp_path, rows, rows, train_name="train.conll", eval_name="dev.conll")
  else:
    rows = "sentence,label\na cat,1\na dog,0\n"
    config = _local(tmp_path, rows, rows, task_kind=kind)
  assert tasks_lib.load(config).kind == kind
  before = sorted(p.name for p in tmp_path.iterdir())
  with pytest.raises(ValueError, match=(
      rf"^The metrics of a {kind} task need {package}, which is not installed; "
      r"install the finetune extra: pip install 'bertjax\[finetune\]'")):
    loop.run(config, str(tmp_path / "no-such-init"), str(tmp_path / "ft"))
  assert sorted(p.name for p in tmp_path.iterdir()) == before


def _local(tmp_path, train: str, evals: str, train_name="train.csv", eval_name="dev.csv",
           **overrides):
  (tmp_path / train_name).write_bytes(train.encode() if isinstance(train, str) else train)
  (tmp_path / eval_name).write_bytes(evals.encode() if isinstance(evals, str) else evals)
  return _finetune_config("local", train_files=str(tmp_path / train_name),
                          eval_files=str(tmp_path / eval_name), **overrides)


_GOOD = "sentence,label\na cat,pos\na dog,neg\n"


@pytest.mark.parametrize("train,evals,names,message", [
    # A short row used to become the label 'None'; a bad JSON line, a line
    # that is not an object, a row without a column, a non-UTF-8 file, a
    # .json that is not SQuAD, a CoNLL line without a tag: tracebacks or
    # messages that named no file.
    (_GOOD, "sentence,label\nfine,pos\nshort\n", ("train.csv", "dev.csv"),
     r"dev\.csv line 3 has 1 fields where its header has 2 \(sentence, label\)"),
    # A quote never closed swallows the lines after it: named where it opens.
    (_GOOD, 'sentence,label\nfine,pos\n"open,neg\nmore,pos\n', ("train.csv", "dev.csv"),
     r"dev\.csv line 3 opens a quoted value that runs on to line 4, so the row has 1 "
     r"of its header's 2 fields; close the quote"),
    (_GOOD, '{"sentence": "a", "label": "pos"}\nnot json\n', ("train.csv", "dev.jsonl"),
     r"dev\.jsonl line 2 is not valid JSON"),
    (_GOOD, '{"sentence": "a", "label": "pos"}\n[1, 2]\n', ("train.csv", "dev.jsonl"),
     r"dev\.jsonl line 2 is a JSON list, not an object"),
    (_GOOD, '{"sentence": "a", "label": "pos"}\n{"sentence": "b"}\n', ("train.csv", "dev.jsonl"),
     r"dev\.jsonl line 2 has no column 'label' \(it has sentence\)"),
    (_GOOD, '{"sentence": null, "label": "pos"}\n', ("train.csv", "dev.jsonl"),
     r"dev\.jsonl line 1 has no value \(null\) in column 'sentence'"),
    (b"sentence,label\n\xff\xfe,pos\n", _GOOD, ("train.csv", "dev.csv"),
     r"train\.csv is not UTF-8 text \(byte 0xff"),
    ('{"version": "1.1"}', '{"data": []}', ("train.json", "dev.json"),
     r"train\.json is not a SQuAD file \(no 'data'\).*\"paragraphs\""),
    ("the\ncat B-PER\n", "cat B-PER\n", ("train.conll", "dev.conll"),
     r"train\.conll line 1 has one column \('the'\)"),
    # Labels: one class only, or an eval label the train files never have.
    ("sentence,label\na,pos\nb,pos\n", _GOOD, ("train.csv", "dev.csv"),
     r"only the label 'pos' in column 'label'.*two or more"),
    (_GOOD, "sentence,label\nfine,pos\nodd,maybe\n", ("train.csv", "dev.csv"),
     r"Label 'maybe' of .*dev\.csv line 3 is not among the labels of the train files"),
    # A table for training, SQuAD for evaluation.
    (_GOOD, json.dumps({"data": [{"paragraphs": [{"context": "a cat", "qas": [
        {"id": "1", "question": "who?", "answers": [{"text": "cat", "answer_start": 2}]}]}]}]}),
     ("train.csv", "dev.json"),
     r"train_files are a table .* but --config.eval_files are SQuAD"),
])
def test_local_files_with_mistakes_are_named_with_their_line(tmp_path, train, evals, names,
                                                             message):
  config = _local(tmp_path, train, evals, *names)
  with pytest.raises(ValueError, match=message):
    tasks_lib.load(config)


def test_local_tables_read_as_users_write_them(tmp_path):
  # Excel's UTF-8 byte-order mark used to stick to the first column's name.
  bom = "\ufeff" + "sentence,label\nGrüße,pos\nno,neg\n"
  task = tasks_lib.load(_local(tmp_path, bom, _GOOD))
  assert [ex["text_a"] for ex in task.train] == ["Grüße", "no"]
  # A .tsv text that starts with a quote mark kept swallowing the lines after
  # it (csv quoting); GLUE's files and BERT's reader use none.
  rows = ['"quoted\tpos', "plain\tneg", 'a "b" c\tpos', "last\tneg"]
  tsv = "sentence\tlabel\n" + "\n".join(rows) + "\n"
  task = tasks_lib.load(_local(tmp_path, tsv, tsv, "train.tsv", "dev.tsv"))
  assert [ex["text_a"] for ex in task.train] == [r.split("\t")[0] for r in rows]
  assert task.label_names == ("neg", "pos")
  assert [ex["label"] for ex in task.eval] == [1, 0, 1, 0]
  with pytest.raises(ValueError, match="label_names lists 'pos' twice"):
    tasks_lib.load(_local(tmp_path, _GOOD, _GOOD, label_names="pos,neg,pos"))


@pytest.mark.parametrize("field,value,message", [
    ("seq_len", 0, "at least 8"),  # IndexError before
    ("learning_rate", -1.0, "must be a number, not negative"),  # trained uphill before
    ("learning_rate", float("nan"), "must be a number, not negative"),
    ("grad_clip_norm", -1.0, "must be a positive number .*reverse it"),
    ("checkpoint_every_steps", 0, "positive integer"),  # ZeroDivisionError
    ("log_every_steps", 0, "positive integer"),
    ("keep_checkpoints", 0, "positive integer"),  # kept no checkpoint to resume
    ("max_train_examples", -3, "must not be negative"),  # silently dropped 3 rows
    ("head_dropout", 1.5, r"in \[0, 1\)"),
    ("seed", -1, "must not be negative"),  # a ValueError of numpy's mid-run
    ("seed", 2**32, "below 2\\*\\*32"),  # seed 0's draws again
    ("doc_stride", 0, "positive integer"),
    ("no_answer", "yes", "one of auto, on, off"),
    ("no_answer_threshold", float("inf"), "finite number"),
    ("unanswerable_fraction", 1.0, r"in \[0, 1\)"),
    # The guard's fields: -2 meant never (as -1) and 0 stopped at the first skip.
    ("debug_nan_step", -2, r"-1 \(never\) or the step"),
    ("max_consecutive_skips", 0, "positive integer"),
    ("nonfinite", "never", "one of stop, skip"),
])
def test_bad_config_values_are_refused_before_any_work(tmp_path, field, value, message):
  config = _finetune_config("coherence", **{field: value})
  workdir = tmp_path / "ft"
  with pytest.raises(ValueError, match=rf"^config\.{field}={value!r} is invalid: .*{message}"):
    loop.run(config, str(tmp_path / "no-such-init"), str(workdir))
  assert not workdir.exists()


def test_unanswerable_questions_are_for_cloze_qa_and_bring_squad_v2_metrics(tmp_path):
  with pytest.raises(ValueError, match="unanswerable_fraction applies to the cloze_qa task"):
    loop.run(_finetune_config("coherence", unanswerable_fraction=0.5),
             str(tmp_path / "no-such-init"), str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()
  # A SQuAD 2.0 metric is a main metric only where "no answer" is decoded.
  squad = ('{"data": [{"paragraphs": [{"context": "Paris is in France.", "qas": ['
           '{"id": "1", "question": "Where is Paris?", "answers": [{"text": "France", '
           '"answer_start": 12}]}, {"id": "2", "question": "Where is Rome?", '
           '"answers": []}]}]}]}')
  (tmp_path / "train.json").write_text(squad)
  config = _finetune_config("local", train_files=str(tmp_path / "train.json"),
                            eval_files=str(tmp_path / "train.json"),
                            main_metric="best_f1")
  task = tasks_lib.load(config)
  assert task.kind == "qa" and task.unanswerable
  assert tasks_lib.predicts_no_answer(config, task)
  config.no_answer = "off"
  assert not tasks_lib.predicts_no_answer(config, task)
  with pytest.raises(ValueError, match="main_metric='best_f1' is not a metric of this qa"):
    loop.run(config, str(tmp_path / "no-such-init"), str(tmp_path / "ft2"))
  answered = _finetune_config("cloze_qa")
  assert not tasks_lib.predicts_no_answer(answered, tasks_lib.load(answered))


def test_files_to_predict_are_read_and_checked_before_any_work(tmp_path):
  (tmp_path / "test.csv").write_text("sentence\nfirst\nsecond\n")
  (tmp_path / "labelled.csv").write_text("sentence,label\nthird,pos\n")
  config = _local(tmp_path, _GOOD, _GOOD)
  task = tasks_lib.load(config)
  config.predict_files = f"{tmp_path / 'test.csv'},{tmp_path / 'labelled.csv'}"
  got = dict(predict_lib.inputs(config, task))
  assert [ex["text_a"] for ex in got["test"]] == ["first", "second"]
  assert [ex["gold"] for ex in got["test"]] == [None, None]
  assert got["labelled"][0]["gold"] == "pos"  # kept as the name, for the record
  bad = {
      "predict_files": (f"{tmp_path / 'test.csv'},{tmp_path / 'sub'}/test.csv",
                        "both write predict_test.jsonl"),
      "predict_split": ("test", "names a split of a TFDS task"),
  }
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "test.csv").write_text("sentence\nx\n")
  (tmp_path / "q.json").write_text('{"data": []}')
  (tmp_path / "words.conll").write_text("just\nwords\n")
  for field, (value, message) in [*bad.items(),
                                  ("predict_files", (str(tmp_path / "words.conll"),
                                                     "is CoNLL .* classification task")),
                                  ("predict_files", (str(tmp_path / "q.json"),
                                                     "No examples in .*predict_files"))]:
    config = _local(tmp_path, _GOOD, _GOOD, **{field: value})
    with pytest.raises(ValueError, match=message):
      loop.run(config, str(tmp_path / "no-such-init"), str(tmp_path / "ft"))
    assert not (tmp_path / "ft").exists()


def test_a_tfds_split_to_predict_keeps_only_the_labels_tfds_does_not_hide(monkeypatch):
  # GLUE's test splits carry label -1; TFDS itself is not prepared here, so
  # its reader is replaced by one that returns such a split.
  rows = [{"text_a": "x", "label": -1}, {"text_a": "y", "label": 1}]
  monkeypatch.setattr(tasks_lib, "tfds_split",
                      lambda config, split: ("classification", rows, ("neg", "pos")))
  config = _finetune_config("glue/sst2", predict_split="test")
  task = tasks_lib.Task("classification", [], [], ("neg", "pos"))
  ((name, examples),) = predict_lib.inputs(config, task)
  assert name == "test" and [ex["gold"] for ex in examples] == [None, "pos"]
  assert [ex["label"] for ex in examples] == [0, 0] and rows[0]["label"] == -1


def test_prediction_records_carry_the_input_the_prediction_and_any_gold():
  task = tasks_lib.Task("classification", [], [], ("neg", "pos"))
  examples = [{"text_a": "a", "label": 0, "gold": None},
              {"text_a": "b", "text_b": "c", "label": 0, "gold": "neg"}]
  logits = np.log(np.array([[0.25, 0.75], [0.9, 0.1]]))
  recs = predict_lib.records(task, examples, {}, logits, _finetune_config("local"))
  assert [r["prediction"] for r in recs] == ["pos", "neg"]
  assert recs[0]["probabilities"] == pytest.approx({"neg": 0.25, "pos": 0.75})
  assert "label" not in recs[0] and recs[1]["label"] == "neg" and recs[1]["text_b"] == "c"
  # QA: the question, the decoded answer, no placeholder answers.
  qa_task = tasks_lib.Task("qa", [], [])
  offsets = np.array([[-1, -1], [0, 1], [2, 3], [-1, -1]])
  feats = {"example": np.array([0]), "context_mask": (offsets[:, 0] >= 0)[None],
           "offsets": offsets[None]}
  logits = np.zeros((1, 4, 2))
  logits[0, 2] = 5.0  # start and end on "b"
  ex = [{"id": "q1", "question": "which?", "context": "a b", "answers": [],
         "answer_start": -1, "gold": None}]
  (rec,) = predict_lib.records(qa_task, ex, feats, logits, _finetune_config("local"))
  assert rec == {"id": "q1", "prediction": "b", "question": "which?"}


def test_a_main_metric_the_task_lacks_is_refused_before_the_init_is_read(tmp_path):
  # It used to be a KeyError after the first epoch's training.
  config = _local(tmp_path, _GOOD, _GOOD, main_metric="acc")
  with pytest.raises(ValueError, match="main_metric='acc' is not a metric of this "
                                       "classification task.*accuracy, matthews_corr, f1"):
    loop.run(config, str(tmp_path / "no-such-init"), str(tmp_path / "ft"))
  assert not (tmp_path / "ft").exists()


def test_too_few_epochs_for_one_step_and_the_direction_of_the_best_metric():
  from bertjax.finetune import checks
  config = _finetune_config("coherence", batch_size=8, num_epochs=0.1)
  # 32 rows of 8: 4 steps an epoch, a tenth of which used to be 0 steps and
  # a TypeError at the end.
  with pytest.raises(ValueError, match="num_epochs 0.1 of 4 steps per epoch is no step"):
    checks.check_steps(config, 32)
  config.num_epochs = 0.25
  checks.check_steps(config, 32)
  # The best checkpoint minimises its loss: the main metric, negated unless
  # lower is better (mse used to keep the worst epoch).
  cfg = _finetune_config("coherence", main_metric="mse")
  assert loop._best_loss(cfg, {"mse": 1.0}) < loop._best_loss(cfg, {"mse": 2.0})
  cfg.main_metric = "pearson"
  assert loop._best_loss(cfg, {"pearson": 0.9}) < loop._best_loss(cfg, {"pearson": 0.1})


def test_one_run_per_workdir_and_a_killed_runs_rows_are_redone_once(inits, tmp_path):
  from bertjax import workdir_lock
  path, workdir = inits(2), tmp_path / "ft"
  cfg = lambda: _finetune_config("coherence", **_TINY)
  workdir.mkdir()
  # A second run on a workdir in use used to train beside the first.
  with workdir_lock.WorkdirLock(str(workdir)):
    with pytest.raises(ValueError, match=r"Another bertjax run .* is training in the workdir"):
      loop.run(cfg(), path, str(workdir))
  assert not (workdir / "checkpoints").exists()

  def steps():
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["task_loss"]) for r in rows if "task_loss" in r]

  # What a run killed before its first checkpoint logged, and what one killed
  # after the checkpoint of step 1 logged past it: both redone, so dropped.
  (workdir / "metrics.jsonl").write_text('{"step": 1, "task_loss": 99.0}\n')
  assert loop.run(cfg(), path, str(workdir), stop_at_step=1) is None
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 2, "task_loss": 99.0}\n')
  assert loop.run(cfg(), path, str(workdir))["step"] == 2
  assert [s for s, _ in steps()] == [1, 2] and 99.0 not in [l for _, l in steps()]


def test_a_finished_workdir_predicts_after_its_init_trained_further(inits, tmp_path):
  import ml_collections
  import shutil
  from bertjax import checkpointing, train
  init = str(tmp_path / "init")
  shutil.copytree(inits(2), init)
  rows = "".join(f"{w} {i},{'neg' if w == 'no' else 'pos'}\n" for i in range(16)
                 for w in ("yes", "no"))
  config = lambda **kw: _local(tmp_path, "sentence,label\n" + rows,
                               "sentence,label\n" + rows, **{**_TINY, **kw})
  assert loop.run(config(), init, str(tmp_path / "ft"))["step"] == 2
  pretraining = checkpointing.Checkpointer(init, read_only=True)
  c = ml_collections.ConfigDict(pretraining.saved_config(1))
  pretraining.close()
  c.num_train_steps = 2  # the init trains on: its newest checkpoint is now step 2
  train.train_and_evaluate(c, init)
  (tmp_path / "test.csv").write_text("sentence\nyes 1\nno 2\n")
  for given in (init, None):  # with --init, or the one it remembers
    again = loop.run(config(predict_files=str(tmp_path / "test.csv")), given,
                     str(tmp_path / "ft"))
    assert again["predicted"] == {"test": 2}
  # More epochs for the finished workdir: the flag to keep, and a new workdir.
  with pytest.raises(ValueError) as e:
    loop.run(config(num_epochs=3.0), None, str(tmp_path / "ft"))
  assert re.search(r"fine-tuned with num_epochs=1.0 but this run says num_epochs=3.0, .*; "
                   r"keep --config.num_epochs=1.0 to resume it as it was, or pass a new "
                   r"--workdir to fine-tune with the change\.$", str(e.value)), e.value


def test_rows_are_bounded_by_the_encoders_position_table_only_where_it_has_one():
  # An XLNet encoder (relative sinusoids) was refused rows longer than the
  # max_position_embeddings its import records, a table it does not have.
  from bertjax.finetune import checks
  config = _finetune_config("coherence", batch_size=8)
  config.seq_len = 1024
  xlnet = {"model": "xlnet", "max_position_embeddings": 512}
  checks.check_positions(config, xlnet)
  deberta = {"model": "deberta", "max_position_embeddings": 512,
             "position_biased_input": False, "emd_layers": 0}
  checks.check_positions(config, deberta)
  for fields in ({"model": "bert", "max_position_embeddings": 512},
                 dict(deberta, position_biased_input=True)):
    with pytest.raises(ValueError, match="seq_len 1024 exceeds the encoder's 512 positions"):
      checks.check_positions(config, fields)
