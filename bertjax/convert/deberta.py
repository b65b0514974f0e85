"""DeBERTa v2/v3 <-> Hugging Face ``DebertaV2ForMaskedLM`` (model_type 'deberta-v2').

bertjax's DeBERTa (bertjax/models/deberta.py) is transformers' DebertaV2 with
``relative_attention=True``: the same disentangled attention (c2p/p2c,
``share_att_key``, log buckets, LayerNorm'd relative table), BERT-style blocks
and the tied MLM head. The first L-1 layers are bertjax's ``encoder/layer_i``,
the last is ``last_layer``.

Enhanced mask decoder. transformers' DebertaV2ForMaskedLM has no EMD: its MLM
head reads the last layer. So:
  import  sets ``emd_layers=0``, so that bertjax computes what transformers
          computes (hidden states and MLM logits both match). A position
          table in a checkpoint with ``position_biased_input=False`` (the
          original EMD's, which transformers ignores too) is reported unused
          and kept as saved beside the checkpoint (``KEPT_WHOLE``, in the
          workdir's hf_kept_tensors.safetensors), so that the export writes
          it back and export -> import -> export stays bit-identical.
  export  writes the encoder and the MLM head. EMD has no weights of its own
          (it re-runs the last layer) except the absolute position table; that
          is written as ``deberta.embeddings.position_embeddings.weight``.
          DebertaV2ForMaskedLM (transformers 4.57 checked) lists it as
          unexpected and skips it with its usual warning ("Some weights of
          the model checkpoint ... were not used"; only the bare
          DebertaV2Model ignores it by name, without a warning), as it does
          for the original checkpoints; nothing is lost on disk, but
          transformers' MLM logits of an EMD-trained model are those of the
          last layer without EMD.
          bertjax's optional SOP head (pooler + sop) has no place in
          DebertaV2ForMaskedLM and is left out.
Sentence head. config.json does not choose it (DebertaV2ForMaskedLM has
none): the import saves the params of the base config's model, as for BERT
(``workdir._with_base_choices``), so ``--config=configs/deberta.py:base+sop``
gets a pooler and SOP head freshly initialised and reported (``FRESH_ONLY``);
without a base config (``bertjax.load`` of an HF directory) there is none.
Refused on import, with the reason: ``relative_attention=False`` (v1-style
absolute attention), no position terms, the convolution of v2-xlarge/xxlarge
(``conv_kernel_size``), an ``embedding_size`` or ``attention_head_size`` other
than the hidden size's, and activations bertjax does not compute.
The MLM head is transformers' legacy ``cls.predictions`` (DebertaV2Config's
default) or, with ``legacy=False``, ``lm_predictions.lm_head`` (same
computation, other names); the import records which (``hf_legacy_mlm_head``)
and the export writes it back. The non-legacy layout exists in transformers
only with ``tie_word_embeddings=False``: with the default True, transformers
(4.57 checked) ties the head's H x H dense kernel to the V x H word table and
the model cannot run, so such a config.json is refused; the export of a
non-legacy head writes ``tie_word_embeddings: false``. Both layouts are
tested (tests/test_convert_deberta.py). A config.json without ``legacy``
(the released microsoft/deberta-v3-* files, whose head is named
lm_predictions) loads no MLM head in transformers; the import does the same
(a fresh MLM head, reported, the lm_predictions tensors listed as unused).
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.convert import bert as bert_mapping
from bertjax.convert import rules as R
from bertjax.models import deberta as deberta_model
from bertjax.models import layers

MODEL_TYPE = "deberta-v2"
BERTJAX_MODEL = "deberta"
BASE_CONFIG = "deberta"  # configs/deberta.py: whole-word dynamic MLM
HF_ARCHITECTURE = "DebertaV2ForMaskedLM"
BASE_PREFIX = "deberta."
# Buffers and the tied decoder of the legacy head.
IGNORED = ("deberta.embeddings.position_ids", "cls.predictions.decoder.weight",
           "cls.predictions.decoder.bias")
# HF tensors with no bertjax parameter once imported (emd_layers=0) that the
# import keeps whole for the export: the EMD's absolute position table.
KEPT_WHOLE = ("deberta.embeddings.position_embeddings.weight",)
# Parts of bertjax's model that no HF tensor holds: initialised afresh on
# import where the config builds them (sentence_head), never exported.
FRESH_ONLY = ("pooler", "sop")
# What the export leaves out (and says so): those.
NOT_EXPORTED = FRESH_ONLY
# DebertaV2Tokenizer's defaults; v3 puts them at 0 [PAD], 1 [CLS], 2 [SEP],
# 3 [UNK] and [MASK] after the sentencepiece pieces.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

_FIELDS = bert_mapping.HF_FIELDS


def _refuse_unsupported(hf_config: Mapping[str, Any]) -> None:
  """One sentence for each DebertaV2 option bertjax does not compute."""
  hidden, heads = int(hf_config["hidden_size"]), int(hf_config["num_attention_heads"])
  checks = (
      (not hf_config.get("relative_attention", False),
       "relative_attention=false (absolute-position attention); bertjax's DeBERTa "
       "computes the relative (disentangled) attention only"),
      (not deberta_model.position_terms(hf_config.get("pos_att_type")),
       "no pos_att_type; bertjax's DeBERTa needs c2p and/or p2c"),
      (int(hf_config.get("conv_kernel_size", 0) or 0) > 0,
       f"conv_kernel_size={hf_config.get('conv_kernel_size')} (the convolution of "
       "v2-xlarge/xxlarge), which bertjax does not compute"),
      (hf_config.get("legacy", True) is False
       and hf_config.get("tie_word_embeddings", True) is not False,
       "legacy=false with tie_word_embeddings=true, whose MLM head transformers "
       "ties to the word table so that it cannot run; save it with "
       "tie_word_embeddings=false"),
      (int(hf_config.get("embedding_size") or hidden) != hidden,
       f"embedding_size={hf_config.get('embedding_size')} != hidden_size={hidden} "
       "(an embedding projection), which bertjax's DeBERTa does not have"),
      (int(hf_config.get("attention_head_size") or hidden // heads) * heads != hidden,
       f"attention_head_size={hf_config.get('attention_head_size')} with {heads} heads "
       f"!= hidden_size={hidden}, which bertjax's attention does not compute"),
  )
  for bad, reason in checks:
    if bad:
      raise ValueError(f"config.json has {reason}.")


def model_fields(hf_config: Mapping[str, Any]) -> dict[str, Any]:
  """bertjax config fields of an HF DebertaV2 config.json.

  Raises:
    ValueError: for an option bertjax does not compute (module docstring).
  """
  missing = [k for k in _FIELDS if k not in hf_config]
  if missing:
    raise ValueError(f"config.json lacks {missing}; is it a DeBERTa-v2 config?")
  numerics = bert_mapping.hf_numerics(hf_config, default_act="gelu")
  _refuse_unsupported(hf_config)
  fields = {ours: hf_config[theirs] for theirs, ours in _FIELDS.items()}
  norm = str(hf_config.get("norm_rel_ebd") or "none").lower()
  norms = {n.strip() for n in norm.split("|")}
  if norms - {"layer_norm", "none"}:
    raise ValueError(f"config.json has norm_rel_ebd={norm!r}; bertjax computes "
                     "'layer_norm' or 'none'.")
  fields.update(
      model=BERTJAX_MODEL, hf_model_type=MODEL_TYPE,
      position_buckets=int(hf_config.get("position_buckets") or -1),
      max_relative_positions=int(hf_config.get("max_relative_positions") or -1),
      pos_att_type="|".join(deberta_model.position_terms(hf_config.get("pos_att_type"))),
      share_att_key=bool(hf_config.get("share_att_key", False)),
      norm_rel_ebd="layer_norm" if "layer_norm" in norms else "none",
      position_biased_input=bool(hf_config.get("position_biased_input", True)),
      emd_layers=0,
      hf_legacy_mlm_head=bool(hf_config.get("legacy", True)), **numerics)
  deberta_model.check_fields(fields)
  return fields


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of a bertjax DeBERTa config (explicit dimensions)."""
  out = {theirs: config[ours] for theirs, ours in _FIELDS.items()}
  numerics = layers.numerics(config)
  out.update(
      model_type=MODEL_TYPE, architectures=[HF_ARCHITECTURE],
      hidden_act=numerics["activation"], layer_norm_eps=numerics["layer_norm_eps"],
      initializer_range=layers.KERNEL_STDDEV, relative_attention=True,
      position_buckets=int(config.get("position_buckets", -1)),
      max_relative_positions=int(config.get("max_relative_positions", -1)),
      pos_att_type="|".join(deberta_model.position_terms(config.get("pos_att_type"))),
      share_att_key=bool(config.get("share_att_key", True)),
      norm_rel_ebd=str(config.get("norm_rel_ebd", "layer_norm")),
      position_biased_input=bool(config.get("position_biased_input", False)),
      legacy=_legacy(config), pad_token_id=int(pad_token_id))
  # The legacy decoder is the tied word table; the non-legacy head must stay
  # untied, or transformers ties its dense kernel to the table.
  out["tie_word_embeddings"] = _legacy(config)
  return out


def _legacy(config: Mapping[str, Any]) -> bool:
  return bool(config.get("hf_legacy_mlm_head", True))


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """Every tensor of ``DebertaV2ForMaskedLM`` and where it lives in bertjax."""
  emb = "deberta.embeddings"
  out = [R.embedding(f"{emb}.word_embeddings", ("embeddings", "word_embeddings"),
                     vocab=True),
         *R.layer_norm(f"{emb}.LayerNorm", ("embeddings", "layer_norm"))]
  if int(config["type_vocab_size"]) > 0:
    out.append(R.embedding(f"{emb}.token_type_embeddings",
                           ("embeddings", "type_embeddings")))
  positions = R.embedding(f"{emb}.position_embeddings",
                          ("embeddings", "position_embeddings"))
  if config.get("position_biased_input", False):
    out.append(positions)
  elif int(config.get("emd_layers", 0)) > 0:
    out.append(R.Rule(positions.hf, positions.path, hf_ndim=2, head="emd"))
  terms = deberta_model.position_terms(config.get("pos_att_type"))
  share = bool(config.get("share_att_key", True))
  num_layers = int(config["num_layers"])
  for i in range(num_layers):
    hf = f"deberta.encoder.layer.{i}"
    ours = ("last_layer",) if i == num_layers - 1 else ("encoder", f"layer_{i}")
    for theirs, name in (("query_proj", "query"), ("key_proj", "key"),
                         ("value_proj", "value")):
      out += R.linear(f"{hf}.attention.self.{theirs}", ours + ("attention", name))
    if not share:
      for term, theirs, name in (("c2p", "pos_key_proj", "pos_key"),
                                 ("p2c", "pos_query_proj", "pos_query")):
        if term in terms:
          out += R.linear(f"{hf}.attention.self.{theirs}", ours + ("attention", name))
    out += R.linear(f"{hf}.attention.output.dense", ours + ("attention", "out"),
                    in_axes=2)
    out += R.layer_norm(f"{hf}.attention.output.LayerNorm", ours + ("attention_norm",))
    out += R.linear(f"{hf}.intermediate.dense", ours + ("mlp", "wi"))
    out += R.linear(f"{hf}.output.dense", ours + ("mlp", "wo"))
    out += R.layer_norm(f"{hf}.output.LayerNorm", ours + ("mlp_norm",))
  out.append(R.embedding("deberta.encoder.rel_embeddings", ("relative",)))
  if config.get("norm_rel_ebd", "layer_norm") == "layer_norm":
    out += R.layer_norm("deberta.encoder.LayerNorm", ("relative", "layer_norm"))
  head = "cls.predictions" if _legacy(config) else "lm_predictions.lm_head"
  dense, norm = (("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm")
                 if _legacy(config) else (f"{head}.dense", f"{head}.LayerNorm"))
  out += R.linear(dense, ("mlm_head", "dense"), head="mlm")
  out += R.layer_norm(norm, ("mlm_head", "layer_norm"), head="mlm")
  out.append(R.Rule(f"{head}.bias", ("mlm_head", "output_bias"), vocab=True, head="mlm"))
  return out


def build_model(config: Mapping[str, Any], dtype: Any) -> deberta_model.DebertaForPretraining:
  """The bertjax module for explicit dimensions (num_layers, hidden_size, ...)."""
  return deberta_model.from_config(config, dtype)
