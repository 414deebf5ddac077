"""tf_mixed.scaling.optimizer on one device: arithmetic, knobs, wrapping, state."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed._internal import tf_keras_check
from tf_mixed.scaling import accumulation, allreduce, compensated, optimizer, scale_state
from tf_mixed.scaling.optimizer import LossScaleOptimizer, wrap_optimizer

# Many tests here feed the optimizer hand-made gradients or skip steps on purpose;
# the misuse and skipped-step warnings that draws are expected there (the tests of
# those warnings catch them with pytest.warns, which these filters do not touch).
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:.*never went through scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning"),
    pytest.mark.filterwarnings(
        "ignore:A step was skipped:tf_mixed._internal.warning.MixedPrecisionWarning"),
]

INF = float("inf")
NAN = float("nan")


def _reference_scales(finite_pattern, *, initial_scale, growth_interval,
                      growth_factor, backoff_factor, min_scale, max_scale,
                      hysteresis):
    """Pure-Python model of the documented update rule."""
    scale, good, streak, out = initial_scale, 0, 0, []
    for finite in finite_pattern:
        if finite:
            good, streak = good + 1, 0
            if good >= growth_interval:
                scale, good = min(scale * growth_factor, max_scale), 0
        else:
            good, streak = 0, streak + 1
            if streak >= hysteresis:
                scale, streak = max(scale * backoff_factor, min_scale), 0
        out.append(scale)
    return out


def _stepper(opt, var, use_function):
    def step(grad):
        return opt.apply([grad], [var])
    return tf.function(step) if use_function else step


@pytest.mark.slow
@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
def test_sgd_step_values_are_exact(use_function):
    var = keras.Variable(1.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8.0,
                             growth_interval=2)
    step = _stepper(opt, var, use_function)
    expected = [  # (scaled grad, applied, kernel after, scale after)
        (8.0, True, 0.5, 8.0),     # grad 8/8 = 1
        (INF, False, 0.5, 4.0),    # skipped, scale halves
        (NAN, False, 0.5, 2.0),    # NaN is skipped too
        (2.0, True, 0.0, 2.0),     # grad 2/2 = 1
        (2.0, True, -0.5, 4.0),    # second finite step in a row: grows
    ]
    for grad, applied, value, scale in expected:
        assert bool(step(tf.constant(grad))) is applied
        assert float(var.numpy()) == value
        assert float(opt.loss_scale.numpy()) == scale
    assert int(opt.iterations.numpy()) == 3
    assert int(opt.skipped_steps.numpy()) == 2
    assert int(opt.last_step_skipped.numpy()) == 0


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [
    dict(growth_interval=3, hysteresis=1),
    dict(growth_interval=2, hysteresis=3, growth_factor=4.0,
         backoff_factor=0.25),
    dict(growth_interval=1, hysteresis=2, min_scale=8.0, max_scale=64.0),
])
def test_scale_sequence_matches_closed_form_for_100_steps(knobs):
    settings = dict(initial_scale=32.0, growth_interval=2000, growth_factor=2.0,
                    backoff_factor=0.5, min_scale=1.0, max_scale=2.0**24,
                    hysteresis=1)
    settings.update(knobs)
    pattern = list(np.random.default_rng(7).random(100) > 0.3)
    var = keras.Variable([0.0])
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), **settings)
    step = _stepper(opt, var, use_function=True)
    scales, skipped = [], 0
    for finite in pattern:
        applied = step(tf.constant([1.0 if finite else INF]))
        assert bool(applied) is bool(finite)
        scales.append(float(opt.loss_scale.numpy()))
        skipped += not finite
    assert scales == _reference_scales(pattern, **settings)
    assert int(opt.skipped_steps.numpy()) == skipped
    assert int(opt.iterations.numpy()) == 100 - skipped


def test_hysteresis_tolerates_overflows_but_skips_each():
    var = keras.Variable(0.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=16.0,
                             hysteresis=2)
    step = _stepper(opt, var, use_function=False)
    step(tf.constant(INF))
    assert float(opt.loss_scale.numpy()) == 16.0  # tolerated
    assert int(opt.overflow_streak.numpy()) == 1
    step(tf.constant(16.0))                      # finite step resets streak
    assert int(opt.overflow_streak.numpy()) == 0
    step(tf.constant(INF))
    assert float(opt.loss_scale.numpy()) == 16.0
    step(tf.constant(INF))
    assert float(opt.loss_scale.numpy()) == 8.0  # second in a row: back off
    assert int(opt.skipped_steps.numpy()) == 3
    assert float(var.numpy()) == -1.0            # only the finite step moved it


def test_scale_is_clamped_to_min_and_max():
    var = keras.Variable(0.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0,
                             growth_interval=1, min_scale=2.0, max_scale=8.0)
    step = _stepper(opt, var, use_function=False)
    for _ in range(3):
        step(tf.constant(INF))
    assert float(opt.loss_scale.numpy()) == 2.0
    for _ in range(4):
        step(tf.constant(1.0))
    assert float(opt.loss_scale.numpy()) == 8.0


def test_skipped_step_leaves_weights_slots_and_iterations_untouched():
    var = keras.Variable([1.0, -1.0])
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.1), initial_scale=4.0)
    opt.apply([tf.constant([4.0, 8.0])], [var])
    before = [v.numpy().copy() for v in opt.inner_optimizer.variables]
    weights = var.numpy().copy()
    applied = opt.apply([tf.constant([1.0, NAN])], [var])
    assert not bool(applied)
    np.testing.assert_array_equal(var.numpy(), weights)
    for old, new in zip(before, opt.inner_optimizer.variables):
        np.testing.assert_array_equal(old, new.numpy())
    assert int(opt.iterations.numpy()) == 1
    assert int(opt.last_step_skipped.numpy()) == 1


def test_sparse_gradients_are_unscaled_and_checked():
    table = keras.Variable(np.zeros((3, 1), np.float32))
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    grad = tf.IndexedSlices(tf.constant([[8.0]]), tf.constant([1]),
                            tf.constant([3, 1]))
    assert bool(opt.apply([grad], [table]))
    np.testing.assert_array_equal(table.numpy().ravel(), [0.0, -2.0, 0.0])
    bad = tf.IndexedSlices(tf.constant([[INF]]), tf.constant([2]),
                           tf.constant([3, 1]))
    assert not bool(opt.apply([bad], [table]))
    np.testing.assert_array_equal(table.numpy().ravel(), [0.0, -2.0, 0.0])


def test_scale_loss_and_unscale_gradients():
    opt = LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=2.0**15)
    # Before build the initial scale is used; half precision is widened so
    # 4 * 2**15 does not overflow float16's 65504.
    scaled = opt.scale_loss(tf.constant(4.0, tf.float16))
    assert scaled.dtype == tf.float32
    assert float(scaled) == 4.0 * 2**15
    opt.build([keras.Variable(0.0)])
    grads = opt.unscale_gradients([tf.constant(2.0**16), None])
    assert float(grads[0]) == 2.0 and grads[1] is None


def test_learning_rate_and_iterations_forward_to_inner():
    inner = keras.optimizers.SGD(0.25)
    opt = LossScaleOptimizer(inner)
    assert float(opt.learning_rate.numpy()) == 0.25
    opt.learning_rate = 0.125
    assert float(inner.learning_rate.numpy()) == 0.125
    assert opt.iterations is inner.iterations


_BAD_KNOBS = [
    ("initial_scale", 0.0, ValueError), ("initial_scale", INF, ValueError),
    ("initial_scale", "big", ValueError), ("growth_interval", 0, ValueError),
    ("growth_interval", 2.5, ValueError), ("growth_factor", 0.5, ValueError),
    ("growth_factor", 1.0, ValueError), ("growth_factor", None, ValueError),
    ("backoff_factor", 0.0, ValueError), ("backoff_factor", 1.0, ValueError),
    ("backoff_factor", 2.0, ValueError),
    ("min_scale", -1.0, ValueError), ("max_scale", INF, ValueError),
    ("hysteresis", 0, ValueError), ("hysteresis", True, ValueError),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,value,error", _BAD_KNOBS)
def test_bad_knobs_are_refused_with_the_argument_named(name, value, error):
    with pytest.raises(error, match=name):
        LossScaleOptimizer(keras.optimizers.SGD(), **{name: value})


def test_initial_scale_outside_min_max_is_refused():
    with pytest.raises(ValueError, match="min_scale <= initial_scale"):
        LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=2.0**30)


def test_inner_must_be_a_plain_keras_optimizer():
    with pytest.raises(TypeError, match="inner_optimizer"):
        LossScaleOptimizer("adam")
    with pytest.raises(ValueError, match="scaled twice"):
        LossScaleOptimizer(LossScaleOptimizer(keras.optimizers.SGD()))
    with pytest.raises(ValueError, match="scaled twice"):
        LossScaleOptimizer(keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD()))


def test_wrap_optimizer_follows_the_policy_and_never_double_wraps():
    keras.config.set_dtype_policy("float32")
    sgd = keras.optimizers.SGD()
    passing = wrap_optimizer(sgd)  # pass-through: scale 1, fixed
    assert passing.inner_optimizer is sgd
    assert (passing.dynamic, passing.initial_scale) == (False, 1.0)
    forced = wrap_optimizer(keras.optimizers.SGD(), force=True)
    assert isinstance(forced, LossScaleOptimizer) and forced.dynamic
    keras.config.set_dtype_policy("mixed_float16")
    wrapped = wrap_optimizer("sgd", initial_scale=64.0)
    assert isinstance(wrapped, LossScaleOptimizer)
    assert wrapped.initial_scale == 64.0
    assert wrap_optimizer(wrapped) is wrapped
    assert wrap_optimizer(wrapped, initial_scale=64.0) is wrapped
    with pytest.raises(ValueError, match="inner_optimizer"):
        wrap_optimizer(wrapped, initial_scale=8.0)
    keras_lso = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(), initial_scale=128.0, dynamic_growth_steps=10)
    rewrapped = wrap_optimizer(keras_lso)
    assert type(rewrapped) is LossScaleOptimizer
    assert rewrapped.inner_optimizer is keras_lso.inner_optimizer
    assert (rewrapped.initial_scale, rewrapped.growth_interval) == (128.0, 10)
    with pytest.raises(TypeError, match="optimizer="):
        wrap_optimizer(3)
    keras.config.set_dtype_policy("float32")
    assert isinstance(wrap_optimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD())), LossScaleOptimizer)


def test_compile_under_mixed_float16_does_not_wrap_again():
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = LossScaleOptimizer(keras.optimizers.SGD())
    model.compile(optimizer=opt, loss="mse")
    assert model.optimizer is opt


def test_config_round_trips():
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.125), initial_scale=256.0,
                             growth_interval=7, growth_factor=4.0,
                             backoff_factor=0.25, min_scale=2.0,
                             max_scale=1024.0, hysteresis=3, name="lso")
    config = opt.get_config()
    clone = LossScaleOptimizer.from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(opt))
    assert type(restored) is LossScaleOptimizer
    assert restored.get_config() == config
    assert float(restored.inner_optimizer.learning_rate.numpy()) == 0.125


# ------------------------------------------------------------ checkpoints

_PATTERN = [True, False, True, True, False, False, True, True, True, True]


def _train(opt, var, pattern, start=0):
    step = _stepper(opt, var, use_function=True)
    scales = []
    for i, finite in enumerate(pattern, start):
        grad = tf.constant([float(i + 1), -1.0]) * opt.loss_scale
        step(grad if finite else tf.constant([INF, 1.0]))
        scales.append(float(opt.loss_scale.numpy()))
    return scales


def _fresh():
    var = keras.Variable([1.0, 2.0])
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.1), initial_scale=64.0,
                             growth_interval=2, hysteresis=2)
    opt.build([var])
    return opt, var


def _state(opt, var):
    return [v.numpy().copy() for v in opt.variables] + [var.numpy().copy()]


def _assert_same_state(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)  # bit-exact, NaN-free


@pytest.mark.slow
def test_tf_checkpoint_restores_state_and_continues_identically(tmp_path):
    opt, var = _fresh()
    uninterrupted = _train(opt, var, _PATTERN)
    final = _state(opt, var)

    opt, var = _fresh()
    _train(opt, var, _PATTERN[:5])
    saved = _state(opt, var)
    path = tf.train.Checkpoint(optimizer=opt, var=var.value).save(
        str(tmp_path / "ckpt"))

    opt2, var2 = _fresh()
    tf.train.Checkpoint(optimizer=opt2, var=var2.value).restore(
        path).assert_consumed()
    _assert_same_state(_state(opt2, var2), saved)
    assert int(opt2.overflow_streak.numpy()) == 1  # hysteresis mid-way
    assert _train(opt2, var2, _PATTERN[5:], start=5) == uninterrupted[5:]
    _assert_same_state(_state(opt2, var2), final)


def _model_and_data():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    model.compile(
        optimizer=LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                     initial_scale=8.0, growth_interval=2,
                                     hysteresis=2),
        loss="mse")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3)).astype("float32")
    y = rng.standard_normal((8, 1)).astype("float32")
    return model, x, y


@pytest.mark.slow
def test_keras_file_restores_optimizer_state_exactly(tmp_path):
    model, x, y = _model_and_data()
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False)
    # Put the counters in a non-default state: one tolerated overflow.
    opt = model.optimizer
    opt.apply([tf.fill(v.shape, INF) for v in model.trainable_variables],
              model.trainable_variables)
    before = _state(opt, model.trainable_variables[0])
    path = str(tmp_path / "model.keras")
    saved_scale = float(model.optimizer.dynamic_scale.numpy())
    assert saved_scale < 2.0**15
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is LossScaleOptimizer
    assert loaded.optimizer.get_config() == opt.get_config()
    after = _state(loaded.optimizer, loaded.trainable_variables[0])
    _assert_same_state(after, before)
    assert int(loaded.optimizer.overflow_streak.numpy()) == 1
    assert int(loaded.optimizer.skipped_steps.numpy()) == 1

    # Continued training gives the same scale and weights as the original.
    for m in (model, loaded):
        m.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False)
    _assert_same_state(_state(loaded.optimizer, loaded.trainable_variables[0]),
                       _state(model.optimizer, model.trainable_variables[0]))


def test_cross_replica_apply_is_refused(mirrored):
    with mirrored.scope():
        var = keras.Variable(1.0)
        opt = LossScaleOptimizer(keras.optimizers.SGD(0.1))
        opt.build([var])
        with pytest.raises(ValueError, match="strategy.run"):
            opt.apply([tf.constant(1.0)], [var])


# ---------------------------------------------------- unscale_gradients


@pytest.mark.slow
@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
def test_unscaled_flag_says_whether_apply_divides(use_function):
    var = keras.Variable(1.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    opt.build([var])

    def step(scaled_grad):
        grads = opt.unscale_gradients([scaled_grad])  # 128 / 64 = 2
        return opt.apply_gradients(zip(grads, [var]), unscaled=True)

    step = tf.function(step) if use_function else step
    step(tf.constant(128.0))
    assert float(var.numpy()) == -1.0  # 1 - 2, not 1 - 2 / 64
    opt.apply([tf.constant(128.0)], [var])  # scaled: divided
    assert float(var.numpy()) == -3.0


@pytest.mark.slow
@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
def test_unscale_to_log_then_apply_original_is_the_true_step(use_function):
    # Issue 9, point 2: unscaling only to look leaves no mark on the
    # arithmetic; issue 16, case 2: the apply says which gradients it got.
    var = keras.Variable(0.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=1024.0)
    opt.build([var])

    def step(g):
        norm = tf.linalg.global_norm(opt.unscale_gradients([g]))
        opt.apply([g], [var], unscaled=False)
        return norm

    step = tf.function(step) if use_function else step
    assert float(step(tf.constant(1024.0))) == 1.0
    assert float(var.numpy()) == -1.0  # not -1024


@pytest.mark.slow
@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("which", ["unscaled", "scaled"])
def test_apply_after_unscale_without_saying_raises(use_function, which):
    """Issue 16, case 2: torch's unscale_()-then-step() habit divided twice
    (a step 1/1024 of the true one here); the inspect-only case would be
    1024x too large if apply guessed the other way. Both are loud."""
    var = keras.Variable(0.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=1024.0)
    opt.build([var])

    def step(g):
        unscaled = opt.unscale_gradients([g])
        opt.apply(unscaled if which == "unscaled" else [g], [var])

    step = tf.function(step) if use_function else step
    with pytest.raises(ValueError, match=r"after unscale_gradients\(\) was called, and no "
                       r"`unscaled=`.*Received: unscaled=None\. Pass unscaled=True.*"
                       r"Pass unscaled=False"):
        step(tf.constant(1024.0))
    assert float(var.numpy()) == 0.0  # nothing applied
    assert int(opt.iterations.numpy()) == 0
    # The refusal is not remembered: a plain scaled step works next.
    opt.apply([tf.constant(1024.0)], [var])
    assert float(var.numpy()) == -1.0


def test_apply_gradients_after_tf_keras_unscale_takes_them_as_unscaled():
    # Issue 27: tf-keras's apply_gradients took unscaled gradients, and the
    # TF guide's loop (get_unscaled_gradients, then apply_gradients) runs
    # unchanged. After Keras 3's unscale_gradients, apply() still asks.
    var = keras.Variable(0.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0)
    opt.get_scaled_loss(tf.constant(1.0))
    grads = opt.get_unscaled_gradients([tf.constant(16.0)])
    opt.apply_gradients(zip(grads, [var]))
    assert float(var.numpy()) == -2.0
    opt.get_scaled_loss(tf.constant(1.0))
    grads = opt.unscale_gradients([tf.constant(16.0)])
    with pytest.raises(ValueError, match="unscaled=True"):
        opt.apply_gradients(zip(grads, [var]))


@pytest.mark.slow
@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
def test_clipping_after_unscale_equals_clipping_float32_gradients(use_function):
    x = tf.constant([[3.0, 4.0, 12.0]])  # gradient norm 13

    def make():
        var = keras.Variable([[1.0], [1.0], [1.0]])
        return var

    # Reference: float32, no scaling, clip by global norm 1.
    ref_var = make()
    ref_opt = keras.optimizers.SGD(1.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, ref_var))
    grads = tape.gradient(loss, [ref_var])
    grads, _ = tf.clip_by_global_norm(grads, 1.0)
    ref_opt.apply_gradients(zip(grads, [ref_var]))

    var = make()
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=2.0**10)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, var))
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, [var])
        grads = opt.unscale_gradients(grads)
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        return opt.apply(grads, [var], unscaled=True)

    step = tf.function(step) if use_function else step
    assert bool(step())
    np.testing.assert_array_equal(var.numpy(), ref_var.numpy())
    np.testing.assert_allclose(var.numpy().ravel(), [1 - 3 / 13, 1 - 4 / 13, 1 - 12 / 13],
                               rtol=1e-6)


def test_unscaled_overflow_is_still_skipped():
    var = keras.Variable(1.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0)
    opt.build([var])
    grads = opt.unscale_gradients([tf.constant(INF)])
    grads, _ = tf.clip_by_global_norm(grads, 1.0)  # inf -> NaN
    assert not bool(opt.apply(grads, [var], unscaled=True))
    assert float(var.numpy()) == 1.0
    assert float(opt.loss_scale.numpy()) == 4.0
    assert int(opt.skipped_steps.numpy()) == 1


# ------------------------------------------------- Keras drop-in (issue 9)


def test_keras_argument_names_and_config_are_accepted():
    opt = LossScaleOptimizer(keras.optimizers.SGD(), dynamic_growth_steps=10)
    assert opt.growth_interval == 10 and opt.dynamic_growth_steps == 10
    theirs = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.5), initial_scale=64.0, dynamic_growth_steps=7)
    ours = LossScaleOptimizer.from_config(theirs.get_config())
    assert (ours.initial_scale, ours.growth_interval) == (64.0, 7)
    assert float(ours.inner_optimizer.learning_rate.numpy()) == 0.5
    with pytest.raises(ValueError, match="dynamic_growth_steps"):
        LossScaleOptimizer(keras.optimizers.SGD(), dynamic_growth_steps=3,
                           growth_interval=4)


def test_state_variables_follow_keras_layout():
    var = keras.Variable([1.0])
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    ours = LossScaleOptimizer(keras.optimizers.SGD())
    theirs.build([var])
    ours.build([var])

    def layout(opt):
        return [(v.name, v.dtype) for v in opt.variables]

    n = len(layout(theirs)) - 2  # the inner SGD's iteration, learning_rate
    assert layout(ours)[:n] == layout(theirs)[:n]
    assert [v.name for v in ours.variables][n:n + 4] == [
        "overflow_streak", "skipped_steps", "last_step_skipped",
        "min_scale_skips"]


def _keras_trained(policy_model):
    """A model compiled under mixed_float16 (Keras wraps its optimizer), then
    one overflow so the scale is not the initial one."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2),
                              keras.layers.Dense(1, dtype="float32")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    x = np.ones((4, 2), np.float32)
    y = np.zeros((4, 1), np.float32)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    model.optimizer.apply([tf.fill(v.shape, INF) for v in
                           model.trainable_variables], model.trainable_variables)
    return model, x, y


@pytest.mark.slow
def test_keras_wrapper_checkpoint_restores_into_tf_mixed(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    model, x, y = _keras_trained(None)
    saved_scale = float(model.optimizer.dynamic_scale.numpy())
    assert saved_scale < 2.0**15  # not the initial scale
    weights = [w.copy() for w in model.get_weights()]
    slots = [v.numpy().copy() for v in model.optimizer.inner_optimizer.variables]
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
        str(tmp_path / "ckpt"))

    keras.utils.set_random_seed(9)  # different initial weights
    clone = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2),
                              keras.layers.Dense(1, dtype="float32")])
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.01))
    clone.compile(optimizer=opt, loss="mse")
    opt.build(clone.trainable_variables)
    tf.train.Checkpoint(model=clone, optimizer=opt).restore(path).expect_partial()
    assert opt.loss_scale_state().scale == saved_scale
    for a, b in zip(clone.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
    for v, old in zip(opt.inner_optimizer.variables, slots):
        np.testing.assert_array_equal(v.numpy(), old)
    # Training continues from the saved scale with the saved slots.
    iterations = int(model.optimizer.iterations.numpy())
    assert int(opt.iterations.numpy()) == iterations
    clone.fit(x, y, batch_size=2, epochs=1, verbose=0)
    assert int(opt.iterations.numpy()) == iterations + 2
    assert opt.loss_scale_state().scale == saved_scale


@pytest.mark.slow
def test_keras_wrapper_keras_file_loads_into_tf_mixed(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    model, x, y = _keras_trained(None)
    path = str(tmp_path / "keras_wrapper.keras")
    saved_scale = float(model.optimizer.dynamic_scale.numpy())
    assert saved_scale < 2.0**15
    model.save(path)
    # A model compiled with tf_mixed's optimizer loads the file's weights and
    # Keras's optimizer layout (load_own_variables maps it).
    keras.utils.set_random_seed(9)
    loaded = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2),
                               keras.layers.Dense(1, dtype="float32")])
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.01))
    loaded.compile(optimizer=opt, loss="mse")
    opt.build(loaded.trainable_variables)
    loaded.load_weights(path)
    assert opt.loss_scale_state().scale == saved_scale
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(opt.inner_optimizer.variables,
                    model.optimizer.inner_optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    before = int(opt.iterations.numpy())
    loaded.fit(x, y, batch_size=2, epochs=1, verbose=0)
    assert int(opt.iterations.numpy()) + opt.loss_scale_state().skipped_steps == before + 2
    # Or keep Keras's object and re-wrap it: the scale carries over.
    plain = keras.models.load_model(path)
    rewrapped = wrap_optimizer(plain.optimizer)
    assert type(rewrapped) is LossScaleOptimizer
    assert rewrapped.loss_scale_state().scale == saved_scale


def test_tf_keras_names_and_fixed_scale():
    var = keras.Variable(0.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8.0,
                             dynamic=False)
    assert float(opt.get_scaled_loss(tf.constant(2.0))) == 16.0
    grads = opt.get_unscaled_gradients([tf.constant(16.0)])  # silent now (issue 27)
    assert float(grads[0]) == 2.0
    opt.apply_gradients(zip(grads, [var]), unscaled=True)
    assert float(var.numpy()) == -2.0
    for _ in range(3):
        opt.apply([tf.constant(INF)], [var])
    for _ in range(5000 // 2000 + 2):
        opt.apply([tf.constant(8.0)], [var])
    state = opt.loss_scale_state()
    assert state.scale == 8.0 and state.skipped_steps == 3


def test_pass_through_under_bfloat16_runs_the_same_loop():
    keras.config.set_dtype_policy("mixed_bfloat16")
    var = keras.Variable(1.0)
    opt = wrap_optimizer(keras.optimizers.SGD(1.0))

    def step(g):
        with tf.GradientTape() as tape:
            loss = g * var
            scaled = opt.scale_loss(loss)
        return opt.apply(tape.gradient(scaled, [var]), [var])

    assert bool(step(tf.constant(0.5)))
    assert float(var.numpy()) == 0.5  # scale 1: the plain SGD step
    assert not bool(step(tf.constant(NAN)))
    assert float(var.numpy()) == 0.5
    assert opt.loss_scale_state().scale == 1.0


# ------------------------------------------------------------ bad input


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_wrap_optimizer_validates_knobs_under_every_policy(policy):
    keras.config.set_dtype_policy(policy)
    with pytest.raises(ValueError, match="growth_factor=0.5"):
        wrap_optimizer(keras.optimizers.SGD(), growth_factor=0.5)
    with pytest.raises(ValueError, match="initail_scale"):
        wrap_optimizer(keras.optimizers.SGD(), initail_scale=8.0)


def test_wrap_optimizer_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        wrap_optimizer("no_such_optimizer")
    message = str(info.value)
    assert "optimizer='no_such_optimizer'" in message
    assert "adam" in message and "sgd" in message and "rmsprop" in message


@pytest.mark.slow
@pytest.mark.parametrize("loss,text", [
    (tf.constant(3), "floating-point"), (tf.constant([1.0, 2.0]), "scalar"),
    ("big", "floating-point")])
def test_scale_loss_refuses_non_float_or_non_scalar(loss, text):
    opt = LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(ValueError, match=text) as info:
        opt.scale_loss(loss)
    assert "`loss`" in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("grads,variables,text", [
    (None, 1, "grads=None"), ([tf.constant(1.0)] * 2, 1, "2 gradients for 1"),
    (tf.constant([1.0]), 1, "list")])
def test_apply_refuses_bad_grads_before_building(grads, variables, text):
    var = keras.Variable(1.0)
    opt = LossScaleOptimizer(keras.optimizers.SGD())
    with pytest.raises(ValueError, match=text):
        opt.apply(grads, [var] * variables)
    assert not opt.built and float(var.numpy()) == 1.0


# ------------------------------------------- issue 33.2: built in one pass


@pytest.fixture
def calls(monkeypatch):
    counts = collections.Counter()

    def counting(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counting(tf_keras_check, "check_objects")
    counting(allreduce, "validate_communication_dtype")
    counting(accumulation, "steps_to_take_over")
    counting(compensated, "compensation_of")
    real_post_init = scale_state.LossScaleConfig.__post_init__

    def post_init(self):
        counts["LossScaleConfig"] += 1
        real_post_init(self)

    monkeypatch.setattr(scale_state.LossScaleConfig, "__post_init__", post_init)
    return counts


ONCE = {"check_objects": 1, "validate_communication_dtype": 1, "steps_to_take_over": 1,
        "compensation_of": 1, "LossScaleConfig": 1}


@pytest.mark.slow
@pytest.mark.parametrize("policy, force, knobs", [
    ("mixed_float16", False, {"initial_scale": 8.0, "communication_dtype": "float16"}),
    ("float32", True, {"dynamic_growth_steps": 4, "gradient_accumulation_steps": 2}),
    ("float32", False, {"initial_scale": 8.0, "hysteresis": 2}),
    ("mixed_bfloat16", False, {"communication_dtype": "float16"}),
    ("bfloat16", False, {}),
], ids=["scaling", "forced", "pass-through", "wire", "bfloat16-compensated"])
def test_every_concern_is_checked_once(calls, policy, force, knobs):
    with tf_mixed.policy_scope(policy):
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5), force=force, **knobs)
    assert dict(calls) == ONCE
    if policy in ("float32", "mixed_bfloat16") and not force:
        assert opt.config in (scale_state.LossScaleConfig.pass_through(),
                              scale_state.LossScaleConfig.wire())
    if policy == "bfloat16":
        assert compensated.compensation_of(opt.inner_optimizer).method == "kahan"


def test_the_constructor_checks_once_too(calls):
    optimizer.LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=4.0)
    assert dict(calls) == ONCE


def test_a_keras_wrapper_is_converted_in_one_pass(calls, monkeypatch):
    keras_lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                                    initial_scale=64.0)
    calls.clear()
    opt = tf_mixed.wrap_optimizer(keras_lso)
    assert dict(calls) == ONCE
    assert opt.config.initial_scale == 64.0 and not opt.built
    # A built one: the constructor's one pass, then one build, and the run
    # continues from the Keras wrapper's scale and step counter.
    var = keras.Variable([1.0])
    keras_lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                                    initial_scale=64.0)
    keras_lso.build([var])
    keras_lso.dynamic_scale.assign(16.0)
    keras_lso.step_counter.assign(3)
    real_build = optimizer.LossScaleOptimizer.build

    def build(self, var_list):
        calls["build"] += 1
        real_build(self, var_list)

    monkeypatch.setattr(optimizer.LossScaleOptimizer, "build", build)
    calls.clear()
    opt = tf_mixed.wrap_optimizer(keras_lso)
    assert dict(calls) == {**ONCE, "build": 1}
    assert opt.built and opt.inner_optimizer is keras_lso.inner_optimizer
    state = opt.loss_scale_state()
    assert (state.scale, state.good_steps, opt.config.initial_scale) == (16.0, 3, 64.0)


def test_a_non_optimizer_is_refused_before_any_config(calls):
    with pytest.raises(TypeError, match=r"wrap_optimizer\(\) needs .* optimizer=3 "):
        tf_mixed.wrap_optimizer(3, initial_scale=8.0)
    assert dict(calls) == {"check_objects": 1}


def test_pass_through_knobs_are_still_validated_once(calls):
    with tf_mixed.policy_scope("float32"):
        with pytest.raises(ValueError, match="growth_factor"):
            tf_mixed.wrap_optimizer(keras.optimizers.SGD(), growth_factor=0.5)
    assert calls["LossScaleConfig"] == 1 and calls["check_objects"] == 0


def test_config_and_knobs_are_one_or_the_other():
    config = scale_state.LossScaleConfig(initial_scale=4.0)
    opt = optimizer.LossScaleOptimizer(keras.optimizers.SGD(), config=config)
    assert opt.config is config and opt.get_config()["initial_scale"] == 4.0
    with pytest.raises(ValueError, match="both `config` and knobs"):
        optimizer.LossScaleOptimizer(keras.optimizers.SGD(), config=config, hysteresis=2)
    with pytest.raises(TypeError, match="`config` must be"):
        optimizer.LossScaleOptimizer(keras.optimizers.SGD(), config={"initial_scale": 4.0})


def test_config_and_formats_live_with_the_class():
    """get_config/from_config/from_keras and the .keras hooks are defined on
    the class itself; the older layouts are plain functions in formats.py."""
    from tf_mixed.scaling import formats

    own = vars(optimizer.LossScaleOptimizer)
    for name in ("get_config", "from_config", "from_keras", "save_own_variables",
                 "load_own_variables", "finalize_variable_values"):
        assert name in own, name
    assert callable(formats.load_listed_layout) and callable(formats.load_unsplit_layout)
