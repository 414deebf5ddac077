"""MirroredStrategy over two logical CPUs: one verdict for all replicas.

The replica that overflows is chosen with ``replica_id_in_sync_group``; the
step must be skipped on both replicas whichever one it is (Keras's own
wrapper only notices replica 0: it checks the first replica's local gradients).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_mixed.scaling.optimizer import LossScaleOptimizer
from tf_mixed.training import make_train_step

# These tests hand the optimizer gradients they made themselves, not a scaled
# loss's: tf_mixed's misuse check warns about that (tested in
# tests/scaling/test_optimizer.py); here it is expected, not news.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*never\ went\ through\ scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")

INF = float("inf")
NAN = float("nan")
# Which replicas get a non-finite gradient: none, replica 0, replica 1, both.
BAD = {"none": [False, False], "replica0": [True, False],
       "replica1": [False, True], "both": [True, True]}


def _locals(strategy, value):
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def _setup(strategy, make_inner, **knobs):
    with strategy.scope():
        var = keras.Variable([1.0, 1.0])
        opt = LossScaleOptimizer(make_inner(), **knobs)
        opt.build([var])
    return var, opt


def _grad_step(strategy, opt, var, bad_replica, use_function, bad_value=INF):
    def replica_fn(bad):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        grad = tf.constant([4.0, 4.0])
        is_bad = tf.logical_or(tf.equal(replica, bad), tf.equal(bad, 2))
        grad = tf.where(is_bad, tf.constant([bad_value, 4.0]), grad)
        return opt.apply([grad], [var])

    def step(bad):
        return strategy.run(replica_fn, args=(bad,))

    return tf.function(step) if use_function else step


@pytest.mark.slow
@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("bad_value", [INF, NAN], ids=["inf", "nan"])
@pytest.mark.parametrize("bad_replica", [None, 0, 1, 2],
                         ids=["none", "replica0", "replica1", "both"])
def test_skip_decision_is_shared_by_all_replicas(mirrored, bad_replica,
                                                 bad_value, use_function):
    var, opt = _setup(mirrored, lambda: keras.optimizers.SGD(0.25),
                      initial_scale=4.0)
    step = _grad_step(mirrored, opt, var, bad_replica, use_function, bad_value)
    # bad: -1 nobody, 0 or 1 that replica, 2 both.
    applied = step(tf.constant(-1 if bad_replica is None else bad_replica))
    finite = bad_replica is None
    assert [bool(a) for a in _locals(mirrored, applied)] == [finite, finite]
    # Finite: each replica's gradient 4/4 = 1, summed over 2 replicas, lr .25.
    expected = [0.5, 0.5] if finite else [1.0, 1.0]
    for copy in _locals(mirrored, var.value):
        np.testing.assert_array_equal(copy, expected)
    for copy in _locals(mirrored, opt.loss_scale.value):
        assert float(copy) == (4.0 if finite else 2.0)
    assert int(opt.iterations.numpy()) == int(finite)
    for copy in _locals(mirrored, opt.skipped_steps.value):
        assert int(copy) == int(not finite)


def test_adam_slots_untouched_and_scale_grows_under_mirrored(mirrored):
    var, opt = _setup(mirrored, lambda: keras.optimizers.Adam(0.1), initial_scale=4.0,
                      growth_interval=2)
    step = _grad_step(mirrored, opt, var, None, use_function=True)
    step(tf.constant(-1))
    slots = [[c.copy() for c in _locals(mirrored, v.value)]
             for v in opt.inner_optimizer.variables]
    weights = _locals(mirrored, var.value)
    applied = step(tf.constant(1))  # replica 1 overflows
    assert not any(bool(a) for a in _locals(mirrored, applied))
    for old, v in zip(slots, opt.inner_optimizer.variables):
        for a, b in zip(old, _locals(mirrored, v.value)):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(weights, _locals(mirrored, var.value)):
        np.testing.assert_array_equal(a, b)
    step(tf.constant(-1))
    step(tf.constant(-1))
    assert [float(s) for s in _locals(mirrored, opt.loss_scale.value)] == [4.0, 4.0]
    assert int(opt.iterations.numpy()) == 3


def test_inner_optimizer_made_outside_the_scope_is_refused(mirrored):
    inner = keras.optimizers.SGD(0.25)  # its `iterations` is not mirrored
    var, opt = _setup(mirrored, lambda: inner)
    step = _grad_step(mirrored, opt, var, None, use_function=True)
    with pytest.raises(ValueError, match="strategy.scope"):
        step(tf.constant(-1))


def test_keras_wrapper_still_corrupts_weights_when_replica_1_overflows(mirrored):
    """Why tf_mixed exists: Keras applies replica 1's overflow. Fails once Keras fixes it."""
    with mirrored.scope():
        var = keras.Variable([1.0, 1.0])
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.25),
                                                  initial_scale=4.0)
        opt.build([var])

    def replica_fn():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        grad = tf.where(tf.equal(replica, 1), tf.constant([INF, 4.0]),
                        tf.constant([4.0, 4.0]))
        opt.apply([grad], [var])

    tf.function(lambda: mirrored.run(replica_fn))()
    assert np.isneginf(_locals(mirrored, var.value)[0][0])


def _flag_loss(y_true, y_pred):
    """Squared error; y_true[:, 1] of 1 makes a sample's loss inf, 2 NaN."""
    flag = y_true[:, 1:]
    blow_up = tf.where(flag > 1.5, NAN, tf.where(flag > 0.5, INF, 1.0))
    return tf.reduce_mean(tf.square(y_pred - y_true[:, :1]) * blow_up, axis=-1)


def _fit_model(strategy, jit_compile=False):
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((1,)),
            keras.layers.Dense(1, kernel_initializer="ones",
                               bias_initializer="zeros"),
        ])
        opt = LossScaleOptimizer(keras.optimizers.SGD(0.125), initial_scale=4.0)
        model.compile(optimizer=opt, loss=_flag_loss, jit_compile=jit_compile)
    return model, opt


@pytest.mark.slow
@pytest.mark.parametrize("flag", [1.0, 2.0], ids=["inf", "nan"])
@pytest.mark.parametrize("bad_samples", [(), (0,), (3,), (0, 3)],
                         ids=["none", "replica0", "replica1", "both"])
def test_fit_skips_when_any_replica_overflows(mirrored, bad_samples, flag):
    model, opt = _fit_model(mirrored)
    x = np.ones((4, 1), np.float32)
    y = np.zeros((4, 2), np.float32)
    for sample in bad_samples:
        y[sample, 1] = flag  # batch of 4 splits 2 + 2 over the replicas
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False)
    kernel, bias = (float(w.ravel()[0]) for w in model.get_weights())
    for weight in model.weights:  # every replica holds the same finite copy
        copies = _locals(mirrored, weight.value)
        assert all(np.isfinite(c).all() for c in copies)
        np.testing.assert_array_equal(copies[0], copies[1])
    if not bad_samples:
        # d/dw mean((w + b)^2) at w=1, b=0 is 2; lr 1/8.
        assert (kernel, bias) == (0.75, -0.25)
        assert float(opt.loss_scale.numpy()) == 4.0
        assert int(opt.iterations.numpy()) == 1
    else:
        assert (kernel, bias) == (1.0, 0.0)
        assert float(opt.loss_scale.numpy()) == 2.0
        assert int(opt.iterations.numpy()) == 0
        assert int(opt.skipped_steps.numpy()) == 1


@pytest.mark.slow
def test_fit_with_jit_compile_under_strategy_raises_clear_error(mirrored):
    model, _ = _fit_model(mirrored, jit_compile=True)
    x = np.ones((4, 1), np.float32)
    y = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="jit_compile=False"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)


@pytest.mark.slow
def test_make_train_step_under_mirrored(mirrored):
    with mirrored.scope():
        model = keras.Sequential([
            keras.Input((1,)),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
        ])
        opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=4.0)
        opt.build(model.trainable_variables)

    def loss_fn(y, pred):
        return tf.reduce_mean(pred * y[:, :1] * tf.where(y[:, 1:] > 0, INF, 1.0))

    step = make_train_step(model, loss_fn, opt, strategy=mirrored)
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.ones((2, 1), np.float32),
         np.array([[1.0, 0.0], [3.0, 1.0]], np.float32))).batch(2)
    x, y = next(iter(mirrored.experimental_distribute_dataset(dataset)))
    result = step(x, y)  # replica 1 holds the flagged sample
    assert not bool(result["applied"])
    assert float(model.get_weights()[0].ravel()[0]) == 1.0
    clean = tf.data.Dataset.from_tensor_slices(
        (np.ones((2, 1), np.float32),
         np.array([[1.0, 0.0], [3.0, 0.0]], np.float32))).batch(2)
    x, y = next(iter(mirrored.experimental_distribute_dataset(clean)))
    result = step(x, y)
    assert bool(result["applied"])
    assert float(result["loss"]) == 2.0  # mean of 1 and 3 (pred = 1)
    assert float(model.get_weights()[0].ravel()[0]) == 0.0  # 1 - 0.5 * 2


def test_make_train_step_refuses_jit_under_strategy(mirrored):
    with mirrored.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        opt = LossScaleOptimizer(keras.optimizers.SGD(0.5))
    with pytest.raises(ValueError, match="jit_compile"):
        make_train_step(model, keras.losses.MeanSquaredError(), opt,
                        strategy=mirrored, jit_compile=True)


@pytest.mark.slow
def test_unscale_then_clip_under_mirrored(mirrored):
    """Unscaled gradients, clipped per replica, applied with unscaled=True."""
    var, opt = _setup(mirrored, lambda: keras.optimizers.SGD(0.5),
                      initial_scale=8.0)

    def replica_fn():
        grads = opt.unscale_gradients([tf.constant([24.0, 32.0])])  # [3, 4]
        grads, _ = tf.clip_by_global_norm(grads, 1.0)  # [0.6, 0.8]
        return opt.apply(grads, [var], unscaled=True)

    applied = tf.function(lambda: mirrored.run(replica_fn))()
    assert all(bool(a) for a in _locals(mirrored, applied))
    # Summed over 2 replicas: [1.2, 1.6], lr 0.5.
    for copy in _locals(mirrored, var.value):
        np.testing.assert_allclose(copy, [1.0 - 0.6, 1.0 - 0.8], rtol=1e-6)
    assert int(opt.iterations.numpy()) == 1
