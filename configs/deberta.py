r"""DeBERTa (v2/v3 architecture): disentangled attention, EMD, whole-word dynamic MLM.

The quick local run on the embedded demo corpus:

  python -m bertjax.main --config=configs/deberta.py:tiny --workdir=/tmp/deberta-demo

``get_config(arg)`` takes a size: ``tiny`` (the demo run), ``xsmall`` and
``small`` (DeBERTa-v3's: 12 layers H 384 6 heads, 6 layers H 768 12 heads),
``base`` and ``large`` (the paper's, BERT's shapes). Append ``+sop`` (e.g.
``base+sop``) to add the optional sentence-order head: sentence-pair rows and
the ALBERT objective (MLM + SOP) instead of MLM alone. Parameters with the
128,100-token vocabulary (without the word embeddings, EMD's position table
included): xsmall 71.2M (22.0M), small 142.4M (44.0M), base 184.9M (86.6M),
large 435.7M (304.5M), as the released deberta-v3 models.

What differs from ``configs/bert.py`` (every other field is BERT's):
  model       'deberta' (bertjax/models/deberta.py): disentangled attention
              with relative positions shared by the layers, no absolute
              positions in the encoder, the enhanced mask decoder.
  objective   'mlm_only' with whole-word, dynamic masks (DeBERTa has no
              sentence task); '+sop' uses 'albert' (MLM + SOP).
  layout      'doc_sentences': rows of whole sentences from one document.
  recipe      the paper's base/large (He et al., 2021, Table 9 and appendix
              A.4): batch 2K sequences of 512 tokens, 1M steps, Adam
              (0.9, 0.98, ε 1e-6), peak lr 2e-4 (base) or 1e-4 (large),
              10K warmup, dropout 0.1; v3's 128K sentencepiece vocabulary.
"""

import ml_collections

from bertjax import config_files
from bertjax.models import sizes

# Loaded by path (configs are data, not a package): the bert.py beside this
# file, else bertjax's shipped one.
bert = config_files.sibling(__file__, "bert")

# DeBERTa-v3's smaller encoders (microsoft/deberta-v3-xsmall and -small), as
# explicit dimensions: they are not rows of the shared size table.
_V3_SIZES = {
    "xsmall": sizes.Size(num_layers=12, hidden_size=384, num_heads=6, mlp_dim=1536),
    "small": sizes.Size(num_layers=6, hidden_size=768, num_heads=12, mlp_dim=3072),
}
# Peak learning rate of the paper where it is not base's 2e-4.
_PAPER_LR = {"large": 1e-4}


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  size, _, extra = (arg or "tiny").partition("+")
  if extra not in ("", "sop"):
    raise ValueError(f"Unknown config option {extra!r} in {arg!r}; use a size "
                     "such as 'base' or 'base+sop'.")
  tiny = size == "tiny"
  c = bert.get_config("base" if size in _V3_SIZES else size)
  if size in _V3_SIZES:
    c.model_size = "custom"
    for field, value in vars(_V3_SIZES[size]).items():
      setattr(c, field, value)  # explicit dims win over model_size (sizes.resolve)

  # --- variant -------------------------------------------------------------
  c.model = "deberta"  # bertjax/models/deberta.py
  c.objective = "mlm_only"  # MLM alone; '+sop' switches to 'albert' below
  c.sentence_head = extra == "sop"  # pooler + sentence-order head
  del c.nsp_negative_rate
  if c.sentence_head:
    c.objective = "albert"  # MLM + SOP (bertjax/objectives/albert.py)
    c.sop_swap_rate = 0.5  # fraction of pairs presented swapped
    c.layout = "sentence_pairs"
    c.pair_chunking = "whole_sentences"  # A and B stay exactly adjacent
  else:
    c.layout = "doc_sentences"  # whole sentences of one document per row
    del c.short_seq_prob, c.pair_chunking
    # Rows of one document each; there is nothing to attend across.
    c.attend_across_documents = False

  # --- attention ------------------------------------------------------------
  # Relative distances: |d| < position_buckets / 2 kept, longer ones in log
  # buckets up to max_relative_positions (-1 = max_position_embeddings); the
  # shared table has 2 * position_buckets rows (0 = no buckets: 2 *
  # max_relative_positions rows). v3: 256 buckets, max 512.
  c.position_buckets = 32 if tiny else 256
  c.max_relative_positions = -1
  c.pos_att_type = "p2c|c2p"  # position terms: content->position, position->content
  c.share_att_key = True  # v3: positions use the content query/key projections
  c.norm_rel_ebd = "layer_norm"  # LayerNorm on the relative table ('none': off)
  c.position_biased_input = False  # no absolute positions in the encoder
  c.emd_layers = 2  # enhanced mask decoder passes (0 = off, MLM reads H_L)

  # --- data and masking ------------------------------------------------------
  c.tokenizer = "unigram"  # sentencepiece (v3: 128K vocabulary)
  c.vocab_size = 8000 if tiny else 128_100
  c.masking = "dynamic"  # a new mask every step: fold_in(seed, step)
  c.whole_word_masking = True
  c.max_ngram = 1
  c.type_vocab_size = 0  # v3 has no segment embeddings
  c.layer_norm_eps = 1e-7  # DeBERTa's

  # --- optimisation ----------------------------------------------------------
  c.adam_b2 = 0.98
  c.adam_eps = 1e-6
  c.weight_decay = 0.01
  if tiny:
    c.dropout_rate = c.attention_dropout_rate = 0.0
    c.batch_size = 32
    # 600 steps of 32 x 128 tokens: about 6 CPU-minutes (8.75 minutes wall on
    # a busy 2-core machine); held-out MLM 0.238, 4.2x the baseline.
    c.num_train_steps = 600
    c.learning_rate = 1e-3
    c.warmup_steps = 60
  else:
    c.dropout_rate = c.attention_dropout_rate = 0.1
    c.batch_size = 2048
    c.num_train_steps = 1_000_000
    c.learning_rate = _PAPER_LR.get(size, 2e-4)
    c.warmup_steps = 10_000
    c.checkpoint_every_steps = 5000
  return c
