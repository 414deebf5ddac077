"""The optimizer's saved layouts: a tf.train.Checkpoint carries accumulation.

A checkpoint written inside an accumulation window (what ``BackupAndRestore``
and ``CheckpointManager`` write) restores the micro-step counter and every
replica's buffer, so the resumed run equals the uninterrupted one, exactly.
"""

import keras
import mirrored_windows
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed

STEPS = 4


def _fresh(inner=None):
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(inner or keras.optimizers.SGD(1.0), initial_scale=1.0,
                                      dynamic=False, gradient_accumulation_steps=STEPS)
    opt.build([w])
    return w, opt


GRADS = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]


@pytest.mark.slow
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_checkpoint_inside_a_window_resumes_it_on_one_device(tmp_path, graph):
    w, opt = _fresh()

    def steps(opt, w, grads):
        def one(g):
            return opt.apply([g], [w])

        one = tf.function(one) if graph else one
        for g in grads:
            one(tf.constant(g))

    steps(opt, w, GRADS[:2])
    path = tf.train.Checkpoint(optimizer=opt, w=w).write(str(tmp_path / "ckpt"))
    w2, resumed = _fresh()
    tf.train.Checkpoint(optimizer=resumed, w=w2).read(path).assert_consumed()
    assert int(resumed.accumulator.micro_step.numpy()) == 2
    np.testing.assert_array_equal(resumed.accumulator.buffers[0].numpy(), [4.0, 6.0])
    steps(resumed, w2, GRADS[2:])
    np.testing.assert_array_equal(w2.numpy(), [-4.0, -5.0])  # mean of the four
    assert int(resumed.iterations.numpy()) == 1


def test_a_checkpoint_manager_restore_into_a_fresh_run(tmp_path):
    """As BackupAndRestore does: CheckpointManager, restore the latest."""
    w, opt = _fresh(keras.optimizers.Adam(2.0**-4))
    for g in GRADS[:3]:
        opt.apply([tf.constant(g)], [w])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(optimizer=opt, w=w),
                                         str(tmp_path), max_to_keep=1)
    manager.save()
    opt.apply([tf.constant(GRADS[3])], [w])
    w2, resumed = _fresh(keras.optimizers.Adam(2.0**-4))
    tf.train.Checkpoint(optimizer=resumed, w=w2).restore(manager.latest_checkpoint)
    resumed.apply([tf.constant(GRADS[3])], [w2])
    np.testing.assert_array_equal(w2.numpy(), w.numpy())


def test_a_plain_optimizer_checkpoint_still_restores_into_the_wrapper(tmp_path):
    """The accumulation children are additions: the inner layout is unchanged."""
    w = keras.Variable(np.zeros(2, np.float32))
    plain = keras.optimizers.SGD(1.0)
    plain.apply([tf.constant([1.0, 1.0])], [w])
    path = tf.train.Checkpoint(optimizer=plain).write(str(tmp_path / "plain"))
    _, opt = _fresh()
    tf.train.Checkpoint(optimizer=opt).read(path).expect_partial()
    assert int(opt.iterations.numpy()) == 1


# ------------------------------------------------------------ two replicas


@pytest.mark.slow
def test_mirrored_checkpoint_inside_a_window_equals_the_uninterrupted_run(mirrored, tmp_path):
    def carry(first, w1):
        path = tf.train.Checkpoint(optimizer=first, w=w1).write(str(tmp_path / "ckpt"))
        w2, resumed = mirrored_windows.fresh(mirrored)
        tf.train.Checkpoint(optimizer=resumed, w=w2).read(path).assert_consumed()
        for mine, theirs in zip(resumed.accumulator.buffers[0].value.values,
                                first.accumulator.buffers[0].value.values):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())  # each replica its own
        return w2, resumed

    uninterrupted, resumed = mirrored_windows.resume_inside_a_window(mirrored, carry)
    for copy, expected in zip(resumed, uninterrupted):
        np.testing.assert_array_equal(copy, expected)  # exactly
