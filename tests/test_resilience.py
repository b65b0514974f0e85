"""Nothing lost: SIGKILL and SIGTERM mid-run, corrupted checkpoints, NaN losses,
restoring onto another mesh."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bertjax import checkpointing
from bertjax import evaluation
from bertjax import guards
from bertjax import models
from bertjax import objectives
from bertjax import optim
from bertjax import sharding
from bertjax import state as state_lib
from bertjax import train
from bertjax.data import pipeline

from test_train import read_metrics, small_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 16
NAN_STEP = 5  # the step whose loss the NaN tests make NaN


def run_config(demo_config, demo_data, **overrides):
  base = dict(num_train_steps=STEPS, log_every_steps=1, checkpoint_every_steps=4,
              keep_checkpoints=10)
  base.update(overrides)
  return small_config(demo_config, demo_data, **base)


def cli_args(config, workdir):
  fields = ("data_dir", "batch_size", "seq_len", "max_predictions_per_seq",
            "num_train_steps", "warmup_steps", "log_every_steps",
            "checkpoint_every_steps", "keep_checkpoints", "eval_max_batches",
            "shuffle_window")
  return ([sys.executable, "-m", "bertjax.main", "--config=configs/bert.py:tiny",
           f"--workdir={workdir}"] + [f"--config.{f}={config[f]}" for f in fields])


def last_rows(workdir):
  """The last logged row of every step (a killed run re-logs some steps)."""
  return {r["step"]: r for r in read_metrics(workdir) if "loss" in r}


def restore(workdir, step, config, mesh):
  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  abstract, shardings = state_lib.state_shardings(model, tx, config, mesh)
  state, _ = checkpointing.Checkpointer(workdir).restore(step, abstract, shardings)
  return state


def assert_states_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_config, demo_data):
  """An uninterrupted run of STEPS steps, every step logged."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  record = train.train_and_evaluate(run_config(demo_config, demo_data), workdir)
  return workdir, record


def wait_for(predicate, proc, timeout=240):
  start = time.time()
  while not predicate():
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.time() - start < timeout, "timed out"
    time.sleep(0.05)


def test_sigkill_then_restart_is_bit_identical(tmp_path, reference, demo_config,
                                                demo_data):
  ref_dir, ref_record = reference
  config = run_config(demo_config, demo_data)
  workdir = str(tmp_path)
  proc = subprocess.Popen(cli_args(config, workdir), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  wait_for(lambda: os.path.isdir(os.path.join(workdir, "checkpoints", "8")), proc)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  killed_at = max(last_rows(workdir))
  assert killed_at < STEPS  # really interrupted before the end
  record = train.train_and_evaluate(config, workdir)
  ref, got = last_rows(ref_dir), last_rows(workdir)
  assert sorted(got) == list(range(1, STEPS + 1))
  # The steps redone after the checkpoint are logged once, not twice.
  logged = [r["step"] for r in read_metrics(workdir) if "loss" in r]
  assert logged == sorted(set(logged)), logged
  for step in range(1, STEPS + 1):
    assert got[step]["batch_hash"] == ref[step]["batch_hash"], step
    assert got[step]["loss"] == ref[step]["loss"], step
  assert record == ref_record
  mesh = sharding.make_mesh(config.mesh_shape)
  assert_states_equal(restore(workdir, STEPS, config, mesh),
                      restore(ref_dir, STEPS, config, mesh))


def test_a_start_over_stale_rows_and_a_finished_rerun_log_each_step_once(
    tmp_path, reference, demo_config, demo_data):
  config = run_config(demo_config, demo_data)
  workdir = str(tmp_path)
  # A run killed before its first checkpoint (of another model, even) left rows.
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step in (1, 2, 3):
      f.write(json.dumps({"step": step, "loss": 99.0}) + "\n")
  record = train.train_and_evaluate(config, workdir)
  rows = read_metrics(workdir)
  assert all(r.get("loss") != 99.0 for r in rows)
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, STEPS + 1))
  # Run again when finished, it evaluates again and logs that evaluation once.
  assert train.train_and_evaluate(config, workdir) == record
  evals = [r["step"] for r in read_metrics(workdir)
           if any(k.startswith("eval_") for k in r)]
  assert evals == [STEPS]


def _signal_mid_run(config, workdir, sig, popen):
  """Starts ``bertjax.main`` with ``popen``, sends ``sig`` once three rows
  are logged; (exit status, stdout, stderr, the checkpointed steps)."""
  proc = popen(cli_args(config, workdir), cwd=ROOT, stdout=subprocess.PIPE,
               stderr=subprocess.PIPE, text=True)
  metrics = os.path.join(workdir, "metrics.jsonl")
  wait_for(lambda: os.path.exists(metrics) and len(open(metrics).readlines()) >= 3,
           proc)
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=120)
  return proc.returncode, out, err, checkpointing.Checkpointer(workdir).all_steps()


def test_sigterm_saves_the_current_step_and_exits_75(tmp_path, reference,
                                                      demo_config, demo_data):
  config = run_config(demo_config, demo_data, num_train_steps=400,
                      checkpoint_every_steps=1000)
  workdir = str(tmp_path)
  returncode, out, err, steps = _signal_mid_run(config, workdir, signal.SIGTERM,
                                                subprocess.Popen)
  assert returncode == guards.EXIT_PREEMPTED, err[-3000:]
  assert len(steps) == 1 and 3 <= steps[0] < 400  # saved where it stopped
  assert f"Preempted at step {steps[0]}" in out
  # The restart continues from that checkpoint.
  train.train_and_evaluate(config, workdir, stop_at_step=steps[0] + 2)
  rows = [r["step"] for r in read_metrics(workdir) if "loss" in r]
  assert rows[-2:] == [steps[0] + 1, steps[0] + 2]


def test_corrupted_newest_checkpoint_falls_back(tmp_path, reference, demo_config,
                                                demo_data, caplog):
  ref_dir, _ = reference
  workdir = str(tmp_path / "work")
  shutil.copytree(ref_dir, workdir)
  newest = os.path.join(workdir, "checkpoints", str(STEPS))
  victims = [p for p in glob.glob(os.path.join(newest, "state", "**", "*"),
                                  recursive=True)
             if os.path.isfile(p) and os.path.getsize(p) > 64]
  assert victims
  for path in victims:  # truncate every data file of the state item
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  config = run_config(demo_config, demo_data)
  mesh = sharding.make_mesh(config.mesh_shape)
  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  abstract, shardings = state_lib.state_shardings(model, tx, config, mesh)
  step, state, _ = checkpointing.Checkpointer(workdir).restore_latest(abstract,
                                                                      shardings)
  assert step == STEPS - 4
  assert os.path.isdir(newest + ".unreadable")  # kept, not deleted
  assert_states_equal(state, restore(ref_dir, STEPS - 4, config, mesh))


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, demo_config,
                                                       demo_data):
  config = run_config(demo_config, demo_data, debug_nan_step=NAN_STEP)
  with pytest.raises(guards.NonFiniteLoss, match=f"at step {NAN_STEP + 1}"):
    train.train_and_evaluate(config, str(tmp_path))
  assert checkpointing.Checkpointer(str(tmp_path)).all_steps() == [4]


def test_nan_loss_skip_mode_leaves_state_unchanged(demo_config, demo_data):
  config = run_config(demo_config, demo_data, nonfinite="skip")
  mesh = sharding.make_mesh(config.mesh_shape)
  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  state, shardings = state_lib.create_train_state(model, tx, config, mesh)
  # The step the test above poisons (5), so that the two tests compile one
  # program between them (the session's compilation cache); the state is put
  # at that step.
  poisoned = train.make_train_step(model, objectives.get_objective(config), tx,
                                   shardings, mesh, debug_nan_step=NAN_STEP)
  state = state.replace(step=jax.device_put(
      np.array(NAN_STEP, state.step.dtype), state.step.sharding))
  batch = next(pipeline.make_train_iterator(config, demo_data.source("train"),
                                            local_batch_size=config.batch_size))
  before = jax.device_get(state)
  with sharding.use_mesh(mesh):
    after, m = poisoned(state, train.to_global(batch, mesh), jax.random.key(0))
  assert float(m["skipped"][0]) == 1.0
  assert int(after.step) == NAN_STEP + 1
  assert_states_equal(after.params, before.params)
  assert_states_equal(after.opt_state, before.opt_state)
  guard = guards.NonFiniteGuard("skip", max_consecutive=3)
  guard.check(1, m["skipped"])
  guard.check(2, m["skipped"])
  with pytest.raises(guards.NonFiniteLoss, match="3 updates in a row"):
    guard.check(3, m["skipped"])


def test_held_out_loss_is_the_objectives_terms_over_the_split(demo_config, demo_data):
  # It was a mean of per-batch means: a padded last batch (or one of padding
  # only, as a host of a pod can get) counted as much as a full one, and for
  # an MLM-only objective it was not the record's mlm_loss.
  from bertjax import metrics as metrics_lib
  config = run_config(demo_config, demo_data)
  mesh = sharding.make_mesh(config.mesh_shape)
  model = models.get_model(config)
  objective = objectives.get_objective(config)
  state, _ = state_lib.create_train_state(model, optim.make_optimizer(config), config, mesh)
  step_fn = evaluation.make_eval_step(config, mesh, model, objective)
  batches = iter(pipeline.make_eval_batches(
      config, demo_data.source("validation"), local_batch_size=config.batch_size,
      max_batches=2))
  batch, other = next(batches), next(batches)
  assert batch["example_mask"].all()
  padding = dict(batch, example_mask=np.zeros_like(batch["example_mask"]))
  rng = jax.random.key(config.eval_seed)
  with sharding.use_mesh(mesh):
    full, counts = step_fn(state.params, train.to_global(batch, mesh), rng)
    empty, _ = step_fn(state.params, train.to_global(padding, mesh), rng)
    second, _ = step_fn(state.params, train.to_global(other, mesh), rng)
  alone = evaluation._record(full, counts, objective)
  both = evaluation._record(metrics_lib.add(full, empty), counts, objective)
  assert np.isfinite(alone["loss"]) and both["loss"] == pytest.approx(alone["loss"], rel=1e-6)
  assert alone["loss"] == pytest.approx(alone["mlm_loss"] + alone["nsp_loss"], rel=1e-6)
  # Over two batches each term is a mean over both batches' predictions,
  # not a mean of the two batches' means (they hold different numbers).
  two = evaluation._record(metrics_lib.add(full, second), counts, objective)
  mlm = (full["mlm_loss"][0] + second["mlm_loss"][0]) / (
      full["mlm_loss"][1] + second["mlm_loss"][1])
  nsp = (full["nsp_loss"][0] + second["nsp_loss"][0]) / (
      full["nsp_loss"][1] + second["nsp_loss"][1])
  assert full["mlm_loss"][1] != second["mlm_loss"][1]
  assert two["loss"] == pytest.approx(float(mlm + nsp), rel=1e-6)
  # Always answering the majority NSP label: the floor for nsp_accuracy.
  with sharding.use_mesh(mesh):
    # Jitted: eagerly, each random op of the masking compiles on its own.
    _, targets = jax.jit(objective.corrupt)(rng, train.to_global(batch, mesh),
                                            jax.numpy.zeros((), "int32"))
  random = np.asarray(targets["nsp_labels"])[np.asarray(batch["example_mask"])].mean()
  assert 0.0 < random < 1.0
  assert alone["baseline_nsp_accuracy"] == pytest.approx(max(random, 1.0 - random), rel=1e-6)
  assert not any(k.endswith("_random") for k in alone)


@pytest.mark.parametrize("save_shape,restore_shape", [
    ("1,1,1", "8,1,1"), ("8,1,1", "1,1,1"), ("8,1,1", "2,4,1"), ("2,4,1", "8,1,1")])
def test_restore_onto_another_mesh(tmp_path, demo_config, demo_data, save_shape,
                                   restore_shape):
  config = run_config(demo_config, demo_data)

  def mesh_of(shape):
    dims = [int(d) for d in shape.split(",")]
    devices = np.asarray(jax.devices()[:int(np.prod(dims))]).reshape(dims)
    return sharding.Mesh(devices, sharding.MESH_AXES)

  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  state, _ = state_lib.create_train_state(model, tx, config, mesh_of(save_shape))
  ckpt = checkpointing.Checkpointer(str(tmp_path))
  ckpt.save(3, state, {"note": "x"}, config, "fp")
  ckpt.wait()
  target = mesh_of(restore_shape)
  restored = restore(str(tmp_path), 3, config, target)
  assert_states_equal(restored, state)
  leaf = restored.params["encoder"]["layer_0"]["mlp"]["wi"]["kernel"]
  assert leaf.sharding.mesh.shape == target.shape


def test_best_checkpoint_by_held_out_loss_is_kept_apart(tmp_path, demo_config,
                                                        demo_data, monkeypatch):
  config = run_config(demo_config, demo_data, num_train_steps=12,
                      eval_every_steps=4, keep_checkpoints=1)
  built, real_make = [], evaluation.make_eval_step
  monkeypatch.setattr(evaluation, "make_eval_step",
                      lambda *a: built.append(real_make(*a)) or built[-1])
  calls, real_evaluate = [], evaluation.evaluate_params
  monkeypatch.setattr(evaluation, "evaluate_params",
                      lambda *a, **k: calls.append(1) or real_evaluate(*a, **k))
  final = train.train_and_evaluate(config, str(tmp_path))
  # Three evaluations (steps 4, 8 and 12, the last step's being the final
  # one: it used to run twice and log step 12 twice) through one eval step,
  # traced and compiled once.
  assert len(built) == 1 and built[0]._cache_size() == 1
  assert len(calls) == 3
  rows = [r for r in read_metrics(str(tmp_path)) if "eval_loss" in r]
  assert [r["step"] for r in rows] == [4, 8, 12]
  assert final["step"] == 12 and final["loss"] == pytest.approx(rows[-1]["eval_loss"])
  evals = {r["step"]: r["eval_loss"] for r in rows}
  best_step = min(evals, key=evals.get)
  with open(tmp_path / "best_checkpoint" / "best.json") as f:
    best = json.load(f)
  assert best["step"] == best_step
  assert best["loss"] == pytest.approx(evals[best_step], rel=1e-6)
  kept = [d for d in os.listdir(tmp_path / "best_checkpoint") if d.isdigit()]
  assert kept == [str(best_step)]
  # The rolling checkpoints keep only the newest one; the best is apart.
  assert checkpointing.Checkpointer(str(tmp_path)).all_steps() == [12]


def _start(args, tmp_path):
  """Starts a binary with stdout and stderr going to files (read while it runs)."""
  out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
  proc = subprocess.Popen(args, cwd=ROOT, stdout=open(out, "w"),
                          stderr=open(err, "w"), text=True)
  return proc, out, err


def _shows(path, text):
  return lambda: text in path.read_text()


def test_sigterm_before_the_first_step_exits_75_and_changes_nothing(
    tmp_path, reference, demo_config, demo_data):
  ref_dir, _ = reference
  workdir = str(tmp_path / "work")
  shutil.copytree(ref_dir, workdir)
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  rows_before = len(read_metrics(workdir))
  # 400 steps, as the SIGTERM and Ctrl-C tests run: the rerun's step is theirs
  # (the schedule's length is in the compiled program), loaded, not compiled.
  config = run_config(demo_config, demo_data, num_train_steps=400,
                      checkpoint_every_steps=1000)
  proc, out, err = _start(cli_args(config, workdir), tmp_path)
  wait_for(_shows(err, f"Resuming from the checkpoint at step {STEPS}"), proc)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == guards.EXIT_PREEMPTED, err.read_text()[-3000:]
  # The signal lands in the data's (reused) prepare step or after it.
  assert out.read_text().strip().splitlines()[-1] in (
      f"Preempted before the first step; nothing new to save (the newest "
      f"checkpoint is step {STEPS}), run the same command again to go on.",
      f"Preempted while preparing the data (the newest checkpoint is step "
      f"{STEPS}); run the same command again to go on from the units already "
      f"prepared.")
  assert "cannot be read" not in err.read_text()
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
  assert len(read_metrics(workdir)) == rows_before
  # The rerun goes on from there.
  train.train_and_evaluate(config, workdir, stop_at_step=STEPS + 1)
  assert [r["step"] for r in read_metrics(workdir)][-1] == STEPS + 1


def test_sigterm_during_the_final_evaluation_exits_75_and_rerun_evaluates(
    tmp_path, reference, demo_config, demo_data):
  ref_dir, ref_record = reference
  workdir = str(tmp_path / "work")
  shutil.copytree(ref_dir, workdir)
  for step in range(13, STEPS + 1):  # the run still has steps 13-16 to go
    shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)),
                  ignore_errors=True)
  os.remove(os.path.join(workdir, f"eval_{STEPS}.json"))
  config = run_config(demo_config, demo_data, eval_max_batches=0)
  proc, out, err = _start(cli_args(config, workdir), tmp_path)
  wait_for(_shows(out, f"step {STEPS}/{STEPS} "), proc)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=120) == guards.EXIT_PREEMPTED, err.read_text()[-3000:]
  assert out.read_text().strip().splitlines()[-1] == (
      f"Preempted during the final evaluation; the checkpoint of step {STEPS} is "
      "saved, run the same command again to evaluate it.")
  assert not os.path.exists(os.path.join(workdir, f"eval_{STEPS}.json"))
  checkpointer = checkpointing.Checkpointer(workdir)
  assert checkpointer.all_steps()[-1] == STEPS
  assert checkpointer.verify(STEPS).status == "ok"  # committed and sealed
  record = train.train_and_evaluate(
      run_config(demo_config, demo_data, eval_max_batches=0), workdir)
  assert record["step"] == STEPS and record["num_tokens"] >= ref_record["num_tokens"]


def test_checkpoint_of_8_devices_loads_in_a_one_device_process(reference):
  # A notebook on one CPU reads what a mesh of 8 devices wrote.
  workdir, _ = reference
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = ROOT
  code = ("import jax, bertjax; assert jax.device_count() == 1; "
          "m = bertjax.load(%r); h = m.encode(['The cat sat.'])['hidden']; "
          "import numpy as np; assert np.isfinite(h).all(); print(h.shape)") % workdir
  proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip().startswith("(1, ")


def _popen_as_from_a_terminal(*args, **kwargs):
  """Popen with SIGINT not ignored: a test run as a shell's background job
  starts with it ignored, which a child inherits; a terminal's has it."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    return subprocess.Popen(*args, **kwargs)
  finally:
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_saves_the_current_step_and_exits_130_in_one_line(
    tmp_path, demo_config, demo_data):
  # Ctrl-C ended the run with a page of KeyboardInterrupt traceback and lost
  # the steps since the last checkpoint; and a stop (SIGTERM alike) never
  # logged the row of the step it saved.
  from bertjax import workdir_lock
  config = run_config(demo_config, demo_data, num_train_steps=400,
                      checkpoint_every_steps=1000)
  workdir = str(tmp_path)
  returncode, out, err, steps = _signal_mid_run(config, workdir, signal.SIGINT,
                                                _popen_as_from_a_terminal)
  assert returncode == guards.EXIT_INTERRUPTED, err[-3000:]
  assert len(steps) == 1 and 3 <= steps[0] < 400  # saved where it stopped
  assert out.splitlines()[-1] == (
      f"Interrupted (Ctrl-C) at step {steps[0]}; a checkpoint of that step was "
      "saved, run the same command again to resume.")
  assert "Traceback" not in err
  rows = [r["step"] for r in read_metrics(workdir) if "loss" in r]
  assert rows == list(range(1, steps[0] + 1))
  with workdir_lock.WorkdirLock(workdir):  # free for the rerun
    pass


def test_ctrl_c_outside_the_train_loop_is_one_line(tmp_path):
  # Here during prepare: stops at once, with one line instead of the
  # traceback of wherever the main thread was (worker processes say nothing).
  log = tmp_path / "stderr"
  with open(log, "w") as err:
    proc = _popen_as_from_a_terminal(
        [sys.executable, "-m", "bertjax.prepare", "--config=configs/bert.py:tiny",
         f"--workdir={tmp_path / 'work'}"], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=err)
    # Its tokenizing stage's first line (a file name would move with the code).
    wait_for(lambda: "Tokenizing " in log.read_text(), proc, timeout=120)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
  text = log.read_text()
  assert proc.returncode == -signal.SIGINT, text[-3000:]
  assert "Traceback" not in text
  assert text.splitlines()[-1] == ("error: interrupted (Ctrl-C); run the same command "
                                   "again to go on from what was saved.")


def test_a_best_checkpoint_rotated_out_of_checkpoints_is_still_read(
    tmp_path, demo_config, demo_data):
  """The best evaluation's checkpoint outlives the rolling ones; reading it by
  its step, or by its directory, used to say it did not exist."""
  import bertjax
  from bertjax.convert import workdir as workdir_lib
  config = run_config(demo_config, demo_data)
  model = models.get_model(config)
  tx = optim.make_optimizer(config)
  mesh = sharding.make_mesh(config.mesh_shape)
  best_state, _ = state_lib.create_train_state(model, tx, config, mesh)
  newer = best_state.replace(params=jax.tree.map(lambda p: p + 1.0, best_state.params))
  best = checkpointing.BestCheckpoint(str(tmp_path))
  best.offer(4, 5.0, best_state, {"note": "x"}, config, "fp")
  best.close()
  rolling = checkpointing.Checkpointer(str(tmp_path), keep=1)
  rolling.save(8, newer, {"note": "x"}, config, "fp")
  rolling.wait()
  rolling.close()

  def first_leaf(params):
    return np.asarray(jax.tree.leaves(params)[0])

  want = {4: first_leaf(best_state.params), 8: first_leaf(newer.params)}
  for step in (None, 4, 8):
    _, params, got = workdir_lib.load_params(str(tmp_path), step)
    assert got == (step or 8)
    np.testing.assert_array_equal(first_leaf(params), want[got])
  loaded = bertjax.load(str(tmp_path / "best_checkpoint"))
  np.testing.assert_array_equal(first_leaf(loaded.params), want[4])
  with pytest.raises(ValueError, match=(
      r"No checkpoint for step 6 in .*checkpoints; pass --step as one of \[8\] "
      r"\(or 4, the best evaluation's, in best_checkpoint/\)\.$")):
    workdir_lib.load_params(str(tmp_path), 6)


def test_a_checkpoint_removed_while_it_is_read_is_read_again_or_named(tmp_path):
  """A run training in the workdir rotates its checkpoints while load,
  convert or evaluate reads one: the latest is read again; a named step
  that went is refused in one sentence (it was a FileNotFoundError)."""
  (tmp_path / "checkpoints" / "12").mkdir(parents=True)
  calls = []

  def read(step):  # the run removes step 8 while it is read, 12 is the new latest
    calls.append(step)
    if len(calls) == 1:
      raise FileNotFoundError("Checkpoint at checkpoints/8 not found")
    return "read the latest"

  assert checkpointing.read_while_training(str(tmp_path), None, read) == "read the latest"
  assert calls == [None, None]
  calls.clear()
  with pytest.raises(ValueError, match=(
      r"^The checkpoint at step 8 in .*checkpoints was removed while it was read "
      r"\(a run training there keeps only its last config\.keep_checkpoints\); pass a "
      r"--step it still has, or leave --step out to read the latest\.$")):
    checkpointing.read_while_training(str(tmp_path), 8, read)
  # A file missing from a checkpoint that is still there is another fault.
  calls.clear()
  with pytest.raises(FileNotFoundError):
    checkpointing.read_while_training(str(tmp_path), 12, read)


def test_a_run_whose_lock_was_taken_over_stops_writing(tmp_path, reference,
                                                       demo_config, demo_data,
                                                       monkeypatch):
  """A gs:// workdir's lease that another run took over (this one could not
  renew it for a whole lease, bertjax/gcs_lease.py): the run stops before
  its next step or checkpoint, instead of writing over the other's."""
  from bertjax import workdir_lock
  asked, released = [], []

  class TakenOverAfterSixSteps:
    def check(self):
      asked.append(1)
      if len(asked) > 7:  # each step asks once, and step 4's checkpoint
        raise workdir_lock.WorkdirLost("The lock was taken over by another run.")

    def release(self):
      released.append(1)
  monkeypatch.setattr(workdir_lock, "hold", lambda *a: TakenOverAfterSixSteps())
  with pytest.raises(workdir_lock.WorkdirLost, match="taken over"):
    train.train_and_evaluate(run_config(demo_config, demo_data), str(tmp_path))
  assert checkpointing.Checkpointer(str(tmp_path)).all_steps() == [4]
  assert max(last_rows(str(tmp_path))) <= 6
  assert not glob.glob(str(tmp_path / "eval_*.json")) and released == [1]
