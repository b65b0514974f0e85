"""An imported Hugging Face checkpoint continues pretraining with its own
tokenizer, and bertjax.evaluate scores it."""


import jax
import numpy as np
import pytest

pytest.importorskip("torch", reason="the import fixture needs torch (the hf extra)")
pytest.importorskip("transformers", reason="the import fixture needs transformers")

from bertjax import config_files  # noqa: E402
from bertjax import evaluation  # noqa: E402
from bertjax import train  # noqa: E402
from bertjax.convert import hf_tokenizers  # noqa: E402
from bertjax.convert import workdir as workdir_lib  # noqa: E402
from bertjax.data import prepare  # noqa: E402

from test_convert import hf_bert  # noqa: E402,F401  (fixture)

hf_config = config_files.shipped("hf")  # configs/hf.py, loaded by path


def test_imported_model_continues_pretraining(hf_bert, tmp_path, demo_config):  # noqa: F811
  workdir = str(tmp_path / "imported")
  workdir_lib.import_hf(hf_bert[0], workdir, demo_config)
  _, before, _ = workdir_lib.load_params(workdir, step=0)
  config = hf_config.get_config(workdir)
  config.data_dir = str(tmp_path / "data")
  config.batch_size = 16
  config.max_predictions_per_seq = 6
  config.num_train_steps = 3
  config.warmup_steps = 1
  config.log_every_steps = 1
  config.checkpoint_every_steps = 3
  config.eval_max_batches = 1
  record = train.train_and_evaluate(config, workdir)
  assert record["step"] == 3 and np.isfinite(record["mlm_loss"])
  # The demo text was tokenized with the imported WordPiece vocabulary.
  prepared = prepare.prepare(config, config.data_dir)
  tokenizer = hf_tokenizers.HfTokenizer(config.tokenizer_path)
  assert prepared.fingerprint == tokenizer.fingerprint
  doc = prepared.source(config.train_split)[0]
  text_ids, _ = tokenizer.encode("the cat sat on the mat.")
  assert doc["tokens"].max() < config.vocab_size and len(text_ids) > 0
  # Training moved the imported weights, and evaluate scores the checkpoint.
  _, after, _ = workdir_lib.load_params(workdir, step=3)
  moved = [not np.array_equal(np.asarray(a), np.asarray(b))
           for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))]
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(before)[0]]
  # Attention key biases get no gradient (softmax ignores a per-query constant),
  # every other tensor must have been updated.
  stuck = [p for p, m in zip(paths, moved) if not m and "['key']['bias']" not in p]
  assert len(moved) > 10 and not stuck, stuck
  again = evaluation.evaluate_checkpoint(config, workdir)
  assert again["step"] == 3
  assert again["mlm_accuracy"] == pytest.approx(record["mlm_accuracy"], rel=1e-5)


def test_bert_imported_with_an_mlm_only_config_continues_without_nsp(
    hf_bert, tmp_path):  # noqa: F811
  # configs/roberta.py continues a BERT without NSP: the import saves the
  # params of that config's model (no pooler/NSP), reporting the HF heads as
  # ignored, so that bertjax.main resumes the workdir.
  base = config_files.shipped("roberta").get_config("tiny")
  workdir = str(tmp_path / "mlm_only")
  report = workdir_lib.import_hf(hf_bert[0], workdir, base)
  assert report.initialised == [] and report.config.sentence_head is False
  assert {n.split(".")[1] for n in report.unused} == {"pooler", "seq_relationship"}
  _, params, _ = workdir_lib.load_params(workdir, step=0)
  assert "nsp" not in params and "pooler" not in params
  config = hf_config.get_config(workdir)
  config.data_dir = str(tmp_path / "data")
  config.batch_size = 8
  config.max_predictions_per_seq = 6
  config.num_train_steps = 2
  config.warmup_steps = 1
  config.log_every_steps = 1
  config.checkpoint_every_steps = 2
  config.eval_max_batches = 1
  record = train.train_and_evaluate(config, workdir)
  assert record["step"] == 2 and np.isfinite(record["mlm_loss"])
