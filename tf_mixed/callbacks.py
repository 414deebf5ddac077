"""Keras `fit` callbacks that make mixed-precision failures visible.

`LossScaleMonitor` does three jobs:

1. **Reports.** At the end of every epoch it writes ``loss_scale``,
   ``skipped_steps`` (steps skipped in that epoch) and ``skipped_fraction``
   (skipped / steps in that epoch) into the epoch ``logs`` as Python floats, so
   `History`, Keras's `TensorBoard` callback and the progress bar show them.
   With ``log_every_n_batches=N`` it also writes them into the batch logs every
   N batches (off by default).
2. **Checks the set-up** at ``on_train_begin`` and warns (with the fix in the
   message) when the model computes in float16 but its optimizer does not scale
   the loss, when an output of the model is float16/bfloat16, and when the
   model's dtype policy differs from the global one (a model built before
   ``tf_mixed.enable()``).
3. **Stops a run that cannot recover**: the loss scale sits at its minimum
   while steps keep being skipped for ``patience`` consecutive steps; the
   fraction of skipped steps in an epoch passes ``max_skip_fraction``; or the
   loss turns NaN/inf on steps that were not skipped (weights are being
   corrupted), or on skipped steps while the weights already hold NaN/inf
   (an earlier update corrupted them). It sets ``model.stop_training = True`` and logs why, or with
   ``raise_on_failure=True`` raises `LossScaleFailure` carrying the same text.

The monitor reads counters from the optimizer's variables rather than
counting hook calls, so it is exact with ``steps_per_execution > 1`` (hooks
fire once per execution) and under `tf.distribute.MirroredStrategy` (the
variables are mirrored; reading one gives the synchronised value).

Supported optimizers (duck-typed):

* ``tf_mixed.LossScaleOptimizer`` and anything with ``loss_scale`` and
  ``skipped_steps`` variables (and optionally ``last_step_skipped`` and a
  ``min_scale`` attribute): the skipped counter is read directly.
* ``keras.optimizers.LossScaleOptimizer`` (scale in ``dynamic_scale``): it has
  no skipped counter, but its inner optimizer's ``iterations`` advance only on
  applied steps, so skipped = steps run - iterations advanced. It has no
  minimum scale either; "at its minimum" then means at or below the monitor's
  ``min_scale`` (default 1.0).
* any other optimizer: nothing is skipped; only the NaN-loss check and the
  set-up checks apply, and ``loss_scale`` is logged as 1.0.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import keras
import numpy as np
from absl import logging

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


def _value(variable) -> float:
    """A scalar variable or tensor (possibly mirrored) as a Python float."""
    return float(keras.ops.convert_to_numpy(variable))


def is_loss_scaling(optimizer) -> bool:
    """Whether `optimizer` scales the loss (tf_mixed's or Keras's wrapper)."""
    if optimizer is None:
        return False
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return True
    return _ScaleReader(optimizer).kind != "none"


class _ScaleReader:
    """Reads (scale, skipped_total, applied_total, last_skipped) from an optimizer.

    ``skipped_total`` is None when the optimizer has no skipped counter (Keras's
    wrapper); the caller then derives skipped steps from ``applied_total``.
    """

    def __init__(self, optimizer):
        self.optimizer = optimizer
        # tf_mixed's optimizer creates its variables when it builds (first
        # step), so recognise it by its Python knobs as well.
        if optimizer is not None and (
            hasattr(optimizer, "skipped_steps")
            or (hasattr(optimizer, "min_scale")
                and hasattr(optimizer, "growth_interval"))
        ):
            self.kind = "counter"
        elif isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or (
            hasattr(optimizer, "dynamic_growth_steps")
        ):
            self.kind = "keras"
        else:
            self.kind = "none"
        self.backoff = float(getattr(optimizer, "backoff_factor", 0.5) or 0.5)
        # Overflows needed per backoff (tf_mixed's hysteresis knob).
        self.hysteresis = int(getattr(optimizer, "hysteresis", 1) or 1)

    def scale(self) -> float:
        opt = self.optimizer
        if self.kind == "counter":
            var = getattr(opt, "loss_scale", None)
        elif self.kind == "keras":
            var = getattr(opt, "dynamic_scale", None)
        else:
            return 1.0
        if var is None:  # variables are created when the optimizer builds
            return float(getattr(opt, "initial_scale", 1.0))
        return _value(var)

    def skipped_total(self) -> int | None:
        if self.kind != "counter":
            return None
        var = getattr(self.optimizer, "skipped_steps", None)
        return 0 if var is None else int(_value(var))

    def applied_total(self) -> int:
        if self.optimizer is None:
            return 0
        return int(_value(self.optimizer.iterations))

    def last_skipped(self) -> bool | None:
        var = getattr(self.optimizer, "last_step_skipped", None)
        if self.kind != "counter" or var is None:
            return None
        return bool(_value(var))


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
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"'{name}' must be an integer >= {minimum}{hint}. "
            f"Received: {name}={value!r} (of type {type(value).__name__})"
        )
    if value < minimum:
        raise ValueError(
            f"'{name}' must be an integer >= {minimum}{hint}. "
            f"Received: {name}={value!r}"
        )
    return value


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
      min_scale: the loss scale counted as "minimum". None (default) uses the
        optimizer's ``min_scale`` attribute when it has one, else 1.0
        (Keras's wrapper has no minimum and keeps halving below it).
      log_every_n_batches: also write the values into the batch logs every N
        batches (so TensorBoard with ``update_freq=N`` plots them). 0
        (default) = epoch logs only.
      raise_on_failure: raise `LossScaleFailure` instead of setting
        ``model.stop_training``.
      check_setup: run the set-up checks at ``on_train_begin``.

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
    ):
        super().__init__()
        self.patience = _check_int(
            "patience", patience, 1, ", such as 20 (steps at the minimum loss "
            "scale before stopping)")
        self.max_skip_fraction = _check_fraction(
            "max_skip_fraction", max_skip_fraction)
        if min_scale is not None:
            if isinstance(min_scale, bool) or not isinstance(
                    min_scale, (int, float)):
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
        self.raise_on_failure = bool(raise_on_failure)
        self.check_setup = bool(check_setup)
        self.stop_reason: str | None = None
        self.total_skipped_steps = 0

    def get_config(self) -> dict[str, Any]:
        return {
            "patience": self.patience,
            "max_skip_fraction": self.max_skip_fraction,
            "min_scale": self.min_scale,
            "log_every_n_batches": self.log_every_n_batches,
            "raise_on_failure": self.raise_on_failure,
            "check_setup": self.check_setup,
        }

    # -- hooks

    def on_train_begin(self, logs=None):
        self.stop_reason = None
        self.total_skipped_steps = 0
        self._reader = _ScaleReader(getattr(self.model, "optimizer", None))
        threshold = self.min_scale
        if threshold is None:
            threshold = float(getattr(self._reader.optimizer, "min_scale", 1.0)
                              or 1.0)
        self._threshold = threshold
        self._streak = 0  # consecutive skipped steps at the minimum scale
        self._scale = self._reader.scale()
        self._skipped = self._reader.skipped_total()
        self._applied = self._reader.applied_total()
        if self.check_setup:
            for problem in model_setup_problems(self.model):
                warnings.warn(problem, MixedPrecisionWarning, stacklevel=2)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_steps = 0
        self._epoch_skipped = 0
        self._loss_was_finite = True
        self._logged_at = 0

    def on_train_batch_end(self, batch, logs=None):
        logs = logs if logs is not None else {}
        steps = batch + 1
        total = self.params.get("steps") if self.params else None
        if total:
            steps = min(steps, total)
        n = steps - self._epoch_steps
        if n <= 0:
            return
        self._epoch_steps = steps
        k, scale, prev_scale = self._advance(n)
        self._epoch_skipped += k
        self.total_skipped_steps += k
        self._check_streak(n, k, scale, prev_scale)
        self._check_loss(n, k, logs)
        every = self.log_every_n_batches
        if every and steps // every > self._logged_at // every:
            self._logged_at = steps
            self._write(logs)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        self._write(logs)
        steps = self._epoch_steps
        if (self.stop_reason is None and steps
                and self._epoch_skipped / steps > self.max_skip_fraction):
            self._fail(
                f"{self._epoch_skipped} of {steps} steps in epoch {epoch + 1} "
                f"were skipped ({self._epoch_skipped / steps:.0%} > "
                f"max_skip_fraction={self.max_skip_fraction:g}): the loss "
                "scale keeps finding non-finite gradients, so most updates "
                "are thrown away." + self._advice())

    # -- bookkeeping

    def _write(self, logs):
        steps = self._epoch_steps
        logs["loss_scale"] = float(self._scale)
        logs["skipped_steps"] = float(self._epoch_skipped)
        logs["skipped_fraction"] = (
            float(self._epoch_skipped / steps) if steps else 0.0)

    def _advance(self, n: int) -> tuple[int, float, float]:
        """Reads the optimizer after `n` more steps; returns (skipped, scale, previous scale)."""
        reader = self._reader
        prev_scale = self._scale
        self._scale = reader.scale()
        applied = reader.applied_total()
        skipped_total = reader.skipped_total()
        if skipped_total is not None:
            k = skipped_total - (self._skipped or 0)
            self._skipped = skipped_total
        elif reader.kind == "keras":
            # Keras's wrapper advances the inner optimizer's iterations only on
            # applied steps.
            k = n - (applied - self._applied)
        else:
            k = 0
        self._applied = applied
        return max(0, min(k, n)), self._scale, prev_scale

    def _at_min(self, scale: float) -> bool:
        return scale <= self._threshold * (1 + 1e-6)

    def _check_streak(self, n: int, k: int, scale: float, prev_scale: float):
        if self._reader.kind == "none":
            return
        if k == n and self._at_min(scale):
            # Every step in this interval was skipped, so the scale only
            # shrank: the first `arrive` skips brought it down to the minimum,
            # the rest ran at it.
            arrive = 0
            if not self._at_min(prev_scale):
                ratio = prev_scale / self._threshold
                arrive = self._reader.hysteresis * max(1, math.ceil(
                    math.log(ratio) / -math.log(self._reader.backoff) - 1e-9))
            self._streak += max(0, k - arrive)
        else:
            last = self._reader.last_skipped()
            self._streak = 1 if (last and self._at_min(scale)
                                 and self._at_min(prev_scale)) else 0
        if self._streak >= self.patience and self.stop_reason is None:
            self._fail(
                f"the loss scale has sat at its minimum ({self._threshold:g}) "
                f"for {self._streak} consecutive skipped steps "
                f"(patience={self.patience}): the gradients are non-finite "
                "even without scaling, so no amount of loss scaling helps."
                + self._advice())

    def _check_loss(self, n: int, k: int, logs):
        loss = logs.get("loss")
        if loss is None or not self._loss_was_finite:
            return
        try:
            finite = math.isfinite(float(loss))
        except (TypeError, ValueError):
            return
        if finite:
            return
        # `loss` in the logs is the epoch's running mean, so it turns
        # non-finite on the first bad step and stays so; judge that step.
        self._loss_was_finite = False
        if self.stop_reason is not None:
            return
        if k < n:
            what = ("no step was skipped" if k == 0 else
                    f"only {k} of its {n} steps were skipped")
            self._fail(
                f"the loss became {loss} at step {self._epoch_steps} of the "
                f"epoch and {what}: non-finite values are reaching the "
                "weights." + self._advice(nan=True))
            return
        # All skipped: harmless if the weights are intact, fatal if an earlier
        # applied step already wrote NaN/inf into them (then every later step
        # is skipped and only the scale collapse would show it, much later).
        bad = self._nonfinite_weights()
        if bad:
            self._fail(
                f"the loss became {loss} at step {self._epoch_steps} of the "
                f"epoch and weights {bad[:3]} hold NaN/inf: an earlier update "
                "corrupted them and no later step can repair them. Restore a "
                "checkpoint." + self._advice(nan=True))

    def _nonfinite_weights(self) -> list[str]:
        bad = []
        for weight in self.model.weights:
            value = keras.ops.convert_to_numpy(weight)
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                bad.append(weight.path)
        return bad

    def _advice(self, nan: bool = False) -> str:
        if nan and self._reader.kind == "none":
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
