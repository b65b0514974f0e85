"""Hugging Face interop for RoBERTa and ALBERT: numerical parity with
transformers (padding in the batch), bit-identical round trips, tokenizers
that give transformers' ids, bare encoders, and continued pretraining."""

import io
import json
import os
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax.convert import workdir as workdir_lib

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

CORPUS = (["The quick brown fox jumps over the lazy dog."] * 10 +
          ["the cat sat on the mat, and a dog sat on a log."] * 10 +
          ["Héllo, WORLD!! The cat's mats... naïve café", "你好 世界 ok",
           "e-mail: someone@example.com (2024) — ‘quotes’", "It costs 1,000 dollars."] * 4 +
          # Teaches sentencepiece pieces such as '9,', which ALBERT's
          # tokenizer splits into '9' ','.
          ["It costs 1,000, or 2,500, dollars 9,9,"] * 20)
TEXTS = ["Héllo, WORLD!! The cat's mats... naïve café", "你好 世界 ok",
         "e-mail: someone@example.com (2024) — ‘quotes’", "  spaced\tout \n text  ",
         "It costs 1,000 dollars, ``said'' the dog.", "pay 9,9, or 2,500, now"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=40,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# The numerics of the released checkpoints, which differ from BERT's exact
# GELU and epsilon 1e-12: roberta-base/large and ALBERT v2.
NUMERICS = {"roberta": dict(layer_norm_eps=1e-5, hidden_act="gelu"),
            "albert": dict(layer_norm_eps=1e-12, hidden_act="gelu_new")}


def _roberta_tokenizer(path):
  """Byte-level BPE trained here, with <mask> last as in roberta-base."""
  from tokenizers import ByteLevelBPETokenizer
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(CORPUS, vocab_size=300, min_frequency=1,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
  bpe.save_model(path)
  with open(os.path.join(path, "vocab.json")) as f:
    vocab = json.load(f)
  vocab["<mask>"] = len(vocab)
  with open(os.path.join(path, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  transformers.RobertaTokenizer(os.path.join(path, "vocab.json"),
                                os.path.join(path, "merges.txt")).save_pretrained(path)
  return len(vocab)


def _albert_tokenizer(path):
  """A sentencepiece unigram model laid out as ALBERT's: <pad> <unk> [CLS] [SEP] [MASK]."""
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=90,
      model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
      control_symbols=["[CLS]", "[SEP]", "[MASK]"], hard_vocab_limit=False,
      character_coverage=1.0, minloglevel=2)
  spiece = os.path.join(path, "spiece.model")
  with open(spiece, "wb") as f:
    f.write(model.getvalue())
  tok = transformers.AlbertTokenizer(spiece)
  tok.save_pretrained(path)
  return len(tok)


def _perturb(model):
  # Non-zero biases and LayerNorm parameters, so that a misplaced one shows.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


@pytest.fixture(scope="module", params=["roberta", "albert"])
def hf_model(request, tmp_path_factory):
  """(kind, directory, the HF PyTorch model) of a random tiny HF model."""
  kind = request.param
  path = str(tmp_path_factory.mktemp(f"hf_{kind}"))
  torch.manual_seed(0)
  if kind == "roberta":
    vocab = _roberta_tokenizer(path)
    config = transformers.RobertaConfig(vocab_size=vocab, type_vocab_size=1,
                                        **SIZES, **NUMERICS[kind])
    model = transformers.RobertaForMaskedLM(config)
  else:
    vocab = _albert_tokenizer(path)
    config = transformers.AlbertConfig(vocab_size=vocab, embedding_size=16,
                                       type_vocab_size=2, **SIZES, **NUMERICS[kind])
    model = transformers.AlbertForPreTraining(config)
  model = _perturb(model).eval()
  model.save_pretrained(path)
  return kind, path, model


def _hf_outputs(kind, model, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  logits = out.logits if kind == "roberta" else out.prediction_logits
  return out, out.hidden_states[-1].numpy(), logits.numpy()


def _close(ours, ref):
  return np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()


def test_hidden_states_and_logits_match_pytorch(hf_model):
  from bertjax import api
  kind, path, hf = hf_model
  model = api.load(path)
  tok, vocab = model.tokenizer, hf.config.vocab_size
  if kind == "roberta":
    # <s>=0 <pad>=1 </s>=2 <unk>=3, <mask> last: moved to bertjax's 0..4.
    assert tok.special_ids == [1, 3, 0, 2, vocab - 1]
    assert model.config["max_position_embeddings"] == 40 - 2
  else:
    assert tok.special_ids == [0, 1, 2, 3, 4]
  pad = hf.config.pad_token_id
  rng = np.random.default_rng(1)
  # One shape (one compile). The longest row reaches bertjax position 37,
  # RoBERTa's last HF row (39 = 37 + offset 2); the others end in padding.
  lengths = [38, 20, 7, 1]
  length = max(lengths)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int64)
  # Real tokens are never the pad id (HF RoBERTa would skip their positions).
  ids = rng.integers(0, vocab - 1, (len(lengths), length))
  ids = np.where(ids >= pad, ids + 1, ids) * mask + pad * (1 - mask)
  types = (np.arange(length)[None] >= np.array(lengths)[:, None] // 2) * mask
  if kind == "roberta":
    types = np.zeros_like(types)
  out, ref_hidden, ref_logits = _hf_outputs(kind, hf, ids, mask, types)
  # bertjax positions count from 0 on every row (api.tokenize's convention).
  ours = model.run(dict(tokens=tok.from_hf_ids(ids), segment_ids=types,
                        positions=np.broadcast_to(np.arange(length), ids.shape),
                        doc_ids=mask))
  real = mask.astype(bool)
  assert _close(ours["hidden"][real], ref_hidden[real])
  logits = ours["mlm_logits"][..., tok.from_hf_ids(np.arange(vocab))]
  assert _close(logits[real], ref_logits[real])
  if kind == "albert":  # the pooler and the sentence-order head
    assert _close(ours["nsp_logits"], out.sop_logits.numpy())
  else:
    assert "nsp_logits" not in ours and "pooled" not in ours


def test_tokenizer_ids_and_encode_match_transformers(hf_model):
  from bertjax import api
  from bertjax.convert import hf_tokenizers
  kind, path, hf = hf_model
  ours = hf_tokenizers.HfTokenizer(path)
  slow_cls = transformers.RobertaTokenizer if kind == "roberta" else transformers.AlbertTokenizer
  slow = slow_cls.from_pretrained(path)
  for text, ids in zip(TEXTS, ours.encode_batch(TEXTS)):
    assert list(ours.to_hf_ids(ids)) == slow(text, add_special_tokens=False)["input_ids"], text
  # End to end: api.encode's rows (specials, pair format, segments, positions)
  # against transformers' tokenizer and model, singles and pairs in one batch.
  fast = transformers.AutoTokenizer.from_pretrained(path)
  firsts = ["The cat sat on the mat.", "a dog", "The quick brown fox"]
  seconds = ["The lazy dog.", "sat on a log, and the cat sat", "jumps."]
  refs = [fast(a) for a in firsts] + [fast(a, b) for a, b in zip(firsts, seconds)]
  out = api.load(path).encode(firsts + list(zip(firsts, seconds)))
  length = out["tokens"].shape[1]
  ids, mask, types = (np.zeros((len(refs), length), np.int64) for _ in range(3))
  ids += hf.config.pad_token_id
  for row, ref in enumerate(refs):
    n = len(ref["input_ids"])
    ids[row, :n], mask[row, :n] = ref["input_ids"], 1
    types[row, :n] = ref.get("token_type_ids", [0] * n)
  assert np.array_equal(out["mask"], mask.astype(bool))
  assert np.array_equal(ours.to_hf_ids(out["tokens"]) * mask, ids * mask)
  _, ref_hidden, ref_logits = _hf_outputs(kind, hf, ids, mask, types)
  real = mask.astype(bool)
  assert _close(out["hidden"][real], ref_hidden[real])
  logits = out["mlm_logits"][..., ours.from_hf_ids(np.arange(hf.config.vocab_size))]
  assert _close(logits[real], ref_logits[real])


@pytest.fixture(scope="module")
def imported(hf_model, tmp_path_factory):
  from bertjax import config_files
  kind, path, _ = hf_model
  base = config_files.shipped(kind).get_config("tiny")
  workdir = str(tmp_path_factory.mktemp(f"imported_{kind}"))
  return workdir, workdir_lib.import_hf(path, workdir, base)


def test_import_and_export_are_bit_identical(hf_model, imported, tmp_path):
  import jax
  import ml_collections
  from bertjax import config_validation
  from bertjax import models
  from bertjax.convert import core
  kind, path, _ = hf_model
  workdir, report = imported
  assert report.initialised == [] and report.unused == []
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  if kind == "roberta":
    assert (saved["model"], saved["sentence_head"], saved["objective"]) == (
        "bert", False, "mlm_only")
    assert (saved["max_position_embeddings"], saved["hf_position_offset"]) == (38, 2)
    assert saved["seq_len"] == 38
  else:
    assert (saved["model"], saved["embedding_size"], saved["layer_sharing"]) == (
        "albert", 16, "all")
  # The checkpoint is the model the saved config builds for bertjax.main.
  config = ml_collections.ConfigDict(saved)
  config_validation.validate(config)
  _, params, _ = workdir_lib.load_params(workdir)
  assert (jax.tree.map(np.shape, core.param_shapes(models.get_model(config))) ==
          jax.tree.map(np.shape, params))
  out = str(tmp_path / "hf")
  workdir_lib.export_hf(workdir, out)
  original = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))
  exported = safetensors_numpy.load_file(os.path.join(out, "model.safetensors"))
  assert set(exported) == set(original)
  for name, array in exported.items():
    assert array.dtype == original[name].dtype, name
    assert np.array_equal(array, original[name]), name
  _, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
  assert info["missing_keys"] == []
  if kind == "albert":  # AlbertForMaskedLM has no pooler and SOP head
    assert {k.split(".")[1] for k in info["unexpected_keys"]} == {"pooler", "classifier"}
    _, info = transformers.AlbertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == []
  assert info["unexpected_keys"] == []
  with open(os.path.join(out, "config.json")) as f:
    exported_config = json.load(f)
  assert exported_config["max_position_embeddings"] == 40
  for field, value in NUMERICS[kind].items():  # recorded on import, written back
    assert saved[field] == value and exported_config[field] == value, field
  assert transformers.AutoTokenizer.from_pretrained(out)("the cat")["input_ids"] == (
      transformers.AutoTokenizer.from_pretrained(path)("the cat")["input_ids"])


def test_roberta_rows_without_the_import_record_export_as_zeros(hf_model, imported):
  from bertjax import convert
  from bertjax.convert import core
  kind, path, _ = hf_model
  if kind != "roberta":
    pytest.skip("only RoBERTa drops HF rows")
  config, params, _ = workdir_lib.load_params(imported[0])
  dims = core.model_dims(config)
  # A bertjax-pretrained RoBERTa has no kept rows: they are written as zeros.
  tensors = core.params_to_hf(convert.mapping_for_config(dims), dims, params,
                              core.vocab_order(config))
  name = "roberta.embeddings.position_embeddings.weight"
  original = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))[name]
  assert original[:2].any()
  assert np.array_equal(tensors[name][:2], np.zeros_like(original[:2]))
  assert np.array_equal(tensors[name][2:], original[2:])


def test_export_refuses_a_model_type_of_another_architecture(hf_model, imported, tmp_path):
  kind, _, _ = hf_model
  other = "albert" if kind == "roberta" else "roberta"
  with pytest.raises(ValueError, match="cannot be written"):
    workdir_lib.export_hf(imported[0], str(tmp_path / "hf"), model_type=other)


def test_bare_encoders_get_fresh_heads(hf_model, tmp_path):
  import jax
  from bertjax import api
  kind, path, hf = hf_model
  bare = str(tmp_path / "bare")
  # RobertaModel / AlbertModel, with a pooler (RobertaForMaskedLM has none).
  base = transformers.AutoModel.from_config(hf.config).eval()
  base.load_state_dict(getattr(hf, kind).state_dict(), strict=False)
  base.save_pretrained(bare)
  for name in os.listdir(path):
    if not name.startswith(("model", "config")):
      shutil.copy(os.path.join(path, name), bare)
  model = api.load(bare)
  fresh, unused = (["mlm"], ["pooler.dense.bias", "pooler.dense.weight"]) if (
      kind == "roberta") else (["mlm", "sop"], [])
  assert list(model.fresh_heads) == fresh and not model.has_mlm_head
  assert workdir_lib.load_hf(bare)[3] == unused
  # The encoder is the full model's, whose outputs match transformers.
  full = workdir_lib.load_hf(path)[1]
  for part in ("embeddings", "encoder") + (("pooler",) if kind == "albert" else ()):
    assert all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(model.params[part]), jax.tree.leaves(full[part]))), part
  if kind == "albert":  # a fresh SOP head's logits are not returned
    out = model.encode(["the cat sat"])
    assert "mlm_logits" not in out and "nsp_logits" not in out and "pooled" in out


def test_unsupported_configs_are_refused(hf_model, tmp_path):
  kind, path, _ = hf_model
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  changes = [({"hidden_act": "silu"}, "hidden_act")]
  if kind == "albert":
    changes += [({"num_hidden_groups": 2}, "num_hidden_groups=2"),
                ({"inner_group_num": 2}, "inner_group_num=2")]
  else:
    changes += [({"pad_token_id": None}, "pad_token_id")]
  for i, (change, message) in enumerate(changes):
    bad = tmp_path / str(i)
    bad.mkdir()
    with open(bad / "config.json", "w") as f:
      json.dump({**config, **change}, f)
    with pytest.raises(ValueError, match=message):
      workdir_lib.load_hf(str(bad))


@pytest.mark.parametrize("type_vocab_size", [1, 2])
def test_roberta_pairs_match_transformers(hf_model, tmp_path, type_vocab_size):
  # transformers' RoBERTa tokenizer gives every token of a pair segment id 0,
  # also where the checkpoint has a second segment row (RobertaConfig's
  # default type_vocab_size is 2), so bertjax must not use that row.
  from bertjax import api
  kind, path, hf = hf_model
  if kind != "roberta":
    pytest.skip("RoBERTa's one-segment pairs")
  torch.manual_seed(type_vocab_size)
  config = transformers.RobertaConfig(**{**hf.config.to_dict(),
                                         "type_vocab_size": type_vocab_size})
  hf = _perturb(transformers.RobertaForMaskedLM(config)).eval()
  hf_dir = str(tmp_path / "hf")
  hf.save_pretrained(hf_dir)
  for name in os.listdir(path):
    if not name.startswith(("model", "config")):
      shutil.copy(os.path.join(path, name), hf_dir)
  model = api.load(hf_dir)
  firsts = ["The cat sat on the mat.", "a dog", "The quick brown fox"]
  seconds = ["The lazy dog.", "sat on a log, and the cat sat", "jumps."]
  ref = transformers.AutoTokenizer.from_pretrained(hf_dir)(
      firsts, seconds, padding=True, return_token_type_ids=True, return_tensors="np")
  ours = model.tokenize(list(zip(firsts, seconds)))
  mask = ref["attention_mask"]
  assert np.array_equal(ours["doc_ids"], mask)
  assert np.array_equal(model.tokenizer.to_hf_ids(ours["tokens"]) * mask,
                        ref["input_ids"] * mask)
  assert not ref["token_type_ids"].any()
  assert np.array_equal(ours["segment_ids"], ref["token_type_ids"])
  out = model.run(ours)
  _, ref_hidden, ref_logits = _hf_outputs(
      kind, hf, ref["input_ids"], mask, ref["token_type_ids"])
  real = mask.astype(bool)
  assert _close(out["hidden"][real], ref_hidden[real])
  logits = out["mlm_logits"][..., model.tokenizer.from_hf_ids(np.arange(config.vocab_size))]
  assert _close(logits[real], ref_logits[real])


def test_imported_roberta_trains_pairs_with_one_segment_id(hf_model, imported):
  # Continued pretraining of an imported RoBERTa keeps RoBERTa's single
  # segment id even in a layout that makes pairs (segment 1 for B).
  import jax
  import ml_collections
  from bertjax import api
  from bertjax import batch as batch_lib
  from bertjax import objectives
  from bertjax.data import packing
  kind, _, _ = hf_model
  if kind != "roberta":
    pytest.skip("RoBERTa's one-segment pairs")
  workdir, _ = imported
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  assert config.objective == "mlm_only"
  seq_len = int(config.seq_len)
  pair = packing.pair_row(
      packing.Segment(np.arange(5, 9, dtype=np.int32), np.ones(4, bool)),
      packing.Segment(np.arange(9, 14, dtype=np.int32), np.ones(5, bool)), seq_len)
  assert pair["segment_ids"].any()  # the packer's pair layout: B is segment 1
  batch = batch_lib.empty_batch(2, seq_len)
  for name, value in pair.items():
    batch[name][:] = value
  batch["example_mask"][:] = True
  assert config.single_segment  # recorded by the import
  segments = {}
  for type_vocab_size, single in ((1, True), (2, True), (2, False)):
    config.type_vocab_size, config.single_segment = type_vocab_size, single
    inputs, _ = jax.jit(objectives.get_objective(config).corrupt)(
        jax.random.key(0), batch, np.int32(0))
    segments[type_vocab_size, single] = np.asarray(inputs["segment_ids"])
  assert not segments[1, True].any() and not segments[2, True].any()
  # A two-segment model without the record (a BERT) keeps the packer's ids.
  assert np.array_equal(segments[2, False], batch["segment_ids"])
  # The workdir's model encodes pairs the same way.
  assert not api.load(workdir).tokenize([("a cat", "a dog")])["segment_ids"].any()
