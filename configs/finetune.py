r"""Fine-tuning a pretrained encoder on a task (``python -m bertjax.finetune``).

  python -m bertjax.finetune --config=configs/finetune.py:coherence \
      --init=/tmp/bertjax-demo --workdir=/tmp/ft-coherence

``get_config(arg)`` takes the task: ``coherence`` and ``cloze_qa`` (demo tasks
built from the demo corpus's held-out documents), ``glue/<name>`` (cola, sst2,
mrpc, qqp, stsb, mnli, qnli, rte, wnli), ``squad`` (v1.1), ``squad/v2.0``
(with unanswerable questions), ``conll2003`` (TFDS,
prepared beforehand in ``tfds_data_dir``), or ``local`` (your files:
``train_files``/``eval_files``). The recipe is the usual one: AdamW, lr 3e-5,
3 epochs, 10% warmup, batch 32; ``layer_decay`` < 1 for layer-wise decay.
The encoder, its size and its tokenizer come from ``--init``.
"""

import ml_collections


def get_config(arg: str = "coherence") -> ml_collections.ConfigDict:
  task = arg or "coherence"
  c = ml_collections.ConfigDict()
  c.task = task  # coherence | cloze_qa | local | squad | squad/v2.0 | conll2003 | glue/<name>
  squad = task.startswith("squad")
  # For task 'local': the files (comma-separated; .csv .tsv .jsonl .json .conll).
  c.train_files = ""
  c.eval_files = ""
  c.task_kind = "classification"  # local tables: 'classification' or 'regression'
  c.text_fields = "sentence"  # local tables: one or two text columns, comma-separated
  c.label_field = "label"  # local tables: the label column
  c.label_names = ""  # local classification: every label, comma-separated ('' = those in train)
  c.tfds_data_dir = ""  # where TFDS tasks are prepared ('' = TFDS's default)
  c.max_train_examples = 0  # use only the first N training examples (0 = all)
  c.max_eval_examples = 0  # score only the first N eval examples (0 = all)
  # Inputs to predict once trained (and whenever the finished run is run
  # again), with the best evaluation's parameters, into predict_<name>.jsonl:
  # files in the task's format, labels optional (comma-separated) ...
  c.predict_files = ""
  c.predict_split = ""  # ... and a split of a TFDS task (e.g. GLUE's 'test')
  c.train_split = "train"
  c.eval_split = "validation_matched" if task == "glue/mnli" else "validation"

  c.random_init = False  # keep --init's architecture and tokenizer, not its weights
  c.pooling = "first"  # sequence head: 'first' token | 'mean' of tokens (dense+tanh) | the encoder's 'pooler'
  c.head_dropout = 0.1  # dropout on the head's input
  # after the first/mean head's dense layer: 'tanh' (BERT's pooler, RoBERTa's
  # head) | 'gelu' (ELECTRA's classification head)
  c.head_activation = "tanh"
  c.seq_len = 384 if squad else 128
  c.doc_stride = 128 if squad else 32  # QA: tokens between window starts
  c.max_query_tokens = 64  # QA: the question is cut to this many tokens
  # QA: longest answer span decoded (a cloze answer is one word: a few pieces)
  c.max_answer_tokens = 8 if task == "cloze_qa" else 30
  # QA: longest answer in whitespace-separated words of the context (0 = no
  # limit); a cloze answer is one word, so its span must stay inside one
  c.max_answer_words = 1 if task == "cloze_qa" else 0
  # QA: may the answer be "no answer"? 'auto' = when the task has questions
  # without one (SQuAD 2.0, local files with empty answers) | 'on' | 'off'
  c.no_answer = "auto"
  # QA: "no answer" where its score ([CLS] start + end) beats the best span's
  # by more than this (the eval's best_*_threshold says what would have been best)
  c.no_answer_threshold = 0.0
  # cloze_qa: share of questions asked of another document's passage, which
  # does not hold the word (their answer is "no answer")
  c.unanswerable_fraction = 0.0

  c.batch_size = 32
  c.num_epochs = 3.0
  c.learning_rate = 3e-5  # peak; the usual range is 2e-5 ... 5e-5
  c.warmup_fraction = 0.1  # of all steps, linear warmup then linear decay to 0
  c.layer_decay = 1.0  # layer-wise lr decay (ELECTRA/DeBERTa use 0.8-0.9); 1 = off
  c.optimizer = "adamw"
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.adam_eps = 1e-6
  c.weight_decay = 0.01
  c.grad_clip_norm = 1.0
  c.main_metric = ""  # best-checkpoint metric; '' = the task's (accuracy, pearson, f1 ...)
  c.nonfinite = "stop"  # NaN/Inf loss or gradient: 'stop' at once | 'skip' the update
  c.max_consecutive_skips = 10  # 'skip' mode gives up after this many in a row
  c.debug_nan_step = -1  # test hook: make this step's loss NaN (-1 = never)

  c.mesh_shape = "-1,1,1"  # devices on data,fsdp,tensor
  c.seed = 0  # head init, batch order, dropout
  c.log_every_steps = 50
  c.checkpoint_every_steps = 1000  # also at the end of every epoch
  c.keep_checkpoints = 2
  return c
