"""``python -m bertjax.convert`` on the inputs users give it: an exported
single-segment model and tokenizer that work on pairs, a fast tokenizer with
bertjax's byte fallback, export targets that are refused or replaced by
rule, files where directories belong, a fine-tuning workdir, and DeBERTa's
EMD table kept through a round trip."""

import json
import os
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax.convert import export_target
from bertjax.convert import workdir as workdir_lib
from tree_snapshot import tree_hash

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Accents, a dash, CJK, an ellipsis and an emoji: outside the demo vocabulary.
EXOTIC = "naïve café — 漢字 … 🙂"


@pytest.fixture(scope="module")
def spanbert(tmp_path_factory, demo_data):
  """(workdir, export dir) of a SpanBERT (type_vocab_size 1) trained 2 steps."""
  from bertjax import config_files
  from bertjax import train
  config = config_files.shipped("spanbert").get_config("tiny")
  assert config.type_vocab_size == 1
  config.data_dir = demo_data.data_dir
  for k, v in dict(batch_size=8, seq_len=32, max_predictions_per_seq=5,
                   num_train_steps=2, warmup_steps=1, checkpoint_every_steps=2,
                   log_every_steps=2, eval_max_batches=1, shuffle_window=32).items():
    config[k] = v
  root = tmp_path_factory.mktemp("spanbert")
  workdir, out = str(root / "run"), str(root / "hf")
  train.train_and_evaluate(config, workdir)
  workdir_lib.export_hf(workdir, out)
  return workdir, out


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "bertjax.convert", *args],
                        capture_output=True, text=True, cwd=ROOT)


def _one_sentence(run):
  assert run.returncode != 0
  assert "Traceback" not in run.stderr, run.stderr[-2000:]
  return run.stderr.strip().splitlines()[-1]


def test_exported_single_segment_model_runs_pairs_as_bertjax_does(spanbert):
  from bertjax import api
  workdir, out = spanbert
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  slow = transformers.AutoTokenizer.from_pretrained(out, use_fast=False)
  pair = ("The Python interpreter is easily extended.", "Lists are mutable.")
  encoded = hf_tok(*pair, return_tensors="pt")
  # No token_type_ids (the model has one segment row), from either tokenizer.
  assert "token_type_ids" not in encoded and "token_type_ids" not in slow(*pair)
  hf_model = transformers.BertForMaskedLM.from_pretrained(out).eval()
  with torch.no_grad():
    ref = hf_model(**encoded, output_hidden_states=True)
  ours = api.load(workdir).encode([pair])
  assert ours["tokens"][0].tolist() == encoded["input_ids"][0].tolist()
  hidden = ref.hidden_states[-1][0].numpy()
  assert np.abs(ours["hidden"][0] - hidden).max() <= 1e-5 * np.abs(hidden).max()
  logits = ref.logits[0].numpy()
  assert np.abs(ours["mlm_logits"][0] - logits).max() <= 1e-5 * np.abs(logits).max()
  config = json.loads(open(os.path.join(out, "tokenizer_config.json")).read())
  assert config["model_input_names"] == ["input_ids", "attention_mask"]


def test_fast_tokenizer_has_bertjax_byte_fallback(spanbert):
  from bertjax import api
  workdir, out = spanbert
  ours = [int(i) for i in api.load(workdir).tokenizer.encode(EXOTIC)[0]]
  assert 1 not in ours  # bertjax: byte pieces, no [UNK]
  fast = transformers.AutoTokenizer.from_pretrained(out)
  assert fast.is_fast
  assert fast(EXOTIC, add_special_tokens=False)["input_ids"] == ours
  assert fast.decode(ours) == EXOTIC.replace("…", "...")  # NFKC, as sentencepiece
  slow = transformers.AutoTokenizer.from_pretrained(out, use_fast=False)
  assert slow(EXOTIC, add_special_tokens=False)["input_ids"] == ours


def test_export_refuses_workdirs_and_foreign_directories(spanbert, tmp_path):
  workdir, _ = spanbert
  before = tree_hash(workdir)
  line = _one_sentence(_cli(f"--to_hf={workdir}", f"--workdir={workdir}"))
  assert "is the --workdir itself" in line
  assert tree_hash(workdir) == before
  other = tmp_path / "other_run"  # another bertjax workdir
  (other / "checkpoints").mkdir(parents=True)
  (other / "config.json").write_text(json.dumps({"model": "bert"}))
  with pytest.raises(ValueError, match="is a bertjax workdir"):
    workdir_lib.export_hf(workdir, str(other))
  assert json.loads((other / "config.json").read_text()) == {"model": "bert"}
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("keep me")
  with pytest.raises(ValueError, match="holds no earlier bertjax export"):
    workdir_lib.export_hf(workdir, str(mine), overwrite=True)
  assert sorted(os.listdir(mine)) == ["notes.txt"]


def test_overwrite_replaces_only_the_earlier_export(spanbert, tmp_path):
  workdir, _ = spanbert
  out = tmp_path / "hf"
  workdir_lib.export_hf(workdir, str(out))
  # An earlier export of another kind left a generator; the user added notes.
  manifest = json.loads((out / export_target.MANIFEST).read_text())
  (out / "generator").mkdir()
  for name in ("config.json", "model.safetensors"):
    (out / "generator" / name).write_text("{}")
  manifest["files"] += ["generator/config.json", "generator/model.safetensors"]
  (out / export_target.MANIFEST).write_text(json.dumps(manifest))
  (out / "notes.txt").write_text("keep me")
  with pytest.raises(ValueError, match="pass --overwrite"):
    workdir_lib.export_hf(workdir, str(out))
  assert (out / "generator" / "config.json").exists()
  workdir_lib.export_hf(workdir, str(out), overwrite=True)
  assert not (out / "generator").exists()
  assert (out / "notes.txt").read_text() == "keep me"
  assert transformers.BertForMaskedLM.from_pretrained(str(out)) is not None
  # A file of an export's name that the earlier export did not write stays.
  (out / "vocab.txt").write_text("mine")
  with pytest.raises(ValueError, match="vocab.txt, which the earlier export did not write"):
    workdir_lib.export_hf(workdir, str(out), overwrite=True)
  assert (out / "vocab.txt").read_text() == "mine"


def test_files_where_directories_belong_get_one_sentence(spanbert, tmp_path):
  workdir, _ = spanbert
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  line = _one_sentence(_cli(f"--to_hf={a_file}", f"--workdir={workdir}"))
  assert line.endswith("is a file, not a directory; pass the path of a directory "
                       "(it is created if missing).") and "--to_hf=" in line
  line = _one_sentence(_cli(f"--from_hf={workdir}", f"--workdir={a_file}"))
  assert "--workdir=" in line and "is a file, not a directory" in line
  assert a_file.read_text() == "x"


def test_finetuning_workdir_export_says_what_to_export_and_load_predicts(spanbert, tmp_path):
  from bertjax import config_files
  from bertjax.finetune import loop
  workdir, _ = spanbert
  config = config_files.shipped("finetune").get_config("coherence")
  for k, v in dict(seq_len=32, batch_size=8, num_epochs=1.0, max_train_examples=16,
                   max_eval_examples=8, log_every_steps=1000,
                   checkpoint_every_steps=1000).items():
    setattr(config, k, v)
  finetuned = str(tmp_path / "ft")
  loop.run(config, workdir, finetuned)
  # bertjax.load gives the fine-tuned classifier: the same predictions as
  # the run's own evaluation of those pairs (one epoch: best = last).
  import json
  import bertjax
  from bertjax.finetune import tasks as tasks_lib
  model = bertjax.load(finetuned)
  pairs = [(ex["text_a"], ex["text_b"]) for ex in tasks_lib.load(config).eval[:8]]
  got = model.predict(pairs)
  evaluated = [json.loads(l) for l in
               (tmp_path / "ft" / "predictions_validation.jsonl").read_text().splitlines()]
  assert [r["prediction"] for r in got] == [r["prediction"] for r in evaluated]
  assert [r["text_b"] for r in got] == [b for _, b in pairs]
  with pytest.raises(ValueError, match="takes a text or a \\(text, text\\) pair"):
    model.predict([("only one",)])
  # It fills no masks: evaluate --fill_mask says so in one sentence.
  proc = subprocess.run([sys.executable, "-m", "bertjax.evaluate", f"--workdir={finetuned}",
                         "--fill_mask", "a [MASK] b"], capture_output=True, text=True,
                        cwd=ROOT)
  line = _one_sentence(proc)
  assert "fine-tuned classification model" in line and "its --init" in line, line
  # --to_hf writes it as BertForSequenceClassification (SpanBERT is a BERT;
  # pooling 'first' is BERT's pooler), which computes the same probabilities.
  import torch
  import transformers
  from bertjax.finetune import features as features_lib
  proc = _cli(f"--to_hf={tmp_path / 'hf'}", f"--workdir={finetuned}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1])["architecture"] == \
      "BertForSequenceClassification"
  hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(tmp_path / "hf"), output_loading_info=True)
  assert not any(info.values()), info  # nothing missing, unexpected or mismatched
  assert hf.config.id2label == {0: "other_document", 1: "continuation"}
  examples = [{"text_a": a, "text_b": b, "label": 0} for a, b in pairs]
  feats = features_lib.build(model._encoder, model.task, examples, model.config)  # noqa: SLF001
  tokens = torch.tensor(feats["tokens"], dtype=torch.long)
  with torch.no_grad():
    logits = hf.eval()(input_ids=tokens, token_type_ids=torch.tensor(
        feats["segment_ids"], dtype=torch.long), attention_mask=(tokens != 0).long()).logits
  probs = torch.softmax(logits, -1).numpy()
  ours = np.array([[r["probabilities"][n] for n in ("other_document", "continuation")]
                   for r in got])
  np.testing.assert_allclose(probs, ours, atol=1e-5)


def test_deberta_emd_table_survives_export_import_export(tmp_path):
  import jax
  from bertjax import config_files
  from bertjax.convert import core
  from bertjax.convert import deberta
  from bertjax.convert import hf_files
  from test_convert_deberta import KINDS, _deberta_tokenizer
  src = str(tmp_path / "src")
  os.makedirs(src)
  vocab = _deberta_tokenizer(src)
  torch.manual_seed(0)
  hf = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(
      vocab_size=vocab, intermediate_size=37, max_position_embeddings=40,
      relative_attention=True, pad_token_id=0, **KINDS["v3"]))
  hf.save_pretrained(src)
  # An EMD-trained export: its position table goes out under transformers' name.
  fields, params, _, _, _ = workdir_lib.load_hf(src)
  fields = dict(fields, emd_layers=2)
  table = core.param_shapes(core.build_model(fields))["embeddings"]["position_embeddings"]
  params["embeddings"]["position_embeddings"] = {"embedding": np.asarray(
      jax.random.normal(jax.random.key(0), table["embedding"].shape))}
  first = str(tmp_path / "first")
  hf_files.write(first, deberta.hf_config(fields, 0),
                 core.params_to_hf(deberta, fields, params, core.vocab_order(fields)))
  hf_files.copy_tokenizer_files(src, first)
  workdir = str(tmp_path / "wd")
  report = workdir_lib.import_hf(first, workdir,
                                 config_files.shipped("deberta").get_config("tiny"))
  assert report.unused == [deberta.KEPT_WHOLE[0]]  # no place in the model ...
  second = str(tmp_path / "second")
  workdir_lib.export_hf(workdir, second)  # ... but kept for the export
  a = safetensors_numpy.load_file(os.path.join(first, "model.safetensors"))
  b = safetensors_numpy.load_file(os.path.join(second, "model.safetensors"))
  assert set(a) == set(b) and deberta.KEPT_WHOLE[0] in b
  for name in a:
    assert np.array_equal(a[name], b[name]), name


def test_model_type_names_what_the_model_can_be_written_as(spanbert, tmp_path):
  # SpanBERT writes as a BERT: naming that type used to be refused ("cannot
  # be written as HF 'bert'"), and a wrong type's refusal named no type.
  workdir, out = spanbert
  named = str(tmp_path / "named")
  workdir_lib.export_hf(workdir, named, model_type="bert")
  for name in ("model.safetensors", "config.json"):
    with open(os.path.join(out, name), "rb") as a, open(os.path.join(named, name), "rb") as b:
      assert a.read() == b.read(), name
  with pytest.raises(ValueError, match=r"cannot be written as HF 'xlnet'; leave "
                     r"--model_type out to write it as 'bert'\.$"):
    workdir_lib.export_hf(workdir, str(tmp_path / "wrong"), model_type="xlnet")
  assert not (tmp_path / "wrong").exists()
