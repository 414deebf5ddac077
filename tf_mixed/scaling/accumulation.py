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
# checkpointed with the optimizer, the buffers **per replica**
# (`save_variables`, `load_variables`): each replica's buffer holds its own
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
# `validate_steps` is the argument's one check.

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from tf_mixed._internal import validate as _validate

__all__ = ["AccumulationHooks", "Accumulator", "load_variables", "save_variables", "steps_to_take_over",
           "take_over", "validate_steps"]


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


class AccumulationHooks:
    """The optimizer methods accumulation overrides (a mixin of the wrapper).

    Saving and loading keep each replica's buffers (`save_variables`,
    `load_variables`); Keras's end of ``fit`` drops an unfinished window
    (`Accumulator.end_of_fit`). Without accumulation they are Keras's own.
    """

    accumulator: Accumulator | None

    def save_own_variables(self, store) -> None:
        """The wrapper's layout; accumulation buffers per replica."""
        save_variables(self, store, super().save_own_variables)  # type: ignore[misc]

    def load_own_variables(self, store) -> None:
        """Keras's (or Keras's wrapper's) layout; each replica's own buffers."""
        load_variables(self, store, super().load_own_variables)  # type: ignore[misc]

    def finalize_variable_values(self, var_list) -> None:
        """At the end of ``fit``: drops an unfinished window (a warning)."""
        if self.accumulator is not None:
            self.accumulator.end_of_fit()
        super().finalize_variable_values(var_list)  # type: ignore[misc]


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


def _local_copies(variable) -> list:
    """This process's copies of a (Keras) variable: one per local replica."""
    value = getattr(variable, "value", variable)
    if isinstance(value, tf.distribute.DistributedValues):
        return list(value.values)
    return [value]


def _replicas_of(variable):
    """``(strategy, global ids of the local copies, replicas in sync)``."""
    value = getattr(variable, "value", variable)
    if not isinstance(value, tf.distribute.DistributedValues):
        return None, [0], 1
    strategy = value.distribute_strategy
    with strategy.scope():
        ids = strategy.run(
            lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
        ids = [int(i) for i in strategy.experimental_local_results(ids)]
    return strategy, ids, strategy.num_replicas_in_sync


def _every_replica(buffers) -> list[np.ndarray]:
    """Every replica's copy of each buffer, stacked ``[replicas, ...]``.

    Across workers this is a collective (every worker must save).
    """
    strategy, _, replicas = _replicas_of(buffers[0])
    if replicas == 1:
        return [np.stack([c.numpy() for c in _local_copies(b)]) for b in buffers]
    gathered = []
    with strategy.scope():
        for buffer in buffers:
            # Read in replica context: each replica's own copy. (One buffer
            # per run: a list returned by `run` gathers one replica only.)
            local = strategy.run(
                lambda b=buffer: tf.expand_dims(tf.convert_to_tensor(b.value), 0))
            gathered.append(np.asarray(strategy.gather(local, axis=0)))
    return gathered


def _entries(optimizer) -> dict[int, str]:
    """The store key of each array variable of the wrapper's own layout.

    `tf_mixed.scaling.keras_compat.KerasCompat.save_own_variables` writes the
    scalar state as entry "0" and each array variable (the accumulation
    buffers) as "1", "2", ... in order.
    """
    arrays = [v for v in optimizer._variables if v.shape]
    return {id(v): str(i) for i, v in enumerate(arrays, start=1)}


def save_variables(optimizer, store, save) -> None:
    """``save`` (the wrapper's ``save_own_variables``), with every replica's buffer.

    On several replicas an accumulation buffer's entry holds
    ``[replicas, *shape]``; on one, its own shape (the plain layout).
    """
    save(store)
    accumulator = optimizer.accumulator
    if accumulator is None or not accumulator.buffers:
        return
    _, _, replicas = _replicas_of(accumulator.buffers[0])
    if replicas <= 1:
        return
    keys = _entries(optimizer)
    for buffer, value in zip(accumulator.buffers, _every_replica(accumulator.buffers)):
        store[keys[id(buffer)]] = value


def load_variables(optimizer, store, load) -> None:
    """``load`` (the wrapper's ``load_own_variables``), then each replica's buffer.

    Args:
        optimizer: A built ``LossScaleOptimizer``.
        store: What ``save_variables`` wrote (or an older file: then ``load``
            alone reads it).
        load: The loader of the plain layout, called with a store whose
            buffer entries have the buffer's own shape.
    """
    accumulator = optimizer.accumulator
    keys = _entries(optimizer) if optimizer.built else {}
    stored = list(store.keys())
    if (accumulator is None or not accumulator.buffers or not optimizer.built
            or len(stored) != 1 + len(keys)
            or any(keys[id(b)] not in stored for b in accumulator.buffers)):
        load(store)
        return
    plain = {key: store[key] for key in stored}
    saved = {}
    for buffer in accumulator.buffers:
        value = np.asarray(plain[keys[id(buffer)]], np.float32)
        saved[id(buffer)] = (value if value.shape != tuple(buffer.shape)
                             else value[None])
        plain[keys[id(buffer)]] = np.zeros(buffer.shape, np.float32)
    load(plain)
    _, ids, replicas = _replicas_of(accumulator.buffers[0])
    folded = False
    for buffer in accumulator.buffers:
        rows = saved[id(buffer)]
        if len(rows) != replicas:
            # Another replica count: keep the window's sum, on replica 0.
            folded = folded or len(rows) > 1
            total = rows.sum(axis=0, dtype=np.float32)
            rows = np.stack([total if i == 0 else np.zeros_like(total)
                             for i in range(replicas)])
        for copy, replica in zip(_local_copies(buffer), ids):
            copy.assign(rows[replica])
    if folded:
        warnings.warn(
            "The optimizer's accumulation buffers were saved on "
            f"{len(saved[id(accumulator.buffers[0])])} replicas and are "
            f"restored onto {replicas}: the window's sum is kept (on the first "
            "replica), but its rounding may differ from the uninterrupted run.",
            RuntimeWarning, stacklevel=3)
