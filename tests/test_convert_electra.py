"""Hugging Face interop for ELECTRA: a random discriminator (ElectraForPreTraining)
with its generator (ElectraForMaskedLM) in ``generator/``, built here with a
WordPiece vocabulary: parity with transformers, bit-identical round trips,
a bare ElectraModel."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax.convert import workdir as workdir_lib

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

WORDS = ("the quick brown fox jumps over lazy dog cat sat on mat and a log "
         "it costs dollars said now pay or".split())
# Odd head count (3) and a generator narrower than E, as electra-small's.
DISC = dict(embedding_size=24, hidden_size=36, num_hidden_layers=2,
            num_attention_heads=3, intermediate_size=37)
GEN = dict(embedding_size=24, hidden_size=12, num_hidden_layers=2,
           num_attention_heads=1, intermediate_size=20)


def _close(ours, ref):
  return np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()


def _perturb(model):
  # Non-zero biases and LayerNorm parameters, so that a misplaced one shows.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
  """(directory, discriminator, generator): random HF ELECTRA models sharing
  their embeddings, as ELECTRA trains them, with a WordPiece tokenizer."""
  path = str(tmp_path_factory.mktemp("hf_electra"))
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(WORDS) + [
      "##s", "##ed", ",", ".", "!"]
  with open(os.path.join(path, "vocab.txt"), "w") as f:
    f.write("\n".join(vocab) + "\n")
  tok = transformers.ElectraTokenizerFast(os.path.join(path, "vocab.txt"))
  tok.save_pretrained(path)
  common = dict(vocab_size=len(vocab), max_position_embeddings=40, type_vocab_size=2,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  torch.manual_seed(0)
  disc = _perturb(transformers.ElectraForPreTraining(
      transformers.ElectraConfig(**common, **DISC))).eval()
  gen = _perturb(transformers.ElectraForMaskedLM(
      transformers.ElectraConfig(**common, **GEN))).eval()
  gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  disc.save_pretrained(path)
  gen.save_pretrained(os.path.join(path, "generator"))
  return path, disc, gen


def _batch(vocab, seed=1):
  rng = np.random.default_rng(seed)
  lengths = [30, 12, 5, 1]
  length = max(lengths)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int64)
  ids = rng.integers(1, vocab, (len(lengths), length)) * mask
  types = (np.arange(length)[None] >= np.array(lengths)[:, None] // 2) * mask
  return ids, mask, types


def test_discriminator_and_generator_match_pytorch(hf_pair):
  import jax
  from bertjax import api
  path, disc, gen = hf_pair
  model = api.load(path)
  assert model.fresh_heads == ()
  ids, mask, types = _batch(disc.config.vocab_size)
  with torch.no_grad():
    args = dict(attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                output_hidden_states=True)
    ref = disc(torch.tensor(ids), **args)
    ref_gen = gen(torch.tensor(ids), **args)
  tok = model.tokenizer
  inputs = dict(tokens=tok.from_hf_ids(ids), segment_ids=types,
                positions=np.broadcast_to(np.arange(ids.shape[1]), ids.shape),
                doc_ids=mask)
  ours = model.run(inputs)
  real = mask.astype(bool)
  assert _close(ours["hidden"][real], ref.hidden_states[-1].numpy()[real])
  assert _close(ours["rtd_logits"][real], ref.logits.numpy()[real])
  # The generator, through the module's generate method at every position.
  x = {k: np.asarray(v, np.int32) for k, v in inputs.items()}
  x["masked_positions"] = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32),
                                          ids.shape)
  out = jax.jit(lambda p, x: model._module.apply({"params": p}, x, method="generate"))(
      model.params, x)
  logits = np.asarray(out["mlm_logits"])[..., tok.from_hf_ids(np.arange(len(tok.order)))]
  assert _close(np.asarray(out["hidden"])[real], ref_gen.hidden_states[-1].numpy()[real])
  assert _close(logits[real], ref_gen.logits.numpy()[real])


def test_encode_matches_transformers(hf_pair):
  from bertjax import api
  path, disc, _ = hf_pair
  fast = transformers.AutoTokenizer.from_pretrained(path)
  texts = ["the quick brown fox jumps", ("the cat sat on the mat", "a dog said now")]
  out = api.load(path).encode(texts)
  refs = [fast(texts[0]), fast(*texts[1])]
  length = out["tokens"].shape[1]
  ids, mask, types = (np.zeros((2, length), np.int64) for _ in range(3))
  for row, ref in enumerate(refs):
    n = len(ref["input_ids"])
    ids[row, :n], mask[row, :n], types[row, :n] = (
        ref["input_ids"], 1, ref["token_type_ids"])
  tok = api.load(path).tokenizer
  assert np.array_equal(out["mask"], mask.astype(bool))
  assert np.array_equal(tok.to_hf_ids(out["tokens"]) * mask, ids * mask)
  with torch.no_grad():
    ref = disc.electra(torch.tensor(ids), attention_mask=torch.tensor(mask),
                       token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
  real = mask.astype(bool)
  assert _close(out["hidden"][real], ref[real])


def test_import_and_export_are_bit_identical(hf_pair, tmp_path):
  from bertjax import config_files
  path, _, _ = hf_pair
  workdir = str(tmp_path / "work")
  report = workdir_lib.import_hf(
      path, workdir, config_files.shipped("electra").get_config("tiny"))
  assert report.initialised == [] and report.unused == []
  assert (report.config.generator_hidden_size, report.config.embedding_size) == (12, 24)
  out = str(tmp_path / "hf")
  workdir_lib.export_hf(workdir, out)
  for sub in ("", "generator"):
    original = safetensors_numpy.load_file(os.path.join(path, sub, "model.safetensors"))
    exported = safetensors_numpy.load_file(os.path.join(out, sub, "model.safetensors"))
    assert set(exported) == set(original), sub
    for name, array in exported.items():
      assert np.array_equal(array, original[name]), (sub, name)
  _, info = transformers.ElectraForPreTraining.from_pretrained(
      out, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
  _, info = transformers.ElectraForMaskedLM.from_pretrained(
      os.path.join(out, "generator"), output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []
  with open(os.path.join(out, "generator", "config.json")) as f:
    assert json.load(f)["hidden_size"] == 12


def test_bare_electra_model_gets_a_fresh_generator_and_head(hf_pair, tmp_path):
  from bertjax import api
  path, disc, _ = hf_pair
  bare = str(tmp_path / "bare")
  disc.electra.save_pretrained(bare)
  transformers.AutoTokenizer.from_pretrained(path).save_pretrained(bare)
  model = api.load(bare)
  assert set(model.fresh_heads) == {"generator", "rtd"}
  assert "rtd_logits" not in model.encode(["the cat"])
  # 3 heads x 1/4 rounds to one head of the discriminator's width (12).
  assert model.config["generator_hidden_size"] == 12
