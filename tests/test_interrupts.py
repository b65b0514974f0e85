"""SIGTERM to the binaries other than bertjax.main's train loop (evaluate,
finetune, convert) and TensorBoard event files of quick restarts: exit 75 with one
line, nothing partial left in the workdir, the rerun goes on."""

import os
import shutil
import signal
import subprocess
import sys

import pytest

from bertjax import guards
from bertjax import train

from test_resilience import ROOT, run_config, wait_for

STEPS = 2


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo_config, demo_data):
  """A workdir with the checkpoint of step STEPS and its final evaluation."""
  workdir = str(tmp_path_factory.mktemp("trained"))
  config = run_config(demo_config, demo_data, num_train_steps=STEPS,
                      checkpoint_every_steps=STEPS)
  train.train_and_evaluate(config, workdir)
  return workdir, config


def _listing(workdir):
  """Every file of the workdir but its data (hidden temporary files too)."""
  found = set()
  for root, dirs, files in os.walk(workdir):
    dirs[:] = [d for d in dirs if os.path.join(root, d) != os.path.join(workdir, "data")]
    found.update(os.path.relpath(os.path.join(root, f), workdir) for f in files)
  return found


def test_sigterm_during_evaluate_exits_75_writes_nothing_and_rerun_evaluates(
    tmp_path, trained):
  # It died of the signal (status 143, no word); the record is written by
  # rename, so only the status and the missing message were wrong.
  source, config = trained
  workdir = str(tmp_path / "work")
  shutil.copytree(source, workdir)
  before = _listing(workdir)
  # The whole eval split (not the 2 batches the run evaluated): the record
  # goes to eval_<step>-2.json, and there are batches left to stop in.
  args = [sys.executable, "-m", "bertjax.evaluate", "--config=configs/bert.py:tiny",
          f"--workdir={workdir}", "--config.eval_max_batches=0"] + [
              f"--config.{f}={config[f]}" for f in
              ("data_dir", "batch_size", "seq_len", "max_predictions_per_seq")]
  out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
  with open(out, "w") as o, open(err, "w") as e:
    proc = subprocess.Popen(args, cwd=ROOT, stdout=o, stderr=e)
    wait_for(lambda: f"Restored checkpoint {STEPS}" in err.read_text(), proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == guards.EXIT_PREEMPTED, err.read_text()[-3000:]
  assert out.read_text().strip().splitlines()[-1] == (
      f"Preempted while evaluating the checkpoint of step {STEPS}; nothing "
      "written, run the same command again to evaluate it.")
  assert "Traceback" not in err.read_text()
  assert _listing(workdir) == before
  rerun = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert _listing(workdir) == before | {f"eval_{STEPS}-2.json"}


def test_evaluate_on_several_processes_stops_at_jaxs_sync_point(monkeypatch):
  """bertjax.evaluate on several processes asked nothing before its batches
  and finished the whole evaluation after a SIGTERM; it now asks JAX's sync
  point before each batch (as the train loop after each step), so every
  process stops before the same one."""
  import jax
  from jax._src import distributed
  from jax.experimental import multihost_utils
  from bertjax import checkpointing
  from bertjax import config_files
  from bertjax import evaluation
  from bertjax import multihost
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(distributed.global_state, "client", object())
  monkeypatch.setattr(multihost, "check_same_run", lambda *args: [])
  asked = []
  monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point",
                      lambda n: asked.append(n) or n == 3)
  monkeypatch.setattr(checkpointing, "read_while_training",
                      lambda workdir, step, evaluate: evaluate(step))
  # Each batch of the evaluation asks before it is scored.
  monkeypatch.setattr(evaluation, "_evaluate_checkpoint",
                      lambda config, workdir, step, should_stop: [
                          should_stop() for _ in range(4)])
  config = config_files.shipped("bert").get_config("tiny")
  got = evaluation.evaluate_checkpoint(config, "/w", should_stop=lambda: False)
  assert got == [False, False, True, False] and asked == [1, 2, 3, 4]


def _finetune_config(**overrides):
  from bertjax import config_files
  config = config_files.shipped("finetune").get_config("coherence")
  for k, v in {**_FINETUNE, **overrides}.items():
    config[k] = v
  return config


_FINETUNE = dict(seq_len=32, batch_size=16, num_epochs=1.0, max_train_examples=32,
                 max_eval_examples=16)


def test_sigterm_while_finetune_starts_exits_75_in_one_line(tmp_path, trained):
  # Before the train loop's watcher it died of the signal (143, no word).
  init, _ = trained
  workdir = tmp_path / "ft"
  args = [sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune.py:coherence",
          f"--init={init}", f"--workdir={workdir}"] + [
              f"--config.{k}={v}" for k, v in _FINETUNE.items()]
  err = tmp_path / "stderr.txt"
  with open(err, "w") as e:
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=e, text=True)
    # The workdir is held: the state is being built, no step taken yet.
    wait_for(lambda: (workdir / ".bertjax.lock").exists(), proc)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
  assert proc.returncode == guards.EXIT_PREEMPTED, err.read_text()[-3000:]
  assert out.strip().splitlines()[-1].startswith("Preempted ")
  assert "Traceback" not in err.read_text()
  from bertjax.finetune import loop
  assert loop.run(_finetune_config(), init, str(workdir))["step"] == 2


def test_sigterm_before_finetunings_first_step_saves_nothing(tmp_path, trained):
  # It took a step and saved it first: the watcher looked only after a step.
  from bertjax import checkpointing
  from bertjax.finetune import loop
  init, _ = trained
  workdir = tmp_path / "ft"
  guards._SIGTERM.set()  # as the handler bertjax.finetune installs first does
  try:
    with pytest.raises(guards.Preempted) as e:
      loop.run(_finetune_config(), init, str(workdir))
  finally:
    guards._SIGTERM.clear()
  assert str(e.value) == ("Preempted before the first step; nothing new to save (no "
                          "checkpoint yet), run the same command again to go on.")
  assert e.value.exit_status == guards.EXIT_PREEMPTED
  assert checkpointing.Checkpointer(str(workdir)).all_steps() == []


def test_a_sigterm_a_library_wrapped_in_its_own_error_still_reads_as_a_stop():
  # SIGTERM while TFDS parsed a dataset's JSON came out as "cannot be read
  # (Failed to parse JSON: Terminated)": a damaged dataset, status 2.
  def parse():
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(10_000_000):  # the handler runs between bytecodes
        pass
    except Exception as e:  # as a library that catches everything does
      raise ValueError(f"Failed to parse JSON: {e!r}") from e
  try:
    with pytest.raises(guards.Terminated) as stopped:
      with guards.sigterm_raises():
        parse()
    assert isinstance(stopped.value.__cause__, ValueError)
    # An error with no SIGTERM behind it stays what it was.
    guards._SIGTERM.clear()
    with pytest.raises(ValueError, match="not a stop"):
      with guards.sigterm_raises():
        raise ValueError("not a stop")
  finally:
    guards._SIGTERM.clear()
  assert signal.getsignal(signal.SIGTERM) is not guards._raise_terminated


def test_two_starts_within_one_second_keep_both_event_files(tmp_path, monkeypatch):
  # tensorboardX names an event file by whole seconds and host and opens it
  # with "wb": a resume within the same second erased the first start's file.
  import types
  from tensorboardX import event_file_writer
  from bertjax import metrics
  from test_train import read_scalars
  monkeypatch.setattr(event_file_writer, "time",
                      types.SimpleNamespace(time=lambda: 1796000000.25))
  workdir = str(tmp_path)
  first = metrics.MetricWriter(workdir)
  for step in (1, 2, 3):
    first.write(step, {"loss": float(step)})
  first.close()  # killed after step 3, resumed from the checkpoint of step 2
  resumed = metrics.MetricWriter(workdir, resumed_at=2)
  for step in (3, 4):
    resumed.write(step, {"loss": 10.0 + step})
  resumed.close()
  # In name order, as TensorBoard reads them: the first start's file first.
  files = sorted(os.listdir(tmp_path / "tensorboard"))
  assert [read_scalars(tmp_path / "tensorboard" / f) for f in files] == [
      {"loss": {1: 1.0, 2: 2.0, 3: 3.0}}, {"loss": {3: 13.0, 4: 14.0}}]


def test_an_export_killed_midway_is_replaced_by_the_rerun_but_no_file_of_yours(
    tmp_path, trained, monkeypatch):
  # Its files were written before its manifest: the rerun (with --overwrite
  # too) refused the directory as one holding no earlier export. Then its
  # manifest listed every name an export may write, so the rerun deleted a
  # file of yours of such a name that it had never begun to write.
  from bertjax.convert import export
  from bertjax.convert import export_target
  workdir, _ = trained
  whole = export.export_hf(workdir, str(tmp_path / "whole"))
  out = tmp_path / "hf"

  def killed(*args, **kwargs):
    # The weights half-written (a temporary file not renamed yet), then the
    # kill, before any tokenizer file was begun.
    (out / ".model.safetensors.tmp-1-2").write_text("{")
    raise KeyboardInterrupt

  monkeypatch.setattr(export, "tokenizer_files", killed)
  monkeypatch.setattr(export_target, "remove_earlier", lambda *args: None)  # a kill cleans up nothing
  with pytest.raises(KeyboardInterrupt):
    export.export_hf(workdir, str(out))
  monkeypatch.undo()
  assert (out / export_target.MANIFEST).exists()
  (out / "tokenizer_config.json").write_text("mine")  # yours, put there since
  with pytest.raises(ValueError, match="tokenizer_config.json, which the earlier "
                     "export did not write"):
    export.export_hf(workdir, str(out))
  assert (out / "tokenizer_config.json").read_text() == "mine"
  (out / "tokenizer_config.json").unlink()  # moved away, as the refusal says
  assert export.export_hf(workdir, str(out)) == whole
  assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "whole"))
  for name in os.listdir(out):
    assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


# In bertjax.convert's process: the export waits once it has begun its first
# tokenizer file (half-written), and says so in a file.
_SLOW_TOKENIZER = """
import os, time
from bertjax.convert import export

def _waits(config, workdir, out_dir, record=None):
  if record is not None:
    record("spiece.model")
  with open(os.path.join(out_dir, ".spiece.model.tmp-1-2"), "w") as f:
    f.write("half")
  open(os.environ["BERTJAX_TEST_WRITING"], "w").close()
  time.sleep(600)

export.tokenizer_files = _waits
"""


def test_sigterm_during_an_export_exits_75_and_leaves_nothing(tmp_path, trained):
  # It died of the signal (143), leaving its files and an unfinished manifest.
  from bertjax.convert import export
  workdir, _ = trained
  hooks = tmp_path / "hooks"
  hooks.mkdir()
  (hooks / "sitecustomize.py").write_text(_SLOW_TOKENIZER)
  writing, out = tmp_path / "writing", tmp_path / "hf"
  env = dict(os.environ, BERTJAX_TEST_WRITING=str(writing),
             PYTHONPATH=os.pathsep.join([str(hooks), ROOT]))
  proc = subprocess.Popen(
      [sys.executable, "-m", "bertjax.convert", f"--to_hf={out}", f"--workdir={workdir}"],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    wait_for(writing.exists, proc)
    assert (out / "model.safetensors").exists()  # stopped midway
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == guards.EXIT_PREEMPTED, err[-3000:]
  assert err.strip().splitlines()[-1] == (
      f"error: stopped by SIGTERM before the end of the export (nothing of it is "
      f"left in --to_hf={out}); run the same command again.")
  assert not out.exists()  # made by the export, and nothing of it left
  assert export.export_hf(workdir, str(out))["step"] == STEPS  # the rerun


def _sigterm_pending_at_start():
  """preexec_fn: SIGTERM blocked in the child, so that one sent at once waits
  for the program's handler: a SIGTERM during its start-up, deterministically."""
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def test_sigterm_while_a_study_starts_stops_it_before_the_first_step(tmp_path, demo_data):
  # It died of a SIGTERM outside the train loops (143, no word).
  workdir = tmp_path / "study"
  proc = subprocess.Popen(
      [sys.executable, "-m", "bertjax.study", "--configs=bert", "--flops=1e12",
       f"--workdir={workdir}", "--tasks=", f"--set=data_dir={demo_data.data_dir}",
       "--set=batch_size=16", "--set=seq_len=64"], cwd=ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, preexec_fn=_sigterm_pending_at_start)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == guards.EXIT_PREEMPTED, err[-3000:]
  assert out.strip().splitlines()[-1] == (
      "Preempted before the first step; nothing new to save (no checkpoint yet), "
      "run the same command again to go on.")
  assert "Traceback" not in err
  assert not (workdir / "bert" / "checkpoints").exists() or not os.listdir(
      workdir / "bert" / "checkpoints")


def test_an_import_stopped_midway_leaves_no_stage_after_the_rerun(tmp_path, trained):
  # A SIGTERM or kill skips the stage's clean-up; its checkpoint (the model
  # and its optimizer state) stayed in the workdir for good.
  from bertjax import config_files
  from bertjax.convert import export
  from bertjax.convert import workdir as workdir_lib
  source, _ = trained
  export.export_hf(source, str(tmp_path / "hf"))
  workdir = tmp_path / "imported"
  stale = workdir / f"{workdir_lib.STAGING_PREFIX}0123456789ab"
  (stale / "checkpoints" / "0").mkdir(parents=True)  # as the stopped import left it
  (stale / "checkpoints" / "0" / "state").write_bytes(b"\0" * 1024)
  workdir_lib.import_hf(str(tmp_path / "hf"), str(workdir),
                        config_files.shipped("bert").get_config("tiny"))
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "tokenizer"]


def test_sigterm_while_fill_mask_loads_exits_75_in_one_line(trained):
  # evaluate remembers SIGTERM from its first line on: --fill_mask must
  # still stop on it, not print and exit 0 as if none had come.
  workdir, _ = trained
  proc = subprocess.Popen(
      [sys.executable, "-m", "bertjax.evaluate", f"--workdir={workdir}",
       "--fill_mask=The [MASK] returns a value."], cwd=ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, preexec_fn=_sigterm_pending_at_start)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == guards.EXIT_PREEMPTED, err[-3000:]
  assert out.strip().splitlines() == [
      "Preempted before the fillings were printed; nothing written, run the same "
      "command again."]
