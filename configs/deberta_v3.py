r"""DeBERTa-v3: ELECTRA's replaced-token detection with DeBERTa encoders.

The quick local run on the embedded demo corpus:

  python -m bertjax.main --config=configs/deberta_v3.py:tiny --workdir=/tmp/deberta-v3-demo

He, Gao and Chen (2021), "DeBERTaV3". No new training code: this is
``configs/deberta.py`` (sizes, tokenizer, layout, attention fields, schedule)
with ``configs/electra.py``'s model and objective on top. ``get_config(arg)``
takes the sizes of ``configs/deberta.py``: tiny, xsmall, small, base, large.

What differs from ``configs/deberta.py``:
  model, objective  'electra' (bertjax/models/electra.py,
                    bertjax/objectives/electra.py) with ``encoder='deberta'``:
                    generator and discriminator are DeBERTa stacks
                    (disentangled attention, relative positions, no absolute
                    positions), sharing the word embeddings.
  generator         the discriminator's width (generator_hidden_fraction
                    1.0) and half its depth (generator_num_layers) (v3).
                    It has no enhanced mask decoder: its MLM head reads its
                    last layer, as transformers' DebertaV2ForMaskedLM does.
  gdes              gradient-disentangled embedding sharing: the
                    discriminator reads stop_gradient(word table) + a delta
                    table initialised at zero, so the discriminator's loss
                    trains the delta only and the generator's MLM loss the
                    table. False: ELECTRA's plain sharing.
  masking           ELECTRA's 15%: 85% [MASK], 15% kept (whole words, dynamic).
  loss              generator MLM + 50 x replaced-token detection.

``python -m bertjax.convert --workdir=... --to_hf=OUT`` writes the
discriminator as a DebertaV2Model (word table = shared table + delta).
"""

import ml_collections

from bertjax import config_files
from bertjax.models import sizes

deberta = config_files.sibling(__file__, "deberta")
electra = config_files.sibling(__file__, "electra")

# ELECTRA's fields that configs/deberta.py has not (or has otherwise).
_ELECTRA_FIELDS = ("objective", "model", "mask_token_rate", "random_token_rate",
                   "disc_loss_weight", "generator_temperature")


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  size = arg or "tiny"
  if "+" in size:
    raise ValueError(f"configs/deberta_v3.py takes a size only, not {arg!r}: "
                     "DeBERTa-v3 has no sentence head.")
  c = deberta.get_config(size)
  rtd = electra.get_config("small")  # the paper's settings, temperature 1
  for field in _ELECTRA_FIELDS:
    setattr(c, field, rtd[field])
  del c.emd_layers  # the ELECTRA towers have no enhanced mask decoder

  # --- variant -------------------------------------------------------------
  c.encoder = "deberta"  # both towers: bertjax/models/deberta.py DisentangledStack
  c.gdes = True  # discriminator word table = stop_gradient(shared) + delta

  # --- generator: the discriminator's width, half its depth ------------------
  # Sized as configs/electra.py's: the width by the fraction of the
  # discriminator's heads (v3: all of them), unless generator_hidden_size,
  # generator_num_heads and generator_mlp_dim are all set (> 0), which then
  # win; the depth by generator_num_layers (0 = the discriminator's).
  disc = sizes.resolve(c)
  c.embedding_size = disc.hidden_size  # E = H: no projections
  c.generator_hidden_fraction = 1.0
  c.generator_num_layers = max(1, disc.num_layers // 2)
  c.generator_hidden_size = 0
  c.generator_num_heads = 0
  c.generator_mlp_dim = 0
  if size == "tiny":
    c.num_train_steps = 600
    c.checkpoint_every_steps = 300
  return c
