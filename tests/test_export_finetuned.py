"""A fine-tuned model written for transformers (``--to_hf`` of a fine-tuning
workdir): each exported head class loads with no missing or unexpected
weight and computes bertjax's head outputs on the same token ids."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="export parity needs torch (the hf extra)")
transformers = pytest.importorskip("transformers")

from bertjax import config_files  # noqa: E402
from bertjax.convert import workdir as workdir_lib  # noqa: E402
from bertjax.finetune import inference  # noqa: E402
from bertjax.finetune import loop  # noqa: E402

WORDS = "the cat sat on mat dog a".split()


def _tiny(cls_config, cls_model, path, **extra):
  torch.manual_seed(0)
  config = cls_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=48, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, **extra)
  cls_model(config).save_pretrained(path)


@pytest.fixture(scope="module")
def hf_inits(tmp_path_factory):
  """A tiny random BERT and ELECTRA (WordPiece), RoBERTa (byte-level BPE),
  ALBERT, DeBERTa-v3 and XLNet (sentencepiece) directory."""
  bert = str(tmp_path_factory.mktemp("bert"))
  vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + ["##s"]
           + [f"w{i}" for i in range(20)])
  _tiny(transformers.BertConfig, transformers.BertForPreTraining, bert,
        vocab_size=len(vocab), max_position_embeddings=64)
  with open(os.path.join(bert, "vocab.txt"), "w") as f:
    f.write("\n".join(vocab) + "\n")
  electra = str(tmp_path_factory.mktemp("electra"))
  _tiny(transformers.ElectraConfig, transformers.ElectraForPreTraining, electra,
        vocab_size=len(vocab), max_position_embeddings=64, embedding_size=16)
  with open(os.path.join(electra, "vocab.txt"), "w") as f:
    f.write("\n".join(vocab) + "\n")
  roberta = str(tmp_path_factory.mktemp("roberta"))
  from tokenizers import ByteLevelBPETokenizer
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator([" ".join(WORDS)] * 20, vocab_size=300, min_frequency=1,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  bpe.save_model(roberta)
  _tiny(transformers.RobertaConfig, transformers.RobertaForMaskedLM, roberta,
        vocab_size=bpe.get_vocab_size(), max_position_embeddings=70, pad_token_id=1,
        type_vocab_size=1)
  albert = str(tmp_path_factory.mktemp("albert"))
  from test_convert_variants import _albert_tokenizer
  _tiny(transformers.AlbertConfig, transformers.AlbertForPreTraining, albert,
        vocab_size=_albert_tokenizer(albert), embedding_size=16, max_position_embeddings=64)
  deberta = str(tmp_path_factory.mktemp("deberta"))
  from test_convert_deberta import _deberta_tokenizer
  _tiny(transformers.DebertaV2Config, transformers.DebertaV2ForMaskedLM, deberta,
        vocab_size=_deberta_tokenizer(deberta), max_position_embeddings=64,
        relative_attention=True, pos_att_type="p2c|c2p", position_buckets=8,
        max_relative_positions=16, norm_rel_ebd="layer_norm",
        position_biased_input=False, type_vocab_size=0, pad_token_id=0)
  xlnet = str(tmp_path_factory.mktemp("xlnet"))
  from test_convert_xlnet import _xlnet_tokenizer
  torch.manual_seed(0)
  transformers.XLNetLMHeadModel(transformers.XLNetConfig(
      vocab_size=_xlnet_tokenizer(xlnet), d_model=32, n_layer=2, n_head=4, d_inner=48,
      dropout=0.0, ff_activation="gelu")).save_pretrained(xlnet)
  # With a tokenizer.json beside spiece.model, as released XLNet directories
  # have (DeBERTa's here has only its spm.model).
  transformers.XLNetTokenizerFast.from_pretrained(xlnet).save_pretrained(xlnet)
  return {"bert": bert, "roberta": roberta, "electra": electra, "albert": albert,
          "deberta": deberta, "xlnet": xlnet}


def test_an_hf_init_gives_its_architecture_without_its_weights(hf_inits, tmp_path):
  # What a fine-tuned workdir reads of its init (encoder_init.load_architecture):
  # the fields and tokenizer the full read gives, with the weights unreadable.
  import shutil
  from bertjax.finetune import encoder_init
  from bertjax.convert import hf_files
  for name, path in hf_inits.items():
    fields, _, tokenizer = encoder_init.load_init(path)
    copy = tmp_path / name
    shutil.copytree(path, copy)
    (copy / hf_files.SAFETENSORS).write_bytes(b"not safetensors")
    with pytest.raises(Exception):
      encoder_init.load_init(str(copy))
    got_fields, got_tokenizer = encoder_init.load_architecture(str(copy))
    assert got_fields == fields, name
    text = " ".join(WORDS + ["cats", "w3"])
    for a, b in zip(got_tokenizer.encode(text), tokenizer.encode(text)):
      np.testing.assert_array_equal(a, b)


def _finetune(tmp_path, init, train_file, **overrides):
  config = config_files.shipped("finetune").get_config("local")
  for k, v in dict(train_files=str(train_file), eval_files=str(train_file), seq_len=32,
                   batch_size=8, num_epochs=1.0, learning_rate=1e-3, log_every_steps=1000,
                   checkpoint_every_steps=1000, **overrides).items():
    setattr(config, k, v)
  workdir = str(tmp_path / "ft")
  loop.run(config, init, workdir)
  return workdir


def _ours_and_theirs(workdir, out, auto_class, inputs):
  """bertjax's head outputs and the exported model's on the same ids."""
  workdir_lib.export_hf(workdir, out)
  model = inference.load(workdir)
  _, feats, ours = model.logits(inputs)
  hf, info = auto_class.from_pretrained(out, output_loading_info=True)
  assert not any(info.values()), info  # nothing missing, unexpected or mismatched
  to_hf = getattr(model.tokenizer, "to_hf_ids", np.asarray)
  ids = torch.tensor(np.asarray(to_hf(feats["tokens"])), dtype=torch.long)
  kwargs = {"attention_mask": torch.tensor(feats["tokens"] != 0, dtype=torch.long)}
  if getattr(hf.config, "type_vocab_size", 2) > 1:  # XLNet: relative segments
    kwargs["token_type_ids"] = torch.tensor(feats["segment_ids"], dtype=torch.long)
  with torch.no_grad():
    out = hf.eval()(input_ids=ids, **kwargs)
  if hasattr(out, "start_logits"):
    theirs = torch.stack([out.start_logits, out.end_logits], -1).numpy()
  else:
    theirs = out.logits.numpy()
  return ours, theirs, hf, feats


@pytest.mark.parametrize("init,pooling,activation,architecture", [
    ("roberta", "first", "tanh", "RobertaForSequenceClassification"),
    ("electra", "first", "gelu", "ElectraForSequenceClassification"),
    ("albert", "pooler", "tanh", "AlbertForSequenceClassification"),
    ("deberta", "first", "tanh", "DebertaV2ForSequenceClassification"),
    ("xlnet", "first", "gelu", "XLNetForSequenceClassification"),
])
def test_sequence_classifiers_export_as_their_transformers_class(
    hf_inits, tmp_path, init, pooling, activation, architecture):
  rows = [(" ".join(np.random.default_rng(i).choice(WORDS, 5)), "yes" if i % 2 else "no")
          for i in range(16)]
  (tmp_path / "train.csv").write_text("sentence,label\n" + "".join(
      f"{s},{label}\n" for s, label in rows))
  workdir = _finetune(tmp_path, hf_inits[init], tmp_path / "train.csv",
                      pooling=pooling, head_activation=activation)
  ours, theirs, hf, _ = _ours_and_theirs(
      workdir, str(tmp_path / "hf"), transformers.AutoModelForSequenceClassification,
      [s for s, _ in rows])
  assert type(hf).__name__ == architecture
  assert hf.config.id2label == {0: "no", 1: "yes"}
  np.testing.assert_allclose(theirs, ours, atol=1e-4)
  if init == "deberta":  # DeBERTa's pooler takes the head's activation
    assert hf.config.pooler_hidden_act == activation
  if init == "xlnet":  # so does XLNet's sequence summary, over the first token
    assert (hf.config.summary_type, hf.config.summary_activation) == ("first", activation)
  if init != "roberta":
    return
  # A mean-pooled head has no transformers class, nor has a RoBERTa head
  # with ELECTRA's activation: refused before writing.
  for name, change in (("mean", {"pooling": "mean"}), ("gelu", {"head_activation": "gelu"})):
    (tmp_path / name).mkdir()
    other = _finetune(tmp_path / name, hf_inits["roberta"], tmp_path / "train.csv", **change)
    with pytest.raises(ValueError, match="pooling='mean', which no transformers class"
                       if name == "mean" else "head_activation='gelu'"):
      workdir_lib.export_hf(other, str(tmp_path / f"hf_{name}"))
    assert not (tmp_path / f"hf_{name}").exists()


def _tagger_parity(tmp_path, init):
  """Fine-tunes a tagger from ``init``; exported, transformers' logits equal
  bertjax's on the real tokens. Returns the exported class's name."""
  rng = np.random.default_rng(0)
  (tmp_path / "tags.conll").write_text("".join(
      "".join(f"{w} {'B-X' if w == 'cat' else 'O'}\n" for w in rng.choice(WORDS, 6)) + "\n"
      for _ in range(16)))
  tagger = _finetune(tmp_path, init, tmp_path / "tags.conll")
  sentences = [list(rng.choice(WORDS, 6)) for _ in range(4)]
  ours, theirs, hf, feats = _ours_and_theirs(
      tagger, str(tmp_path / "hf_tag"), transformers.AutoModelForTokenClassification,
      sentences)
  real = feats["tokens"] != 0
  np.testing.assert_allclose(theirs[real], ours[real], atol=1e-4)
  return type(hf).__name__


def _reader_parity(tmp_path, init):
  """Fine-tunes an extractive reader (a SQuAD file) from ``init``; exported,
  transformers' start/end logits equal bertjax's. Returns the class's name."""
  import json
  qas = [{"id": str(i), "question": "the cat ?",
          "answers": [{"text": "cat", "answer_start": 4}]} for i in range(16)]
  (tmp_path / "qa.json").write_text(json.dumps(
      {"data": [{"paragraphs": [{"context": "the cat sat on a mat", "qas": qas}]}]}))
  reader = _finetune(tmp_path, init, tmp_path / "qa.json", doc_stride=8)
  ours, theirs, hf, feats = _ours_and_theirs(
      reader, str(tmp_path / "hf_qa"), transformers.AutoModelForQuestionAnswering,
      [{"question": "the dog ?", "context": "a dog sat on the mat"}])
  # bertjax's decoding rules out all but the context and [CLS]: compare there.
  scored = feats["context_mask"].copy()
  scored[:, 0] = True
  np.testing.assert_allclose(theirs[scored], ours[scored], atol=1e-4)
  return type(hf).__name__


# XLNet's AutoModelForQuestionAnswering is XLNetForQuestionAnsweringSimple
# (start/end logits); XLNetForQuestionAnswering is the beam-search reader.
# DeBERTa's directory has no tokenizer.json: answers and word tags are mapped
# through the sentencepiece offsets of bertjax's import.
@pytest.mark.parametrize("init,kind,architecture", [
    ("bert", "tagging", "BertForTokenClassification"),
    ("bert", "qa", "BertForQuestionAnswering"),
    ("deberta", "tagging", "DebertaV2ForTokenClassification"),
    ("deberta", "qa", "DebertaV2ForQuestionAnswering"),
    ("xlnet", "tagging", "XLNetForTokenClassification"),
    ("xlnet", "qa", "XLNetForQuestionAnsweringSimple"),
])
def test_taggers_and_readers_export_as_their_transformers_class(
    hf_inits, tmp_path, init, kind, architecture):
  parity = _tagger_parity if kind == "tagging" else _reader_parity
  assert parity(tmp_path, hf_inits[init]) == architecture
