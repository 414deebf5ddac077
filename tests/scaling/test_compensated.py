"""tf_mixed.scaling.compensated: bfloat16 weights keep updates below their spacing.

Exact numbers: SGD with learning rate 2**-10 and gradient 1 moves a weight
of 1.0 by a quarter of bfloat16's spacing below 1.0 (2**-8) per step.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import compensated

# These tests hand the optimizer gradients they made themselves, not a scaled
# loss's: tf_mixed's misuse check warns about that (tested in
# tests/scaling/test_optimizer.py); here it is expected, not news.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*never\ went\ through\ scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")

STEP = 2.0**-10


def _run(opt, variable, grad, steps, graph):
    def step():
        opt.apply([grad], [variable])

    fn = tf.function(step) if graph else step
    for _ in range(steps):
        fn()


@pytest.mark.slow
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_plain_keras_sgd_loses_every_small_step(graph):
    """The stall: 64 steps of 2**-10 leave a bfloat16 weight at exactly 1.0."""
    v = keras.Variable(1.0, dtype="bfloat16")
    _run(keras.optimizers.SGD(STEP), v, tf.constant(1.0, tf.bfloat16), 64, graph)
    assert float(v.numpy()) == 1.0


def _kahan_total(opt, variable):
    """What the weight and its buffer hold together, in float64."""
    return compensated.kahan_sum(variable.value, opt.variables[-1].value).numpy().astype(
        np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_kahan_keeps_every_small_step_exactly(graph):
    v = keras.Variable(1.0, dtype="bfloat16")
    opt = compensated.compensate(keras.optimizers.SGD(STEP), "kahan")
    for k in range(1, 9):
        _run(opt, v, tf.constant(1.0, tf.bfloat16), 8, graph)
        # Weight and buffer hold the sum of the updates (exact here: every
        # partial sum is a float32 number).
        assert _kahan_total(opt, v) == 1.0 - 8 * k * STEP
    assert float(v.numpy()) == 0.9375 and int(opt.variables[-1].numpy()) == 0
    assert opt.variables[-1].dtype == "int16"  # 2 bytes per parameter


def test_kahan_on_a_vector_of_different_weights_is_exact():
    start = np.array([1.0, -1.0, 0.5, 3.0, 0.0], np.float32)
    v = keras.Variable(start, dtype="bfloat16")
    opt = compensated.compensate(keras.optimizers.SGD(STEP), "kahan")
    grad = tf.constant([1.0, -2.0, 0.5, 4.0, -1.0], tf.bfloat16)
    _run(opt, v, grad, 100, graph=True)
    expected = start - 100 * STEP * grad.numpy().astype(np.float64)
    np.testing.assert_array_equal(_kahan_total(opt, v), expected)
    # The weight itself is within half a spacing of the exact sum.
    spacing = 2.0 ** (np.floor(np.log2(np.abs(expected) + 1e-30)) - 7)
    assert np.all(np.abs(v.numpy().astype(np.float64) - expected) <= spacing / 2)


def test_kahan_split_rounds_to_nearest_and_reads_back():
    total = tf.constant([1.0 + 2.0**-9, 1.0 + 3 * 2.0**-9, -(1.0 + 3 * 2.0**-9),
                         2.0 - 2.0**-20, 3.0e38, 1e-40, 0.0, np.inf, -np.inf])
    weight, buffer = compensated._split(total)
    assert buffer.dtype == tf.int16
    np.testing.assert_array_equal(
        weight.numpy().astype(np.float32),
        [1.0, 1.0 + 2.0**-7, -(1.0 + 2.0**-7), 2.0, np.float32(tf.cast(
            tf.cast(3.0e38, tf.bfloat16), tf.float32)), np.float32(tf.cast(
                tf.cast(1e-40, tf.bfloat16), tf.float32)), 0.0, np.inf, -np.inf])
    np.testing.assert_array_equal(compensated.kahan_sum(weight, buffer).numpy(),
                                  total.numpy())


def _adam_updates(grads, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Keras's Adam updates for ``grads`` (one row per step), in float64."""
    m = np.zeros(grads.shape[1])
    v = np.zeros(grads.shape[1])
    updates = []
    for t, g in enumerate(grads.astype(np.float64), start=1):
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m += (g - m) * (1 - beta_1)
        v += (g * g - v) * (1 - beta_2)
        updates.append(-m * alpha / (np.sqrt(v) + epsilon))
    return np.array(updates)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_kahan_weight_tracks_the_float64_sum_within_one_ulp(name):
    """10,000 steps whose updates bfloat16 cannot hold: the weight stays
    within one bfloat16 spacing of the float64 sum of the updates, checked
    every 100 steps (the bfloat16 buffer tf_mixed kept before drifted by
    2.5% of the whole move: many spacings over 10,000 steps)."""
    steps, lr = 10_000, 1e-4
    rng = np.random.default_rng(0)
    # Steps of one sign per weight (a drift would add up), noisy after the
    # first 100; the weights move by about 1 and stay away from zero.
    start = np.array([3.0, -3.0, 2.0, 4.0, -2.5, 2.5], np.float32)
    base = np.array([1.0, -1.0, 0.5, 2.0, -0.3, 0.7], np.float32)
    grads = (base * (1 + 0.25 * rng.uniform(-1, 1, size=(steps, base.size)))).astype(
        np.float32)
    grads[:100] = base  # 100 equal steps first
    grads = tf.constant(grads, tf.bfloat16).numpy()  # what the optimizer sees
    if name == "sgd":
        opt = keras.optimizers.SGD(lr)
        updates = -lr * grads.astype(np.float32).astype(np.float64)
    else:
        opt = keras.optimizers.Adam(lr)
        updates = _adam_updates(grads.astype(np.float32), lr)
    opt = compensated.compensate(opt, "kahan")
    v = keras.Variable(start, dtype="bfloat16")
    opt.build([v])
    expected = start.astype(np.float64) + np.cumsum(updates, axis=0)

    @tf.function
    def run(chunk):
        for g in chunk:
            opt.apply([g], [v])

    worst = 0.0
    for k in range(0, steps, 100):
        run(tf.constant(grads[k:k + 100]))
        exact = expected[k + 99]
        spacing = 2.0 ** (np.floor(np.log2(np.abs(exact))) - 7)
        error = np.abs(v.numpy().astype(np.float64) - exact) / spacing
        worst = max(worst, float(error.max()))
    print(f"{name}: worst error {worst:.3f} bfloat16 spacings")
    assert worst <= 1.0, worst


def test_stochastic_round_picks_a_neighbour_with_the_right_odds():
    lower, upper = 1.0, 1.0 + 2.0**-7
    value = tf.fill([1 << 16], 1.0 + 2.0**-9)  # a quarter of the way up
    rounded = compensated.stochastic_round(value, tf.constant([3, 4], tf.int64))
    got = rounded.numpy().astype(np.float64)
    assert set(np.unique(got)) <= {lower, upper}
    share_up = float(np.mean(got == upper))
    sigma = (0.25 * 0.75 / (1 << 16)) ** 0.5
    assert abs(share_up - 0.25) < 5 * sigma
    again = compensated.stochastic_round(value, tf.constant([3, 4], tf.int64))
    np.testing.assert_array_equal(again.numpy(), rounded.numpy())
    negative = compensated.stochastic_round(-value, tf.constant([3, 4], tf.int64))
    np.testing.assert_array_equal(negative.numpy(), -rounded.numpy())


def test_stochastic_round_keeps_representable_and_non_finite_values():
    values = tf.constant([1.0, -0.5, 3.0, 0.0, np.inf, -np.inf, np.nan])
    out = compensated.stochastic_round(values, tf.constant([0, 0], tf.int64))
    np.testing.assert_array_equal(out.numpy().astype(np.float32), values.numpy())


def test_stochastic_updates_are_right_on_average():
    v = keras.Variable(tf.ones([1 << 14]), dtype="bfloat16")
    opt = compensated.compensate(keras.optimizers.SGD(STEP), "stochastic")
    _run(opt, v, tf.ones([1 << 14], tf.bfloat16), 64, graph=True)
    mean = float(np.mean(v.numpy().astype(np.float64)))
    # Each weight's error is at most 64 roundings of variance <= (2**-8)**2/4.
    sigma = ((64 * 2.0**-16 / 4) / (1 << 14)) ** 0.5
    assert abs(mean - 0.9375) < 5 * sigma
    assert len(opt.variables) == 2  # no buffer


@pytest.mark.slow
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", ["kahan", "stochastic"])
def test_state_dtype_sets_the_slots_of_bfloat16_weights_only(method, state_dtype):
    w16 = keras.Variable(np.ones([3], np.float32), dtype="bfloat16", name="w16")
    w32 = keras.Variable(np.ones([3], np.float32), dtype="float32", name="w32")
    opt = compensated.compensate(keras.optimizers.Adam(1e-3), method,
                                 state_dtype=state_dtype)
    opt.build([w16, w32])
    dtypes = {v.name: v.dtype for v in opt.variables}
    assert dtypes["w16_momentum"] == dtypes["w16_velocity"] == state_dtype
    assert dtypes["w32_momentum"] == dtypes["w32_velocity"] == "float32"
    assert ("w16_kahan" in dtypes) == (method == "kahan")
    assert "w32_kahan" not in dtypes
    opt.apply([tf.ones([3], tf.bfloat16), tf.ones([3])], [w16, w32])
    # Adam's first step is lr * sign(g) for every weight.
    np.testing.assert_allclose(w32.numpy(), 1 - 1e-3, rtol=1e-6)


def test_float32_variables_are_updated_as_keras_does():
    plain, hooked = (keras.Variable(np.linspace(-1, 1, 5), dtype="float32")
                     for _ in range(2))
    opts = [keras.optimizers.Adam(1e-2),
            compensated.compensate(keras.optimizers.Adam(1e-2), "kahan")]
    for _ in range(5):
        for opt, v in zip(opts, (plain, hooked)):
            opt.apply([tf.constant([0.1, -0.2, 0.3, 0.0, 1.0])], [v])
    np.testing.assert_array_equal(plain.numpy(), hooked.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("method", ["kahan", "stochastic"])
def test_decoupled_weight_decay_is_compensated_too(method):
    v = keras.Variable(tf.ones([1 << 12]), dtype="bfloat16")
    opt = compensated.compensate(
        keras.optimizers.AdamW(2.0**-10, weight_decay=2.0**-4), method)
    _run(opt, v, tf.zeros([1 << 12], tf.bfloat16), 16, graph=True)
    mean = float(np.mean(v.numpy().astype(np.float64)))
    if method == "kahan":
        mean = float(np.mean(_kahan_total(opt, v)))
    expected = (1 - 2.0**-14) ** 16  # decay only: the gradient is zero
    assert abs(mean - expected) < 2e-4
    plain = keras.Variable(tf.ones([4]), dtype="bfloat16")
    _run(keras.optimizers.AdamW(2.0**-10, weight_decay=2.0**-4), plain,
         tf.zeros([4], tf.bfloat16), 16, graph=True)
    assert np.all(plain.numpy() == 1.0)  # Keras's own decay is rounded away


def _stochastic_sgd_run(strategy):
    """Eight steps of stochastic-rounding SGD; every replica's copy."""
    with strategy.scope():
        v = keras.Variable(tf.ones([256]), dtype="bfloat16")
        opt = compensated.compensate(keras.optimizers.SGD(STEP), "stochastic")
        opt.build([v])

    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            # Per-replica gradient whose sum over replicas is 1.
            g = tf.ones([256], tf.bfloat16) / ctx.num_replicas_in_sync
            opt.apply([g], [v])
        strategy.run(replica_fn)

    for _ in range(8):
        step()
    return [c.numpy() for c in getattr(v.value, "values", [v.value])]


def test_replicas_agree_and_match_one_device(mirrored):
    """Stochastic rounding draws the same bits on every replica."""
    one, = _stochastic_sgd_run(tf.distribute.get_strategy())
    first, second = _stochastic_sgd_run(mirrored)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, one)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"compensation=.kahn.*'kahan'"):
        compensated.compensate(keras.optimizers.SGD(), "kahn")
    with pytest.raises(ValueError, match=r"state_dtype='float16'"):
        compensated.compensate(keras.optimizers.SGD(), state_dtype="float16")
    with pytest.raises(ValueError, match=r"seed=-1"):
        compensated.compensate(keras.optimizers.SGD(), seed=-1)
    with pytest.raises(TypeError, match=r"optimizer='sgd'"):
        compensated.compensate("sgd")
    with pytest.raises(ValueError, match="inner_optimizer"):
        compensated.compensate(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()))
    built = keras.optimizers.SGD()
    built.build([keras.Variable(1.0)])
    with pytest.raises(ValueError, match="before the optimizer is built"):
        compensated.compensate(built)
    opt = compensated.compensate(keras.optimizers.SGD(), "kahan")
    assert compensated.compensate(opt, "kahan") is opt
    with pytest.raises(ValueError, match="already updates"):
        compensated.compensate(opt, "stochastic")
    assert compensated.compensation_of(opt) == compensated.CompensationConfig("kahan")
    assert compensated.compensation_of(keras.optimizers.SGD()) is None


@pytest.mark.slow
def test_pure_bfloat16_model_trains_through_fit():
    tf_mixed.enable("bfloat16", quiet=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert model.layers[0].kernel.dtype == "bfloat16"
    opt = compensated.compensate(keras.optimizers.Adam(1e-4), "kahan")
    model.compile(optimizer=opt, loss="mse")
    x = np.ones((32, 4), np.float32)
    before = model.layers[0].kernel.numpy().astype(np.float32).copy()
    model.fit(x, np.full((32, 1), 100.0, np.float32), epochs=3, verbose=0)
    kahan = next(v for v in opt.variables if v.name.endswith("kernel_kahan"))
    moved = compensated.kahan_sum(model.layers[0].kernel.value, kahan.value).numpy() - before
    np.testing.assert_allclose(moved, 3e-4, rtol=0.02)  # Adam: lr per step


def test_plain_keras_adam_never_moves_bfloat16_weights():
    """The stall of keras-hub#2629, at any learning rate.

    Keras computes Adam's bias correction in the variable's dtype: bfloat16
    rounds beta_2 = 0.999 to 1.0, so sqrt(1 - beta_2**t) and every update
    are exactly 0. `compensate` computes the update in float32.
    """
    assert float(tf.cast(tf.constant(0.999), tf.bfloat16)) == 1.0
    for lr in (1e-4, 1e-2):
        v = keras.Variable(tf.ones([4]), dtype="bfloat16")
        _run(keras.optimizers.Adam(lr), v, tf.ones([4], tf.bfloat16), 5, graph=True)
        assert np.all(v.numpy() == 1.0)
    v = keras.Variable(tf.ones([4]), dtype="bfloat16")
    opt = compensated.compensate(keras.optimizers.Adam(2.0**-4), "kahan")
    _run(opt, v, tf.ones([4], tf.bfloat16), 4, graph=True)
    np.testing.assert_allclose(v.numpy().astype(np.float32), 0.75, rtol=1e-3)


def test_the_monitor_names_a_plain_optimizer_on_bfloat16_weights():
    from tf_mixed.callbacks.monitor import model_setup_problems

    tf_mixed.enable("bfloat16", quiet=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="head")])
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    problems = [p for p in model_setup_problems(model) if "keeps weights" in p]
    assert len(problems) == 1
    assert "keeps weights in bfloat16 (1 layers, e.g. 'head')" in problems[0]
    assert "tf_mixed.wrap_optimizer(optimizer)" in problems[0]
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam()), loss="mse")
    assert not [p for p in model_setup_problems(model) if "keeps weights" in p]
