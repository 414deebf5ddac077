"""tf_mixed.scaling.calibration: the loss scale's calibration skips, counted in the step.

A skipped step is calibration when no step was applied yet, the scale is
dynamic and above its minimum, and the reason is non-finite gradients. The
count lives in the optimizer (global, saved, restored); the monitor reads it.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import calibration
from tf_mixed.scaling.replicas import local_copies

# Hand-made "scaled" gradients: the misuse check's warning is expected here.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*never\ went\ through\ scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")

INF = float("inf")


def _steps(opt, w, grads):
    """Applies each gradient in turn (eagerly); returns the verdicts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [bool(opt.apply([tf.constant(g, tf.float32)], [w])) for g in grads]


def test_the_skips_before_the_first_applied_step_are_counted_and_no_later_one():
    # Eager here; traced (tf.function, XLA, steps_per_execution) in
    # tests/callbacks/test_monitor_calibration.py and the mirrored test below.
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    applied = _steps(opt, w, [[INF, 0.0]] * 3 + [[4.0, 4.0], [INF, 1.0], [4.0, 4.0]])
    assert applied == [False, False, False, True, False, True]
    state = tf_mixed.loss_scale_state(opt)
    assert state.calibration_skips == 3 and state.skipped_steps == 4
    assert opt.step_state.calibration.read() == 3


def test_a_fixed_scale_searches_nothing():
    w = keras.Variable(np.zeros(2, np.float32))
    for opt in (tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0,
                                            dynamic=False),
                tf_mixed.wrap_optimizer(keras.optimizers.SGD(1.0))):  # float32: pass-through
        _steps(opt, w, [[INF, 0.0]] * 2)
        state = tf_mixed.loss_scale_state(opt)
        assert state.skipped_steps == 2 and state.calibration_skips == 0


def test_a_skip_at_the_minimum_scale_is_not_calibration():
    # 4 -> 2 -> 1 (the minimum): the third and fourth skips ran at 1.
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0,
                                      min_scale=1.0)
    _steps(opt, w, [[INF, 0.0]] * 4)
    state = tf_mixed.loss_scale_state(opt)
    assert state.calibration_skips == 2 and state.min_scale_skips == 2


def test_a_skip_no_scale_can_cure_is_not_calibration():
    # Adam's bound: a finite gradient of 1e30 would square to inf (reason
    # "update"); the scale backs off, but it was not the scale's search.
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=64.0)
    _steps(opt, w, [[1e30 * 64.0, 0.0], [INF, 0.0], [64.0, 64.0]])
    state = tf_mixed.loss_scale_state(opt)
    assert state.skip_reasons.update == 1 and state.skip_reasons.gradients == 1
    assert state.calibration_skips == 1 and state.skipped_steps == 2


def test_a_keras_wrapper_and_a_plain_optimizer_report_what_they_count():
    assert tf_mixed.loss_scale_state(keras.optimizers.SGD(1.0)).calibration_skips == 0
    keras_wrapper = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    assert tf_mixed.loss_scale_state(keras_wrapper).calibration_skips is None
    unbuilt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    assert tf_mixed.loss_scale_state(unbuilt).calibration_skips == 0


def _calibrated(initial_scale=64.0, skips=3):
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=initial_scale)
    _steps(opt, w, [[INF, 0.0]] * skips + [[1.0, 1.0]])
    return w, opt


@pytest.mark.parametrize("built", [True, False], ids=["built", "restored-before-build"])
def test_a_checkpoint_saves_and_restores_the_count(tmp_path, built):
    _, opt = _calibrated()
    path = tf.train.Checkpoint(optimizer=opt).write(str(tmp_path / "ckpt"))
    w = keras.Variable(np.zeros(2, np.float32))
    fresh = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    if built:
        fresh.build([w])
    tf.train.Checkpoint(optimizer=fresh).read(path).expect_partial()
    if not built:
        fresh.build([w])  # the count waited on the optimizer for its variable
    state = tf_mixed.loss_scale_state(fresh)
    assert state.calibration_skips == 3 and state.skipped_steps == 3


@pytest.mark.parametrize("built", [True, False], ids=["built", "loaded-before-build"])
def test_a_keras_store_saves_and_loads_the_count(built):
    _, opt = _calibrated()
    store: dict = {}
    opt.save_own_variables(store)
    assert store[calibration.STORE_KEY].tolist() == [3]
    w = keras.Variable(np.zeros(2, np.float32))
    fresh = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    if built:
        fresh.build([w])
        fresh.load_own_variables(store)
    else:
        fresh.step_state.calibration.load_from(store)
        assert tf_mixed.loss_scale_state(fresh).calibration_skips == 3  # kept for build
        fresh.build([w])
    assert tf_mixed.loss_scale_state(fresh).calibration_skips == 3


def test_a_file_without_the_count_loads_with_zero():
    _, opt = _calibrated()
    store: dict = {}
    opt.save_own_variables(store)
    del store[calibration.STORE_KEY]  # written before the count existed
    w = keras.Variable(np.zeros(2, np.float32))
    fresh = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    fresh.build([w])
    fresh.load_own_variables(store)
    state = tf_mixed.loss_scale_state(fresh)
    assert state.skipped_steps == 3 and state.calibration_skips == 0


def test_every_replica_holds_the_same_count_whichever_replica_overflows(mirrored):
    # Replica 1 alone overflows for three steps: the verdict, hence the count,
    # is the all-reduced one on both replicas.
    with mirrored.scope():
        w = keras.Variable([0.0, 0.0])
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
        opt.build([w])

    @tf.function
    def step(bad):
        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            g = tf.where(tf.logical_and(bad, tf.equal(replica, 1)),
                         tf.constant([INF, 1.0]), tf.constant([1.0, 1.0]))
            return opt.apply([g], [w])
        return mirrored.run(replica_fn)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for bad in (True, True, True, False, True):
            step(tf.constant(bad))
    counts = [int(c) for c in local_copies(opt.step_state.calibration.skips)]
    assert counts == [3, 3]
    assert tf_mixed.loss_scale_state(opt).skipped_steps == 4
