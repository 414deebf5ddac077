"""Keras `fit` callbacks that make mixed-precision failures visible.

`LossScaleMonitor` does four jobs and costs nothing per step by default: it
does not override ``on_train_batch_end`` (so Keras dispatches batch hooks
asynchronously and never waits for a step on its behalf) and reads the
optimizer once per epoch. Every counter it judges is kept by the optimizer
itself (`tf_mixed.scale_state.LossScaleState`), so a read every epoch is as
exact as a read every step, whatever ``steps_per_execution`` is.

1. **Reports.** At the end of every epoch it writes ``loss_scale``,
   ``skipped_steps`` (steps skipped in that epoch) and ``skipped_fraction``
   into the epoch ``logs`` as Python floats, so `History`, Keras's
   `TensorBoard` callback and the progress bar show them. With
   ``log_every_n_batches=N`` it also writes them into the batch logs every N
   batches (a host read every N batches).
2. **Corrects the epoch loss.** When an epoch skipped steps, Keras's
   ``logs["loss"]`` averages in the skipped steps' NaN/inf loss and shows
   ``loss: nan`` for a healthy epoch. With ``tf_mixed.LossScaleOptimizer``
   the monitor replaces ``logs["loss"]`` by the mean loss of the applied
   steps (the optimizer sums them as it applies; see
   ``LossScaleOptimizer.applied_loss_totals``). Epochs without a skipped step
   keep Keras's value untouched.
3. **Protects the model.** At ``on_train_begin`` it hands the model to a
   ``tf_mixed.LossScaleOptimizer`` (``track_forward_state``), so a skipped
   step also rolls back what its forward pass wrote (BatchNormalization's
   moving statistics), on every replica.
4. **Checks the set-up** at ``on_train_begin`` (`model_setup_problems`) and
   **stops a run that cannot recover**: ``patience`` consecutive steps skipped
   at the minimum loss scale; more than ``max_skip_fraction`` of an epoch
   skipped; a non-finite loss on an *applied* step, or NaN/inf in any
   replica's copy of the weights or statistics. These checks run at the end
   of every epoch, and every ``check_every_n_batches`` batches when asked.
   Every stop decision is taken from values that are the same on every
   replica and worker (the optimizer's counters follow the all-reduced skip
   verdict; the NaN checks are reduced across workers), so no worker stops
   while its peers wait in a collective.

Supported optimizers, all read through `tf_mixed.loss_scale_state`:

* ``tf_mixed.LossScaleOptimizer``: every rule is exact.
* ``keras.optimizers.LossScaleOptimizer``: it keeps no skipped counter, but
  its inner optimizer's ``iterations`` advance only on applied steps, so
  skipped = steps run - iterations advanced; it has no minimum scale and
  halves on every skip, so "at its minimum" means at or below the monitor's
  ``min_scale`` (default 1.0) and the streak is counted from the halvings
  between two reads. Its epoch loss cannot be corrected.
* any other optimizer: nothing is skipped; only the NaN checks and the
  set-up checks apply, and ``loss_scale`` is logged as 1.0.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from tf_mixed import loss_scale as loss_scale_module
from tf_mixed import tf_keras_check

__all__ = [
    "LossScaleFailure",
    "LossScaleMonitor",
    "MixedPrecisionWarning",
    "model_setup_problems",
]

class MixedPrecisionWarning(UserWarning):
    """A mixed-precision set-up that will train badly or not at all."""


class LossScaleFailure(RuntimeError):
    """Raised by `LossScaleMonitor(raise_on_failure=True)` when training fails."""


# ---------------------------------------------------------------- optimizer


def is_loss_scaling(optimizer) -> bool:
    """Whether `optimizer` scales the loss (tf_mixed's or Keras's wrapper).

    A tf_mixed pass-through wrapper (fixed scale 1) does not.
    """
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return False
    if isinstance(optimizer, loss_scale_module.LossScaleOptimizer):
        return optimizer.dynamic or optimizer.initial_scale != 1.0
    return True


# ---------------------------------------------------------------- set-up checks


# Audit findings that make a fit train badly; the monitor warns with them.
SETUP_FINDINGS = ("half_output_activation", "half_output", "policy_mismatch")


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
    from tf_mixed import auditing

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
            "optimizer=tf_mixed.wrap_optimizer(optimizer)."
        )
    problems.extend(
        f"Model '{model.name}': {finding} (LossScaleMonitor(check_setup=False) "
        "silences this check.)"
        for finding in report.findings if finding.code in SETUP_FINDINGS)
    return problems


# ---------------------------------------------------------------- callback


def _check_fraction(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"'{name}' must be a number in (0, 1], such as 0.5. "
            f"Received: {name}={value!r} (of type {type(value).__name__})"
        )
    if not 0.0 < value <= 1.0 or math.isnan(value):
        raise ValueError(
            f"'{name}' must be in (0, 1] (1.0 turns the check off), such as "
            f"0.5. Received: {name}={value!r}"
        )
    return float(value)


def _check_int(name: str, value, minimum: int, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"'{name}' must be an integer >= {minimum}{hint}. "
            f"Received: {name}={value!r} (of type {type(value).__name__})"
        )
    if value < minimum:
        raise ValueError(
            f"'{name}' must be an integer >= {minimum}{hint}. "
            f"Received: {name}={value!r}"
        )
    return int(value)


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
    share = tf.constant(values, tf.float32) / local_replicas

    @tf.function
    def reduce():
        per_replica = strategy.run(lambda: tf.identity(share))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None)

    return [float(v) for v in reduce().numpy()]


def _keras_streak(scale_before: float, n: int, k: int, threshold: float,
                  streak: int, scale_after: float) -> int:
    """Consecutive skips at or below ``threshold``, for Keras's wrapper.

    Keras's wrapper halves the scale on every skip and has no floor or
    counter. When all ``n`` steps since the last read were skipped, step
    ``i`` ran at ``scale_before / 2**i``: count those at the threshold (a
    walk over the halvings, exact for powers of two). Otherwise the order of
    applied and skipped steps is unknown; the streak restarts, at 1 if the
    last step was skipped at the threshold (no growth since, scale halved).
    """
    if n and k == n:
        used = scale_before
        for _ in range(k):
            if used <= threshold * (1 + 1e-6):
                streak += 1
            used /= 2
        return streak
    return 1 if k and scale_after * 2 <= threshold * (1 + 1e-6) else 0


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
        first batch end after every N batches). 0 (default) = at the end of
        every epoch only, which costs nothing per step.
      raise_on_failure: raise `LossScaleFailure` instead of setting
        ``model.stop_training``.
      check_setup: run the set-up checks at ``on_train_begin``.
      rollback_forward_state: hand the model to a
        ``tf_mixed.LossScaleOptimizer`` so skipped steps roll back its
        non-trainable state (BatchNormalization statistics).

    Attributes:
      stop_reason: why training was stopped, or None.
      total_skipped_steps: skipped steps seen since ``on_train_begin``.

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
        check_every_n_batches: int = 0,
        rollback_forward_state: bool = True,
    ):
        super().__init__()
        self.patience = _check_int(
            "patience", patience, 1, ", such as 20 (steps at the minimum loss "
            "scale before stopping)")
        self.max_skip_fraction = _check_fraction(
            "max_skip_fraction", max_skip_fraction)
        if min_scale is not None:
            if isinstance(min_scale, bool) or not isinstance(
                    min_scale, (int, float, np.floating, np.integer)):
                raise TypeError(
                    "'min_scale' must be a positive number or None, such as "
                    f"1.0. Received: min_scale={min_scale!r} (of type "
                    f"{type(min_scale).__name__})")
            if not min_scale > 0 or math.isinf(min_scale):
                raise ValueError(
                    "'min_scale' must be a positive finite number or None, "
                    f"such as 1.0. Received: min_scale={min_scale!r}")
            min_scale = float(min_scale)
        self.min_scale = min_scale
        self.log_every_n_batches = _check_int(
            "log_every_n_batches", log_every_n_batches, 0,
            " (0 turns batch logging off)")
        self.check_every_n_batches = _check_int(
            "check_every_n_batches", check_every_n_batches, 0,
            " (0 checks at epoch ends only)")
        self.raise_on_failure = bool(raise_on_failure)
        self.check_setup = bool(check_setup)
        self.rollback_forward_state = bool(rollback_forward_state)
        self.stop_reason: str | None = None
        self.total_skipped_steps = 0
        if self.log_every_n_batches or self.check_every_n_batches:
            # Only then: overriding the hook makes Keras call it
            # synchronously, waiting for every step.
            self.on_train_batch_end = self._on_train_batch_end

    def get_config(self) -> dict[str, Any]:
        return {
            "patience": self.patience,
            "max_skip_fraction": self.max_skip_fraction,
            "min_scale": self.min_scale,
            "log_every_n_batches": self.log_every_n_batches,
            "raise_on_failure": self.raise_on_failure,
            "check_setup": self.check_setup,
            "check_every_n_batches": self.check_every_n_batches,
            "rollback_forward_state": self.rollback_forward_state,
        }

    # -- hooks

    def on_train_begin(self, logs=None):
        tf_keras_check.check_objects("tf_mixed.LossScaleMonitor", model=self.model)
        self.stop_reason = None
        self.total_skipped_steps = 0
        optimizer = getattr(self.model, "optimizer", None)
        self._optimizer = optimizer
        self._ours = isinstance(optimizer,
                                loss_scale_module.LossScaleOptimizer)
        self._keras = (isinstance(optimizer,
                                  keras.optimizers.LossScaleOptimizer)
                       and not self._ours)
        self._threshold = self.min_scale if self.min_scale is not None else 1.0
        self._streak = 0  # Keras's wrapper only: derived between reads
        if self._ours and self.rollback_forward_state:
            self._track(optimizer)
        self._last = self._read()
        self._epoch_start = self._last
        self._epoch_skipped_seen = 0
        self._batch_steps = 0
        if self.check_setup:
            for problem in model_setup_problems(self.model):
                warnings.warn(problem, MixedPrecisionWarning, stacklevel=2)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._last
        self._epoch_skipped_seen = 0
        self._batch_steps = 0
        self._logged_at = 0
        self._checked_at = 0

    def _on_train_batch_end(self, batch, logs=None):
        logs = logs if logs is not None else {}
        self._batch_steps = batch + 1
        steps = self._batch_steps
        log_every, check_every = (self.log_every_n_batches,
                                  self.check_every_n_batches)
        log_now = log_every and steps // log_every > self._logged_at // log_every
        check_now = (check_every
                     and steps // check_every > self._checked_at // check_every)
        if not (log_now or check_now):
            return
        reading = self._advance()
        if log_now:
            self._logged_at = steps
            self._write(logs, reading)
        if check_now:
            self._checked_at = steps
            self._check(reading, logs, epoch=None)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        reading = self._advance()
        self._write(logs, reading, epoch_end=True)
        self._check(reading, logs, epoch=epoch)

    # -- reading

    def _track(self, optimizer):
        """Hands the model's forward state to the optimizer (retraces once)."""
        model = self.model
        wanted = tuple(id(v) for v in loss_scale_module._forward_variables(model))
        tracked = tuple(id(v) for v in optimizer._scratch.forward_variables)
        if wanted == tracked:
            return
        with model.distribute_strategy.scope():
            optimizer.track_forward_state(model)
        if getattr(model, "train_function", None) is not None:
            # A step traced before tracking would not roll back.
            model.make_train_function(force=True)

    def _read(self) -> dict[str, Any]:
        """One read of everything the rules need (plain Python values)."""
        optimizer = self._optimizer
        if optimizer is None:
            state = None
            applied = 0
        else:
            state = loss_scale_module.loss_scale_state(optimizer)
            applied = int(keras.ops.convert_to_numpy(optimizer.iterations))
        loss_sum, loss_steps = (optimizer.applied_loss_totals()
                                if self._ours else (0.0, 0))
        return {"state": state, "applied": applied,
                "loss_sum": loss_sum, "loss_steps": loss_steps}

    def _advance(self) -> dict[str, Any]:
        """Reads the optimizer and works out what happened since the last read."""
        previous, now = self._last, self._read()
        self._last = now
        start = self._epoch_start
        applied_in_epoch = now["applied"] - start["applied"]
        if self._ours:
            skipped_in_epoch = (now["state"].skipped_steps
                                - start["state"].skipped_steps)
        elif self._keras:
            # Keras's wrapper advances `iterations` on applied steps only.
            steps = self._steps_so_far()
            skipped_in_epoch = max(0, steps - applied_in_epoch) if steps else 0
        else:
            skipped_in_epoch = 0
        new_skips = skipped_in_epoch - self._epoch_skipped_seen
        self._epoch_skipped_seen = skipped_in_epoch
        self.total_skipped_steps += new_skips
        now["skipped_in_epoch"] = skipped_in_epoch
        now["steps_in_epoch"] = applied_in_epoch + skipped_in_epoch
        if self._keras:
            new_applied = now["applied"] - previous["applied"]
            self._streak = _keras_streak(
                previous["state"].scale, new_applied + new_skips, new_skips,
                self._threshold, self._streak, now["state"].scale)
        return now

    def _steps_so_far(self) -> int | None:
        """Steps run in this epoch, for Keras's wrapper (no skip counter)."""
        if self._batch_steps:
            return self._batch_steps
        return (self.params or {}).get("steps")

    # -- logs

    def _write(self, logs, reading, epoch_end=False):
        steps = reading["steps_in_epoch"]
        skipped = reading["skipped_in_epoch"]
        scale = reading["state"].scale if reading["state"] else 1.0
        logs["loss_scale"] = float(scale)
        logs["skipped_steps"] = float(skipped)
        logs["skipped_fraction"] = float(skipped / steps) if steps else 0.0
        if epoch_end and self._ours and skipped:
            applied = reading["loss_steps"] - self._epoch_start["loss_steps"]
            if applied:
                # Each worker's sum covers its own replicas only; `skipped`
                # and `applied` follow the global verdict, so every worker
                # enters this sum, and every worker logs the same loss.
                total, = _global_sums(
                    self.model.distribute_strategy,
                    [reading["loss_sum"] - self._epoch_start["loss_sum"]])
                logs["loss"] = float(total / applied)

    # -- rules

    def _check(self, reading, logs, epoch):
        if self.stop_reason is not None:
            return
        state = reading["state"]
        steps, skipped = reading["steps_in_epoch"], reading["skipped_in_epoch"]
        if self._ours:
            streak, threshold = state.min_scale_skips, self._optimizer.min_scale
        else:
            streak, threshold = self._streak, self._threshold
        if (self._ours or self._keras) and streak >= self.patience:
            return self._fail(
                f"the loss scale has sat at its minimum ({threshold:g}) for "
                f"{streak} consecutive skipped steps (patience="
                f"{self.patience}): the gradients are non-finite even without "
                "scaling, so no amount of loss scaling helps." + self._advice())
        bad_loss, bad_weights = self._nan_signs(reading, logs, epoch)
        if bad_loss:
            return self._fail(bad_loss + self._advice(nan=True))
        if bad_weights:
            return self._fail(
                f"weights {bad_weights[:3]} hold NaN/inf (in at least one "
                "replica's copy): an earlier update corrupted them and no "
                "later step can repair them. Restore a checkpoint."
                + self._advice(nan=True))
        if (epoch is not None and steps
                and skipped / steps > self.max_skip_fraction):
            self._fail(
                f"{skipped} of {steps} steps in epoch {epoch + 1} were skipped "
                f"({skipped / steps:.0%} > max_skip_fraction="
                f"{self.max_skip_fraction:g}): the loss scale keeps finding "
                "non-finite gradients, so most updates are thrown away."
                + self._advice())

    def _nan_signs(self, reading, logs, epoch) -> tuple[str | None, list]:
        """(message about a non-finite loss on applied steps, bad weights).

        Judged from values every worker agrees on: the local signs are
        summed across workers before anything is decided.
        """
        loss_message = None
        loss = logs.get("loss") if not self._ours else None
        if self._ours:
            applied_sum = reading["loss_sum"] - self._epoch_start["loss_sum"]
            if not math.isfinite(applied_sum):
                loss_message = (
                    "the loss was NaN/inf on steps that were applied (not "
                    "skipped) in this epoch: non-finite values are reaching "
                    "the weights.")
        elif loss is not None and not math.isfinite(float(loss)):
            since = reading["skipped_in_epoch"]
            if since == 0:
                loss_message = (
                    f"the loss became {loss} and no step was skipped: "
                    "non-finite values are reaching the weights.")
        logs_loss = logs.get("loss")
        suspicious = epoch is not None or (
            logs_loss is not None and not math.isfinite(float(logs_loss)))
        bad = self._nonfinite_weights() if suspicious else []
        strategy = self.model.distribute_strategy
        flags = _global_sums(strategy, [float(loss_message is not None),
                                        float(len(bad))])
        if flags[0] and loss_message is None:
            loss_message = ("the loss was NaN/inf on applied steps on "
                            "another worker: non-finite values are reaching "
                            "the weights.")
        if flags[1] and not bad:
            bad = ["(on another worker)"]
        return loss_message, bad

    def _nonfinite_weights(self) -> list[str]:
        bad = []
        for weight in self.model.weights:
            if not keras.backend.is_float_dtype(weight.dtype):
                continue
            if not all(np.isfinite(c).all() for c in loss_scale_module.local_copies(weight)):
                bad.append(weight.path)
        return bad

    def _advice(self, nan: bool = False) -> str:
        if nan and not (self._ours or self._keras):
            return (" Fix: scale the loss with tf_mixed.wrap_optimizer(...) "
                    "(float16), lower the learning rate, and make the model's "
                    "outputs float32 (tf_mixed.audit(model) lists risky "
                    "layers).")
        return (" Fix: look for float16 overflow in the forward pass "
                "(tf_mixed.audit(model) lists risky layers), keep "
                "softmax/normalisation in float32, lower the learning rate, or "
                "train in mixed_bfloat16.")

    def _fail(self, reason: str):
        self.stop_reason = reason
        message = f"LossScaleMonitor stopped training: {reason}"
        if self.raise_on_failure:
            raise LossScaleFailure(message)
        logging.error(message)
        self.model.stop_training = True
