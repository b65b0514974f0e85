"""Hugging Face interop for XLNet: parity with transformers' XLNetLMHeadModel
on random models of two sizes (content stream; query stream under a
perm_mask / target_mapping), bit-identical round trips, the sentencepiece
tokenizer, refused options."""

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

# An odd head count and a clamp of relative distances shorter than the rows.
KINDS = {
    "h3": dict(d_model=30, n_head=3, n_layer=2, d_inner=37, clamp_len=-1),
    "h4": dict(d_model=32, n_head=4, n_layer=3, d_inner=40, clamp_len=5),
}


def _xlnet_tokenizer(path):
  """A sentencepiece model laid out as XLNet's: <unk>=0 <s>=1 </s>=2, then
  <cls> <sep> <pad> <mask> as control symbols."""
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=90,
      model_type="unigram", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
      control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"],
      hard_vocab_limit=False, character_coverage=1.0, minloglevel=2)
  spiece = os.path.join(path, "spiece.model")
  with open(spiece, "wb") as f:
    f.write(model.getvalue())
  tok = transformers.XLNetTokenizer(spiece)
  tok.save_pretrained(path)
  return len(tok)


@pytest.fixture(scope="module", params=sorted(KINDS))
def hf_model(request, tmp_path_factory):
  """(kind, directory, the HF PyTorch model) of a random tiny XLNetLMHeadModel."""
  kind = request.param
  path = str(tmp_path_factory.mktemp(f"hf_xlnet_{kind}"))
  vocab = _xlnet_tokenizer(path)
  torch.manual_seed(len(kind))
  config = transformers.XLNetConfig(vocab_size=vocab, dropout=0.0, layer_norm_eps=1e-7,
                                    ff_activation="gelu", **KINDS[kind])
  model = transformers.XLNetLMHeadModel(config)
  model = _perturb(model).eval()
  model.save_pretrained(path)
  return kind, path, model


def _inputs(tok, vocab, lengths, seed):
  length = max(lengths)
  mask = (np.arange(length)[None] < np.array(lengths)[:, None]).astype(np.int64)
  rng = np.random.default_rng(seed)
  ids = rng.integers(9, vocab, (len(lengths), length)) * mask
  types = (np.arange(length)[None] >= np.array(lengths)[:, None] // 2) * mask
  ours = dict(tokens=tok.from_hf_ids(ids), segment_ids=types,
              positions=np.broadcast_to(np.arange(length), ids.shape), doc_ids=mask)
  return ids, mask, types, ours


def test_content_stream_matches_pytorch(hf_model):
  from bertjax import api
  kind, path, hf = hf_model
  model = api.load(path)
  tok, vocab = model.tokenizer, hf.config.vocab_size
  # <pad> <unk> <cls> <sep> <mask> at bertjax's 0..4.
  assert tok.special_ids == [5, 0, 3, 4, 6]
  ids, mask, types, ours = _inputs(tok, vocab, [13, 9, 4], seed=1)
  with torch.no_grad():
    out = hf(torch.tensor(ids), attention_mask=torch.tensor(mask),
             token_type_ids=torch.tensor(types), output_hidden_states=True)
  ref_hidden, ref_logits = out.hidden_states[-1].numpy(), out.logits.numpy()
  got = model.run(ours)
  real = mask.astype(bool)
  assert _close(got["hidden"][real], ref_hidden[real])
  logits = got["mlm_logits"][..., tok.from_hf_ids(np.arange(vocab))]
  assert _close(logits[real], ref_logits[real])


def test_rows_past_max_position_embeddings_match_pytorch(hf_model):
  """XLNet reads no position table, so the API takes rows longer than the
  trained length (max_position_embeddings 512 on import), as transformers
  does: tokenize's max_length and run past it."""
  from bertjax import api
  kind, path, hf = hf_model
  model = api.load(path)
  limit = int(model.config["max_position_embeddings"])
  tok, vocab = model.tokenizer, hf.config.vocab_size
  ids, mask, types, ours = _inputs(tok, vocab, [limit + 24, 7], seed=3)
  with torch.no_grad():
    ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask),
             token_type_ids=torch.tensor(types), output_hidden_states=True)
  got = model.run(ours)
  real = mask.astype(bool)
  assert got["hidden"].shape[1] == limit + 24
  assert _close(got["hidden"][real], ref.hidden_states[-1].numpy()[real])
  long_text = " ".join(["the cat sat on the mat"] * (limit // 3))
  rows = model.tokenize([long_text], max_length=limit + 10)
  assert rows["tokens"].shape == (1, limit + 10)
  with pytest.raises(ValueError, match="max_length=0 is below 1"):
    model.tokenize(["a"], max_length=0)


def test_query_stream_matches_pytorch_under_a_permutation(hf_model):
  import jax.numpy as jnp
  from bertjax.convert import xlnet as mapping
  kind, path, hf = hf_model
  fields, params, initialised, unused, tok = workdir_lib.load_hf(path)
  assert initialised == [] and unused == []
  vocab, length, slots = hf.config.vocab_size, 11, 4
  ids, mask, types, ours = _inputs(tok, vocab, [length] * 3, seed=2)
  rng = np.random.default_rng(3)
  orders = np.stack([rng.permutation(length) for _ in range(3)])
  rank = np.argsort(orders, axis=1)
  visible = rank[:, None, :] < rank[:, :, None]  # j before i
  targets = orders[:, ::-1][:, :slots]  # the last tokens of each order
  mapping_matrix = np.zeros((3, slots, length), np.float32)
  for b in range(3):
    mapping_matrix[b, np.arange(slots), targets[b]] = 1
  with torch.no_grad():
    out = hf(torch.tensor(ids), token_type_ids=torch.tensor(types),
             perm_mask=torch.tensor((~visible).astype(np.float32)),
             target_mapping=torch.tensor(mapping_matrix), output_hidden_states=True)
  model = mapping.build_model(fields, jnp.float32)
  got = model.apply({"params": params}, {
      **{k: jnp.asarray(v, jnp.int32) for k, v in ours.items()},
      "perm_visible": jnp.asarray(visible),
      "masked_positions": jnp.asarray(targets, jnp.int32)})
  logits = np.asarray(got["mlm_logits"])[..., tok.from_hf_ids(np.arange(vocab))]
  assert _close(logits, out.logits.numpy())
  # hidden_states interleave (h, g) per layer: the last content stream.
  assert _close(np.asarray(got["hidden"]), out.hidden_states[-2].numpy())


def test_two_segments_with_memory_match_pytorch(hf_model):
  """Segment 1 without memory, segment 2 reading segment 1's memory, through
  transformers' XLNetLMHeadModel (``mems``, ``use_mems``) and bertjax's model
  (``memory``): the memory, the content stream and, under a perm_mask /
  target_mapping, the query stream's logits agree within 1e-5."""
  import jax
  import jax.numpy as jnp
  from bertjax.convert import xlnet as mapping
  kind, path, hf = hf_model
  fields, params, _, _, tok = workdir_lib.load_hf(path)
  vocab, length, slots, mem_len = hf.config.vocab_size, 9, 3, 6
  model = mapping.build_model(dict(fields, mem_len=mem_len), jnp.float32)
  run = jax.jit(lambda x: model.apply({"params": params}, x))
  empty = {k: jnp.zeros(s.shape, s.dtype) for k, s in model.carry_shapes(2).items()}
  rng = np.random.default_rng(5)
  order = np.stack([rng.permutation(length) for _ in range(2)])
  rank = np.argsort(order, axis=1)
  visible = rank[:, None, :] < rank[:, :, None]
  targets = order[:, ::-1][:, :slots]
  target_mapping = np.zeros((2, slots, length), np.float32)
  for b in range(2):
    target_mapping[b, np.arange(slots), targets[b]] = 1
  hf.transformer.mem_len = mem_len  # what XLNetModel's cache reads
  try:
    memory, mems = empty, None
    for seed in (6, 7):  # memory holds only real tokens, as transformers' does
      ids, _, types, ours = _inputs(tok, vocab, [length] * 2, seed=seed)
      ours = {k: jnp.asarray(v, jnp.int32) for k, v in ours.items()}
      with torch.no_grad():
        ref = hf.transformer(torch.tensor(ids), token_type_ids=torch.tensor(types),
                             mems=mems, use_mems=True)
        query = hf(torch.tensor(ids), token_type_ids=torch.tensor(types),
                   mems=mems, use_mems=True,
                   perm_mask=torch.tensor((~visible).astype(np.float32)),
                   target_mapping=torch.tensor(target_mapping))
      got = run({**ours, **memory})
      assert _close(np.asarray(got["hidden"]), ref.last_hidden_state.numpy())
      if mems is not None:  # the memory is read: without it the states differ
        alone = np.asarray(run({**ours, **empty})["hidden"])
        assert not _close(alone, ref.last_hidden_state.numpy())
      # transformers' mems: per layer [mem_len, batch, d_model].
      want = np.stack([m.numpy() for m in ref.mems], axis=0).transpose(2, 0, 1, 3)
      assert _close(np.asarray(got["memory"]), want)
      assert np.asarray(got["memory_mask"]).all()
      two = run({**ours, **memory, "perm_visible": jnp.asarray(visible),
                 "masked_positions": jnp.asarray(targets, jnp.int32)})
      logits = np.asarray(two["mlm_logits"])[..., tok.from_hf_ids(np.arange(vocab))]
      assert _close(logits, query.logits.numpy())
      memory = {k: got[k] for k in empty}
      mems = ref.mems
  finally:
    hf.transformer.mem_len = hf.config.mem_len


def test_import_and_export_are_bit_identical(hf_model, tmp_path):
  import ml_collections
  from bertjax import config_files
  from bertjax import config_validation
  kind, path, _ = hf_model
  workdir = str(tmp_path / "imported")
  report = workdir_lib.import_hf(path, workdir,
                                 config_files.shipped("xlnet").get_config("tiny"))
  assert report.initialised == [] and report.unused == []
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  assert (saved["model"], saved["objective"]) == ("xlnet", "xlnet")
  assert saved["clamp_len"] == KINDS[kind]["clamp_len"]
  # transformers' XLNetConfig defaults to mem_len=512: the import keeps it,
  # with the layout its memory needs.
  assert saved["mem_len"] == 512 and saved["layout"] == "stream"
  config_validation.validate(ml_collections.ConfigDict(saved))
  out = str(tmp_path / "hf")
  workdir_lib.export_hf(workdir, out)
  original = safetensors_numpy.load_file(os.path.join(path, "model.safetensors"))
  exported = safetensors_numpy.load_file(os.path.join(out, "model.safetensors"))
  assert set(exported) == set(original) - {"lm_loss.weight"}
  for name, array in exported.items():
    assert array.dtype == original[name].dtype and np.array_equal(array, original[name]), name
  _, info = transformers.XLNetLMHeadModel.from_pretrained(out, output_loading_info=True)
  assert info["missing_keys"] == [] and info["unexpected_keys"] == []


def test_mem_len_travels_both_ways(hf_model):
  from bertjax.convert import xlnet as mapping
  kind, path, _ = hf_model
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  assert config["mem_len"] == 512  # transformers' default
  none = mapping.model_fields({**config, "mem_len": None})
  assert none["mem_len"] == 0 and "layout" not in none
  fields = mapping.model_fields({**config, "mem_len": 6})
  assert fields["mem_len"] == 6 and fields["layout"] == "stream"
  assert mapping.hf_config(fields, 5)["mem_len"] == 6
  assert mapping.hf_config(dict(fields, mem_len=0), 5)["mem_len"] is None


def test_tokenizer_matches_transformers(hf_model):
  from bertjax.convert import hf_tokenizers
  kind, path, _ = hf_model
  if kind != "h3":
    pytest.skip("one model is enough for the tokenizer")
  ours = hf_tokenizers.HfTokenizer(path)
  slow = transformers.XLNetTokenizer.from_pretrained(path)
  for text, ids in zip(TEXTS, ours.encode_batch(TEXTS)):
    assert list(ours.to_hf_ids(ids)) == slow(text, add_special_tokens=False)["input_ids"], text


def test_unsupported_options_are_refused_and_leave_nothing(hf_model, tmp_path):
  from bertjax import config_files
  kind, path, _ = hf_model
  if kind != "h3":
    pytest.skip("one model is enough for the refusals")
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  base = config_files.shipped("xlnet").get_config("tiny")
  for i, (change, message) in enumerate([
      ({"attn_type": "uni"}, "attn_type"),
      ({"bi_data": True}, "bi_data"),
      ({"ff_activation": "silu"}, "ff_activation"),
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
