"""`Float8Monitor`: float8 scaling health in ``logs``, and a stop rule."""

# The tf_mixed optimizer keeps, for the float8 layers it agrees scales for, counters that are
# identical on every replica and worker (`tf_mixed.scaling.float8_sync`): per tensor, how many
# steps saturated (the cast clipped values: the global amax over the scale in use went beyond the
# format's largest value by more than rounding, `tf_mixed.scaling.float8_sync.clipping_overflow`;
# a kernel that grew a little or the one-ulp rounding of an unchanged kernel's scale does not
# count) and how many amaxes were non-finite; and the current and longest run of consecutive
# steps in which some tensor saturated. Each ``fit`` with a monitor starts the runs afresh
# (`Float8Sync.reset_streaks` at ``on_train_begin``): a run of an earlier ``fit`` never stops a
# later one. The monitor reads them once per epoch (or every ``check_every_n_batches`` batches),
# writes floats into ``logs`` so `History`, TensorBoard and the progress bar show them, and
# judges them with a pure rule (`saturation_verdict`): ``patience`` consecutive saturating steps
# stop training. Every worker reads the same counters, so every worker takes the same decision.
#
# With ``data=(x, y)`` it also measures, at each epoch end, the saturated and flushed fractions
# of every tensor on that batch (`tf_mixed.float8.state`).

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import walk_layers
from tf_mixed.float8 import readiness
from tf_mixed.float8 import reading as float8_reading
from tf_mixed.scaling.float8_sync import Float8Sync, clipping_overflow
from tf_mixed.scaling.optimizer import LossScaleOptimizer, float8_sync_of

__all__ = ["Float8Monitor", "Float8Saturation", "read", "saturation_verdict"]


class Float8Saturation(NamedTuple):
    """One reading of the optimizer's float8 counters (plain Python values).

    Attributes:
        saturating_tensors: Tensors whose values the last step's cast
            clipped (`tf_mixed.scaling.float8_sync.clipping_overflow`).
        max_overflow: The largest ``amax / (scale * format max)`` of the last
            step (beyond `tf_mixed.scaling.float8_sync.clipping_overflow`,
            1.036 for e4m3fn, values were clipped).
        saturated_steps: Sum over tensors of saturating steps so far.
        nonfinite_amax: Sum over tensors of non-finite amaxes kept out of
            the histories so far.
        streak: Consecutive steps, up to now, in which some tensor saturated.
        longest_streak: The longest such run since this ``fit`` began (with
            a monitor; else since the optimizer was built).
    """

    saturating_tensors: int
    max_overflow: float
    saturated_steps: int
    nonfinite_amax: int
    streak: int
    longest_streak: int


def read(sync) -> Float8Saturation:
    """Reads a `tf_mixed.scaling.float8_sync.Float8Sync`'s counters (replica 0's copy)."""
    def first(variable):
        value = variable.values[0] if isinstance(
            variable, tf.distribute.DistributedValues) else variable
        return np.asarray(value.numpy())

    overflow = first(sync.last_overflow)
    clipping = np.array([clipping_overflow(slot.kind) for slot in sync.slots],
                        np.float32)
    return Float8Saturation(
        saturating_tensors=int(np.count_nonzero(overflow > clipping)),
        max_overflow=float(overflow.max(initial=0.0)),
        saturated_steps=int(first(sync.saturated_steps).sum()),
        nonfinite_amax=int(first(sync.nonfinite_amax).sum()),
        streak=int(first(sync.streak)),
        longest_streak=int(first(sync.longest_streak)))


def saturation_verdict(reading: Float8Saturation, patience: int) -> str | None:
    """Why training should stop, or None: the pure stop rule.

    Args:
        reading: A `Float8Saturation`.
        patience: Consecutive saturating steps tolerated before stopping.

    Returns:
        A sentence naming the problem and the fix, or None.
    """
    if reading.longest_streak < patience:
        return None
    return (f"float8 saturated for {reading.longest_streak} consecutive steps "
            f"(patience {patience}): the delayed scales do not keep up with "
            "the values, which are being clipped (largest overflow "
            f"{reading.max_overflow:.3g}x). Give the scales headroom: call "
            "tf_mixed.float8.quantize(model, margin=1) (each unit of margin "
            "doubles it; it takes effect on the trained model and its "
            "optimizer) and fit again, or follow the amax faster with "
            "amax_compute_algo='most_recent'; tf_mixed.float8.state(model) "
            "says which tensors saturate.")


class Float8Monitor(keras.callbacks.Callback):
    """Logs float8 saturation counters; stops on sustained saturation.

    Writes into the epoch ``logs`` (and the batch logs when
    ``check_every_n_batches`` is set), as Python floats:
    ``float8_saturating_tensors``, ``float8_max_overflow``,
    ``float8_saturated_steps``, ``float8_nonfinite_amax``; with ``data``,
    also ``float8_max_saturated`` and ``float8_max_flushed`` (fractions of
    values on that batch).

    Args:
        patience: Stop after this many consecutive steps in which some
            float8 tensor saturated. Integer >= 1.
        data: Optional ``(x, y)`` batch to measure saturated and flushed
            fractions on at every epoch end (use the training batch size).
        check_every_n_batches: Also read and judge every N batches (a host
            read every N batches). 0 (default): epoch ends only; exact all
            the same, since the optimizer keeps the longest streak.
        raise_on_failure: Raise ``RuntimeError`` instead of setting
            ``model.stop_training``.

    Attributes:
        stop_reason: Why training was stopped, or None.

    Raises:
        ValueError: an argument out of range; at ``on_train_begin``, a model
            without float8 layers, or one trained with an optimizer that
            does not agree float8 scales (not ``tf_mixed.wrap_optimizer``).
    """

    def __init__(self, patience: int = 50, data=None,
                 check_every_n_batches: int = 0,
                 raise_on_failure: bool = False):
        super().__init__()
        patience = _validate.number(
            patience, "patience", integer=True, rule=lambda n: n >= 1,
            owner="Float8Monitor", valid="an integer >= 1, such as 50")
        check_every_n_batches = _validate.number(
            check_every_n_batches, "check_every_n_batches", integer=True,
            rule=lambda n: n >= 0, owner="Float8Monitor",
            valid="an integer >= 0 (0: epoch ends only)")
        raise_on_failure = _validate.boolean(
            raise_on_failure, "raise_on_failure", owner="Float8Monitor")
        if data is not None and (not isinstance(data, (tuple, list))
                                 or len(data) != 2):
            raise ValueError(
                "'data' must be an (x, y) pair (one batch) or None. Received: "
                f"data of type {type(data).__name__}.")
        self.patience = patience
        self.data = data
        self.check_every_n_batches = check_every_n_batches
        self.raise_on_failure = raise_on_failure
        self.stop_reason: str | None = None
        self._sync: Float8Sync | None = None
        self._batches = 0
        if check_every_n_batches:
            # Only then: overriding the hook makes Keras wait for each step.
            self.on_train_batch_end = self._on_train_batch_end

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (without ``data``)."""
        return {"patience": self.patience,
                "check_every_n_batches": self.check_every_n_batches,
                "raise_on_failure": self.raise_on_failure}

    def on_train_begin(self, logs=None):
        self.stop_reason = None
        self._batches = 0
        model = self.model
        if not any(readiness.is_float8(layer) for layer in _leaves(model)):
            raise ValueError(
                f"Float8Monitor: model '{model.name}' has no float8 layer. "
                "Quantize it first: tf_mixed.float8.quantize(model).")
        optimizer = model.optimizer
        if not isinstance(optimizer, LossScaleOptimizer):
            raise ValueError(
                "Float8Monitor needs the tf_mixed optimizer wrapper, which "
                "agrees float8 scales across replicas and keeps non-finite "
                "amaxes out of the histories. Received: optimizer of type "
                f"{type(optimizer).__name__}. Compile with "
                "optimizer=tf_mixed.wrap_optimizer(your_optimizer).")
        # The optimizer is built by fit's first step, in the strategy's
        # scope; its float8 sync is read from the first check on. A sync
        # built before (an earlier fit) starts its streaks afresh.
        self._sync = None
        earlier = float8_sync_of(optimizer) if optimizer.built else None
        if earlier is not None:
            earlier.reset_streaks()

    def _judge(self, logs) -> None:
        if self._sync is None:
            self._sync = float8_sync_of(self.model.optimizer)
        if self._sync is None:
            raise ValueError(
                "Float8Monitor: the optimizer holds no float8 scales of model "
                f"'{self.model.name}': it was built before the model was "
                "quantized. Quantize first, then compile (or build the "
                "optimizer) again.")
        reading = read(self._sync)
        logs["float8_saturating_tensors"] = float(reading.saturating_tensors)
        logs["float8_max_overflow"] = float(reading.max_overflow)
        logs["float8_saturated_steps"] = float(reading.saturated_steps)
        logs["float8_nonfinite_amax"] = float(reading.nonfinite_amax)
        reason = saturation_verdict(reading, self.patience)
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason
            if self.raise_on_failure:
                raise RuntimeError(reason)
            warnings.warn(reason, RuntimeWarning, stacklevel=2)
            self.model.stop_training = True

    def _on_train_batch_end(self, batch, logs=None):
        logs = logs if logs is not None else {}
        self._batches += 1
        if self._batches % self.check_every_n_batches == 0:
            self._judge(logs)

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        if self.data is not None:
            measured = float8_reading.state(self.model, *self.data)
            logs["float8_max_saturated"] = float(measured.max_saturated)
            logs["float8_max_flushed"] = float(measured.max_flushed)
        self._judge(logs)


def _leaves(model):
    return [layer for _, layer in walk_layers(model)]
