"""The wrong kind of config, or a size that does not exist, gets one sentence
naming the fix (found by a user sweep of the installed binaries)."""

import json

import pytest

from bertjax import config_files
from bertjax import config_validation


def test_a_fine_tuning_config_given_to_pretraining_names_the_binary():
  config = config_files.load("finetune:coherence")
  with pytest.raises(ValueError, match=r"^This is a fine-tuning config .*"
                     r"python -m bertjax\.finetune"):
    config_validation.validate(config)


def test_an_unknown_size_names_the_config_argument_not_a_field():
  with pytest.raises(ValueError) as error:
    config_files.load("roberta:huge")
  message = str(error.value)
  assert "after the config file's colon" in message
  assert "--config.model_size" not in message  # overriding it cannot help
  assert "tiny" in message and "large" in message


def test_a_hugging_face_directory_given_as_an_import_says_to_import_it(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(
      {"model_type": "bert", "architectures": ["BertForMaskedLM"],
       "hidden_size": 64}))
  with pytest.raises(ValueError, match=r"holds a Hugging Face model, not an "
                     r"import .*--from_hf="):
    config_files.load(f"hf:{tmp_path}")
  # An import's own config.json (bertjax fields) still loads.
  (tmp_path / "config.json").write_text(json.dumps(
      {"objective": "bert", "model": "bert", "model_type": "bert"}))
  assert config_files.load(f"hf:{tmp_path}").objective == "bert"


def test_a_batch_the_devices_cannot_split_is_refused_before_any_data(demo_config):
  # 8 CPU devices (conftest): the check used to wait for the mesh, after the
  # corpus had been prepared into the workdir.
  config = demo_config.copy_and_resolve_references()
  config.batch_size = 12
  with pytest.raises(ValueError, match=r"config\.batch_size=12 is invalid: "
                     r".*8 data-parallel devices") as error:
    config_validation.validate(config)
  # The refusal names a batch size that works (the next multiple).
  assert str(error.value).endswith("e.g. --config.batch_size=16.")
  config.batch_size = 16
  config_validation.validate(config)
  config.microbatches = 3
  with pytest.raises(ValueError, match=r"a multiple of 24, e\.g\. --config\.batch_size=24\.$"):
    config_validation.validate(config)
  config.batch_size = 24
  config_validation.validate(config)


@pytest.mark.parametrize("field, value", [
    ("learning_rate", float("nan")), ("adam_b2", 1.5), ("adam_b1", -0.1),
    ("adam_eps", 0.0), ("weight_decay", -1.0), ("grad_clip_norm", -1.0),
    ("grad_clip_norm", 0.0), ("dropout_rate", 1.5),
    ("attention_dropout_rate", -0.1), ("eval_max_batches", -1),
    ("eval_every_steps", -5), ("seed", -1), ("initializer_range", float("inf")),
    ("type_vocab_size", -1), ("eval_seed", -1), ("max_consecutive_skips", 0),
    ("max_consecutive_skips", -3), ("debug_nan_step", -2), ("nonfinite", "never"),
    ("seed", 2**32), ("eval_seed", 2**63), ("pair_chunking", "sentences"),
    ("layout", "doc_sentencez")])
def test_optimizer_and_loop_numbers_that_would_train_wrongly_are_refused(
    demo_config, field, value):
  # Each of these used to train: NaN from step 1 or 2 (lr NaN, eps 0, dropout
  # 1.5), gradient ascent (clip -1), a frozen model (clip 0), an evaluation
  # that silently left out a batch (eval_max_batches -1), or a bare numpy
  # message naming no field (seed -1; eval_seed -1 at the first evaluation,
  # after training). initializer_range inf stopped at step 1 blaming the
  # learning rate; type_vocab_size -1 died in init with a TypeError about
  # shape (-1, 128). max_consecutive_skips <= 0 stopped at the first skip
  # (as 1) and debug_nan_step -2 never fired (as -1); nonfinite 'never' failed
  # only after the data was prepared and the workdir written. seed 2**32 drew
  # seed 0's init and masks (JAX keeps the low 32 bits), 2**63 was an
  # OverflowError after prepare; pair_chunking 'sentences' failed when the
  # first row was packed, after the workdir was written.
  config = demo_config.copy_and_resolve_references()
  config[field] = value
  with pytest.raises(ValueError, match=rf"^config\.{field}=.* is invalid: .*"
                     rf"--config\.{field}="):
    config_validation.validate(config)


@pytest.mark.parametrize("field, value", [
    ("prepare_block_mb", 0.0), ("prepare_workers", -1),
    ("tokenizer_sample_sentences", 0), ("tokenizer_train_threads", 0)])
def test_prepare_fields_are_refused_before_the_workdir_is_locked(
    demo_config, tmp_path, field, value):
  # Refused by prepare only, after the workdir had been locked and its
  # checkpoints/ made.
  from bertjax import train
  config = demo_config.copy_and_resolve_references()
  config[field] = value
  with pytest.raises(ValueError, match=rf"^config\.{field}={value!r} "):
    config_validation.validate(config)
  workdir = tmp_path / "never"
  with pytest.raises(ValueError, match=rf"^config\.{field}={value!r} "):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize("name", ["roberta", "spanbert", "xlnet"])
def test_sentence_pairs_on_a_single_segment_config_is_refused_up_front(name, tmp_path):
  # These configs drop short_seq_prob: the pipeline failed with an
  # AttributeError traceback once the workdir had been written (and a
  # RoBERTa layout of 'doc_sentencez' when its first row was packed).
  from bertjax import train
  config = config_files.shipped(name).get_config("tiny")
  config.layout = "sentence_pairs"
  workdir = tmp_path / "never"
  with pytest.raises(ValueError, match=(
      r"^config\.layout='sentence_pairs' needs the field short_seq_prob .*; "
      r"set --config\.layout to one of doc_sentences, full_sentences, stream, ")):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()
  config.layout = "doc_sentencez"
  with pytest.raises(ValueError, match=r"^config\.layout='doc_sentencez' is invalid"):
    config_validation.validate(config)


def test_text_files_with_another_dataset_is_refused_not_ignored(demo_config):
  # Only bertjax_local_text reads text_files: with the default dataset the
  # run trained on the demo corpus and never read the user's files.
  config = demo_config.copy_and_resolve_references()
  config.text_files = "corpus/*.txt"
  with pytest.raises(ValueError, match=(
      r"^config\.text_files='corpus/\*\.txt' is read only by the dataset "
      r"bertjax_local_text, but config\.dataset is 'bertjax_python_docs'.*"
      r"--config\.dataset=bertjax_local_text")):
    config_validation.validate(config)
  config.dataset = "bertjax_local_text/paragraphs"
  config_validation.validate(config)


@pytest.mark.parametrize("name, field, value, words", [
    ("albert", "embedding_size", 0, "embedding_size=0 must be positive"),
    ("albert", "layer_sharing", "some", "Unknown layer_sharing"),
    ("spanbert", "span_geometric_p", 0.0, "span_geometric_p=0.0"),
    ("ernie", "ernie_level_rates", "0.5,0.5", "ernie_level_rates="),
    ("ernie", "ernie_gazetteer", "/nonexistent/names.txt", "Gazetteer .* does not exist"),
    ("ernie", "ernie_phrase_min_pmi", float("nan"), r"ernie_phrase_min_pmi=nan is invalid"),
    ("ernie", "knowledge_fit_documents", 0, r"knowledge_fit_documents=0 is invalid"),
    ("deberta", "pos_att_type", "c2x", "pos_att_type"),
    # Trained without position terms, then failed only at export (no
    # relative/embedding to map).
    ("deberta", "pos_att_type", "", r"^pos_att_type='' names no position term.*"
     r"--config.pos_att_type=c2p, p2c or 'p2c\|c2p'\.$"),
    ("unilm", "unilm_mask_rates", (0.5, 0.5), "unilm_mask_rates="),
    ("xlnet", "partial_prediction_k", 0, "partial_prediction_k=0"),
    # Less than one prediction a row: 27 in the demo's held-out 28,629 tokens.
    ("xlnet", "partial_prediction_k", 1000, r"^partial_prediction_k=1000 must lie "
     r"between 1 and seq_len \(128\); fix --config\.partial_prediction_k"),
    # Each of these trained without a word: one SBO offset embedding for
    # every slot of a span; rows of the offset table no 128-token row can
    # read; a clamp or bucket count below transformers' -1 read as "off".
    ("spanbert", "sbo_max_offset", 0, r"^config\.sbo_max_offset=0 is invalid: "
     r"it must be between 1 and seq_len - 1 \(127\).*--config\.sbo_max_offset=31 "),
    ("spanbert", "sbo_max_offset", 128, r"^config\.sbo_max_offset=128 is invalid"),
    ("xlnet", "clamp_len", -2, r"^config\.clamp_len=-2 is invalid: it must be -1 "
     r"\(or 0: no clamp\) or a positive distance; set --config\.clamp_len=-1"),
    ("deberta", "position_buckets", -2, r"^config\.position_buckets=-2 is invalid: "
     r"it must be 0 or -1 \(no buckets.*or at least 4; set --config\.position_buckets="),
    ("deberta_v3", "position_buckets", -5, r"^config\.position_buckets=-5 is invalid"),
    # NaN compared False with every bound: the rates let every chosen token
    # through unchanged, the n-gram lengths were never drawn as asked.
    ("bert", "mask_token_rate", float("nan"), r"^mask_token_rate=nan and "
     r"random_token_rate=0\.1 must be non-negative and sum to at most 1"),
    ("roberta", "random_token_rate", float("nan"), r"random_token_rate=nan must"),
    ("albert", "ngram_probs", (float("nan"), 0.5, 0.5), r"^ngram_probs=\(nan, "),
    # N-grams longer than a row's slots never fit, so the rows were masked
    # below mask_rate (ALBERT's demo: about half the held-out predictions).
    ("albert", "max_ngram", 11, r"^max_ngram=11 is longer than the "
     r"max_predictions_per_seq=10 tokens .*--config\.max_ngram to at most 10 "),
    ("xlnet", "max_span", 23, r"^max_span=23 is longer than the "
     r"max_predictions_per_seq=22 tokens .*--config\.max_span to at most 22 "),
    ("unilm", "unilm_mask_rates", (float("nan"), 0.5, 0.25, 0.25),
     r"^unilm_mask_rates=\(nan, "),
    ("ernie", "ernie_level_rates", "nan,0.5,0.5", r"^ernie_level_rates='nan,0\.5,0\.5' must"),
    # inf scaled every LayerNorm output to 0: a model that could learn nothing.
    ("bert", "layer_norm_eps", float("inf"), r"^layer_norm_eps=inf must be a positive number"),
    # XLNet's seq_len no longer checks it against a table; encode still reads it.
    ("xlnet", "max_position_embeddings", 0,
     r"^config\.max_position_embeddings=0 is invalid: it must be a positive"),
    ("deberta", "max_relative_positions", -3,
     r"^config\.max_relative_positions=-3 is invalid: .*--config\.max_relative_positions="),
])
def test_a_variant_field_is_refused_before_the_workdir_is_touched(
    tmp_path, name, field, value, words):
  # These were checked only when the model and objective were built, after
  # the corpus had been prepared into the workdir and checkpoints/ created.
  config = config_files.load(f"{name}:tiny")
  config[field] = value
  _refused_before_the_workdir(config, words, tmp_path / "run")


def _refused_before_the_workdir(config, words, workdir):
  from bertjax import train
  with pytest.raises(ValueError, match=words):
    config_validation.validate(config)
  with pytest.raises(ValueError, match=words):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists() or not any(workdir.iterdir())


def test_an_objective_on_another_systems_config_names_the_missing_field(tmp_path):
  # --config.objective=albert on BERT's config raised AttributeError
  # 'sop_swap_rate' from inside the objective.
  config = config_files.load("bert:tiny")
  config.objective = "albert"
  _refused_before_the_workdir(
      config, r"^config.objective='albert' needs the config field 'sop_swap_rate', "
      r"which this config does not have; start from .*configs/albert.py:tiny",
      tmp_path / "run")


@pytest.mark.parametrize("system, field, value, words", [
    # ELECTRA's step on a BERT died in training ("no attribute 'generate'"),
    # after data, init, checkpoints/ and metrics.jsonl.
    ("electra", "model", "bert", r"^config.objective='electra' cannot train "
     r"config.model='bert': it runs only with 'electra'; set "
     r"--config.model=electra, or start from the shipped config of model 'bert' "
     r"\(e.g. --config=configs/bert.py:tiny\).$"),
    ("roberta", "model", "xlnet", r"it runs only with 'bert', 'albert', 'deberta' "
     r"or 'spanbert'; set --config.model=bert"),
    ("bert", "sentence_head", False, r"its sentence-level task needs a sentence "
     r"head, which this model is built without; set --config.sentence_head=True"),
])
def test_an_objective_the_model_cannot_run_is_refused(system, field, value, words,
                                                       tmp_path):
  config = config_files.load(f"{system}:tiny")
  config[field] = value
  _refused_before_the_workdir(config, words, tmp_path / "run")


def test_evaluate_refuses_top_k_zero_before_reading_the_workdir(tmp_path):
  # --top_k=0 printed empty fillings; now refused before the checkpoint is
  # read (here there is none: the refusal must come first).
  import subprocess
  import sys
  proc = subprocess.run(
      [sys.executable, "-m", "bertjax.evaluate", f"--workdir={tmp_path / 'none'}",
       "--fill_mask=The [MASK] sat.", "--top_k=0"],
      capture_output=True, text=True, timeout=300, cwd=tmp_path,
      env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("error: --top_k=0 is invalid")


@pytest.mark.parametrize("name", ["bert:base", "xlnet:base"])
def test_a_shorter_seq_len_is_told_a_slot_count_that_works(name):
  # An import's (or a paper size's) slots follow its 512 positions; the
  # refusal of a shorter seq_len names a value, and that value is accepted.
  import re
  config = config_files.load(name)
  config.seq_len = 64
  config.batch_size = 8
  with pytest.raises(ValueError, match=r"between 1 and seq_len \(64\)") as error:
    config_validation.validate(config)
  slots = int(re.search(r"--config\.max_predictions_per_seq=(\d+)",
                        str(error.value)).group(1))
  assert 1 <= slots <= 64
  config.max_predictions_per_seq = slots
  config_validation.validate(config)


def test_too_few_slots_for_the_mask_rate_are_warned_with_a_count_that_fits(caplog):
  # The tiny config's 20 slots are meant for 128 tokens; at 512 they would
  # cap masking at 20 / 512 = 3.9% instead of 15%.
  config = config_files.load("bert:tiny")
  config.seq_len = 512
  with caplog.at_level("WARNING"):
    config_validation.validate(config)
  warned = [r.getMessage() for r in caplog.records if "max_predictions_per_seq" in r.getMessage()]
  assert len(warned) == 1 and "3.9%" in warned[0], warned
  assert "--config.max_predictions_per_seq=77" in warned[0]  # ceil(0.15 * 512)
  config.max_predictions_per_seq = 77
  assert config_validation.slot_shortfall(config) is None
  # The shipped configs' own slot counts pass: BERT's 20 for 128 (15% is
  # 19.2) and 76 for 512 (76.8), XLNet's 1/K of the row.
  for name in ("bert:tiny", "bert:base", "xlnet:base", "albert:tiny", "spanbert:base"):
    assert config_validation.slot_shortfall(config_files.load(name)) is None, name


def test_a_directory_named_like_a_config_does_not_hide_the_shipped_one(
    tmp_path, monkeypatch):
  # `--config=bert:tiny --workdir=bert`, run twice from the same directory:
  # the second run read the workdir ./bert as the config file
  # ("[Errno 21] Is a directory: 'bert'").
  monkeypatch.chdir(tmp_path)
  (tmp_path / "bert").mkdir()
  (tmp_path / "configs" / "roberta.py").mkdir(parents=True)
  assert config_files.load("bert:tiny").model_size == "tiny"
  assert config_files.load("configs/roberta.py:tiny").objective == (
      config_files.shipped("roberta").get_config("tiny").objective)
  (tmp_path / "mine.py").mkdir()
  with pytest.raises(ValueError, match=r"No config file 'mine\.py' here"):
    config_files.load("mine.py:tiny")


def test_a_warmup_longer_than_the_run_is_warned(caplog):
  # BERT-base's 10,000 warmup steps in a 1,000-step run: the rate reached 10%
  # of its peak, silently.
  config = config_files.load("bert:tiny")
  config.num_train_steps, config.warmup_steps = 1000, 10_000
  with caplog.at_level("WARNING"):
    config_validation.validate(config)
  warned = [r.getMessage() for r in caplog.records if "warmup_steps" in r.getMessage()]
  assert len(warned) == 1 and "only 10% of" in warned[0], warned
  assert "--config.warmup_steps=100." in warned[0]
  for steps in (0, 10_000, 20_000):
    config.num_train_steps = steps
    assert config_validation.warmup_shortfall(config) is None
