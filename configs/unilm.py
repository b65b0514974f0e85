r"""UniLM pretraining: one BERT encoder, four self-attention masks, cloze + NSP.

The quick local run on the embedded demo corpus, then its held-out
accuracy per mask type:

  python -m bertjax.main --config=configs/unilm.py:tiny --workdir=/tmp/unilm-demo
  python -m bertjax.evaluate --config=configs/unilm.py:tiny --workdir=/tmp/unilm-demo

``get_config(arg)`` takes a model size: ``tiny`` (the demo run), or ``base``
and ``large`` with the recipe of Dong et al. (2019), section 3: batch of
about 330 sequences of 512 tokens, Adam lr 3e-5 after 40K warmup steps,
770K steps, dropout 0.1, weight decay 0.01, cased 28,996-piece vocabulary.
The paper starts from BERT-large's weights (import them with
``python -m bertjax.convert --from_hf``); from scratch, raise the lr.

What differs from ``configs/bert.py`` (every other field is BERT's):
  objective         'unilm' (bertjax/objectives/unilm.py): per example one
                    of four attention masks -- bidirectional, seq2seq
                    (A sees A; B sees A and its own left context),
                    left-to-right, right-to-left -- drawn with
                    ``unilm_mask_rates``; cloze under every mask, NSP on
                    the bidirectional rows only.
  model             'bert' -- the same encoder; it exports as an HF BERT.
  max_ngram,        cloze spans of 1 token (80%) or 2-3 tokens (10% each),
  ngram_probs       as the paper's "80% one token, 20% bigram or trigram".
  masking           'dynamic' (a fresh mask type and cloze every step).
"""

import ml_collections

from bertjax import config_files

# Loaded by path (configs are data, not a package): the bert.py beside this
# file, else bertjax's shipped one.
bert = config_files.sibling(__file__, "bert")


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  size = arg or "tiny"
  tiny = size == "tiny"
  c = bert.get_config(size)

  # --- variant -------------------------------------------------------------
  c.objective = "unilm"  # bertjax/objectives/unilm.py
  c.model = "bert"  # bertjax/models/bert.py with an attention_mask input
  # Probabilities of the mask types bidirectional, seq2seq, left-to-right,
  # right-to-left (bertjax/objectives/unilm_masks.py): the paper's mix.
  c.unilm_mask_rates = (1 / 3, 1 / 3, 1 / 6, 1 / 6)

  # --- data ----------------------------------------------------------------
  c.vocab_size = 8000 if tiny else 28_996  # BERT-large cased, as the paper
  c.layout = "sentence_pairs"  # [CLS] A [SEP] B [SEP]: seq2seq's source, target

  # --- sequence and masking ------------------------------------------------
  c.max_ngram = 3  # cloze spans of up to 3 tokens ...
  c.ngram_probs = (0.8, 0.1, 0.1)  # ... P(1), P(2), P(3)
  c.whole_word_masking = False  # spans count tokens, as in the paper
  c.masking = "dynamic"  # new mask types and cloze positions every step
  c.dupe_factor = 1  # no static copies with dynamic masks

  # --- optimisation --------------------------------------------------------
  if not tiny:
    c.batch_size = 320  # the paper's 330, rounded to divide power-of-2 meshes
    c.num_train_steps = 770_000
    c.learning_rate = 3e-5  # continued from BERT-large weights in the paper
    c.warmup_steps = 40_000
  return c
