r"""RoBERTa pretraining: dynamic masked LM only, full-sentence rows, byte BPE.

The quick local run on the embedded demo corpus:

  python -m bertjax.main --config=configs/roberta.py:tiny --workdir=/tmp/roberta-demo

``get_config(arg)`` takes a model size; ``base`` and ``large`` get the
paper's recipe (Liu et al., 2019, Table 9): batch 8K sequences of 512 tokens,
500K steps, Adam β2 0.98 / ε 1e-6, peak lr 6e-4 (base) or 4e-4 (large) after
24K / 30K warmup steps. ``tiny`` is the demo run (minutes on a laptop CPU).

What differs from ``configs/bert.py`` (every other field is BERT's):
  objective   'mlm_only' -- no NSP; the BERT model is built without its
              pooler and sentence head (``sentence_head=False``).
  masking     'dynamic'  -- a fresh mask every time a row is seen.
  layout      'full_sentences' -- rows filled to seq_len with whole sentences,
              crossing documents with a [SEP] between them; attention is
              blocked between the documents of a row unless
              ``attend_across_documents``. 'doc_sentences' never crosses.
  tokenizer   'bpe_bytes' -- sentencepiece BPE with byte fallback; [CLS]
              [SEP] [PAD] [MASK] play RoBERTa's <s> </s> <pad> <mask>.
The paper's 8K batches are the global ``batch_size``; on small hardware
reach them with gradient accumulation (the loop's micro-batching field).
"""

import ml_collections

from bertjax import config_files

# Loaded by path (configs are data, not a package): the bert.py beside this
# file, else bertjax's shipped one.
bert = config_files.sibling(__file__, "bert")

# Paper recipe per size: (peak lr, warmup steps).
_PAPER_LR = {"base": (6e-4, 24_000), "large": (4e-4, 30_000)}


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  size = arg or "tiny"
  tiny = size == "tiny"
  c = bert.get_config(size)

  # --- variant -------------------------------------------------------------
  c.objective = "mlm_only"  # bertjax/objectives/mlm_only.py
  c.model = "bert"  # the BERT encoder and tied MLM head ...
  c.sentence_head = False  # ... without pooler and NSP head (no dead weights)
  del c.nsp_negative_rate  # no sentence-level task

  # --- data ----------------------------------------------------------------
  c.tokenizer = "bpe_bytes"  # byte-level BPE (sentencepiece, byte fallback)
  c.vocab_size = 8000 if tiny else 50_265  # RoBERTa's 50K byte-level BPE
  c.layout = "full_sentences"  # or 'doc_sentences' (never crosses documents)
  del c.short_seq_prob  # rows are always filled to seq_len
  # False: a row's documents do not see each other (doc_ids block attention,
  # positions restart per document). True: the row reads as one text, as in
  # the paper (one doc id, positions 0..L-1).
  c.attend_across_documents = False

  # --- sequence and masking ------------------------------------------------
  c.masking = "dynamic"  # new mask each step: fold_in(seed, step)
  c.whole_word_masking = False  # option of every MLM objective
  c.max_ngram = 1  # n-gram masking (ALBERT) is an option too; 1 = off
  c.type_vocab_size = 1  # a single segment: RoBERTa has no token types

  # --- model ---------------------------------------------------------------
  c.dropout_rate = 0.1  # the paper's, at every size (the tiny run was
  c.attention_dropout_rate = 0.1  # checked with it)

  # --- optimisation --------------------------------------------------------
  c.adam_b2 = 0.98  # more stable than 0.999 with large batches
  c.adam_eps = 1e-6
  c.weight_decay = 0.01
  if tiny:
    c.batch_size = 32
    c.num_train_steps = 800  # about 7 minutes on 2 CPU cores
    c.learning_rate = 1e-3
    c.warmup_steps = 80
  else:
    lr, warmup = _PAPER_LR.get(size, _PAPER_LR["base"])
    c.batch_size = 8192  # global batch of the paper
    c.num_train_steps = 500_000
    c.learning_rate = lr
    c.warmup_steps = warmup
    c.checkpoint_every_steps = 5000
  return c
