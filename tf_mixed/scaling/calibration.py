"""The loss scale's calibration: the skips before the first applied step, counted in the step."""

# A dynamic loss scale starts high (2**15 by default) and comes down one
# backoff per skipped step until the gradients fit float16: the first steps
# of a mixed_float16 run are skipped by design. `Calibration` counts them
# where they happen, in the optimizer's step, so a reader (the monitor) can
# tell them from later skips however rarely it reads: a skipped step is a
# calibration skip when
#
# * no step has been applied yet (the inner optimizer's ``iterations`` is 0),
# * the scale is dynamic and the step ran above ``min_scale`` (the search
#   could still lower it; a skip at the minimum is the ``patience`` rule's),
# * its reason is ``gradients`` (`tf_mixed.scaling.write_guard`: non-finite
#   reduced gradients, what a scale can cure; bad inputs, forward state or
#   update bounds are not).
#
# The count is one int64 variable per replica (aggregation NONE, like the
# write guard's), written only in the skipped branch of the loss-scale
# state's cond (`tf_mixed.scaling.pipeline.advance_state`): an applied step
# runs no operation of it. Every term above is the same on every replica and
# worker (``iterations`` and the scale follow the all-reduced verdict, the
# reason is read from the reduced gradients and summed flags), so every copy
# holds the same count. It saves with the optimizer (`STORE_KEY`: a
# ``.keras``/``.weights.h5`` entry and a ``tf.train.Checkpoint`` child, a
# checkpoint read before the optimizer was built included); a file without
# it loads with the count at 0.

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed.scaling.write_guard import GRADIENTS

__all__ = ["STORE_KEY", "Calibration"]

STORE_KEY = "calibration_skips"


class Calibration:
    """The skipped steps that were the loss scale's calibration (module comment).

    A part of the optimizer's `tf_mixed.scaling.step_state.StepState`.

    Attributes:
        skips: int64 scalar variable (after `build`), or None.
        pending: A count read from a file before `build`, or None.
    """

    store_keys = (STORE_KEY,)

    def __init__(self) -> None:
        self.skips: Any = None
        self.pending: int | None = None

    def build(self, optimizer) -> None:
        """Creates the variable (in ``optimizer.build``, under the strategy's scope).

        A count read earlier (a ``.keras`` file, a ``tf.train.Checkpoint``
        restored before the build) is written into it.
        """
        self.skips = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                 synchronization=tf.VariableSynchronization.ON_WRITE,
                                 aggregation=tf.VariableAggregation.NONE)
        if self.pending is not None:
            self.skips.assign(self.pending)
            self.pending = None
        _internals.restore_deferred(optimizer, STORE_KEY, self.skips)

    def count(self, optimizer, scale, reason) -> None:
        """In a skipped step's branch: counts it when it was calibration.

        Args:
            optimizer: The ``tf_mixed.LossScaleOptimizer`` (its config and
                ``iterations``).
            scale: The scale this step ran at (a float32 tensor).
            reason: The step's reason code (an int64 tensor).
        """
        config = optimizer.config
        if self.skips is None or not config.dynamic:
            return  # a fixed scale searches nothing: no operation
        calibrating = tf.logical_and(
            tf.logical_and(tf.equal(optimizer.iterations, 0),
                           scale > tf.cast(config.min_scale, scale.dtype)),
            tf.equal(reason, tf.constant(GRADIENTS, tf.int64)))
        self.skips.assign_add(tf.cast(calibrating, tf.int64))

    def read(self) -> int:
        """The count in a Python int (one host read; 0 before `build`)."""
        if self.skips is None:
            return 0 if self.pending is None else self.pending
        return int(self.skips.numpy())

    # ------------------------------------------------------- its files

    def save_into(self, store) -> None:
        """Adds the count to a ``.keras``/``.weights.h5`` store (after `build`)."""
        if self.skips is not None:
            store[STORE_KEY] = np.array([self.read()], np.int64)

    def load_from(self, store) -> None:
        """Reads a saved count (kept for `build` when not built yet)."""
        if STORE_KEY not in list(store.keys()):
            return
        saved = int(np.asarray(store[STORE_KEY][...]).reshape(-1)[0])
        if self.skips is None:
            self.pending = saved
        else:
            self.skips.assign(saved)

    def checkpoint_children(self) -> dict:
        """``{STORE_KEY: variable}`` for a ``tf.train.Checkpoint``, or ``{}`` (not built)."""
        return {} if self.skips is None else {STORE_KEY: self.skips}
