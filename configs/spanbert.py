r"""SpanBERT pretraining: geometric whole-word span masking + span boundary objective.

The quick local run on the embedded demo corpus:

  python -m bertjax.main --config=configs/spanbert.py:tiny --workdir=/tmp/spanbert-demo
  python -m bertjax.evaluate --config=configs/spanbert.py:tiny --workdir=/tmp/spanbert-demo

``get_config(arg)`` takes a model size. ``base`` and ``large`` get the recipe
of the paper (Joshi et al., 2020, "SpanBERT", section 4): single segments of
up to 512 tokens, no NSP, dynamic masking, no short-sequence sampling, AdamW
(β1 0.9, β2 0.999, weight decay 0.01) with peak lr 1e-4, 10K warmup steps then
linear decay, dropout 0.1, batch 256, 2.4M steps, BERT's cased vocabulary
size. ``tiny`` is the demo run (minutes on a laptop CPU).

What differs from ``configs/bert.py`` (every other field is BERT's):
  objective   'spanbert' -- span masking (spans of whole words, lengths
              geometric(0.2) clipped at 10, until 15% of the tokens are
              chosen, 80/10/10 per span) and loss = MLM + SBO
              (bertjax/objectives/spanbert.py).
  model       'spanbert' -- BERT's encoder and tied MLM head, no pooler or
              NSP head, plus the SBO head (bertjax/models/spanbert.py).
  layout      'doc_sentences' -- one segment of whole sentences of one
              document per row ([CLS] ... [SEP]); never crosses documents.
  masking     'dynamic' -- a new mask every time a row is seen.
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
  c.objective = "spanbert"  # bertjax/objectives/spanbert.py
  c.model = "spanbert"  # bertjax/models/spanbert.py
  c.sentence_head = False  # no pooler / NSP (also tells flops.py)
  del c.nsp_negative_rate  # no sentence-level task

  # --- data ----------------------------------------------------------------
  c.vocab_size = 8000 if tiny else 28_996  # the paper uses BERT's cased vocab
  c.layout = "doc_sentences"  # single segment, never crosses documents
  del c.short_seq_prob  # the paper drops BERT's short-sequence sampling
  c.type_vocab_size = 1  # a single segment

  # --- span masking ----------------------------------------------------------
  c.masking = "dynamic"  # new mask each step: fold_in(seed, step)
  c.whole_word_masking = True  # spans are measured in whole words
  c.span_geometric_p = 0.2  # span length ~ geometric(p) words ...
  c.max_span_length = 10  # ... clipped at this many (mean 3.8 words)
  # mask_rate 0.15 and mask/random rates 0.8/0.1 (applied per span) as BERT.
  # Largest in-span offset with its own SBO position embedding; later tokens
  # of longer spans (10 words can exceed 32 tokens) share the last one.
  c.sbo_max_offset = 31

  # --- optimisation --------------------------------------------------------
  if tiny:
    # BERT's tiny demo schedule (1000 steps of 32 x 128, no dropout, lr 2e-3).
    c.batch_size = 32
    c.num_train_steps = 1000
    c.learning_rate = 2e-3
    c.warmup_steps = 100
  else:
    c.batch_size = 256
    c.num_train_steps = 2_400_000
    c.learning_rate = 1e-4
    c.warmup_steps = 10_000
    c.dropout_rate = 0.1
    c.attention_dropout_rate = 0.1
  c.optimizer = "adamw"
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.weight_decay = 0.01
  return c
