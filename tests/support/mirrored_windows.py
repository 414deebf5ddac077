"""Accumulation windows on two replicas, run whole or resumed inside a window.

For tests/scaling/test_accumulation.py (``.keras`` entries) and test_formats.py
(``tf.train.Checkpoint``): a run carried to a fresh optimizer two micro-steps
into its second window ends bit for bit where the uninterrupted run ends.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import tf_mixed

STEPS = 4  # micro-steps per window
FEATURES = 3


def replica_grads() -> np.ndarray:
    """Two windows of micro-steps, a different gradient on each replica.

    Not sums of powers of two: a resumed window must round as the
    uninterrupted one does.
    """
    rng = np.random.default_rng(1)
    return rng.normal(size=(2 * STEPS, 2, FEATURES)).astype(np.float32)


def fresh(strategy):
    """A variable and an accumulating Adam wrapper built under ``strategy``."""
    with strategy.scope():
        w = keras.Variable(np.zeros(FEATURES, np.float32))
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.Adam(2.0**-4), initial_scale=1.0,
                                          dynamic=False, gradient_accumulation_steps=STEPS)
        opt.build([w])
    return w, opt


def micro_steps(mirrored, w, opt, grads) -> None:
    """One ``apply`` per row of ``grads``, replica ``i`` taking ``grads[:, i]``."""
    @tf.function
    def step(both):
        def replica_fn():
            i = tf.distribute.get_replica_context().replica_id_in_sync_group
            return opt.apply([tf.gather(both, i)], [w])

        mirrored.run(replica_fn)

    for both in grads:
        step(tf.constant(both))


def resume_inside_a_window(mirrored, carry):
    """The uninterrupted run's weights and the resumed run's, per replica.

    Args:
        mirrored: A ``MirroredStrategy`` over two replicas.
        carry: ``carry(first, w1)`` returns ``(w2, resumed)``: a `fresh`
            variable and optimizer holding what ``w1`` and ``first`` hold two
            micro-steps into the second window (saved and loaded as the test
            chooses, with its own checks).

    Returns:
        ``(uninterrupted, resumed)``: each a list of every replica's weights.
    """
    grads = replica_grads()
    w, opt = fresh(mirrored)
    micro_steps(mirrored, w, opt, grads)
    uninterrupted = [c.numpy() for c in w.value.values]
    w1, first = fresh(mirrored)
    micro_steps(mirrored, w1, first, grads[:STEPS + 2])  # inside window 2
    w2, resumed = carry(first, w1)
    micro_steps(mirrored, w2, resumed, grads[STEPS + 2:])
    return uninterrupted, [c.numpy() for c in w2.value.values]
