r"""XLNet pretraining: permutation language modelling with two-stream attention.

The quick local run on the embedded demo corpus:

  python -m bertjax.main --config=configs/xlnet.py:tiny --workdir=/tmp/xlnet-demo
  python -m bertjax.main --config=configs/xlnet.py:tiny_mem --workdir=/tmp/xlnet-mem

``get_config(arg)`` takes a model size: ``tiny`` (the demo run), ``base``
(BERT-base's shape, which XLNet-Base shares: 12 layers, H 768, 12 heads, FFN
3072, 32K vocabulary; BERT-base's schedule, as the paper's Base comparison) or ``large`` (XLNet-Large: 24 layers, H 1024, 16
heads; the paper's 500K steps of batch 8192 at lr 4e-4; Yang et al., 2019,
section 3.1 and appendix A.3). A ``_mem`` suffix (``tiny_mem``,
``base_mem``) turns on the segment memory: ``mem_len`` = 3/4 of ``seq_len``
(the paper's 384 of 512) and the ``stream`` layout it needs.

What differs from ``configs/bert.py`` (every other field is BERT's):
  model       'xlnet' (bertjax/models/xlnet.py): relative positions and
              segments, two-stream attention, LM head tied to the input.
  objective   'xlnet' (bertjax/objectives/xlnet.py): a random factorization
              order per example, the last 1/K of it predicted.
  masking     'dynamic': a new order every step ('static' draws one per
              example and ``epoch % dupe_factor``).
  layout      'full_sentences': rows filled with whole sentences; packed
              documents never see each other (doc_ids). With memory
              'stream': the same rows, row r of each batch continuing row r
              of the previous one (bertjax/data/streams.py).
"""

import ml_collections

from bertjax import config_files
from bertjax.models import sizes

bert = config_files.sibling(__file__, "bert")

# The paper's XLNet-Large recipe (appendix A.3).
_LARGE = dict(batch_size=8192, num_train_steps=500_000, learning_rate=4e-4,
              warmup_steps=40_000)


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  size = arg or "tiny"
  sizes.check_config_arg(size, suffix="_mem")  # names the _mem sizes too
  memory = size.endswith("_mem")
  size = size.removesuffix("_mem")
  tiny = size == "tiny"
  c = bert.get_config(size)

  # --- variant -------------------------------------------------------------
  c.objective = "xlnet"  # bertjax/objectives/xlnet.py
  c.model = "xlnet"  # bertjax/models/xlnet.py
  c.partial_prediction_k = 6  # predict the last 1/K of each order (paper: 6)
  # > 0: predict whole-word n-grams of up to max_span words (P(n) ~ 1/n)
  # instead of the last 1/K of a random order; 0 = no spans.
  c.max_span = 0
  c.clamp_len = -1  # relative distances beyond it read as it; -1 = no clamp
  # Segment memory: each layer also reads its input over the last mem_len
  # positions of the previous segment of the same row (stop-gradient,
  # carried in the train state); needs layout 'stream'. 0 = no memory.
  c.mem_len = 0
  for field in ("nsp_negative_rate", "mask_rate", "mask_token_rate",
                "random_token_rate", "whole_word_masking", "short_seq_prob"):
    del c[field]  # no NSP, no corrupted input

  # --- data ----------------------------------------------------------------
  c.vocab_size = 8000 if tiny else 32_000  # XLNet's 32K sentencepiece pieces
  c.layout = "full_sentences"
  c.masking = "dynamic"  # a new factorization order every step
  # Static slots: at least ceil(seq_len / K) (the objective checks).
  c.max_predictions_per_seq = -(-c.seq_len // c.partial_prediction_k)
  if memory:
    c.mem_len = c.seq_len * 3 // 4
    c.layout = "stream"
  c.dropout_rate = 0.0 if tiny else 0.1
  c.attention_dropout_rate = 0.0 if tiny else 0.1
  if size == "large":
    c.update(_LARGE)
    c.checkpoint_every_steps = 5000
  return c
