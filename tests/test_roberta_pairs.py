"""How a RoBERTa joins the two texts of a pair follows its tokenizer: one
[SEP] for a RoBERTa pretrained here (its exported sentencepiece tokenizer,
the export re-imported), ``</s></s>`` for a RoBERTa's own byte-level BPE;
bertjax matches transformers' AutoTokenizer + model on pairs either way."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")

PAIRS = [("Sentence A here.", "And B there."),
         ("The Python interpreter is easily extended.", "Lists are mutable.")]


@pytest.fixture(scope="module")
def roberta(tmp_path_factory, demo_data):
  """(workdir, export, re-import) of configs/roberta.py:tiny trained 2 steps
  (on the demo tokenizer), exported as model_type roberta."""
  from bertjax import config_files
  from bertjax import train
  from bertjax.convert import workdir as workdir_lib
  config = config_files.shipped("roberta").get_config("tiny")
  bert = config_files.shipped("bert").get_config("tiny")
  config.tokenizer, config.vocab_size = bert.tokenizer, bert.vocab_size
  config.data_dir = demo_data.data_dir
  for k, v in dict(batch_size=8, seq_len=32, max_predictions_per_seq=5,
                   num_train_steps=2, warmup_steps=1, checkpoint_every_steps=2,
                   log_every_steps=2, eval_max_batches=1, shuffle_window=32).items():
    config[k] = v
  root = tmp_path_factory.mktemp("roberta")
  workdir, out, again = str(root / "run"), str(root / "hf"), str(root / "again")
  train.train_and_evaluate(config, workdir)
  workdir_lib.export_hf(workdir, out, model_type="roberta")
  workdir_lib.import_hf(out, again, config)
  return workdir, out, again


def _hf_pairs(hf_dir, model_class):
  """(input ids, mask, last hidden states) of PAIRS from transformers."""
  tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
  batch = tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True,
              return_tensors="pt")
  model = model_class.from_pretrained(hf_dir).eval()
  with torch.no_grad():
    hidden = model(**batch, output_hidden_states=True).hidden_states[-1].numpy()
  return batch["input_ids"].numpy(), batch["attention_mask"].numpy(), hidden


def _check_pairs(model, hf_dir, model_class):
  ids, mask, hidden = _hf_pairs(hf_dir, model_class)
  out = model.encode(PAIRS)
  assert np.array_equal(out["mask"], mask.astype(bool))
  hf_ids = getattr(model.tokenizer, "to_hf_ids", lambda x: x)(out["tokens"])
  assert np.array_equal(hf_ids * mask, ids * mask)
  real = mask.astype(bool)
  assert np.abs(out["hidden"][real] - hidden[real]).max() <= 1e-5 * np.abs(hidden).max()
  return out


def test_pretrained_roberta_keeps_one_separator_exported_and_reimported(roberta):
  from bertjax import api
  from bertjax import batch as batch_lib
  from bertjax.finetune import encoder_init
  workdir, out, again = roberta
  # The exported tokenizer joins pairs as the workdir did: one [SEP].
  ours = api.load(workdir).encode(PAIRS)
  first = ours["tokens"][0][ours["mask"][0]].tolist()
  assert first.count(batch_lib.SEP_ID) == 2
  for path in (out, again):
    model = api.load(path)
    got = _check_pairs(model, out, transformers.RobertaForMaskedLM)
    assert np.array_equal(model.tokenizer.to_hf_ids(got["tokens"]), ours["tokens"])
    real = ours["mask"]
    assert np.abs(got["hidden"][real] - ours["hidden"][real]).max() <= 1e-5
  # Fine-tuning lays pairs out the same way from each of the three.
  for path in (workdir, out, again):
    fields, _, tokenizer = encoder_init.load_init(path)
    assert encoder_init.encoder_layout(fields, tokenizer) == (1, True), path


CORPUS = ["Sentence A here. And B there.", "The Python interpreter is easily extended.",
          "Lists are mutable."] * 5


def _byte_level_roberta(path, corpus=CORPUS):
  """A tiny RobertaForMaskedLM (type_vocab_size 1, as roberta-base) with its
  own byte-level BPE trained on ``corpus``, saved in ``path``; its config."""
  from tokenizers import ByteLevelBPETokenizer
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(corpus, vocab_size=300, min_frequency=1,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  path.mkdir()
  bpe.save_model(str(path))
  fast = transformers.RobertaTokenizerFast(str(path / "vocab.json"),
                                           str(path / "merges.txt"))
  fast.save_pretrained(str(path))  # tokenizer.json: RobertaProcessing
  torch.manual_seed(0)
  config = transformers.RobertaConfig(
      vocab_size=len(fast), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=37, max_position_embeddings=40, type_vocab_size=1)
  transformers.RobertaForMaskedLM(config).save_pretrained(str(path))
  return config


def test_the_tokenizers_pair_template_decides_the_separators(tmp_path):
  from bertjax import api
  corpus = CORPUS
  roberta, bert = tmp_path / "roberta", tmp_path / "bert"
  config = _byte_level_roberta(roberta)
  # A RoBERTa's own tokenizer: <s> A </s></s> B </s>, as transformers.
  _check_pairs(api.load(str(roberta)), str(roberta), transformers.RobertaForMaskedLM)
  # The same RoBERTa read with a WordPiece tokenizer: [CLS] A [SEP] B [SEP].
  words = sorted({w for text in corpus for w in text.replace(".", " .").split()})
  vocab = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + words  # RoBERTa's ids
  bert.mkdir()
  (bert / "vocab.txt").write_text("\n".join(vocab) + "\n")
  transformers.BertTokenizerFast(
      str(bert / "vocab.txt"), do_lower_case=False, unk_token="<unk>", sep_token="</s>",
      pad_token="<pad>", cls_token="<s>", mask_token="<mask>",
      model_input_names=["input_ids", "attention_mask"]).save_pretrained(str(bert))
  config.vocab_size = len(vocab)
  transformers.RobertaForMaskedLM(config).save_pretrained(str(bert))
  _check_pairs(api.load(str(bert)), str(bert), transformers.RobertaForMaskedLM)
  # An import records the template for pretraining's sentence pairs
  # (bertjax/data/packing.py): two separators for the RoBERTa's own
  # tokenizer, BERT's one (not recorded) for the WordPiece one.
  from bertjax import config_files
  from bertjax.convert import workdir as workdir_lib
  base = config_files.shipped("roberta").get_config("tiny")
  assert workdir_lib.import_hf(str(roberta), str(tmp_path / "wd_roberta"),
                               base).config.pair_separators == 2
  assert "pair_separators" not in workdir_lib.import_hf(
      str(bert), str(tmp_path / "wd_bert"), base).config
  # What the files say; templates as tokenizers writes them (a Sequence
  # answers by its first processor that says).
  from bertjax.convert import pair_format
  assert pair_format.files_say(str(roberta)) == 2 and pair_format.files_say(str(bert)) == 1
  template = {"type": "TemplateProcessing", "pair": [
      {"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}},
      {"SpecialToken": {"id": "</s>"}}, {"SpecialToken": {"id": "</s>"}},
      {"Sequence": {"id": "B"}}, {"SpecialToken": {"id": "</s>"}}]}
  assert pair_format._template_separators(template) == 2  # noqa: SLF001
  assert pair_format._template_separators(  # noqa: SLF001
      {"type": "Sequence", "processors": [{"type": "ByteLevel"}, template]}) == 2
  assert pair_format._template_separators({"type": "ByteLevel"}) is None  # noqa: SLF001


def test_a_roberta_continues_with_nsp_on_pairs_with_two_separators(tmp_path):
  # configs/bert.py (NSP on sentence pairs) continues a genuine RoBERTa: the
  # import saves that config's model, the pooler and NSP head freshly
  # initialised and reported, and records the tokenizer's two separators;
  # training packs <s> A </s></s> B </s> and feeds segment 0 everywhere (the
  # table has one row); the export is RobertaForMaskedLM without the head.
  import jax
  import jax.numpy as jnp
  import safetensors.numpy
  from bertjax import batch as batch_lib
  from bertjax import config_files
  from bertjax import objectives
  from bertjax import train
  from bertjax.convert import core
  from bertjax.convert import workdir as workdir_lib
  from bertjax.data import pipeline
  from bertjax.data import prepare
  roberta = tmp_path / "roberta"
  hf_config = _byte_level_roberta(roberta)
  base = config_files.shipped("bert").get_config("tiny")
  workdir = str(tmp_path / "nsp")
  report = workdir_lib.import_hf(str(roberta), workdir, base)
  assert sorted(report.initialised) == ["nsp", "pooler"] and report.unused == []
  config = report.config
  assert config.objective == "bert" and config.get("sentence_head", True)
  assert config.pair_separators == 2 and config.single_segment
  assert config.type_vocab_size == 1
  saved, params, _ = workdir_lib.load_params(workdir, step=0)
  assert params["pooler"]["kernel"].shape == (32, 32)
  assert params["nsp"]["kernel"].shape == (32, 2)
  assert np.abs(params["nsp"]["kernel"]).max() > 0  # initialised, not zeros
  assert jax.tree.map(np.shape, core.param_shapes(core.build_model(saved))) == (
      jax.tree.map(np.shape, params))
  # Without a base config (bertjax.load of the HF directory) there is none.
  assert "pooler" not in workdir_lib.load_hf(str(roberta))[1]

  train_config = config_files.shipped("hf").get_config(workdir)
  for k, v in dict(data_dir=str(tmp_path / "data"), batch_size=8, seq_len=32,
                   max_predictions_per_seq=5, num_train_steps=2, warmup_steps=1,
                   checkpoint_every_steps=2, log_every_steps=1, eval_max_batches=1,
                   shuffle_window=32).items():
    train_config[k] = v
  record = train.train_and_evaluate(train_config, workdir)
  assert record["step"] == 2
  assert np.isfinite(record["mlm_loss"]) and np.isfinite(record["nsp_loss"])
  # The packed pairs have two separators; the model reads segment 0 only
  # (row 1 is missing; reading it made the loss NaN at step 1).
  docs = prepare.prepare(train_config, train_config.data_dir).source("train")
  batch = next(pipeline.make_train_iterator(train_config, docs, local_batch_size=8))
  rows = np.arange(8)
  assert np.all(batch["tokens"][rows, batch["a_lengths"] + 1] == batch_lib.SEP_ID)
  assert np.all(batch["tokens"][rows, batch["a_lengths"] + 2] == batch_lib.SEP_ID)
  assert batch["segment_ids"].max() == 1  # the layout's mark of B
  batch = jax.tree.map(jnp.asarray, batch)
  inputs, _ = jax.jit(objectives.get_objective(train_config).corrupt)(
      jax.random.key(0), batch, jnp.int32(0))
  assert int(inputs["segment_ids"].max()) < train_config.type_vocab_size

  out = str(tmp_path / "hf")
  result = workdir_lib.export_hf(workdir, out)
  assert result["left_out"] == ["pooler", "nsp"]
  import subprocess
  import sys
  run = subprocess.run(
      [sys.executable, "-m", "bertjax.convert", f"--to_hf={tmp_path / 'cli'}",
       f"--workdir={workdir}"], capture_output=True, text=True,
      cwd=os.path.dirname(os.path.dirname(__file__)))
  assert run.returncode == 0, run.stderr[-2000:]
  assert "note: left out pooler, nsp, which the HF class has no place for" in run.stdout
  exported = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
  original = safetensors.numpy.load_file(str(roberta / "model.safetensors"))
  assert set(exported) == set(original) - {"lm_head.decoder.weight",
                                           "lm_head.decoder.bias"}
  hf, info = transformers.RobertaForMaskedLM.from_pretrained(
      out, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
  assert hf.config.vocab_size == hf_config.vocab_size
  from bertjax import api
  ours = api.load(workdir)
  tok = transformers.AutoTokenizer.from_pretrained(out)
  pair = tok(*PAIRS[0], return_tensors="pt")
  with torch.no_grad():
    ref = hf.eval()(**pair).logits.numpy()[0]
  got = ours.encode([PAIRS[0]])
  assert np.array_equal(ours.tokenizer.to_hf_ids(got["tokens"][0]),
                        pair["input_ids"][0].numpy())
  logits = got["mlm_logits"][0][..., ours.tokenizer.from_hf_ids(
      np.arange(hf.config.vocab_size))]
  assert np.abs(logits - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())


def test_a_robertamodels_own_pooler_is_kept_for_a_unilm_config(tmp_path):
  # A bare RobertaModel has a pooler (transformers' dense + tanh over <s>):
  # a config with a sentence head (configs/unilm.py) uses it, only the NSP
  # head is fresh; configs/roberta.py still lists it as ignored.
  from bertjax import api
  from bertjax import config_files
  from bertjax.convert import workdir as workdir_lib
  roberta, bare = tmp_path / "roberta", tmp_path / "bare"
  config = _byte_level_roberta(roberta)
  torch.manual_seed(1)
  model = transformers.RobertaModel(config).eval()  # add_pooling_layer=True
  model.save_pretrained(str(bare))
  for name in os.listdir(roberta):
    if not name.startswith(("model", "config")):
      (bare / name).write_bytes((roberta / name).read_bytes())
  report = workdir_lib.import_hf(str(bare), str(tmp_path / "unilm"),
                                 config_files.shipped("unilm").get_config("tiny"))
  assert report.initialised == ["mlm", "nsp"] and report.unused == []
  assert report.config.objective == "unilm" and report.config.pair_separators == 2
  tok = transformers.AutoTokenizer.from_pretrained(str(roberta))
  with torch.no_grad():
    ref = model(**tok(["Lists are mutable."], return_tensors="pt")).pooler_output.numpy()
  got = api.load(str(tmp_path / "unilm")).encode(["Lists are mutable."])["pooled"]
  assert np.abs(got - ref).max() <= 1e-5
  report = workdir_lib.import_hf(str(bare), str(tmp_path / "mlm"),
                                 config_files.shipped("roberta").get_config("tiny"))
  assert report.initialised == ["mlm"]
  assert report.unused == ["pooler.dense.bias", "pooler.dense.weight"]
