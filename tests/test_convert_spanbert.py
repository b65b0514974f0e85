"""SpanBERT exports as Hugging Face BertForMaskedLM (the form of its released
checkpoints), and so is loadable and fine-tunable like any BERT."""

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def test_spanbert_exports_as_bert_masked_lm_with_parity(tmp_path, demo_data):
  from bertjax import api
  from bertjax import config_files
  from bertjax import train
  from bertjax.convert import workdir as workdir_lib
  from bertjax.finetune import encoder_init
  from bertjax.study import core as study_core
  config = config_files.shipped("spanbert").get_config("tiny")
  config.data_dir = demo_data.data_dir
  for k, v in dict(batch_size=8, seq_len=32, max_predictions_per_seq=5,
                   num_train_steps=3, warmup_steps=1, checkpoint_every_steps=3,
                   log_every_steps=3, eval_max_batches=1, shuffle_window=32).items():
    config[k] = v
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  out = str(tmp_path / "hf")
  assert workdir_lib.export_hf(workdir, out)["step"] == 3
  hf_model, info = transformers.BertForMaskedLM.from_pretrained(
      out, output_loading_info=True)
  # BERT's encoder and MLM head, all there; nothing of the SBO head.
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
  hf_model.eval()
  ours = api.load(workdir)
  texts = ["The Python interpreter is easily extended.", "Lists are mutable."]
  result = ours.encode(texts)
  mask = result["mask"]
  with torch.no_grad():
    ref = hf_model(torch.tensor(result["tokens"].astype(np.int64)),
                   attention_mask=torch.tensor(mask.astype(np.int64)),
                   output_hidden_states=True)
  hidden = ref.hidden_states[-1].numpy()
  assert np.abs(result["hidden"][mask] - hidden[mask]).max() <= 1e-5 * np.abs(hidden).max()
  logits = ref.logits.numpy()
  assert np.abs(result["mlm_logits"][mask] - logits[mask]).max() <= (
      1e-5 * np.abs(logits).max())
  # Fine-tuning and the equal-compute study now take a SpanBERT encoder.
  fields, _, tokenizer = encoder_init.load_init(workdir)
  # ... laid out as the BERT it exports as (one separator, BERT's segments).
  assert encoder_init.encoder_layout(fields, tokenizer) == encoder_init.encoder_layout(
      {**fields, "model": "bert"}, tokenizer)
  assert study_core.finetune_unavailable(config) is None
