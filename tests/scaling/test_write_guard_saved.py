"""The write guard's per-reason skip counts save and restore with the optimizer.

`tf_mixed.loss_scale_state(opt).skip_reasons` counts skipped steps per
reason (tf_mixed/scaling/write_guard.py). They save as the ``.keras``
entries ``skip_reasons`` and ``last_skip_reason`` and as
``tf.train.Checkpoint`` children of the same names, so a resumed run goes on
counting; a file written before they were saved loads with zeros.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import write_guard
from tf_mixed.scaling.replicas import local_copies
from tf_mixed.scaling.write_guard import REASONS, SkipReasons

# Hand-made "scaled" gradients: the misuse check's warning is expected here.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*never\ went\ through\ scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")

INF = float("inf")
GRADIENTS = REASONS.index("gradients") + 1


def _steps(opt, w, grads):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for g in grads:
            opt.apply([tf.constant(g, tf.float32)], [w])


def _skipped(skips=3):
    """An optimizer that skipped ``skips`` steps (non-finite gradients), then applied one."""
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    _steps(opt, w, [[INF, 0.0]] * skips + [[1.0, 1.0]])
    assert tf_mixed.loss_scale_state(opt).skip_reasons == SkipReasons(0, 0, skips, 0, 0)
    return opt


def _fresh(build=True):
    w = keras.Variable(np.zeros(2, np.float32))
    fresh = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    if build:
        fresh.build([w])
    return fresh, w


@pytest.mark.parametrize("built", [True, False], ids=["built", "restored-before-build"])
def test_a_checkpoint_saves_and_restores_the_counts(tmp_path, built):
    path = tf.train.Checkpoint(optimizer=_skipped()).write(str(tmp_path / "ckpt"))
    fresh, w = _fresh(build=built)
    tf.train.Checkpoint(optimizer=fresh).read(path).expect_partial()
    if not built:
        fresh.build([w])  # the counts waited on the optimizer for their variables
    assert tf_mixed.loss_scale_state(fresh).skip_reasons == SkipReasons(0, 0, 3, 0, 0)
    assert int(fresh.step_state.guard.last_reason.numpy()) == GRADIENTS
    _steps(fresh, w, [[INF, 0.0]])  # a resumed run goes on counting
    assert tf_mixed.loss_scale_state(fresh).skip_reasons == SkipReasons(0, 0, 4, 0, 0)


@pytest.mark.parametrize("built", [True, False], ids=["built", "loaded-before-build"])
def test_a_keras_store_saves_and_loads_the_counts(built):
    store: dict = {}
    _skipped().save_own_variables(store)
    assert store[write_guard.COUNTS_KEY].tolist() == [0, 0, 3, 0, 0]
    assert store[write_guard.LAST_KEY].tolist() == [GRADIENTS]
    fresh, w = _fresh(build=built)
    if built:
        fresh.load_own_variables(store)
    else:
        fresh.step_state.guard.load_from(store)
        # Kept for build, and read as they are meanwhile.
        assert tf_mixed.loss_scale_state(fresh).skip_reasons == SkipReasons(0, 0, 3, 0, 0)
        fresh.build([w])
    assert tf_mixed.loss_scale_state(fresh).skip_reasons == SkipReasons(0, 0, 3, 0, 0)
    assert int(fresh.step_state.guard.last_reason.numpy()) == GRADIENTS


def test_a_file_without_the_counts_loads_with_zeros():
    store: dict = {}
    _skipped().save_own_variables(store)
    for key in (write_guard.COUNTS_KEY, write_guard.LAST_KEY):
        del store[key]  # written before the counts were saved
    fresh, _ = _fresh()
    fresh.load_own_variables(store)
    state = tf_mixed.loss_scale_state(fresh)
    assert state.skipped_steps == 3 and state.skip_reasons == SkipReasons(0, 0, 0, 0, 0)


def test_a_saved_model_keeps_its_counts(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    model.compile(opt, "mse")
    x, y = np.ones((8, 2), np.float32), np.ones((8, 1), np.float32)
    x[1, 0] = np.nan  # the first batch's data is bad: its step is skipped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    saved = tf_mixed.loss_scale_state(opt).skip_reasons
    assert sum(saved) == 1
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert tf_mixed.loss_scale_state(loaded.optimizer).skip_reasons == saved


def test_every_replica_restores_the_same_counts(tmp_path, mirrored):
    path = tf.train.Checkpoint(optimizer=_skipped()).write(str(tmp_path / "ckpt"))
    with mirrored.scope():
        fresh, _ = _fresh()
    tf.train.Checkpoint(optimizer=fresh).read(path).expect_partial()
    counts = [c.tolist() for c in local_copies(fresh.step_state.guard.counts)]
    assert counts == [[0, 0, 3, 0, 0]] * 2
