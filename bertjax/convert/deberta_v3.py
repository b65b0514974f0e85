"""DeBERTa-v3 (ELECTRA-style, ``configs/deberta_v3.py``) -> Hugging Face ``DebertaV2Model``.

A bertjax ELECTRA with ``encoder='deberta'`` holds a generator and a
discriminator built of DeBERTa stacks (``deberta.DisentangledStack``). What
users fine-tune is the discriminator's encoder, which is exactly a
``DebertaV2Model``; ``bertjax/convert/electra.py`` hands such configs here, so
``python -m bertjax.convert --workdir=W --to_hf=OUT`` writes:

* the shared embeddings (``deberta.embeddings``): the word table the
  discriminator reads, i.e. with gradient-disentangled sharing (``gdes``) the
  shared table + the discriminator's delta, folded into one table as
  DeBERTa-v3's released checkpoints do; its LayerNorm and segment table;
* the discriminator's relative table and layers, with ``configs/deberta.py``'s
  rules (``bertjax/convert/deberta.py``) under the ``discriminator/encoder``
  prefix.

Left out, as transformers has no place for them: the replaced-token head (no
DebertaV2ForPreTraining) and the generator (microsoft/deberta-v3-* ship no
generator either). Export only: an HF DebertaV2 directory imports as
``configs/deberta.py``'s MLM model (``bertjax/convert/deberta.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.convert import deberta as deberta_mapping
from bertjax.convert import rules as R

HF_ARCHITECTURE = "DebertaV2Model"
# bertjax path prefix of the discriminator's DeBERTa stack.
_STACK = ("discriminator", "encoder")
_STACK_PARTS = ("encoder", "last_layer", "relative")


def _deberta_fields(config: Mapping[str, Any]) -> dict[str, Any]:
  # No EMD in the ELECTRA towers; positions enter the encoder only if biased.
  return {**config, "emd_layers": 0, "hf_legacy_mlm_head": True}


def rules(config: Mapping[str, Any]) -> list[R.Rule]:
  """The discriminator's tensors under ``DebertaV2ForMaskedLM``'s names
  without its MLM head (what ``DebertaV2Model`` loads)."""
  out = []
  for rule in deberta_mapping.rules(_deberta_fields(config)):
    if rule.head == "mlm":
      continue
    path = _STACK + rule.path if rule.path[0] in _STACK_PARTS else rule.path
    out.append(R.Rule(rule.hf, path, rule.kind, rule.in_axes, rule.hf_ndim,
                      rule.vocab, rule.head))
  return out


def hf_config(config: Mapping[str, Any], pad_token_id: int) -> dict[str, Any]:
  """The HF config.json of the discriminator (a DebertaV2Model)."""
  out = deberta_mapping.hf_config(_deberta_fields(config), pad_token_id)
  out["architectures"] = [HF_ARCHITECTURE]
  return out


def fold_params(config: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
  """``params`` with the word table the discriminator reads: the shared
  table + ``discriminator_word_delta`` under ``gdes``, else unchanged."""
  if not config.get("gdes", False):
    return dict(params)
  table = R.get_path(params, ("embeddings", "word_embeddings", "embedding"))
  delta = R.get_path(params, ("discriminator_word_delta",))
  embeddings = dict(params["embeddings"])
  embeddings["word_embeddings"] = {"embedding": table + delta}
  return {**params, "embeddings": embeddings}
