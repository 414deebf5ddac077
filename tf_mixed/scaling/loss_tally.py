"""The sum of the losses of applied steps, for the monitor's epoch loss."""

# When a step is skipped its loss is NaN/inf, and Keras's running mean in
# ``logs["loss"]`` then shows ``nan`` for a healthy epoch. A `LossTally`
# attached to a ``tf_mixed.LossScaleOptimizer`` (``attach_loss_tally``) sums
# the losses of the steps that were applied; `tf_mixed.LossScaleMonitor`
# attaches one and reads it once per epoch as a `LossTotals` value.
#
# In ``fit`` the loss reaches tf_mixed only through ``scale_loss`` and the
# verdict only through ``apply``, so the tally is told both: `observe` the
# step's loss, then `settle` with the verdict. With gradient accumulation a
# step is a window: its micro-steps' losses are observed one by one and the
# window settles once, with their mean. Nothing is recorded while no tally is
# attached.
#
# The sum is compensated (Kahan): the monitor's epoch loss is the difference of
# two totals kept since the optimizer was built, and a plain float32 total
# stops absorbing a 0.05 loss exactly once it passes ~1e6 (an epoch mean of
# 0.0495 read 0.0607) and absorbs nothing at 2**24 (it read 0.0). The second
# variable holds what float32 rounding dropped; `LossTally.totals` combines
# both in Python floats (float64), exact to far below a loss's resolution.

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tf_mixed.scaling.replicas import local_copies

__all__ = ["LossTally", "LossTotals"]


class LossTotals(NamedTuple):
    """What a `LossTally` has counted since it was built.

    Attributes:
        loss_sum: Sum of the losses of applied steps, over this worker's
            replicas (in ``fit`` each replica's loss is already divided by
            the number of replicas, so the sum over all workers is the mean).
        applied_steps: Steps applied (counted once, not per replica).
    """

    loss_sum: float
    applied_steps: int


class LossTally:
    """Scratch variables summing applied steps' losses (in no checkpoint).

    Build it under the strategy's scope; every replica keeps its own copy
    (aggregation NONE), written in the replica context.
    """

    def __init__(self) -> None:
        self._pending: tf.Variable | None = None  # losses observed, unsettled
        self._observed: tf.Variable | None = None  # how many
        self._sum: tf.Variable | None = None
        self._lost: tf.Variable | None = None  # minus what rounding dropped from _sum
        self._steps: tf.Variable | None = None

    def build(self) -> None:
        """Creates the variables (once) in the current strategy's scope."""
        if self._pending is not None:
            return

        def scratch(dtype):
            return tf.Variable(tf.zeros((), dtype), trainable=False,
                               aggregation=tf.VariableAggregation.NONE)

        self._pending = scratch(tf.float32)
        self._observed = scratch(tf.float32)
        self._sum = scratch(tf.float32)
        self._lost = scratch(tf.float32)
        self._steps = scratch(tf.int64)

    def observe(self, loss: tf.Tensor) -> None:
        """Remembers the (unscaled) loss of the (micro-)step being run."""
        if self._pending is not None and self._observed is not None:
            self._pending.assign_add(tf.cast(tf.stop_gradient(loss), tf.float32))
            self._observed.assign_add(1.0)

    def settle(self, finite: tf.Tensor) -> None:
        """Adds the mean remembered loss when the verdict is ``finite``; forgets it."""
        if (self._pending is None or self._observed is None or self._sum is None
                or self._lost is None or self._steps is None):
            return
        mean = self._pending.read_value() / tf.maximum(self._observed.read_value(), 1.0)
        # Kahan summation: `lost` is the rounding error of the previous
        # additions (negated), fed back into the next one.
        addend = tf.where(finite, mean, 0.0) - self._lost.read_value()
        before = self._sum.read_value()
        after = before + addend
        self._lost.assign((after - before) - addend)
        self._sum.assign(after)
        self._steps.assign_add(tf.cast(finite, tf.int64))
        self._pending.assign(0.0)
        self._observed.assign(0.0)

    def totals(self) -> LossTotals:
        """The totals since `build`, in Python numbers (one host read).

        Returns:
            A `LossTotals`; zeros before `build`.
        """
        if self._sum is None or self._steps is None:
            return LossTotals(0.0, 0)
        loss = sum(float(total) - float(lost) for total, lost in
                   zip(local_copies(self._sum), local_copies(self._lost)))
        return LossTotals(loss, int(local_copies(self._steps)[0]))

