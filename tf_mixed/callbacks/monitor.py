"""Keras `fit` callbacks that make mixed-precision failures visible."""

# `LossScaleMonitor` reads the optimizer every `DEFAULT_CHECK_EVERY_N_BATCHES`
# batches by default and at each epoch end, so a run in which every step is
# skipped stops within about ``patience`` + 15 (the halvings from 2**15 to the
# minimum) + `DEFAULT_CHECK_EVERY_N_BATCHES` steps, not at the end of an epoch
# that may take hours. This adds no host synchronisation: Keras 3 on
# TensorFlow runs batch hooks in the training loop and converts every step's
# logs to Python floats whether a callback has a batch hook or not (its
# backend is not marked thread-safe, so it never dispatches them
# asynchronously); between reads the hook only counts. Every counter it judges
# is kept by the optimizer itself (`tf_mixed.scaling.scale_state.LossScaleState`), so
# a read every N batches is as exact as a read every step, whatever
# ``steps_per_execution`` is.
#
# 1. **Reports** ``loss_scale``, ``skipped_steps`` (in the epoch),
#    ``skipped_fraction`` and ``calibration_steps`` (of the epoch's skips,
#    those of the loss scale's calibration before the first applied step,
#    counted in the optimizer's step: `tf_mixed.scaling.calibration`) into
#    the epoch ``logs`` as Python floats, so
#    `History`, Keras's `TensorBoard` callback and the progress bar show them;
#    with ``log_every_n_batches=N`` also into the batch logs every N batches.
# 2. **Keeps skipped batches out of what the user sees.** With
#    ``tf_mixed.LossScaleOptimizer`` it installs
#    `tf_mixed.callbacks.skip_contract` on the model: a skipped batch enters
#    no compiled metric and not the running loss (batch logs, progress bar,
#    epoch logs, History), and every batch's logs carry ``skipped``
#    (docs/skipped-step.md). With gradient accumulation it also attaches a
#    `tf_mixed.scaling.LossTally` (applied windows' losses, for the NaN rule).
# 3. **Protects the model**: it hands the model to a
#    ``tf_mixed.LossScaleOptimizer`` (``track_forward_state``), so a skipped
#    step also rolls back BatchNormalization's moving statistics
#    (`tf_mixed.scaling.rollback`).
# 4. **Checks the set-up** at ``on_train_begin`` (`model_setup_problems`; a
#    subclassed model that ``fit`` builds itself, after its first step, when
#    its outputs can be traced), and after the first step the numerics
#    catalog's check of the magnitudes each layer's inputs reached on that
#    batch (`magnitude_problems`; read by `tf_mixed.callbacks.first_batch`), and
#    **stops a run that cannot recover**, by the rules of
#    `tf_mixed.callbacks.stop_rules` (pure functions of a typed reading). Every stop
#    decision is taken from values that are the same on every replica and
#    worker (the optimizer's counters follow the all-reduced skip verdict; the
#    NaN signs and the flags of non-finite weights are summed across workers),
#    so no worker stops while its peers wait in a collective, and every worker
#    states the same reason.
#
# Supported optimizers, each read through its adapter
# (`tf_mixed.callbacks.optimizer_views`): ``tf_mixed.LossScaleOptimizer`` (every rule exact),
# ``keras.optimizers.LossScaleOptimizer`` (skips derived from ``iterations``;
# see `tf_mixed.callbacks.stop_rules`; its epoch loss cannot be corrected), and any other
# optimizer (nothing is skipped; only the NaN and set-up checks apply, and
# ``loss_scale`` is logged as 1.0).

from __future__ import annotations

import math
import warnings
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from tf_mixed._internal import facts, tf_keras_check
from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.warning import MixedPrecisionWarning
from tf_mixed.callbacks import first_batch, fit_check, skip_contract, stop_rules
from tf_mixed.callbacks.optimizer_views import PlainView, view_of
from tf_mixed.callbacks.stop_rules import Progress, Snapshot
from tf_mixed.policy import keep_float32, model_check
from tf_mixed.scaling import unscaled_loop
from tf_mixed.scaling.optimizer import loss_scale_state
from tf_mixed.scaling.replicas import all_copies_finite
from tf_mixed.scaling.write_guard import REASONS

__all__ = [
    "DEFAULT_CHECK_EVERY_N_BATCHES",
    "LossScaleFailure",
    "LossScaleMonitor",
    "MixedPrecisionWarning",
    "magnitude_problems",
    "model_setup_problems",
]


DEFAULT_CHECK_EVERY_N_BATCHES = 50
"""How often the default `LossScaleMonitor` reads the optimizer and checks."""




class LossScaleFailure(RuntimeError):
    """Raised by `LossScaleMonitor(raise_on_failure=True)` when training fails."""


# ---------------------------------------------------------------- optimizer


def is_loss_scaling(optimizer) -> bool:
    """Whether `optimizer` scales the loss (tf_mixed's or Keras's wrapper).

    A tf_mixed pass-through wrapper (fixed scale 1) does not.
    """
    return view_of(optimizer).scales_loss()


# ---------------------------------------------------------------- set-up checks


# Audit findings that make a fit train badly; the monitor warns with them.
SETUP_FINDINGS = ("half_output_activation", "half_output", "policy_mismatch", "rounded_ids",
                  "keras_loss_scale_optimizer", "half_range", "half_resolution",
                  "catalog_no_kernel", "catalog_range")


def model_setup_problems(model) -> list[str]:
    """Mixed-precision set-up mistakes in a compiled model, each with its fix.

    The model checks are `tf_mixed.audit`'s findings (the codes in
    ``SETUP_FINDINGS``), in its words; the optimizer check is added here,
    since audit does not see the optimizer.

    Args:
      model: a `keras.Model` (compiled or not; the optimizer check needs
        ``model.optimizer``).

    Returns:
      A list of messages, empty when the set-up is sound.
    """
    from tf_mixed.tools import auditing

    report = auditing.audit(model)
    problems = []
    float16_layers = [row.name for row in report.rows
                      if row.compute_dtype == "float16"]
    optimizer = getattr(model, "optimizer", None)
    if float16_layers and optimizer is not None and not is_loss_scaling(optimizer):
        problems.append(
            f"Model '{model.name}' computes in float16 ({len(float16_layers)} "
            f"layers, e.g. '{float16_layers[0]}') but its optimizer "
            f"{type(optimizer).__name__} does not scale the loss: small "
            "gradients underflow to zero in float16. Fix: compile with "
            f"optimizer={auditing.wrap_advice()}."
        )
    bfloat16_layers = [row.name for row in report.rows
                       if row.variable_dtype == "bfloat16"]
    if (bfloat16_layers and optimizer is not None
            and not view_of(optimizer).compensates_bfloat16()):
        problems.append(
            f"Model '{model.name}' keeps weights in bfloat16 "
            f"({len(bfloat16_layers)} layers, e.g. '{bfloat16_layers[0]}') but "
            f"its optimizer {type(optimizer).__name__} updates them with "
            "bfloat16 arithmetic and plain rounding: a Keras Adam update of a "
            "bfloat16 weight is exactly 0, and small SGD steps round away. "
            "Fix: compile with optimizer=tf_mixed.wrap_optimizer(optimizer) "
            "under tf_mixed.enable('bfloat16') (compensated updates), or "
            "tf_mixed.scaling.compensate(optimizer) before compiling."
        )
    problems.extend(
        f"Model '{model.name}': {finding} (LossScaleMonitor(check_setup=False) "
        "silences this check.)"
        for finding in report.findings if finding.code in SETUP_FINDINGS)
    unknown = keep_float32.active().unknown_names(model)
    if unknown:
        problems.append(
            f"tf_mixed.enable(): {unknown} Those names keep nothing in float32; "
            "fix them (or pass keep_float32 to tf_mixed.convert, which checks).")
    return problems


def _built_by_first_step(model) -> bool:
    """Whether `model` is a subclassed model whose weights fit has yet to create."""
    from tf_mixed._internal.facts import model_inputs_and_outputs, walk_layers

    if model_inputs_and_outputs(model):
        return False
    return not (model.built and all(layer.built for _, layer in walk_layers(model)))


class _SetupCheck:
    """When the monitor warns with `model_setup_problems`, and with the catalog.

    At ``on_train_begin``; for a subclassed model that ``fit`` builds
    itself (no outputs to trace yet), after its first step instead. The
    catalog's ``catalog_range`` check needs what each layer's inputs reach:
    `tf_mixed.callbacks.first_batch` reads it in the first step, and the
    check runs after that step (`_warn_magnitudes`).
    """

    def __init__(self):
        self.pending = False
        self.first_batch = None

    def begin(self, monitor) -> None:
        """At ``on_train_begin``: warn now, or arrange to after the first step."""
        model = monitor.model
        self.pending = monitor.check_setup and _built_by_first_step(model)
        self.first_batch = (_arm_first_batch(model)
                            if monitor.check_setup and not self.pending else None)
        if self.pending or self.first_batch is not None:
            monitor.on_train_batch_end = monitor._on_train_batch_end
        if monitor.check_setup and not self.pending:
            _warn_setup(model)

    def after_step(self, model) -> None:
        """At a batch end: the pending checks, once."""
        if self.pending:
            self.pending = False
            _warn_setup(model)
        if self.first_batch is not None:
            found, self.first_batch = self.first_batch, None
            _warn_magnitudes(model, found.read())


def _warn_setup(model) -> None:
    for problem in model_setup_problems(model):
        warnings.warn(problem, MixedPrecisionWarning, stacklevel=4)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:  # said here: the optimizer's step does not say it again
        unscaled_loop.note_told(optimizer, model)


def _arm_first_batch(model):
    """The first step reads each layer's input magnitudes (the train step wrapped once)."""
    fresh = not first_batch.installed(model)
    found = first_batch.install(model)
    if found is not None and fresh and getattr(model, "train_function", None) is not None:
        model.make_train_function(force=True)
    return found


def magnitude_problems(model, magnitudes) -> list[str]:
    """The catalog's ``catalog_range`` findings for the first batch's magnitudes.

    Args:
      model: the model in ``fit``.
      magnitudes: ``{layer: max |input|}`` (`tf_mixed.callbacks.first_batch`),
        the same on every replica and worker; None when no step read them.

    Returns:
      Messages in `model_setup_problems`' words, one per layer outside its
      catalog row's safe range.
    """
    from tf_mixed.tools.auditing import Finding
    from tf_mixed.tools.catalog import model_check as catalog_check

    if not magnitudes:
        return []
    return [f"Model '{model.name}': {Finding(n.severity, n.code, n.layer, n.message, n.fix)} "
            "(the first batch's inputs; LossScaleMonitor(check_setup=False) silences "
            "this check.)"
            for n in catalog_check.check_model(model, magnitudes, has_gpu=True)
            if n.code == "catalog_range"]


def _warn_magnitudes(model, magnitudes) -> None:
    for problem in magnitude_problems(model, magnitudes):
        warnings.warn(problem, MixedPrecisionWarning, stacklevel=4)


# ---------------------------------------------------------------- callback


def _check_number(name: str, value, rule, valid: str) -> float:
    return _validate.number(value, name, owner="LossScaleMonitor", rule=rule,
                            valid=valid)


def _check_int(name: str, value, minimum: int, hint: str) -> int:
    return _validate.number(value, name, integer=True, owner="LossScaleMonitor",
                            rule=lambda v: v >= minimum,
                            valid=f"an integer >= {minimum}{hint}")


def _global_sums(strategy, values: list[float]) -> list[float]:
    """Sums ``values`` over the workers of a multi-worker strategy.

    A callback runs on every worker at the same point of ``fit``, so all
    workers enter this one small all-reduce together. With one worker the
    values are returned as they are (no collective).
    """
    if not tf.distribute.has_strategy() and strategy.num_replicas_in_sync == 1:
        return values
    local_replicas = len(strategy.extended.worker_devices)
    if strategy.num_replicas_in_sync <= local_replicas:
        return values
    # One function per strategy, traced once per length of `values` (a check
    # every 50 batches would otherwise trace a new one each time).
    reduce = _internals.rider(strategy, "global_sums", lambda: _summing(strategy))
    return [float(v) for v in reduce(tf.constant(values, tf.float32) / local_replicas).numpy()]


def _summing(strategy):
    """``reduce(share) -> share summed over every replica``, a `tf.function` on ``strategy``."""

    @tf.function
    def reduce(share):
        per_replica = strategy.run(lambda: tf.identity(share))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return reduce


# What the monitor knows before its first read.
_NO_READ = Snapshot(scale=1.0, applied=0)


# LossScaleMonitor's constructor arguments, in order (its get_config).
_CONFIG = ("patience", "max_skip_fraction", "min_scale", "log_every_n_batches",
           "raise_on_failure", "check_setup", "check_every_n_batches",
           "rollback_forward_state", "check_policy")

def _check_period(value) -> tuple[int | None, int]:
    """``check_every_n_batches`` checked, and the period it means."""
    if value is None:
        return None, DEFAULT_CHECK_EVERY_N_BATCHES
    value = _check_int("check_every_n_batches", value, 0,
                       " (0 checks at epoch ends only; "
                       f"None every {DEFAULT_CHECK_EVERY_N_BATCHES})")
    return value, value


class EpochReasons:
    """Skipped steps per reason in one epoch, for the epoch logs.

    ``logs["skipped_<reason>"]`` for each of
    `tf_mixed.scaling.write_guard.REASONS`, read from the optimizer's counts
    (`tf_mixed.loss_scale_state`, field ``skip_reasons``) at the epoch's
    start and end: two host reads an epoch. Nothing is written for an
    optimizer that does not count them (Keras's wrapper).
    """

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer
        self.start = self._read()

    def _read(self):
        if self.optimizer is None:
            return None
        return loss_scale_state(self.optimizer).skip_reasons

    def write(self, logs: dict) -> None:
        """Adds this epoch's counts to ``logs`` as Python floats.

        The last batch's ``skip_reason`` code is not the epoch's: dropped.
        """
        logs.pop(skip_contract.REASON_KEY, None)
        now = self._read()
        if now is None or self.start is None:
            return
        for reason, before, after in zip(REASONS, self.start, now):
            logs[f"skipped_{reason}"] = float(after - before)


def run_advice(model, view) -> stop_rules.Advice:
    """The stop messages' fixes for ``model``'s compute dtype and optimizer.

    From `tf_mixed._internal.facts.POLICY_FIXES`, for the narrowest dtype
    any layer computes in; ``scaled``: whether ``view``'s optimizer scales
    the loss.
    """
    dtype = facts.narrowest_compute_dtype(model)
    return stop_rules.Advice(
        overflow=f" Fix: {facts.policy_fix(dtype, 'overflow')}.",
        no_scale=f" Fix: {facts.policy_fix(dtype, 'no_scale')}.",
        scaled=view.scales_loss())


def _agreed_problems(monitor: "LossScaleMonitor", logged: float | None,
                     scan: bool) -> tuple[str | None, tuple[str, ...]]:
    """The loss problem and the weights holding NaN/inf, the same on every worker.

    Each worker's loss signs (`tf_mixed.callbacks.stop_rules.loss_signs`)
    and a flag per float weight (NaN/inf in a local copy; scanned only when
    ``scan``) are summed across workers in one all-reduce, so every worker
    states the same sentence and names the same weights, whichever worker's
    data or forward state went bad.

    Args:
      monitor: the monitor checking.
      logged: Keras's ``logs["loss"]`` as a float, or None.
      scan: whether this worker reads its weights' copies.

    Returns:
      ``(loss problem or None, paths of non-finite weights)``.
    """
    view, progress, model = monitor._view, monitor._progress, monitor.model
    signs = stop_rules.loss_signs(view.kind, progress,
                                  None if view.judges_loss_by_tally() else logged)
    weights = [w for w in model.weights if keras.backend.is_float_dtype(w.dtype)]
    flags = [float(scan and not all_copies_finite(w)) for w in weights]
    summed = _global_sums(model.distribute_strategy, signs + flags)
    return (stop_rules.agreed_loss_problem(view.kind, progress, summed[:3]),
            tuple(w.path for w, count in zip(weights, summed[3:]) if count))


def _write(monitor: "LossScaleMonitor", logs: dict, epoch_end: bool = False) -> None:
    """Writes the monitor's loss scale, skipped steps and (at an epoch's end) loss into ``logs``.

    ``calibration_steps``: of the epoch's ``skipped_steps``, those the loss
    scale's calibration skipped (`tf_mixed.callbacks.stop_rules.search_skips`),
    which the epoch rule leaves out.
    """
    progress = monitor._progress
    steps, skipped = progress.steps_in_epoch, progress.skipped_in_epoch
    logs["loss_scale"] = float(progress.last.scale)
    logs["skipped_steps"] = float(skipped)
    logs["skipped_fraction"] = float(skipped / steps) if steps else 0.0
    logs["calibration_steps"] = float(stop_rules.search_skips(progress))
    applied = progress.epoch_loss_steps
    # With the skip contract Keras's own loss already leaves skipped
    # batches out (weighted by batch size, as without a skip).
    if epoch_end and monitor._view.corrects_epoch_loss(monitor.model) and skipped and applied:
        # Each worker's sum covers its own replicas only; `skipped` and
        # `applied` follow the global verdict, so every worker enters
        # this sum, and every worker logs the same loss.
        total, = _global_sums(monitor.model.distribute_strategy,
                              [progress.epoch_loss_sum])
        logs["loss"] = float(total / applied)


class LossScaleMonitor(keras.callbacks.Callback):
    """Logs the loss scale and skipped steps, checks the set-up, stops failed runs.

    Put it before `keras.callbacks.TensorBoard` in the callbacks list so
    TensorBoard sees the values it adds to the logs (`History` and the
    progress bar are appended by Keras after user callbacks, so they always
    do).

    Args:
      patience: stop after this many consecutive skipped steps at the
        minimum loss scale. Integer >= 1.
      max_skip_fraction: stop when the fraction of skipped steps in an epoch
        exceeds this, checked at the end of each epoch. In (0, 1]; 1.0
        turns the check off.
      min_scale: for optimizers without a minimum scale (Keras's wrapper),
        the scale counted as "minimum". None (default) = 1.0.
        ``tf_mixed.LossScaleOptimizer`` counts at its own ``min_scale``.
      log_every_n_batches: also write the values into the batch logs every N
        batches (so TensorBoard with ``update_freq=N`` plots them). 0
        (default) = epoch logs only.
      check_every_n_batches: also run the stop checks every N batches (a
        host read every N batches; with ``steps_per_execution > 1`` at the
        first batch end after every N batches). 0 = at epoch ends only;
        None (default) = every `DEFAULT_CHECK_EVERY_N_BATCHES` batches.
      raise_on_failure: raise `LossScaleFailure` instead of setting
        ``model.stop_training``.
      check_setup: run the set-up checks (``on_train_begin``; the catalog's after step 1).
      rollback_forward_state: hand the model to a ``tf_mixed.LossScaleOptimizer``
        so skipped steps roll back its non-trainable state (BatchNormalization
        statistics); False leaves it as a skipped batch wrote it, on purpose (not refused).
      check_policy: time the model's half policy against float32 on its own
        first steps (`tf_mixed.policy.model_check`): under a policy auto
        chose, a slower half policy is replaced by float32; under an
        explicit one it is kept with one warning (docs/policies.md). False
        trains as built, unchecked.

    Attributes:
      stop_reason: why training was stopped, or None.
      total_skipped_steps: skipped steps seen since ``on_train_begin``.
      loss_scaling: the wrapper seen: "tf_mixed", "keras", "none" (None before fit).
      model_check: the `tf_mixed.policy.model_check.Check` of this fit (its
        ``verdict``: auto's half policy against float32 on the model's own
        first steps), or None when the model was not checked.

    Raises:
      TypeError, ValueError: an argument out of range; the message names it.

    Example:

        history = model.fit(x, y, callbacks=[LossScaleMonitor(patience=20)])
        history.history["loss_scale"], history.history["skipped_steps"]
    """

    def __init__(
        self,
        patience: int = 20,
        max_skip_fraction: float = 0.5,
        min_scale: float | None = None,
        log_every_n_batches: int = 0,
        raise_on_failure: bool = False,
        check_setup: bool = True,
        check_every_n_batches: int | None = None,
        rollback_forward_state: bool = True,
        check_policy: bool = True,
    ):
        super().__init__()
        self.patience = _check_int(
            "patience", patience, 1, ", such as 20 (steps at the minimum loss "
            "scale before stopping)")
        self.max_skip_fraction = _check_number(
            "max_skip_fraction", max_skip_fraction, lambda v: 0.0 < v <= 1.0,
            "a number in (0, 1] (1.0 turns the check off), such as 0.5")
        self.min_scale = None if min_scale is None else _check_number(
            "min_scale", min_scale, lambda v: 0.0 < v < math.inf,
            "a positive finite number or None, such as 1.0")
        self.log_every_n_batches = _check_int(
            "log_every_n_batches", log_every_n_batches, 0,
            " (0 turns batch logging off)")
        self.check_every_n_batches, self._check_n = _check_period(check_every_n_batches)
        self.raise_on_failure = bool(raise_on_failure)
        self.check_setup = bool(check_setup)
        self.rollback_forward_state = bool(rollback_forward_state)
        self.check_policy = _validate.boolean(check_policy, "check_policy",
                                              owner="LossScaleMonitor")
        self.stop_reason: str | None = None
        self.loss_scaling: stop_rules.Kind | None = None
        self.model_check: model_check.Check | None = None
        self._rules = stop_rules.StopRules(self.patience, self.max_skip_fraction)
        self._progress = Progress(_NO_READ, _NO_READ)
        self._view = PlainView(None)  # the optimizer's adapter, from on_train_begin
        self._setup = _SetupCheck()
        if self.log_every_n_batches or self._check_n:
            self.on_train_batch_end = self._on_train_batch_end

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments."""
        return {name: getattr(self, name) for name in _CONFIG}

    @property
    def total_skipped_steps(self) -> int:
        """Skipped steps seen since ``on_train_begin``."""
        return self._progress.total_skipped

    # -- hooks

    def on_train_begin(self, logs=None):
        tf_keras_check.check_objects("tf_mixed.LossScaleMonitor", model=self.model)
        self.stop_reason = None
        # The first line: what the model computes in, who chose it, measured on what.
        logging.info("tf_mixed.LossScaleMonitor: %s.", model_check.describe(self.model))
        self._view = view_of(getattr(self.model, "optimizer", None))
        self._view.log_seen()
        self.loss_scaling = self._view.kind
        self._view.prepare(self.model, self.rollback_forward_state)
        self._threshold = self._view.threshold(self.min_scale)
        first = self._view.snapshot()
        self._progress = Progress(first, first)
        self._batches = self._logged_at = self._checked_at = 0
        self._setup.begin(self)
        # Auto's choice checked on this model's own first steps (docs/policies.md).
        self.model_check = fit_check.attach(self) if self.check_policy else None

    def on_epoch_begin(self, epoch, logs=None):
        self._view.refresh(self.rollback_forward_state)
        self._reasons = EpochReasons(self._view.optimizer)
        self._progress = stop_rules.start_epoch(self._progress)
        self._batches = self._logged_at = self._checked_at = 0

    def _on_train_batch_end(self, batch, logs=None):
        self._setup.after_step(self.model)
        logs = logs if logs is not None else {}
        self._batches = steps = batch + 1
        log_n, check_n = self.log_every_n_batches, self._check_n
        log_now = log_n and steps // log_n > self._logged_at // log_n
        check_now = check_n and steps // check_n > self._checked_at // check_n
        if not (log_now or check_now):
            return
        self._advance()
        if log_now:
            self._logged_at = steps
            _write(self, logs)
        if check_now:
            self._checked_at = steps
            self._check(logs, epoch=None)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        self._advance()
        logs.pop(skip_contract.SKIPPED_KEY, None)  # a batch's flag, not the epoch's
        getattr(self, "_reasons", EpochReasons(None)).write(logs)
        _write(self, logs, epoch_end=True)
        self._check(logs, epoch=epoch)
        if self._view.applied_nothing(self._progress):  # after the check, which reads counters
            skip_contract.no_applied_step(logs, self.model)

    # -- reading, logging, judging

    def _advance(self) -> None:
        view = self._view
        steps_run = view.updates(self._batches or (self.params or {}).get("steps"))
        self._progress = stop_rules.advance(
            self._progress, view.snapshot(), view.kind, steps_run, self._threshold)

    def _check(self, logs, epoch) -> None:
        if self.stop_reason is not None:
            return
        logged = None if logs.get("loss") is None else float(logs["loss"])
        # A skipped step in the epoch: Keras's running loss showed it as
        # nan; with the skip contract it leaves the loss, so ask the counters.
        suspicious = epoch is not None or self._progress.skipped_in_epoch > 0 or (
            logged is not None and not math.isfinite(logged))
        # Judged from values every worker agrees on (summed across workers).
        problem, bad = _agreed_problems(self, logged, suspicious)
        reason = stop_rules.decide(self._rules, stop_rules.Reading(
            kind=self._view.kind, progress=self._progress,
            threshold=self._threshold, loss_problem=problem,
            bad_weights=bad, epoch=epoch,
            cause=self._view.wire_cause(self.model),
            advice=run_advice(self.model, self._view)))
        if reason is not None:
            self._fail(reason)

    def _fail(self, reason: str) -> None:
        self.stop_reason = reason
        message = f"LossScaleMonitor stopped training: {reason}"
        if self.raise_on_failure:
            raise LossScaleFailure(message)
        logging.error(message)
        self.model.stop_training = True
