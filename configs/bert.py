r"""BERT pretraining: masked LM (80/10/10) + next-sentence prediction.

The quick local run on the embedded demo corpus (Python's own documentation):

  python -m bertjax.main --config=configs/bert.py:tiny --workdir=/tmp/bertjax-demo

``get_config(arg)`` takes a model size (tiny, mini, small, medium, base, large).
``tiny`` is also the demo run: a short schedule (1000 steps of 32 x 128
tokens, no dropout, peak lr 2e-3) that finishes in minutes on a laptop CPU. The other sizes get BERT's paper schedule (1M steps, batch 256,
seq 512, lr 1e-4). Any field can be overridden: ``--config.batch_size=64``.
"""

import ml_collections

from bertjax.models import sizes


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  size = arg or "tiny"
  sizes.check_config_arg(size)  # fails early, listing the sizes
  c = ml_collections.ConfigDict()

  # --- variant -------------------------------------------------------------
  c.objective = "bert"  # objective registered in bertjax.objectives
  c.model = "bert"  # architecture registered in bertjax.models
  c.model_size = size  # row of bertjax/models/sizes.py

  # --- data ----------------------------------------------------------------
  # TFDS name of the text source: 'bertjax_python_docs' (embedded demo),
  # 'bertjax_local_text' (config.text_files), or any TFDS text dataset such as
  # 'wikipedia/20230601.en' (needs it prepared, maybe the tf extra).
  c.dataset = "bertjax_python_docs"
  c.text_files = ""  # comma-separated paths or globs, for bertjax_local_text
  c.text_feature = "text"  # feature holding the text, for public TFDS datasets
  c.data_dir = ""  # prepared corpus, tokenizer and shards; '' = <workdir>/data
  # Several corpora with weights, entries 'dataset key=value ...' separated by
  # ';' (bertjax/data/mixture.py); '' = the one corpus above.
  c.mixture = ""
  c.train_split = "train"
  c.eval_split = "validation"
  c.tokenizer = "unigram"  # sentencepiece model type: 'unigram' | 'bpe'
  c.vocab_size = 8000 if size == "tiny" else 30522
  c.layout = "sentence_pairs"  # packing layout of bertjax.data.pipeline
  c.short_seq_prob = 0.1  # BERT: 10% of pairs get a shorter random target length
  c.pair_chunking = "bert"  # or 'whole_sentences' (bertjax/data/packing.py)
  c.shuffle_window = 1024  # window of the host shuffle of packed examples
  # How prepare works at scale (bertjax/data/prepare.py); the shards it makes
  # do not depend on the first two.
  c.prepare_workers = 0  # tokenizing processes; 0 = one per core
  c.prepare_block_mb = 8.0  # MB of text per unit of work (and per shard)
  # uniform sample the tokenizer trains on; sentencepiece needs ~2 GB per 1M
  c.tokenizer_sample_sentences = 500_000
  # sentencepiece trainer threads: fixed, because its model changes with them.
  # tiny (1.4 MB demo corpus) keeps 1: the tokenizer its figures were measured with.
  c.tokenizer_train_threads = 1 if size == "tiny" else 16

  # --- sequence and masking ------------------------------------------------
  c.seq_len = 128 if size == "tiny" else 512
  c.mask_rate = 0.15  # fraction of non-special tokens chosen for prediction
  c.max_predictions_per_seq = 20 if size == "tiny" else 76  # static MLM slots
  c.mask_token_rate = 0.8  # of the chosen: replaced by [MASK]
  c.random_token_rate = 0.1  # of the chosen: replaced by a random token
  # (the remaining 10% keep their token)
  c.masking = "static"  # 'static': fixed per example | 'dynamic': new each step
  c.dupe_factor = 10  # data copies cycled over epochs: own masks and pairs
  c.whole_word_masking = False  # all sub-tokens of a chosen word share its fate
  c.nsp_negative_rate = 0.5  # fraction of pairs whose B comes from another doc

  # --- model -----------------------------------------------------------------
  c.max_position_embeddings = 512  # learned position table length
  c.type_vocab_size = 2
  # The tiny demo sees a few million tokens: it underfits, so dropout only
  # slows it down (and costs a third of a CPU step). Paper sizes use 0.1.
  c.dropout_rate = 0.0 if size == "tiny" else 0.1
  c.attention_dropout_rate = 0.0 if size == "tiny" else 0.1
  # std of kernels and embeddings (bertjax/state.py). The tiny demo uses 0.1:
  # with 0.02 its held-out NSP was learnt late and abruptly (0.44 to 0.84
  # between checkpoints of one run); with 0.1 it is above 0.7 from step 200.
  c.initializer_range = 0.1 if size == "tiny" else 0.02
  c.layer_norm_eps = 1e-12  # RoBERTa checkpoints use 1e-5 (set on import)
  c.hidden_act = "gelu"  # exact erf GELU; ALBERT v2 checkpoints: gelu_new
  c.dtype = "float32"  # compute dtype: 'float32' | 'bfloat16'

  # --- devices ---------------------------------------------------------------
  # Mesh sizes for the axes data,fsdp,tensor (bertjax/sharding.py); -1 = the
  # remaining devices. "-1,1,1" is pure data parallelism.
  c.mesh_shape = "-1,1,1"

  # --- scale -----------------------------------------------------------------
  c.microbatches = 1  # gradient accumulation: batch_size is split into this many
  c.scan_layers = False  # nn.scan over encoder layers: compile time independent of depth
  c.remat = "none"  # rematerialise each layer: 'none' | 'full' | 'dots' (keep matmuls)
  # Attention kernel (bertjax/models/attention.py): 'auto' (per platform),
  # 'xla', 'dot_product' (cuDNN on GPU), 'splash' (Pallas, TPU).
  c.attention_impl = "auto"
  # The last layer computes only the rows the losses read ([CLS] and the
  # masked positions; keys and values from every row): same logits, fewer
  # FLOPs (bertjax/models/bert.py), with scan_layers too.
  c.sparse_last_layer = True

  # --- optimisation (BERT paper defaults) ------------------------------------
  c.batch_size = 32 if size == "tiny" else 256  # global batch
  c.num_train_steps = 1000 if size == "tiny" else 1_000_000
  c.learning_rate = 2e-3 if size == "tiny" else 1e-4  # peak
  c.warmup_steps = 100 if size == "tiny" else 10_000  # linear warmup
  # then linear decay to 0 at num_train_steps
  c.optimizer = "adamw"  # or 'lamb' (bertjax/optim.py); ALBERT's is LAMB
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.adam_eps = 1e-6
  c.weight_decay = 0.01  # not applied to LayerNorm scales and biases
  c.grad_clip_norm = 1.0

  # --- loop, checkpoints, evaluation ---------------------------------------
  c.seed = 0  # root of every random decision (init, data order, masks)
  c.log_every_steps = 50
  c.checkpoint_every_steps = 250 if size == "tiny" else 5000
  c.keep_checkpoints = 3
  c.eval_every_steps = 0  # 0 = only at the end of training
  c.eval_max_batches = 0  # 0 = the whole held-out split
  c.eval_seed = 1234  # fixed masking seed of evaluation
  # Resuming with a changed data-stream or schedule field (seq_len, batch_size,
  # seed, masking, learning_rate, ...; table in bertjax/compat.py) is refused
  # unless listed here, comma-separated: 'seq_len,batch_size'.
  c.allow_changes = ""
  # When every checkpoint was damaged and set aside, train from step 0 instead
  # of stopping (never done without this).
  c.restart_from_scratch = False

  # --- guards (bertjax/guards.py) --------------------------------------------
  c.nonfinite = "stop"  # NaN/Inf loss: 'stop' at once | 'skip' the update
  c.max_consecutive_skips = 10  # 'skip' mode gives up after this many in a row
  c.debug_nan_step = -1  # test hook: make this step's loss NaN (-1 = never)
  return c
