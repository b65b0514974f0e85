"""Guards of the train loop: preemption and non-finite losses.

Preemption: TPU VMs are preempted with SIGTERM; on pods JAX also offers a
preemption sync point so that every host stops at the same step. Whenever it
comes, the run ends with ``Preempted`` and ``python -m bertjax.main`` exits
with status ``EXIT_PREEMPTED`` (75, EX_TEMPFAIL: "try again"); rerunning the
same command goes on:
  - before the first step (start-up, data preparation, restore): nothing new
    to save, the newest checkpoint stays the newest; data preparation stops
    at once (``sigterm_raises``, as ``bertjax.prepare``), keeping the units
    already prepared for the rerun (on pods: every process, whichever got
    the notice, bertjax/preempt_notice.py);
  - during training, or while a checkpoint is being written: a checkpoint of
    the current step is saved and the loop waits for it to commit;
  - during an evaluation: the evaluation is abandoned after the checkpoint
    of the step has committed, and the next run does it first (a periodic
    one before its next step, the final one at the end); with several
    processes all abandon it before the same batch (``should_stop_evaluating``).
``bertjax.main`` (and ``evaluate``, ``finetune``) calls ``catch_sigterm``
before its heavy imports, with SIGTERM blocked across the restart before it
(``host_memory``), so a SIGTERM during start-up is remembered rather than
fatal (exit 143). With
several processes (``jax.distributed``) JAX's preemption notifier takes
SIGTERM from the end of ``jax.distributed.initialize`` on, and all stop after
the same step, the run's first at the earliest; one remembered before the
process had connected ends it at once (``bertjax/main.py``), one remembered
after stops every process at the config check (``multihost.check_same_run``).
Ctrl-C (SIGINT) in the train loop is taken the same way, with exit status
``EXIT_INTERRUPTED``; a second Ctrl-C, or one outside the loop (start-up,
data preparation), stops at once, and the binaries say so in one line
(``bertjax/cli.py``).

Non-finite loss: the train step never applies an update whose loss or
gradient norm is NaN/Inf (it reports the step as skipped instead). With
``config.nonfinite='stop'`` (default) the loop stops at the first such step
with ``NonFiniteLoss`` and saves nothing, so the last good checkpoint stays
the newest; with ``'skip'`` it carries on and stops only after
``config.max_consecutive_skips`` skipped steps in a row.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from absl import logging

EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
NONFINITE_MODES = ("stop", "skip")

# Set by the SIGTERM handler; module-level so that a signal caught during
# start-up (``catch_sigterm``) reaches the watcher created later.
_SIGTERM = threading.Event()
# Set with _SIGTERM when the stop was asked for with Ctrl-C.
_SIGINT = threading.Event()


def _cause() -> str:
  return "Interrupted (Ctrl-C)" if _SIGINT.is_set() else "Preempted"


class Preempted(Exception):
  """The run was preempted; what was saved is in the message."""

  def __init__(self, step: int, message: str | None = None):
    super().__init__(message or (
        f"{_cause()} at step {step}; a checkpoint of that step was saved, run "
        "the same command again to resume."))
    self.step = step
    self.interrupted = _SIGINT.is_set()
    self.exit_status = EXIT_INTERRUPTED if self.interrupted else EXIT_PREEMPTED

  @classmethod
  def before_first_step(cls, newest: int | None) -> "Preempted":
    step = newest or 0
    newest = ("no checkpoint yet" if newest is None
              else f"the newest checkpoint is step {newest}")
    return cls(step, f"Preempted before the first step; nothing new to save "
                     f"({newest}), run the same command again to go on.")

  @classmethod
  def while_preparing(cls, newest: int | None) -> "Preempted":
    """SIGTERM while ``bertjax.main`` prepared the data (``sigterm_raises``)."""
    saved = ("no checkpoint yet" if newest is None
             else f"the newest checkpoint is step {newest}")
    return cls(newest or 0, f"Preempted while preparing the data ({saved}); run "
                            "the same command again to go on from the units "
                            "already prepared.")

  @classmethod
  def while_connecting(cls) -> "Preempted":
    """SIGTERM while this process waited in jax.distributed.initialize."""
    return cls(0, "Preempted while this process waited for the others to "
                  "connect (jax.distributed.initialize); nothing read or written, "
                  "run the same command again to go on.")

  @classmethod
  def during_start_up(cls, processes: list[int]) -> "Preempted":
    """Several processes, one or more of which got SIGTERM before JAX's
    preemption notifier was installed (``multihost.check_same_run``)."""
    which = ", ".join(str(p) for p in processes)
    return cls(0, f"Preempted while the run started (SIGTERM to process "
                  f"{which}); nothing read or written yet, run the same command "
                  "again to go on.")

  @classmethod
  def during_final_evaluation(cls, step: int) -> "Preempted":
    return cls(step, f"{_cause()} during the final evaluation; the checkpoint of "
                     f"step {step} is saved, run the same command again to "
                     "evaluate it.")

  @classmethod
  def during_evaluation(cls, step: int) -> "Preempted":
    """SIGTERM while ``bertjax.evaluate`` evaluated the checkpoint of ``step``."""
    return cls(step, f"{_cause()} while evaluating the checkpoint of step {step}; "
                     "nothing written, run the same command again to evaluate it.")

  @classmethod
  def during_evaluation_of_epoch(cls, step: int) -> "Preempted":
    """SIGTERM while ``bertjax.finetune`` evaluated an epoch's end before the last."""
    return cls(step, f"{_cause()} while evaluating the epoch that ended at step "
                     f"{step}; its checkpoint is saved, run the same command again "
                     "to evaluate it and go on.")

  @classmethod
  def during_final_predictions(cls, step: int) -> "Preempted":
    return cls(step, f"{_cause()} while predicting the predict files; the checkpoint "
                     f"of step {step} is saved, run the same command again to "
                     "predict them.")


class NonFiniteLoss(ValueError):
  """The loss or gradient norm became NaN/Inf."""


def _on_sigterm(signum, frame):
  del frame
  logging.warning("Received signal %d: stopping at the next safe point.", signum)
  _SIGTERM.set()


def _on_sigint(signum, frame):
  """The first Ctrl-C stops the train loop as SIGTERM does; a second, or
  one after SIGTERM, stops at once."""
  del signum, frame
  if _SIGTERM.is_set():
    raise KeyboardInterrupt
  logging.warning("Ctrl-C: stopping after a checkpoint of this step; press Ctrl-C "
                  "again to stop at once (the newest checkpoint stays).")
  _SIGINT.set()
  _SIGTERM.set()


def catch_sigterm() -> None:
  """Remembers SIGTERM instead of dying of it (main thread only); one that
  waited, blocked across the restart ``host_memory.reexec_with_malloc_tunables``
  did, is taken now."""
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _on_sigterm)
    if hasattr(signal, "pthread_sigmask"):
      signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


class Terminated(Exception):
  """SIGTERM came inside ``sigterm_raises`` (raised where the main thread was)."""


def _raise_terminated(signum, frame):
  del signum, frame
  _SIGTERM.set()
  signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends it at once
  raise Terminated


@contextlib.contextmanager
def sigterm_raises():
  """Within it SIGTERM raises ``Terminated`` at once, wherever the main thread
  is, instead of being remembered for the next safe point.

  For work that is safe to stop anywhere and may run long without a safe
  point of its own: prepare (every unit is staged and published by rename,
  bertjax/data/staged.py), convert (an import is staged, an export removes
  what it wrote). One remembered before (``catch_sigterm``) raises on entry;
  on exit the handler from before is back. Main thread only. With
  ``jax.distributed`` running, JAX's notifier has SIGTERM: there a preemption
  notice of any process raises ``Terminated`` instead (bertjax/preempt_notice.py).
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  if _several_processes():
    from bertjax import preempt_notice
    with preempt_notice.raising(), _said_as_terminated():
      yield
    return
  previous = signal.signal(signal.SIGTERM, _raise_terminated)
  try:
    if _SIGTERM.is_set():
      raise Terminated
    with _said_as_terminated():
      yield
  finally:
    # None: a handler not set from Python, which cannot be set back.
    signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def _said_as_terminated():
  """A library that catches everything (TFDS reading a JSON file, say) turns
  the Terminated raised inside it into an error of its own, which would be
  reported as bad data: the stop it was is said instead."""
  try:
    yield
  except Terminated:
    raise
  except Exception as e:
    if _SIGTERM.is_set():
      raise Terminated from e
    raise


def remember_sigterm() -> None:
  """Marks this process as stopping (a preemption notice of another process)."""
  _SIGTERM.set()


def finish_on_sigterm() -> None:
  """From here to the end of the ``sigterm_raises`` block a SIGTERM is
  remembered, not raised: for its last part, which a stop would leave half
  done (an import's moves into the workdir) and which is short. With several
  processes: the part after they agreed to go on (``multihost.process_0_first``)."""
  if threading.current_thread() is not threading.main_thread():
    return
  if signal.getsignal(signal.SIGTERM) is _raise_terminated:
    signal.signal(signal.SIGTERM, _on_sigterm)
  from bertjax import preempt_notice  # pylint: disable=g-import-not-at-top
  preempt_notice.hold()


def _several_processes() -> bool:
  """Whether jax.distributed is running (without importing JAX)."""
  if "jax" not in sys.modules:
    return False
  import jax
  return jax.distributed.is_initialized()


class PreemptionWatcher:
  """Notices SIGTERM (and, on pods, JAX's preemption sync point).

  With ``jax.distributed`` running SIGTERM is left to JAX's preemption
  notifier, which jax.distributed.initialize installs: it tells every
  process, and all stop after the same step. A handler of ours would hide
  the signal from it, and a process that stopped on its own would leave the
  others waiting in the next step's collectives. (A SIGTERM that came before
  the notifier was there is bertjax's to pass on: ``multihost.check_same_run``.)
  """

  def __init__(self):
    self._previous = None
    self._previous_sigint = None
    self._steps = 0  # train-loop steps of this run, JAX's sync-point ids
    if (threading.current_thread() is threading.main_thread()
        and not _several_processes()):
      self._previous = signal.signal(signal.SIGTERM, _on_sigterm)

  def catch_interrupt(self) -> None:
    """From here on (the train loop) until ``close``, the first Ctrl-C stops
    at the next step with a checkpoint instead of at once (main thread only;
    a process started with SIGINT ignored, as a shell's background job is,
    keeps ignoring it)."""
    if (threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN):
      self._previous_sigint = signal.signal(signal.SIGINT, _on_sigint)

  @staticmethod
  def signalled() -> bool:
    """Whether this process got SIGTERM (no cross-host agreement)."""
    return _SIGTERM.is_set()

  @staticmethod
  def before_first_step() -> bool:
    """Whether to stop before the train loop's first step (nothing to save).

    With ``jax.distributed`` running only a SIGTERM of one process that is
    alone in the run: the processes of a larger run have agreed on the ones
    that came before JAX's notifier (``multihost.check_same_run``), and JAX's
    sync point stops them at the same step, after the first, for those that
    came after it.
    """
    if not _several_processes():
      return _SIGTERM.is_set()
    import jax
    return _SIGTERM.is_set() and jax.process_count() == 1

  def should_stop(self, step: int) -> bool:
    """Whether to stop after ``step``, called once after every step of the
    train loop; on pods all hosts agree on it."""
    del step  # JAX's sync-point ids count the questions, not the global step
    return self._agreed_stop()

  def should_stop_evaluating(self) -> bool:
    """Whether to abandon an evaluation, asked before each of its batches;
    on pods all hosts agree on it, as on ``should_stop``.

    Every process evaluates the same number of batches in the same order, so
    these questions take JAX's sync-point ids in step on all of them, between
    the train loop's: a notice during an evaluation stops every process
    before the same batch, instead of leaving it to the next train step (an
    evaluation can be long, a preemption's grace period short).
    """
    return self._agreed_stop()

  def _agreed_stop(self) -> bool:
    if not _several_processes():
      return _SIGTERM.is_set()
    # JAX's sync point is the step after the newest any process had reached
    # when the notice came, counted from 0 before the first call: numbered
    # from the run's own first step, a notice that came during start-up
    # stops a resumed run too (with the global step, a run resumed at step 4
    # waited for step 1 and never stopped).
    self._steps += 1
    from jax.experimental import multihost_utils
    try:
      return bool(multihost_utils.reached_preemption_sync_point(self._steps))
    except RuntimeError:  # no preemption service in this cluster set-up
      import jax
      return _SIGTERM.is_set() and jax.process_count() == 1

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
    if self._previous_sigint is not None:
      signal.signal(signal.SIGINT, self._previous_sigint)
      self._previous_sigint = None
    _SIGTERM.clear()  # a later run in this process starts afresh
    _SIGINT.clear()


class NonFiniteGuard:
  """Reads each step's 'skipped' flag (one step late) and applies the policy."""

  def __init__(self, mode: str, max_consecutive: int):
    if mode not in NONFINITE_MODES:
      raise ValueError(f"config.nonfinite={mode!r} is invalid; set "
                       f"--config.nonfinite to one of {', '.join(NONFINITE_MODES)}.")
    self.mode = mode
    self.max_consecutive = max(int(max_consecutive), 1)
    self.consecutive = 0
    self.total = 0

  def check(self, step: int, skipped_flag) -> None:
    """``skipped_flag``: the step's metrics['skipped'] (sum, count) pair."""
    import jax
    skipped = float(jax.device_get(skipped_flag[0])) > 0
    if not skipped:
      self.consecutive = 0
      return
    self.total += 1
    self.consecutive += 1
    if self.mode == "stop":
      raise NonFiniteLoss(
          f"The loss or gradient norm became NaN/Inf at step {step}; the newest "
          "checkpoint is the last good one. Lower --config.learning_rate, or set "
          "--config.nonfinite=skip to skip such updates.")
    logging.warning("Skipped the update of step %d: non-finite loss or gradient "
                    "(%d in a row, %d in all).", step, self.consecutive, self.total)
    if self.consecutive >= self.max_consecutive:
      raise NonFiniteLoss(
          f"{self.consecutive} updates in a row had a NaN/Inf loss or gradient "
          f"(last at step {step}); lower --config.learning_rate or check the data.")


def update_if_finite(finite, tx, grads, params, opt_state, grad_norm=None):
  """The optimizer update of the train step, applied only when ``finite``.

  Where the step compiles for a GPU, ``update_by_select``; elsewhere
  ``update_by_cond``. The two give the same values; they differ in what the
  compiled step pays for the guard (each form's docstring says what).

  Args:
    finite: bool scalar; False leaves params and optimizer state unchanged.
    tx: the optax GradientTransformation.
    grads, params, opt_state: pytrees (inside the jitted step).
    grad_norm: None, or the global norm of ``grads`` the step has computed,
      passed on to ``tx.update`` (``optim.clip_by_global_norm`` then need not
      read every gradient again to compute it).

  Returns:
    (params, opt_state) after the update, or the inputs when not ``finite``.
  """
  from bertjax.models import attention

  form = update_by_select if attention.compiles_for_gpu() else update_by_cond
  return form(finite, tx, grads, params, opt_state, grad_norm)


def _tx_update(tx, grads, params, opt_state, grad_norm):
  import jax
  import optax

  takes_extra = isinstance(tx, optax.GradientTransformationExtraArgs)
  extra = {"grad_norm": grad_norm} if grad_norm is not None and takes_extra else {}
  # Named scopes label the parts in profiles (bench/profile_step.py).
  with jax.named_scope("optimizer"):
    updates, opt_state = tx.update(grads, opt_state, params, **extra)
    return optax.apply_updates(params, updates), opt_state


def update_by_cond(finite, tx, grads, params, opt_state, grad_norm=None):
  """``update_if_finite`` as one ``lax.cond`` around the update.

  On a CPU (and a TPU) rather than selects over the updated and the old
  trees: a select reads the old value of every donated buffer that the
  update writes in place, so XLA:CPU copies each AdamW moment first
  (BERT-base: 880 MB a step; its update alone went from 0.42 to 0.28 s on a
  2-core CPU, bench/update_bench.py; bench/ab_step.py's ``guard_where`` is
  the select form). The skipped branch returns its operands, so a skipped
  step leaves params and optimizer state bit-identical.
  """
  import jax

  with jax.named_scope("nonfinite_guard"):
    return jax.lax.cond(
        finite, lambda operands: _tx_update(tx, *operands, grad_norm),
        lambda operands: operands[1:], (grads, params, opt_state))


def update_by_select(finite, tx, grads, params, opt_state, grad_norm=None):
  """``update_if_finite`` as the update followed by selects (``jnp.where``)
  between the updated and the old trees.

  On a GPU rather than the ``lax.cond``: there the selects fuse into the
  update's elementwise kernels and the step has no conditional to branch on
  (a bf16 BERT-base step, 32 x 512, on an H200 was 0.6% faster than with the
  cond: docs/performance.md, bench/ab_step.py ``guard_cond``). A skipped step
  selects the old values, so it leaves params and optimizer state
  bit-identical.
  """
  import jax
  import jax.numpy as jnp

  new = _tx_update(tx, grads, params, opt_state, grad_norm)
  with jax.named_scope("nonfinite_guard"):
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new,
                        (params, opt_state))
