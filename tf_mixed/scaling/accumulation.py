"""Gradient accumulation with loss scaling: one semantics, on every replica."""

# ``LossScaleOptimizer(inner, gradient_accumulation_steps=N)`` (or an inner
# optimizer created with Keras's ``gradient_accumulation_steps=N``, which the
# wrapper takes over) makes one update of N micro-steps, a *window*:
#
# 1. Every micro-step's gradients are unscaled (divided by the loss scale,
#    which is constant within a window) and added, in float32, to a buffer
#    per variable. Each replica adds its own shard's gradients: no
#    communication during the window.
# 2. At the window's last micro-step the buffers are all-reduced, ONCE (in
#    ``communication_dtype`` if set), so every replica then holds the same
#    sum, and the verdict is taken from that sum: any NaN/inf of any
#    micro-step on any replica is in it (an inf or NaN never leaves a sum).
#    The update bound is the mean's: a sum passes within ``bound * N``,
#    times the loss scale when it travels scaled on a half-precision wire
#    (``bound_factor`` in tf_mixed/scaling/pipeline.py).
# 3. Finite: the inner optimizer applies ``sum / N`` once (so N micro-batches
#    of B examples give the update of one batch of N*B, for losses that are
#    means over the batch). Not finite: the whole window is discarded, on
#    every replica, and the loss scale backs off once. Either way the buffers
#    are zeroed and the scale state, the skip counters, the forward-state
#    rollback and the loss tally advance once per window.
#
# So ``iterations`` of the inner optimizer, and with it every learning-rate
# schedule, advance once per applied update; ``skipped_steps`` counts skipped
# windows; a scale change never happens in the middle of a window.
#
# `Accumulator` holds the buffers and the micro-step counter. Both are
# saved with the optimizer (``.keras`` files and ``tf.train.Checkpoint``), the
# buffers **per replica** (`tf_mixed.scaling.formats`): each replica's buffer holds its own
# shard's sum, so a file holds every replica's (all workers' too, gathered at
# save time: under MultiWorkerMirroredStrategy every worker saves, as the docs
# of multi-worker training say) and a restore gives each replica its own
# again; a run resumed in the middle of a window then makes the update the
# uninterrupted run makes, bit for bit. Restored onto another number of
# replicas, the window's sum is kept (on the first replica, zeros on the
# others) and a warning says the rounding may differ.
#
# **The end of fit.** Keras calls ``finalize_variable_values`` when ``fit``
# ends; a window left unfinished there (10 batches with 4 steps leave 2) is
# **dropped** with a warning (`Accumulator.end_of_fit`): its gradients are
# never applied and the next ``fit`` starts a fresh window. A custom loop
# that wants the same calls ``optimizer.finalize_variable_values(variables)``.
#
# `validate_steps` is the argument's one check. A step without accumulation
# is a window of one micro-step (`WindowOfOne`): `tf_mixed.scaling.pipeline`
# runs every step through the same stages.

from __future__ import annotations

import warnings
from typing import Any

import tensorflow as tf

from tf_mixed._internal import validate as _validate

__all__ = ["Accumulator", "WindowOfOne", "steps_to_take_over", "take_over", "validate_steps"]


def validate_steps(value, inner_steps=None) -> int | None:
    """Checks ``gradient_accumulation_steps`` against the inner optimizer's.

    Args:
        value: The wrapper's argument: None or an int >= 2 (1 means none).
        inner_steps: The inner optimizer's ``gradient_accumulation_steps``.

    Returns:
        The number of micro-steps per update, or None for no accumulation.

    Raises:
        ValueError: for anything but None or an int >= 1 (a wrong type is
            `tf_mixed._internal.validate.ArgumentTypeError`, also a TypeError), or
            when both are set and differ.
    """
    value = _checked(value, "gradient_accumulation_steps", "LossScaleOptimizer")
    inner_steps = _checked(inner_steps, "gradient_accumulation_steps",
                           "The inner optimizer's")
    if value is not None and inner_steps is not None and value != inner_steps:
        raise ValueError(
            "gradient_accumulation_steps is set on both the wrapper and the "
            f"inner optimizer, differently. Received: {value} on the wrapper, "
            f"{inner_steps} on the inner optimizer. Set it in one place.")
    steps = value if value is not None else inner_steps
    return None if steps is None or steps == 1 else steps


def steps_to_take_over(inner_optimizer, value) -> int | None:
    """The wrapper's micro-steps per update, from its argument or the inner's.

    Changes nothing (the wrapper turns the inner optimizer's own
    accumulation off once it is constructed).

    Raises:
        ValueError: as `validate_steps`, or for an inner optimizer already
            built with Keras's accumulation (its buffers exist and it would
            keep counting micro-steps).
    """
    inner_steps = inner_optimizer.gradient_accumulation_steps
    steps = validate_steps(value, inner_steps)
    if inner_steps and inner_optimizer.built:
        raise ValueError(
            "The inner optimizer was built with Keras's gradient accumulation, "
            "which would bypass tf_mixed's window semantics. Received: a built "
            f"{type(inner_optimizer).__name__} with gradient_accumulation_steps="
            f"{inner_steps}. Wrap a fresh optimizer.")
    return steps


def take_over(inner_optimizer, steps: int | None) -> Accumulator | None:
    """Turns the inner optimizer's Keras accumulation off; the wrapper's on.

    Keras's own accumulation runs the learning-rate schedule per micro-step
    and fails under MirroredStrategy in a custom loop (``merge_call`` inside
    its cond).

    Returns:
        An `Accumulator` of ``steps`` micro-steps, or None for ``steps`` None.
    """
    inner_optimizer.gradient_accumulation_steps = None
    return None if steps is None else Accumulator(steps)


def _checked(steps, name, owner):
    if steps is None:
        return None
    return _validate.number(steps, name, valid="None or an integer >= 1 (the "
                            "micro-steps per update)", rule=lambda n: n >= 1,
                            integer=True, owner=owner)


class Accumulator:
    """The float32 buffers and micro-step counter of one optimizer.

    Args:
        steps: Micro-steps per update (>= 2).
    """

    def __init__(self, steps: int):
        self.steps = steps
        self.micro_step: Any = None  # an int64 optimizer variable once built
        self.buffers: list = []

    def build(self, optimizer, var_list) -> None:
        """Creates the counter and one buffer per variable on ``optimizer``.

        Under a strategy, in its scope: every replica keeps its own copy
        (aggregation NONE) and writes it in the replica context.
        """
        self.micro_step = optimizer.add_variable(
            shape=(), dtype="int64", aggregation="none",
            name="accumulation_micro_step")
        self.buffers = []
        for variable in var_list:
            path = getattr(variable, "path", variable.name).replace("/", "_")
            self.buffers.append(optimizer.add_variable(
                shape=variable.shape, dtype="float32", aggregation="none",
                name=f"{path}_accumulated_gradient"))

    def is_last(self) -> tf.Tensor:
        """Whether the micro-step being run ends its window (bool tensor)."""
        return tf.equal(self.micro_step + 1, self.steps)

    def collect(self, grads, divide) -> tuple:
        """Adds a micro-step's gradients: ``(the window's sums, unscaled, is_last)``.

        Args:
            grads: One gradient per variable, scaled unless ``divide`` is None.
            divide: Unscales the gradients (the loss scale is constant within
                a window), or None when they arrive unscaled.

        Returns:
            The sums so far (unscaled), True, and whether this micro-step
            ends the window (bool tensor).
        """
        if divide is not None:
            grads = divide(grads)
        return self.add(grads), True, self.is_last()

    def add(self, grads) -> list:
        """Adds unscaled gradients and returns the window's sums so far.

        Args:
            grads: One unscaled gradient per variable (None, dense or
                ``tf.IndexedSlices``, which is added row by row).

        Returns:
            The buffers' new values (float32 tensors), in order.
        """
        sums = []
        for grad, buffer in zip(grads, self.buffers):
            if grad is None:
                pass
            elif isinstance(grad, tf.IndexedSlices):
                buffer.value.scatter_add(tf.IndexedSlices(
                    tf.cast(grad.values, tf.float32), grad.indices,
                    grad.dense_shape))
            else:
                buffer.assign_add(tf.cast(grad, tf.float32))
            sums.append(tf.convert_to_tensor(buffer.value) if grad is not None
                        else None)
        return sums

    def end_micro_step(self, is_last: tf.Tensor) -> None:
        """Advances the counter; zeroes the buffers when a window ended."""
        def reset():
            for buffer in self.buffers:
                buffer.assign(tf.zeros(buffer.shape, tf.float32))

        tf.cond(is_last, reset, lambda: None)
        self.micro_step.assign((self.micro_step + 1) % self.steps)


    def end_of_fit(self) -> int:
        """Drops a window left unfinished when ``fit`` ends, with a warning.

        Call it eagerly (``LossScaleOptimizer.finalize_variable_values``
        does). Every replica's buffers and the counter go back to zero.

        Returns:
            The number of micro-steps dropped (0: the window was complete).
        """
        if self.micro_step is None:
            return 0
        dropped = int(_local_copies(self.micro_step)[0].numpy())
        if dropped:
            warnings.warn(
                f"fit ended {dropped} micro-step(s) into a gradient accumulation "
                f"window of {self.steps}: they are dropped (never applied), and "
                "the next fit starts a fresh window. Give fit a number of "
                f"batches per run that is a multiple of {self.steps} "
                "(steps_per_epoch, or the data's length) to use every batch.",
                RuntimeWarning, stacklevel=3)
            for variable in [self.micro_step, *self.buffers]:
                for copy in _local_copies(variable):
                    copy.assign(tf.zeros(copy.shape, copy.dtype))
        return dropped


class WindowOfOne:
    """A step without accumulation, as a window of one micro-step.

    Its gradients pass through as they are (scaled or not), every
    micro-step is the last (a Python True: no operation, no cond) and it
    has nothing to save or reset.
    """

    steps = 1

    def collect(self, grads, divide) -> tuple:
        """``(grads, unscaled, True)``: nothing added, nothing divided."""
        return grads, divide is None, True

    def end_micro_step(self, is_last) -> None:
        """Nothing to advance."""


def _local_copies(variable) -> list:
    """This process's copies of a (Keras) variable: one per local replica."""
    value = getattr(variable, "value", variable)
    if isinstance(value, tf.distribute.DistributedValues):
        return list(value.values)
    return [value]
