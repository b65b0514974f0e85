"""prepare's worker pool (bertjax/data/workers.py) and its tokenizer
trainer (bertjax/data/spm_trainer.py) under signals."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import corpus_files
from bertjax.data import workers


def _square(x):
  return {"stats": {}, "value": x * x}


def _within(seconds, fn):
  done = threading.Event()
  threading.Thread(target=lambda: (fn(), done.set()), daemon=True).start()
  return done.wait(seconds)


def _idle_pool():
  workers.run(_square, [1, 2, 3, 4], workers=2)
  time.sleep(0.5)  # idle: one worker blocks in the task queue, holding its lock
  return workers._POOLS[2]


def test_sigterm_to_the_process_group_leaves_the_pool_working():
  # SIGTERM to the whole group (a scheduler, kill -- -PGID) while the pool
  # idled, e.g. during the tokenizer's training, killed a worker inside the
  # task queue's lock: bertjax.main, which stops at its next safe point, then
  # hung in its next prepare stage, and prepare's own stop hung in terminate.
  try:
    for process in _idle_pool()._pool:
      os.kill(process.pid, signal.SIGTERM)
    time.sleep(0.5)
    assert _within(20, lambda: workers.run(_square, [5, 6, 7], workers=2)), (
        "the pool hung after SIGTERM reached its idle workers")
  finally:
    assert _within(20, workers.shutdown)
  assert not workers._POOLS


def test_the_pool_stops_after_a_worker_was_killed_in_the_task_queue():
  for process in _idle_pool()._pool:
    os.kill(process.pid, signal.SIGKILL)
  time.sleep(0.5)
  assert _within(20, workers.shutdown), "terminate waited for ever on a dead worker's lock"
  assert not workers._POOLS


# Put on the PYTHONPATH of prepare (and so of its trainer's process): a
# sentencepiece trainer that reads the sentences, says so, and then never
# returns to Python, as the real one does until it is done.
_NEVER_RETURNING_TRAINER = """
import ctypes, os, sentencepiece

def _train(*args, **kwargs):
  for _ in kwargs.get("sentence_iterator", ()):
    pass
  open(os.environ["BERTJAX_TEST_TRAINING"], "w").close()
  mutex, libc = ctypes.create_string_buffer(64), ctypes.CDLL(None)
  libc.pthread_mutex_lock(mutex)
  libc.pthread_mutex_lock(mutex)  # a normal mutex locked twice: waits for ever

sentencepiece.SentencePieceTrainer.train = staticmethod(_train)
"""


def test_sigterm_while_the_tokenizer_trains_stops_prepare_and_leaves_no_model(tmp_path):
  """sentencepiece's trainer never returns to Python before it is done, so a
  SIGTERM to prepare waited for the rest of the training; prepare now stops
  (status 75, its one line), its trainer with it, no model or part of one is
  left, and the rerun finishes from the sample already made."""
  corpus = tmp_path / "texts"
  corpus.mkdir()
  corpus_files.write_topic_files(corpus)
  hooks = tmp_path / "hooks"
  hooks.mkdir()
  (hooks / "sitecustomize.py").write_text(_NEVER_RETURNING_TRAINER)
  training = tmp_path / "training"
  workdir = tmp_path / "run"
  flags = [sys.executable, "-m", "bertjax.prepare", "--config=bert.py:tiny",
           f"--workdir={workdir}", "--config.dataset=bertjax_local_text",
           f"--config.text_files={corpus}/*.txt", "--config.vocab_size=600",
           "--config.prepare_workers=1"]
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  hooked = dict(env, PYTHONPATH=os.pathsep.join([str(hooks), os.getcwd()]),
                BERTJAX_TEST_TRAINING=str(training))
  proc = subprocess.Popen(flags, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, start_new_session=True, env=hooked, cwd=str(tmp_path))
  try:
    deadline = time.time() + 300  # guards against a hang only
    while not training.exists() and proc.poll() is None and time.time() < deadline:
      time.sleep(0.05)
    assert training.exists(), "prepare ended before its tokenizer trained"
    proc.send_signal(signal.SIGTERM)  # to prepare alone: it stops its trainer itself
    _, err = proc.communicate(timeout=120)  # without the stop: for ever
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, 0)
      raise AssertionError("the tokenizer's trainer outlived prepare")
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 75, err[-2000:]
  assert err.strip().splitlines()[-1] == (
      "error: stopped by SIGTERM; run the same command again to go on from the "
      "units already prepared.")
  tokenizers = workdir / "data" / "tokenizers"
  assert [p.name for p in tokenizers.iterdir()] == ["bertjax_local_text.model.sample"]

  rerun = subprocess.run(flags, capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=600)
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert [p.name for p in tokenizers.iterdir()] == ["bertjax_local_text.model"]
