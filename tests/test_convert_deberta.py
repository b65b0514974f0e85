"""Hugging Face interop for DeBERTa-v2/v3: parity with transformers'
DebertaV2ForMaskedLM on random models of several sizes and bucket settings,
bit-identical round trips, the sentencepiece tokenizer, refused options."""

import io
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax.convert import workdir as workdir_lib
from test_convert_variants import CORPUS, TEXTS, _close, _perturb

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

# Three random models: odd head counts, log buckets on and off, a short
# max_relative_positions that clips, each position term alone and both,
# shared and own position projections, one layer (no stack before the last
# layer), segment and absolute-position tables on and off, the legacy MLM
# head (DebertaV2Config's default) and the non-legacy one, which transformers
# can run only untied (tie_word_embeddings=False).
KINDS = {
    "v3": dict(hidden_size=30, num_attention_heads=3, num_hidden_layers=2,
               pos_att_type="p2c|c2p", share_att_key=True, position_buckets=8,
               max_relative_positions=16, norm_rel_ebd="layer_norm",
               position_biased_input=False, type_vocab_size=0, legacy=True),
    "c2p": dict(hidden_size=16, num_attention_heads=1, num_hidden_layers=3,
                pos_att_type="c2p", share_att_key=False, position_buckets=-1,
                max_relative_positions=6, norm_rel_ebd="none",
                position_biased_input=True, type_vocab_size=2, legacy=False,
                tie_word_embeddings=False),
    "p2c": dict(hidden_size=20, num_attention_heads=5, num_hidden_layers=1,
                pos_att_type=["p2c"], share_att_key=False, position_buckets=6,
                max_relative_positions=-1, norm_rel_ebd="layer_norm",
                position_biased_input=False, type_vocab_size=2, legacy=True),
}


def _deberta_tokenizer(path):
  """A sentencepiece model laid out as DeBERTa-v3's: [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3."""
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=90,
      model_type="unigram", pad_id=0, unk_id=3, bos_id=-1, eos_id=-1,
      pad_piece="[PAD]", unk_piece="[UNK]",
      control_symbols=["[CLS]", "[SEP]", "[MASK]"], hard_vocab_limit=False,
      character_coverage=1.0, minloglevel=2)
  spiece = os.path.join(path, "spm.model")
  with open(spiece, "wb") as f:
    f.write(model.getvalue())
  tok = transformers.DebertaV2Tokenizer(spiece)
  tok.save_pretrained(path)
  return len(tok)


@pytest.fixture(scope="module", params=sorted(KINDS))
def hf_model(request, tmp_path_factory):
  """(kind, directory, the HF PyTorch model) of a random tiny DebertaV2ForMaskedLM."""
  kind = request.param
  path = str(tmp_path_factory.mktemp(f"hf_deberta_{kind}"))
  vocab = _deberta_tokenizer(path)
  torch.manual_seed(len(kind))
  config = transformers.DebertaV2Config(
      vocab_size=vocab, intermediate_size=37, max_position_embeddings=40,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      relative_attention=True, layer_norm_eps=1e-7, hidden_act="gelu",
      pad_token_id=0, **KINDS[kind])
  model = transformers.DebertaV2ForMaskedLM(config)
  with torch.no_grad():  # a relative table of scale 1, as trained ones are
    model.deberta.encoder.rel_embeddings.weight.normal_()
  model = _perturb(model).eval()
  model.save_pretrained(path)
  return kind, path, model


def _hf_outputs(model, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  return out.hidden_states[-1].numpy(), out.logits.numpy()


def test_hidden_states_and_logits_match_pytorch(hf_model):
  from bertjax import api
  kind, path, hf = hf_model
  model = api.load(path)
  tok, vocab = model.tokenizer, hf.config.vocab_size
  assert tok.special_ids == [0, 3, 1, 2, 4]  # [PAD] [UNK] [CLS] [SEP] [MASK]
  assert model.config["emd_layers"] == 0  # transformers has no EMD
  lengths = [38, 20, 7, 1]  # one shape; the longest row reaches position 37
  length = max(lengths)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int64)
  rng = np.random.default_rng(1)
  ids = rng.integers(5, vocab, (len(lengths), length)) * mask
  types = (np.arange(length)[None] >= np.array(lengths)[:, None] // 2) * mask
  if not hf.config.type_vocab_size:
    types = np.zeros_like(types)
  ref_hidden, ref_logits = _hf_outputs(hf, ids, mask, types)
  ours = model.run(dict(tokens=tok.from_hf_ids(ids), segment_ids=types,
                        positions=np.broadcast_to(np.arange(length), ids.shape),
                        doc_ids=mask))
  real = mask.astype(bool)
  assert _close(ours["hidden"][real], ref_hidden[real])
  logits = ours["mlm_logits"][..., tok.from_hf_ids(np.arange(vocab))]
  assert _close(logits[real], ref_logits[real])


def test_fill_mask_past_max_position_embeddings_only_without_a_position_table(hf_model):
  """Relative positions bound no length: without position_biased_input a
  text longer than max_position_embeddings is filled, with scores equal to
  transformers' at that length; with the absolute table it is refused."""
  from bertjax import api, fill_mask
  kind, path, hf = hf_model
  model = api.load(path)
  limit = int(model.config["max_position_embeddings"])
  text = " ".join(["the cat sat on the mat"] * 12) + " [MASK] dog"
  if hf.config.position_biased_input:
    with pytest.raises(ValueError, match=f"longer than the model's {limit}"):
      model.fill_mask(text)
    return
  inputs, where = fill_mask.mask_inputs(model, text)
  assert inputs["tokens"].shape[1] > limit
  ids = model.tokenizer.to_hf_ids(inputs["tokens"])
  _, ref_logits = _hf_outputs(hf, ids, np.ones_like(ids), np.zeros_like(ids))
  ref = ref_logits[0, where[0]]
  ref_probs = np.exp(ref - ref.max()) / np.exp(ref - ref.max()).sum()
  for guess in model.fill_mask(text, top_k=3)[0]:
    hf_id = int(model.tokenizer.to_hf_ids(np.asarray([guess["token_id"]]))[0])
    assert abs(guess["score"] - ref_probs[hf_id]) <= 1e-5


def test_import_and_export_are_bit_identical(hf_model, tmp_path):
  import ml_collections
  from bertjax import config_files
  from bertjax import config_validation
  kind, path, _ = hf_model
  workdir = str(tmp_path / "imported")
  report = workdir_lib.import_hf(path, workdir, config_files.shipped("deberta").get_config("tiny"))
  assert report.initialised == [] and report.unused == []
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  assert (saved["model"], saved["emd_layers"], saved["objective"]) == ("deberta", 0, "mlm_only")
  assert saved["hf_legacy_mlm_head"] == KINDS[kind]["legacy"]
  config_validation.validate(ml_collections.ConfigDict(saved))
  out = str(tmp_path / "hf")
  workdir_lib.export_hf(workdir, out)
  original = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))
  exported = safetensors_numpy.load_file(os.path.join(out, "model.safetensors"))
  tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
  assert set(exported) == set(original) - tied
  for name, array in exported.items():
    assert array.dtype == original[name].dtype and np.array_equal(array, original[name]), name
  _, info = transformers.DebertaV2ForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
  with open(os.path.join(out, "config.json")) as f:
    written = json.load(f)
  for field in ("position_buckets", "max_relative_positions", "share_att_key",
                "position_biased_input", "legacy", "norm_rel_ebd",
                "tie_word_embeddings"):
    assert written[field] == getattr(transformers.DebertaV2Config.from_pretrained(path), field), field


def test_load_encode_matches_transformers_tokenizer_and_model(hf_model):
  from bertjax import api
  from bertjax.convert import hf_tokenizers
  kind, path, hf = hf_model
  if kind != "v3":
    pytest.skip("one model is enough for the tokenizer")
  ours = hf_tokenizers.HfTokenizer(path)
  slow = transformers.DebertaV2Tokenizer.from_pretrained(path)
  for text, ids in zip(TEXTS, ours.encode_batch(TEXTS)):
    assert list(ours.to_hf_ids(ids)) == slow(text, add_special_tokens=False)["input_ids"], text
  firsts = ["The cat sat on the mat.", "a dog", "The quick brown fox"]
  refs = [slow(a) for a in firsts]
  out = api.load(path).encode(firsts)
  length = out["tokens"].shape[1]
  ids, mask = np.zeros((3, length), np.int64), np.zeros((3, length), np.int64)
  for row, ref in enumerate(refs):
    n = len(ref["input_ids"])
    ids[row, :n], mask[row, :n] = ref["input_ids"], 1
  assert np.array_equal(out["mask"], mask.astype(bool))
  assert np.array_equal(ours.to_hf_ids(out["tokens"]) * mask, ids)
  ref_hidden, ref_logits = _hf_outputs(hf, ids, mask, np.zeros_like(ids))
  real = mask.astype(bool)
  assert _close(out["hidden"][real], ref_hidden[real])
  logits = out["mlm_logits"][..., ours.from_hf_ids(np.arange(hf.config.vocab_size))]
  assert _close(logits[real], ref_logits[real])


def test_unsupported_options_are_refused_and_leave_nothing(hf_model, tmp_path):
  from bertjax import config_files
  kind, path, _ = hf_model
  if kind != "v3":
    pytest.skip("one model is enough for the refusals")
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  base = config_files.shipped("deberta").get_config("tiny")
  for i, (change, message) in enumerate([
      ({"relative_attention": False}, "relative_attention=false"),
      ({"conv_kernel_size": 3}, "conv_kernel_size=3"),
      ({"embedding_size": 16}, "embedding_size=16"),
      ({"pos_att_type": None}, "pos_att_type"),
      ({"attention_head_size": 7}, "attention_head_size=7"),
      ({"hidden_act": "silu"}, "hidden_act"),
      ({"norm_rel_ebd": "rms"}, "norm_rel_ebd"),
      ({"legacy": False}, "tie_word_embeddings=true"),
  ]):
    bad = tmp_path / f"hf{i}"
    bad.mkdir()
    for name in os.listdir(path):
      if name != "config.json":
        os.symlink(os.path.join(path, name), bad / name)
    with open(bad / "config.json", "w") as f:
      json.dump({**config, **change}, f)
    workdir = tmp_path / f"workdir{i}"
    with pytest.raises(ValueError, match=message) as error:
      workdir_lib.import_hf(str(bad), str(workdir), base)
    assert "\n" not in str(error.value)
    assert not workdir.exists()


def test_emd_table_is_exported_where_transformers_skips_it(hf_model, tmp_path):
  # A bertjax DeBERTa trained with EMD: the decoder's only weights of its own
  # (the absolute position table) go out under the name transformers ignores;
  # the encoder and MLM head load with nothing missing.
  import jax
  from bertjax import convert
  from bertjax.convert import core
  from bertjax.convert import hf_files
  kind, path, _ = hf_model
  if kind != "v3":
    pytest.skip("one model is enough")
  fields, params, _, _, _ = workdir_lib.load_hf(path)
  fields = dict(fields, emd_layers=2)
  shapes = core.param_shapes(core.build_model(fields))
  table = shapes["embeddings"]["position_embeddings"]["embedding"]
  assert table.shape == (40, 30)
  params["embeddings"]["position_embeddings"] = {
      "embedding": np.asarray(jax.random.normal(jax.random.key(0), table.shape))}
  mapping = convert.mapping_for_config(fields)
  tensors = core.params_to_hf(mapping, fields, params, core.vocab_order(fields))
  assert "deberta.embeddings.position_embeddings.weight" in tensors
  out = str(tmp_path / "hf")
  hf_files.write(out, mapping.hf_config(fields, 0), tensors)
  hf_files.copy_tokenizer_files(path, out)
  _, info = transformers.DebertaV2ForMaskedLM.from_pretrained(out, output_loading_info=True)
  # Listed as unexpected and skipped (without a warning: the model class
  # ignores position_embeddings by name).
  assert info["missing_keys"] == []
  assert info["unexpected_keys"] == ["deberta.embeddings.position_embeddings.weight"]
  # Imported back, the table is reported unused and EMD is off.
  back = workdir_lib.load_hf(out)
  assert back[0]["emd_layers"] == 0
  assert back[3] == ["deberta.embeddings.position_embeddings.weight"]
  # The binary said it "ignored" the table it keeps for the export.
  import subprocess
  import sys
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.convert", f"--from_hf={out}",
       f"--workdir={tmp_path / 'imported'}"], capture_output=True, text=True,
      timeout=300, cwd=tmp_path, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert ("note: kept 1 tensors bertjax does not use beside the checkpoint "
          "(hf_kept_tensors.safetensors), for the export to write back: "
          "deberta.embeddings.position_embeddings.weight") in proc.stdout
  assert "ignored" not in proc.stdout
  assert (tmp_path / "imported" / "hf_kept_tensors.safetensors").exists()


def test_bare_debertav2model_gets_a_fresh_mlm_head(hf_model, tmp_path):
  from bertjax import api
  from bertjax.convert import hf_files
  kind, path, hf = hf_model
  if kind != "v3":
    pytest.skip("one model is enough")
  bare = str(tmp_path / "bare")
  base = transformers.DebertaV2Model(hf.config).eval()
  base.load_state_dict(hf.deberta.state_dict())
  base.save_pretrained(bare)
  hf_files.copy_tokenizer_files(path, bare)
  model = api.load(bare)
  assert list(model.fresh_heads) == ["mlm"] and not model.has_mlm_head
  out = model.encode(["the cat sat on the mat"])
  assert "mlm_logits" not in out
  full = api.load(path).encode(["the cat sat on the mat"], mlm=False)
  np.testing.assert_array_equal(out["hidden"], full["hidden"])


def test_an_sop_config_keeps_its_sentence_head_fresh(hf_model, tmp_path):
  # configs/deberta.py:tiny+sop continues an HF DeBERTa with SOP: the import
  # saves the params of that config's model (pooler and SOP head freshly
  # initialised and reported, as for BERT), keeps sentence_head in the
  # saved config, and the export leaves the head out as before.
  from bertjax import config_files
  kind, path, _ = hf_model
  if kind != "v3":
    pytest.skip("one model is enough")
  base = config_files.shipped("deberta").get_config("tiny+sop")
  workdir = str(tmp_path / "sop")
  report = workdir_lib.import_hf(path, workdir, base)
  assert report.config.sentence_head is True and report.config.objective == "albert"
  assert sorted(report.initialised) == ["pooler", "sop"] and report.unused == []
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f)["sentence_head"] is True
  _, params, _ = workdir_lib.load_params(workdir, step=0)
  hidden = KINDS[kind]["hidden_size"]
  assert params["pooler"]["kernel"].shape == (hidden, hidden)
  assert params["sop"]["kernel"].shape == (hidden, 2)
  assert np.abs(params["sop"]["kernel"]).max() > 0  # initialised, not zeros
  out = str(tmp_path / "hf")
  assert workdir_lib.export_hf(workdir, out)["left_out"] == ["pooler", "sop"]
  exported = safetensors_numpy.load_file(os.path.join(out, "model.safetensors"))
  original = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))
  assert set(exported) == set(original) - {"cls.predictions.decoder.weight",
                                           "cls.predictions.decoder.bias"}
  # Without a base config (bertjax.load of the HF directory) there is no head.
  assert "pooler" not in workdir_lib.load_hf(path)[1]
