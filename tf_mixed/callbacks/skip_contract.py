"""In ``fit``, a skipped step enters no metric and no loss the user sees.

`install` wraps ``model.train_step``; every batch's logs then carry ``skipped``
(docs/skipped-step.md).
"""

# Keras's train step (TF backend) updates the loss tracker behind
# ``logs["loss"]`` *before* the optimizer runs and the compiled metrics
# *after* it, whatever the optimizer decides. So a batch whose step
# ``tf_mixed.LossScaleOptimizer`` skipped would still enter the running loss
# (the progress bar, the batch logs, the epoch logs, ``History``,
# TensorBoard) with its NaN/inf, and ``accuracy`` and every other compiled
# metric would count it.
#
# `install` wraps the model's ``train_step`` once: it reads the metric
# variables before the step, runs Keras's step unchanged, and, when the
# step's global verdict says skipped, writes the values read before back
# (``tf.where``, no control flow), then recomputes the results Keras returns.
# It adds ``logs["skipped"]`` (`SKIPPED_KEY`), 1.0 for a skipped step and 0.0
# for an applied one, and ``logs["skip_reason"]`` (`REASON_KEY`, the
# reason's code), to the values the step already returns: no extra host
# synchronisation. Before Keras's step it notes the batch's inputs with the
# optimizer's write guard (`tf_mixed.scaling.write_guard`), so a batch of
# non-finite inputs is skipped as bad data. The verdict is the optimizer's ``last_step_skipped``
# variable, written from the one all-reduced verdict
# (`tf_mixed.scaling.pipeline`), so every replica and worker restores the
# same way and logs the same flag.
#
# Why a restore rather than a zero sample weight for the metrics: a skipped
# batch's predictions or loss are often NaN/inf, and Keras's metrics multiply
# by the weight (``0 * nan`` is ``nan``); the loss tracker is also written
# before the verdict exists.
#
# With gradient accumulation a step is a window and only its last micro-batch
# carries the verdict: the metrics' values at the window's start are kept in
# copies made with the step, and a discarded window's last micro-batch,
# flagged, writes them back, so the whole window leaves the metrics (its
# earlier micro-batches were shown in their own batch logs while it ran;
# docs/skipped-step.md).
#
# `tf_mixed.callbacks.monitor.LossScaleMonitor` installs it at
# ``on_train_begin`` for ``tf_mixed.LossScaleOptimizer``.

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_mixed._internal.facts import check_model_kind
from tf_mixed.scaling.optimizer import LossScaleOptimizer, step_guard

__all__ = ["REASON_KEY", "SKIPPED_KEY", "install", "installed", "step_skipped"]

SKIPPED_KEY = "skipped"
"""The batch-logs key: 1.0 when this batch's step was skipped, else 0.0."""

REASON_KEY = "skip_reason"
"""The batch-logs key: why this batch's step was skipped, as a float code:
0.0 applied, else 1 + the reason's index in
`tf_mixed.scaling.write_guard.REASONS` (1 input, 2 forward, 3 gradients,
4 update, 5 spike)."""

_MARK = "_tf_mixed_skip_contract"


def installed(model: keras.Model) -> bool:
    """Whether `install` wrapped this model's ``train_step``.

    Args:
        model: A Keras model.

    Returns:
        True once `install` ran on it.
    """
    return bool(getattr(model.train_step, _MARK, False))


def install(model: keras.Model) -> bool:
    """Wraps ``model.train_step`` so a skipped step leaves every metric as it was.

    The wrapper reads ``model.optimizer`` at trace time: with any optimizer
    other than ``tf_mixed.LossScaleOptimizer`` it runs Keras's step
    unchanged. The train function must be made again afterwards
    (``model.make_train_function(force=True)``) for a step traced before.

    Args:
        model: A Keras model (compiled or not).

    Returns:
        True when it was installed now, False when it already was.

    Raises:
        TypeError: if ``model`` is not a ``keras.Model``.
    """
    check_model_kind(model, "skip_contract.install()", traced=False)
    if installed(model):
        return False
    keras_step = model.train_step
    windows = _WindowStart()

    def train_step(data: Any):
        optimizer = model.optimizer
        if not isinstance(optimizer, LossScaleOptimizer):
            return keras_step(data)
        variables = [v for metric in model.metrics for v in metric.variables]
        accumulating = optimizer.accumulator is not None
        if accumulating:
            windows.refresh(variables, optimizer)
        else:
            before = {id(v): tf.convert_to_tensor(v.value) for v in variables}
        guard = step_guard(optimizer)
        guard.note_inputs(data)  # non-finite inputs: the skip's reason is "input"
        logs = keras_step(data)
        if not optimizer.built:  # no trainable weights: nothing applied or skipped
            return logs
        skipped = step_skipped(optimizer)
        # Compiled metrics are built by the first trace of the step: those
        # made just now held zeros before it (Keras's Metric.reset_state).
        variables = [v for metric in model.metrics for v in metric.variables]
        for variable in variables:
            if accumulating:
                value = windows.start(variable)
            else:
                value = before.get(id(variable))
                value = _zeros(variable) if value is None else value
            variable.assign(tf.where(skipped, value, variable.value))
        if isinstance(logs, dict):
            logs = dict(logs)
            results = model.get_metrics_result()
            for key in logs:
                if key in results:
                    logs[key] = results[key]
            logs[SKIPPED_KEY] = tf.cast(skipped, tf.float32)
            logs[REASON_KEY] = tf.cast(tf.where(skipped, guard.last_reason.read_value(),
                                                tf.constant(0, tf.int64)), tf.float32)
        return logs

    setattr(train_step, _MARK, True)
    model.train_step = train_step
    return True


def no_applied_step(logs: dict, model: keras.Model) -> None:
    """Writes nan over an epoch's training loss and metrics: none of its steps was applied.

    The contract keeps skipped batches out of Keras's means; with every batch
    of the epoch skipped, those means are over nothing, and Keras's reads 0.0
    (``divide_no_nan``): a perfect loss where nothing trained. Validation
    values (``val_``) are real and stay.

    Args:
        logs: the epoch logs, changed in place.
        model: the model (its training metrics' keys, as Keras's
            ``get_metrics_result`` names them in the logs).
    """
    for name in model.get_metrics_result():
        if name in logs:
            logs[name] = float("nan")


def step_skipped(optimizer) -> tf.Tensor:
    """This step's global verdict as a scalar bool tensor: True when skipped.

    Read inside the train step, after ``apply``: the optimizer's
    ``last_step_skipped`` (the same on every replica and worker). With
    gradient accumulation, True only on the last micro-step of a discarded
    window (the counter is back at 0 when a window just ended).

    Args:
        optimizer: A built ``tf_mixed.LossScaleOptimizer``.

    Returns:
        A scalar bool tensor.
    """
    skipped = tf.not_equal(tf.convert_to_tensor(optimizer.last_step_skipped.value), 0)
    accumulator = optimizer.accumulator
    if accumulator is None:
        return skipped
    window_ended = tf.equal(tf.convert_to_tensor(accumulator.micro_step.value), 0)
    return tf.logical_and(skipped, window_ended)


class _WindowStart:
    """The metric values at the start of the accumulation window.

    Scratch copies (in no checkpoint), one per metric variable, with the
    variable's own synchronisation, so each replica keeps its own. They are
    created while the step is first traced, as Keras creates the compiled
    metrics, holding zeros (a metric's values after ``reset_state``).
    """

    def __init__(self) -> None:
        self.copies: dict[int, tf.Variable] = {}

    def refresh(self, variables, optimizer) -> None:
        """Before a micro-step: the copies take the metrics' values when it opens a window."""
        opens = (tf.equal(tf.convert_to_tensor(optimizer.accumulator.micro_step.value), 0)
                 if optimizer.built else tf.constant(True))
        for variable in variables:
            copy = self.start(variable)
            copy.assign(tf.where(opens, tf.convert_to_tensor(variable.value),
                                 copy.read_value()))

    def start(self, variable) -> tf.Variable:
        """The copy of ``variable`` (made on first use, zeros)."""
        copy = self.copies.get(id(variable))
        if copy is None:
            inner = variable.value
            copy = self.copies[id(variable)] = tf.Variable(
                _zeros(variable), trainable=False,
                synchronization=inner.synchronization,
                aggregation=inner.aggregation)
        return copy


def _zeros(variable) -> tf.Tensor:
    return tf.zeros(variable.shape, variable.dtype)
