"""ELECTRA <-> Hugging Face ``ElectraForPreTraining`` (model_type 'electra').

bertjax's ELECTRA (bertjax/models/electra.py) is one module holding both
networks; Hugging Face ships them as two checkpoints with the same tensor
names under ``electra.``: the discriminator (``ElectraForPreTraining``, or
a bare ``ElectraModel``) and the generator (``ElectraForMaskedLM``, e.g.
google/electra-small-generator). So:

* The HF directory is the discriminator: what users fine-tune, what
  ``bertjax.load(...).encode`` runs and what ``--to_hf`` writes.
* The generator is an optional companion: ``<hf_dir>/generator/`` (also an
  HF directory). Its tensors take part in the mapping under the name prefix
  ``GENERATOR_PREFIX`` (``bertjax.convert.workdir`` reads and writes the
  companion). Without one, the import initialises a fresh generator of
  ``generator_hidden_fraction`` (1/4) of the discriminator's heads.
* Embeddings are shared in bertjax (and were in ELECTRA's training, so the
  released pairs carry equal tables): the discriminator's tables are the
  ones imported; the generator's copies are written on export and read
  only when the discriminator has none.

The discriminator head is dense(H, H) -> hidden_act -> dense(H, 1); the
generator's MLM head is dense(H_g, E) -> exact GELU (HF hard-codes it) ->
LayerNorm(E) -> decoder tied to the word table + bias.
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax import paths
from bertjax.convert import bert as bert_mapping
from bertjax.convert import deberta_v3
from bertjax.convert import rules as R
from bertjax.models import electra as electra_model
from bertjax.models import layers
from bertjax.models import sizes

MODEL_TYPE = "electra"
BERTJAX_MODEL = "electra"
HF_ARCHITECTURE = "ElectraForPreTraining"
GENERATOR_ARCHITECTURE = "ElectraForMaskedLM"
BASE_PREFIX = "electra."
# The companion generator: its subdirectory and its tensors' name prefix.
GENERATOR_DIR = "generator"
GENERATOR_PREFIX = "generator/"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_BUFFERS = ("electra.embeddings.position_ids", "electra.embeddings.token_type_ids")
# Buffers and the generator's tied decoder weight.
IGNORED = _BUFFERS + tuple(GENERATOR_PREFIX + b for b in _BUFFERS) + (
    GENERATOR_PREFIX + "generator_lm_head.weight",)

_FIELDS = {**bert_mapping.HF_FIELDS, "embedding_size": "embedding_size"}
_GENERATOR_FIELDS = {
    "num_hidden_layers": "generator_num_layers",
    "hidden_size": "generator_hidden_size",
    "num_attention_heads": "generator_num_heads",
    "intermediate_size": "generator_mlp_dim",
}


def model_fields(hf_config: Mapping[str, Any],
                 generator_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """bertjax config fields of an HF ELECTRA discriminator config.json (and
  of the companion generator's, when there is one).

  Raises:
    ValueError: where HF computes something bertjax does not (relative
      positions, an activation outside ``layers.ACTIVATIONS``), or the
      generator's vocabulary or embedding width differs.
  """
  numerics = bert_mapping.hf_numerics(hf_config, default_act="gelu")
  kind = hf_config.get("position_embedding_type", "absolute")
  if kind != "absolute":
    raise ValueError(
        f"config.json has position_embedding_type={kind!r}; bertjax's ELECTRA "
        "has learned absolute positions only.")
  missing = [k for k in _FIELDS if k not in hf_config]
  if missing:
    raise ValueError(f"config.json lacks {missing}; is it an ELECTRA config?")
  fields = {ours: hf_config[theirs] for theirs, ours in _FIELDS.items()}
  fields.update(model=BERTJAX_MODEL, **numerics)
  if generator_config is None:
    gen = electra_model.generator_size(
        {**fields, "generator_hidden_fraction": 0.25})
    fields.update(generator_num_layers=gen.num_layers,
                  generator_hidden_size=gen.hidden_size,
                  generator_num_heads=gen.num_heads, generator_mlp_dim=gen.mlp_dim)
    return fields
  for key in ("vocab_size", "embedding_size", "max_position_embeddings",
              "type_vocab_size", "hidden_act", "layer_norm_eps"):
    if generator_config.get(key, hf_config.get(key)) != hf_config.get(key):
      raise ValueError(
          f"The generator's config.json has {key}={generator_config.get(key)!r} "
          f"but the discriminator's {hf_config.get(key)!r}; bertjax's ELECTRA "
          "shares embeddings, so they must agree.")
  fields.update({ours: int(generator_config[theirs])
                 for theirs, ours in _GENERATOR_FIELDS.items()})
  return fields


def _deberta_encoder(config: Mapping[str, Any]) -> bool:
  """DeBERTa towers (configs/deberta_v3.py): exported by convert/deberta_v3.py."""
  return config.get("encoder", "bert") == "deberta"


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of the discriminator (explicit dimensions)."""
  if _deberta_encoder(config):
    return deberta_v3.hf_config(config, pad_token_id)
  out = {theirs: config[ours] for theirs, ours in _FIELDS.items()}
  numerics = layers.numerics(config)
  out.update(
      model_type=MODEL_TYPE, architectures=[HF_ARCHITECTURE],
      hidden_act=numerics["activation"], layer_norm_eps=numerics["layer_norm_eps"],
      initializer_range=layers.KERNEL_STDDEV, position_embedding_type="absolute",
      summary_type="first", pad_token_id=int(pad_token_id))
  return out


def generator_hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of the companion generator (ElectraForMaskedLM)."""
  out = hf_config(config, pad_token_id)
  gen = electra_model.generator_size(config)
  out.update(architectures=[GENERATOR_ARCHITECTURE],
             num_hidden_layers=gen.num_layers, hidden_size=gen.hidden_size,
             num_attention_heads=gen.num_heads, intermediate_size=gen.mlp_dim)
  return out


def _tower(prefix: str, tower: str, size: sizes.Size, embedding_size: int,
           head: str) -> list[R.Rule]:
  """The projection and encoder layers of one HF ElectraModel."""
  out = []
  if embedding_size != size.hidden_size:
    out += R.linear(f"{prefix}electra.embeddings_project", (tower, "projection"),
                    head=head)
  for rule in bert_mapping.rules({"num_layers": size.num_layers,
                                  "sentence_head": False}):
    if rule.hf.startswith("bert.encoder."):
      out.append(R.Rule(prefix + "electra." + rule.hf[len("bert."):],
                        (tower,) + rule.path, rule.kind, rule.in_axes,
                        rule.hf_ndim, head=head))
  return out


def _embeddings(prefix: str, head: str) -> list[R.Rule]:
  emb = f"{prefix}electra.embeddings"
  out = [R.embedding(f"{emb}.word_embeddings", ("embeddings", "word_embeddings"),
                     vocab=True),
         R.embedding(f"{emb}.position_embeddings", ("embeddings", "position_embeddings")),
         R.embedding(f"{emb}.token_type_embeddings", ("embeddings", "type_embeddings")),
         *R.layer_norm(f"{emb}.LayerNorm", ("embeddings", "layer_norm"))]
  return [R.Rule(r.hf, r.path, r.kind, r.in_axes, r.hf_ndim, r.vocab, head)
          for r in out]


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """Every tensor of the discriminator (``ElectraForPreTraining``) and of the
  companion generator (``GENERATOR_PREFIX`` + ``ElectraForMaskedLM`` names).

  The generator comes first: where its embedding copies and the
  discriminator's are both read, the discriminator's are set last and win.
  DeBERTa towers: the discriminator as a DebertaV2Model (convert/deberta_v3.py).
  """
  if _deberta_encoder(config):
    return deberta_v3.rules(config)
  embedding_size = int(config["embedding_size"])
  g = GENERATOR_PREFIX
  out = _embeddings(g, "generator")
  out += _tower(g, "generator", electra_model.generator_size(config),
                embedding_size, "generator")
  out += R.linear(f"{g}generator_predictions.dense", ("generator", "mlm_head", "dense"),
                  head="generator")
  out += R.layer_norm(f"{g}generator_predictions.LayerNorm",
                      ("generator", "mlm_head", "layer_norm"), head="generator")
  out.append(R.Rule(f"{g}generator_lm_head.bias", ("generator", "mlm_head", "output_bias"),
                    vocab=True, head="generator"))
  out += _embeddings("", "encoder")
  out += _tower("", "discriminator", sizes.resolve(config), embedding_size, "encoder")
  out += R.linear("discriminator_predictions.dense", ("discriminator", "head_dense"),
                  head="rtd")
  out += R.linear("discriminator_predictions.dense_prediction",
                  ("discriminator", "head_prediction"), head="rtd")
  return out


def build_model(config: Mapping[str, Any], dtype: Any) -> electra_model.ElectraForPretraining:
  """The bertjax module for explicit dimensions (num_layers, generator_*, ...)."""
  return electra_model.ElectraForPretraining(
      **electra_model.encoder_fields(config),
      vocab_size=config["vocab_size"],
      max_position_embeddings=config["max_position_embeddings"],
      type_vocab_size=config["type_vocab_size"],
      embedding_size=int(config["embedding_size"]),
      discriminator=sizes.resolve(config),
      generator=electra_model.generator_size(config),
      dropout_rate=config["dropout_rate"],
      attention_dropout_rate=config["attention_dropout_rate"], dtype=dtype,
      **layers.numerics(config))


def read_companion_config(hf_dir: str) -> dict[str, Any] | None:
  """config.json of the generator in ``<hf_dir>/generator`` (None when there
  is none), without its tensors."""
  from bertjax.convert import hf_files
  gen_dir = paths.join(hf_dir, GENERATOR_DIR)
  return hf_files.read_config(gen_dir) if paths.isdir(gen_dir) else None


def read_companion(hf_dir: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
  """(config.json, tensors with ``GENERATOR_PREFIX`` names) of the generator
  in ``<hf_dir>/generator``, or (None, {}) when there is none."""
  from bertjax.convert import hf_files
  gen_dir = paths.join(hf_dir, GENERATOR_DIR)
  if not paths.isdir(gen_dir):
    return None, {}
  tensors = hf_files.read_tensors(gen_dir)
  return hf_files.read_config(gen_dir), {GENERATOR_PREFIX + k: v for k, v in tensors.items()}


def split_companion(config: Mapping[str, Any], pad_token_id: int,
                    tensors: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """Takes the generator's tensors out of an exported state dict: returns
  (the discriminator's tensors, {subdirectory: (config.json, tensors)})."""
  if _deberta_encoder(config):  # no generator companion: convert/deberta_v3.py
    return dict(tensors), {}
  own = {k: v for k, v in tensors.items() if not k.startswith(GENERATOR_PREFIX)}
  gen = {k[len(GENERATOR_PREFIX):]: v for k, v in tensors.items()
         if k.startswith(GENERATOR_PREFIX)}
  # Like save_pretrained, leave out the tied decoder weight (the word table).
  return own, {GENERATOR_DIR: (generator_hf_config(config, pad_token_id), gen)}


def fold_params(config: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
  """The params an export reads: with DeBERTa towers and gradient-disentangled
  sharing, the discriminator's word table folded (convert/deberta_v3.py)."""
  return deberta_v3.fold_params(config, params) if _deberta_encoder(config) else dict(params)
