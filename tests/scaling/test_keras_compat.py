"""tf-keras's LossScaleOptimizer expectations, translated to Keras 3, against tf_mixed.

The cases follow keras-team/tf-keras ``tf_keras/mixed_precision/
loss_scale_optimizer_test.py`` (its names in each docstring), with Keras 3
variables and optimizers; differences that remain are in docs/fit.md. Also:
the TensorFlow guide's loop, issue 27's custom-loop mistakes, and the
``.keras`` file size (issue 28).
"""

from __future__ import annotations

import gc
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from repo_paths import DATA

import tf_mixed
from tf_mixed import MixedPrecisionWarning
from tf_mixed.scaling.optimizer import LossScaleOptimizer


def _lso(inner=None, **kwargs):
    return LossScaleOptimizer(inner or keras.optimizers.SGD(2.0), **kwargs)


def _minimize(opt, var, loss_fn):
    """tf-keras's ``opt.minimize(loss, [var])`` through the tf-keras names."""
    with tf.GradientTape() as tape:
        scaled = opt.get_scaled_loss(loss_fn())
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
    opt.apply_gradients(zip(grads, [var]))


# ------------------------------------------------------------- attributes


@pytest.mark.slow
@pytest.mark.parametrize("when", ["constructed", "from_config", "deserialized"])
def test_attributes_read_right_before_the_first_step(when):
    """testDynamicLossScaleDefaultValues, testGetConfigFixed/Dynamic, testSerialization*."""
    fixed = _lso(keras.optimizers.SGD(2.0, momentum=0.5), dynamic=False, initial_scale=2.0)
    dynamic = _lso(keras.optimizers.SGD(2.0, momentum=0.5), initial_scale=2.0,
                   dynamic_growth_steps=3)
    if when == "from_config":
        fixed = LossScaleOptimizer.from_config(fixed.get_config())
        dynamic = LossScaleOptimizer.from_config(dynamic.get_config())
    elif when == "deserialized":
        fixed = keras.optimizers.deserialize(keras.optimizers.serialize(fixed))
        dynamic = keras.optimizers.deserialize(keras.optimizers.serialize(dynamic))
    assert float(fixed.loss_scale) == 2.0 and isinstance(fixed.loss_scale, tf.Tensor)
    assert fixed.initial_scale == 2.0 and isinstance(fixed.initial_scale, float)
    assert fixed.dynamic is False
    assert fixed.dynamic_growth_steps is None and fixed.dynamic_counter is None
    assert float(dynamic.loss_scale) == 2.0
    assert dynamic.dynamic_growth_steps == 3 and dynamic.dynamic is True
    assert float(dynamic.inner_optimizer.momentum) == 0.5
    default = _lso()
    assert default.initial_scale == 2**15 and default.dynamic_growth_steps == 2000
    assert float(default.loss_scale) == 2**15


def test_get_scaled_loss_and_unscaled_gradients():
    """testGetScaledLoss, testGetUnscaledGradients, testGetUnscaledSparseGradients."""
    opt = _lso(dynamic=False, initial_scale=2.0)
    assert float(opt.get_scaled_loss(tf.constant(5.0))) == 10.0
    assert float(opt.get_scaled_loss(lambda: tf.constant(5.0))()) == 10.0
    assert float(opt.get_scaled_loss(tf.constant(5.0, "float16"))) == 10.0
    grads = opt.get_unscaled_gradients(
        [tf.constant(3.0), None, tf.constant(-4.0, "float16")])
    assert [None if g is None else float(g) for g in grads] == [1.5, None, -2.0]
    sparse = tf.IndexedSlices(tf.constant([[4.0, 2.0], [8.0, 5.0]]),
                              tf.constant([1, 3]), tf.constant([5, 2]))
    out = opt.get_unscaled_gradients([sparse])[0]
    assert isinstance(out, tf.IndexedSlices)
    assert out.values.numpy().tolist() == [[2.0, 1.0], [4.0, 2.5]]


@pytest.mark.slow
@pytest.mark.parametrize("use_tf_function", [False, True])
def test_dynamic_update_and_fixed_scale(use_tf_function):
    """testDynamicUpdate, testFixedLossScaleAppliedToLossWithMinimize, testIterationsIncremented."""
    var = keras.Variable([1.0, 2.0])
    opt = _lso(keras.optimizers.SGD(1.0), initial_scale=2.0, dynamic_growth_steps=1)
    run = (lambda f: tf.function(f)) if use_tf_function else (lambda f: f)
    run(lambda: _minimize(opt, var, lambda: tf.reduce_sum(var * 2.0)))()
    assert var.numpy().tolist() == [-1.0, 0.0] and float(opt.loss_scale) == 4.0
    assert int(opt.iterations) == 1
    run(lambda: _minimize(opt, var, lambda: tf.reduce_sum(var * float("nan"))))()
    assert var.numpy().tolist() == [-1.0, 0.0] and float(opt.loss_scale) == 2.0
    fixed_var = keras.Variable([5.0])
    fixed = _lso(keras.optimizers.SGD(2.0), dynamic=False, initial_scale=10.0)
    run(lambda: _minimize(fixed, fixed_var, lambda: tf.reduce_sum(fixed_var)))()
    assert fixed_var.numpy().tolist() == [3.0] and float(fixed.loss_scale) == 10.0


def test_slots_and_float16_loss():
    """testDynamicLossScaleWithSlots, testDynamicLossScaleWithFloat16Loss."""
    var = keras.Variable([1.0, 2.0])
    opt = _lso(keras.optimizers.SGD(1.0, momentum=1.0), initial_scale=2.0,
               dynamic_growth_steps=1)
    _minimize(opt, var, lambda: tf.reduce_sum(var))
    assert var.numpy().tolist() == [0.0, 1.0] and float(opt.loss_scale) == 4.0
    _minimize(opt, var, lambda: tf.reduce_sum(var))
    assert var.numpy().tolist() == [-2.0, -1.0] and float(opt.loss_scale) == 8.0
    half_var = keras.Variable([5.0])
    half = _lso(keras.optimizers.SGD(2.0), initial_scale=2.0, dynamic_growth_steps=1)
    _minimize(half, half_var, lambda: tf.cast(tf.reduce_sum(half_var), "float16"))
    assert half_var.numpy().tolist() == [3.0]


@pytest.mark.slow
@pytest.mark.parametrize("save_with_ls, restore_with_ls",
                         [(False, True), (True, False), (True, True)])
def test_checkpoint_moves_between_plain_and_wrapper(tmp_path, save_with_ls, restore_with_ls):
    """testCheckpoint: a tf.train.Checkpoint of either restores into either."""
    def make():
        opt = keras.optimizers.SGD(1.0, momentum=1.0)
        return _lso(opt, initial_scale=1.0, dynamic_growth_steps=2) if restore_with_ls else opt

    var = keras.Variable([2.0])
    opt = keras.optimizers.SGD(1.0, momentum=1.0)
    if save_with_ls:
        opt = _lso(opt, initial_scale=1.0, dynamic_growth_steps=2)
        _minimize(opt, var, lambda: tf.reduce_sum(var) + 1.0)
    else:
        opt.apply([tf.constant([1.0])], [var])
    assert var.numpy().tolist() == [1.0]
    path = tf.train.Checkpoint(optimizer=opt, var=var.value).save(str(tmp_path / "ckpt"))
    var2 = keras.Variable([2.0])
    opt2 = make()
    tf.train.Checkpoint(optimizer=opt2, var=var2.value).restore(path)
    opt2.build([var2])
    assert var2.numpy().tolist() == [1.0] and int(opt2.iterations) == 1
    inner = getattr(opt2, "inner_optimizer", opt2)
    assert inner.variables[-1].numpy().tolist() == [-1.0]  # the momentum slot
    if restore_with_ls:
        assert float(opt2.loss_scale) == 1.0
        assert int(opt2.dynamic_counter) == (1 if save_with_ls else 0)
    # The next step continues: momentum -2, the variable -1 (tf-keras's numbers).
    if restore_with_ls:
        _minimize(opt2, var2, lambda: tf.reduce_sum(var2) + 1.0)
    else:
        opt2.apply([tf.constant([1.0])], [var2])
    assert var2.numpy().tolist() == [-1.0] and int(opt2.iterations) == 2


OLDER_WRAPPER_CHECKPOINT = os.path.join(
    str(DATA), "older_wrapper_checkpoint", "ckpt")
"""Written by tf_mixed before issue 27 (the layout of main before this branch): the wrapper's
own unused ``iterations`` (0) and ``learning_rate`` (0.0) at the top level, the
real ones under ``inner_optimizer/``. Made with::

    var = keras.Variable([2.0])
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.5, momentum=0.5),
                                      initial_scale=4.0, dynamic_growth_steps=1)
    for _ in range(2):
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_sum(var) * 2.0)
        opt.apply(tape.gradient(scaled, [var]), [var])
    tf.train.Checkpoint(optimizer=opt, var=var.value).write(path)
"""


def _two_steps_of(opt, var):
    for _ in range(2):
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_sum(var) * 2.0)
        opt.apply(tape.gradient(scaled, [var]), [var])


@pytest.mark.slow
@pytest.mark.parametrize("built_first", [False, True])
@pytest.mark.parametrize("writer", ["keras_wrapper", "older_tf_mixed"])
def test_a_checkpoint_in_the_older_wrapper_layout_restores_the_real_values(
        tmp_path, writer, built_first):
    """Keras's wrapper (and tf_mixed's before) keep unused counters at the top level."""
    if writer == "keras_wrapper":
        var = keras.Variable([2.0])
        old = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.5, momentum=0.5), initial_scale=4.0,
            dynamic_growth_steps=1)
        _two_steps_of(old, var)
        path = tf.train.Checkpoint(optimizer=old, var=var.value).write(
            str(tmp_path / "ckpt"))
        names = dict(tf.train.list_variables(path))
        assert "optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE" in names
    else:
        path = OLDER_WRAPPER_CHECKPOINT
    # The unused top-level copies really are 0 in both files.
    top = "optimizer/{}/.ATTRIBUTES/VARIABLE_VALUE"
    assert int(tf.train.load_variable(path, top.format("_iterations"))) == 0
    assert float(tf.train.load_variable(path, top.format("_learning_rate"))) == 0.0
    var2 = keras.Variable([0.0])
    opt = _lso(keras.optimizers.SGD(0.125, momentum=0.5), initial_scale=4.0,
               dynamic_growth_steps=1)
    if built_first:
        opt.build([var2])
    tf.train.Checkpoint(optimizer=opt, var=var2.value).restore(path)
    if not built_first:
        opt.build([var2])  # the deferred slots and scale state restore here
    assert var2.numpy().tolist() == [-0.5]
    assert int(opt.iterations) == 2
    assert float(opt.learning_rate) == 0.5
    assert opt.inner_optimizer.variables[-1].numpy().tolist() == [-1.5]  # momentum
    assert float(opt.loss_scale) == 16.0
    # The next step continues: momentum 0.5 * -1.5 - 0.5 * 2 = -1.75, var -2.25.
    with tf.GradientTape() as tape:
        scaled = opt.scale_loss(tf.reduce_sum(var2) * 2.0)
    opt.apply(tape.gradient(scaled, [var2]), [var2])
    assert var2.numpy().tolist() == [-2.25] and int(opt.iterations) == 3


@pytest.mark.slow
def test_an_unbuilt_optimizer_under_a_strategy_in_a_function_says_build(mirrored):
    """testDynamicLossScale under MirroredStrategy with use_tf_function=True."""
    with mirrored.scope():
        var = keras.Variable([5.0])
        opt = _lso(keras.optimizers.SGD(2.0), initial_scale=2.0, dynamic_growth_steps=1)

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(tf.reduce_sum(var) / 2.0)
            opt.apply(tape.gradient(scaled, [var]), [var])
        mirrored.run(replica)

    with pytest.raises(ValueError,
                       match=r"must be built.*optimizer\.build\(model\.trainable_variables\)"):
        step()
    with mirrored.scope():
        opt.build([var])
    step()
    assert var.numpy().tolist() == [3.0] and float(opt.loss_scale.numpy()) == 4.0


def test_scaling_warning_when_the_loss_was_never_scaled():
    """testScalingWarning / testScalingNoWarning (a MixedPrecisionWarning here)."""
    var = keras.Variable(1.0)
    opt = _lso()
    with pytest.warns(MixedPrecisionWarning, match="never went through scale_loss"):
        opt.apply_gradients([(tf.constant(1.0), var)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixedPrecisionWarning)
        opt.apply_gradients([(tf.constant(1.0), var)])  # said once
        quiet = _lso()
        quiet.get_scaled_loss(tf.constant(1.0))
        quiet.get_unscaled_gradients([tf.constant(1.0)])
        quiet.apply_gradients([(tf.constant(1.0), var)])
        passing = tf_mixed.wrap_optimizer(keras.optimizers.SGD(1.0))  # scale 1
        passing.apply([tf.constant(1.0)], [var])


# -------------------------------------------------------- the guide's loop


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 8, 4)).astype("float32")
    y = rng.normal(size=(6, 8, 1)).astype("float32")
    x[2, 0, 0] = 1e30  # overflows: a skipped step
    return x, y


def _model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                             keras.layers.Dense(1)])


@pytest.mark.slow
def test_the_guide_loop_matches_apply_scaled_gradients():
    """The TF guide's loop, unchanged, gives the README loop's weights, skips included."""
    x, y = _data()
    loss_fn = keras.losses.MeanSquaredError()
    guide_model, readme_model = _model(), _model()
    guide = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**10)
    readme = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**10)

    @tf.function
    def guide_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, guide_model(xb, training=True))
            scaled_loss = guide.get_scaled_loss(loss)
        scaled_gradients = tape.gradient(scaled_loss, guide_model.trainable_variables)
        gradients = guide.get_unscaled_gradients(scaled_gradients)
        guide.apply_gradients(zip(gradients, guide_model.trainable_variables))

    @tf.function
    def readme_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, readme_model(xb, training=True))
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, readme_model.trainable_variables, readme)

    applied = []
    for xb, yb in zip(x, y):
        guide_step(xb, yb)
        applied.append(bool(readme_step(xb, yb)))
    assert applied == [True, True, False, True, True, True]
    for a, b in zip(guide_model.get_weights(), readme_model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert guide.loss_scale_state() == readme.loss_scale_state()


# ------------------------------------------------ forward state (item 1)


def _nan_data():
    x, y = _data()
    x[2, 0, 0] = float("nan")  # BatchNormalization normalises 1e30 away
    return x, y


def _bn_model():
    keras.utils.set_random_seed(2)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                             keras.layers.BatchNormalization(), keras.layers.Dense(1)])


def _readme_loop(*, track: bool, graph: bool = True):
    """The README's loop over `_bn_model`: (x, y with a NaN batch, model, train_step)."""
    x, y = _nan_data()
    model = _bn_model()
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**10)
    if track:
        opt.track_forward_state(model)
    loss_fn = keras.losses.MeanSquaredError()

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, model.trainable_variables, opt)

    return x, y, model, tf.function(train_step) if graph else train_step


@pytest.mark.slow
def test_the_readme_loop_refuses_the_first_skip_with_untracked_forward_state():
    x, y, _, train_step = _readme_loop(track=False)
    assert bool(train_step(x[0], y[0]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"moving_mean.*opt\.track_forward_state\(model\)"):
        train_step(x[2], y[2])


@pytest.mark.slow
def test_tracked_forward_state_is_rolled_back_and_nothing_is_said():
    x, y, model, train_step = _readme_loop(track=True)
    train_step(x[0], y[0])
    before = [w.copy() for w in model.get_weights()]
    assert not bool(train_step(x[2], y[2]))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_eager_skip_without_tracked_state_warns_once():
    x, y, _, train_step = _readme_loop(track=False, graph=False)
    with pytest.warns(MixedPrecisionWarning, match=r"track_forward_state\(model\)"):
        train_step(x[2], y[2])


# ------------------------------------------------------- mistakes (item 4)


def test_a_wrapper_made_every_batch_is_said_once():
    inner = keras.optimizers.SGD(0.1)
    var = keras.Variable(1.0)
    kept = []
    with pytest.warns(MixedPrecisionWarning, match="scale never adapts") as record:
        for _ in range(3):
            opt = tf_mixed.LossScaleOptimizer(inner, initial_scale=4.0)
            kept.append(opt)
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(var * 2.0)
            opt.apply(tape.gradient(scaled, [var]), [var])
    assert sum("scale never adapts" in str(w.message) for w in record) == 2  # once each


def test_float16_variables_with_the_pass_through_are_said():
    var = keras.Variable(np.ones(2), dtype="float16")
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.1))  # float32 policy
    with pytest.warns(MixedPrecisionWarning, match=r"float16 variables.*force=True"):
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_sum(tf.cast(var, "float32")))
        opt.apply(tape.gradient(scaled, [var]), [var])


# ---------------------------------------------------- .keras size (issue 28)


def _saved_size(tmp_path, optimizer, name):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                              keras.layers.Dense(128), keras.layers.Dense(1)])
    model.compile(optimizer, "mse")
    x = np.ones((32, 64), "float32")
    model.fit(x, np.ones((32, 1), "float32"), epochs=1, verbose=0)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    return model, path, os.path.getsize(path)


@pytest.mark.slow
def test_a_keras_file_with_the_wrapper_is_no_larger_than_the_plain_optimizers(tmp_path):
    _, _, plain = _saved_size(tmp_path, keras.optimizers.Adam(), "plain")
    model, path, wrapped = _saved_size(
        tmp_path, tf_mixed.wrap_optimizer(keras.optimizers.Adam(), force=True), "wrapped")
    assert wrapped <= 1.05 * plain, (wrapped, plain)
    loaded = keras.models.load_model(path)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["keras_wrapper", "older_tf_mixed"])
def test_older_optimizer_layouts_still_load(writer):
    """Stores holding the inner state in the wrapper's entry (Keras's, tf_mixed's before)."""
    var = keras.Variable([1.0, 2.0])
    if writer == "keras_wrapper":
        old = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=8.0)
    else:
        old = _lso(keras.optimizers.Adam(), initial_scale=8.0)
    old.apply([tf.constant([8.0, 16.0]), ], [var])
    store = {}
    keras.optimizers.Optimizer.save_own_variables(old, store)  # the old layout
    new = _lso(keras.optimizers.Adam(), initial_scale=8.0)
    new.build([var])
    new.load_own_variables(store)
    assert int(new.iterations) == 1
    for a, b in zip(old.inner_optimizer.variables, new.inner_optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(new.step_counter.numpy()) == 1 and float(new.dynamic_scale.numpy()) == 8.0


# ------------------------------------- wrap_optimizer forgotten (item 4)


def _fp16_model():
    keras.utils.set_random_seed(4)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                             keras.layers.Dense(1), tf_mixed.Float32Output()])


@pytest.mark.slow
def test_a_forgotten_wrap_optimizer_is_said_by_audit_and_the_monitor():
    """compile adds Keras's own wrapper under mixed_float16; no public compile hook."""
    tf_mixed.enable("mixed_float16", quiet=True)
    x, y = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
    model = _fp16_model()
    model.compile(keras.optimizers.SGD(0.01), "mse")
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    codes = [f.code for f in tf_mixed.audit(model).findings]
    assert codes.count("keras_loss_scale_optimizer") == 1
    monitor = tf_mixed.LossScaleMonitor()
    assert monitor.loss_scaling is None
    with pytest.warns(MixedPrecisionWarning,
                      match=r"Keras's own.*wrap_optimizer\(optimizer\)") as record:
        model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[monitor])
    assert sum("Keras's own" in str(w.message) for w in record) == 1  # said once
    assert monitor.loss_scaling == "keras"

    wrapped = _fp16_model()
    wrapped.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)), "mse")
    assert "keras_loss_scale_optimizer" not in [f.code for f in tf_mixed.audit(wrapped).findings]
    monitor = tf_mixed.LossScaleMonitor()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixedPrecisionWarning)
        wrapped.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[monitor])
    assert monitor.loss_scaling == "tf_mixed"


def test_the_monitor_reports_no_wrapper():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    monitor = tf_mixed.LossScaleMonitor()
    model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0, callbacks=[monitor])
    assert monitor.loss_scaling == "none"


@pytest.mark.slow
def test_a_model_built_before_enable_is_said_once_at_its_first_step():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.Dense(1)])  # float32: before enable
    tf_mixed.enable("mixed_float16", quiet=True)
    model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)), "mse")
    x, y = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")
    with pytest.warns(MixedPrecisionWarning, match=r"built before tf_mixed\.enable\(\)") as record:
        model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    assert sum("built before" in str(w.message) for w in record) == 1
    after = _fp16_model()  # built after enable: nothing said
    after.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)), "mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixedPrecisionWarning)
        after.fit(x, y, batch_size=4, epochs=1, verbose=0)


# ------------------------------------- issue 34.5: the last differences


def test_get_scaled_loss_scales_any_tensor_as_tf_keras():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0)
    per_example = tf.constant([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(opt.get_scaled_loss(per_example).numpy(), [8.0, 16.0, 24.0])
    matrix = tf.ones((2, 2), "float16")
    scaled = opt.get_scaled_loss(matrix)
    assert scaled.dtype == tf.float32 and scaled.shape == (2, 2)
    np.testing.assert_array_equal(scaled.numpy(), np.full((2, 2), 8.0))
    np.testing.assert_array_equal(opt.get_scaled_loss(lambda: per_example)().numpy(),
                                  [8.0, 16.0, 24.0])
    assert float(opt.get_scaled_loss(tf.constant(0.5)).numpy()) == 4.0
    with pytest.raises(ValueError, match="scalar"):
        opt.scale_loss(per_example)  # Keras 3's name keeps asking for a scalar


def test_get_scaled_loss_of_a_per_example_loss_trains_as_the_mean_would():
    var = keras.Variable([1.0, 1.0])
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    with tf.GradientTape() as tape:
        per_example = var * tf.constant([1.0, 3.0])
        scaled = opt.get_scaled_loss(per_example)
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
    opt.apply_gradients(zip(grads, [var]))
    np.testing.assert_array_equal(var.numpy(), [0.0, -2.0])


def test_loss_scale_reads_as_tf_keras_tensor():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0)
    before = opt.loss_scale
    assert tf.is_tensor(before) and before.dtype == tf.float32 and float(before) == 8.0
    opt.build([keras.Variable(1.0)])
    tensor = tf.convert_to_tensor(opt.loss_scale)
    assert tensor.dtype == tf.float32 and tensor.shape == () and float(tensor) == 8.0
    assert float(opt.loss_scale * 2.0) == 16.0 and float(opt.loss_scale.numpy()) == 8.0


@pytest.mark.slow
@pytest.mark.parametrize("inner", [
    lambda: tf_mixed.LossScaleOptimizer(keras.optimizers.SGD()),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
], ids=["tf_mixed", "keras"])
def test_wrapping_a_wrapper_is_a_type_error_as_tf_keras(inner):
    with pytest.raises(TypeError, match="cannot wrap another loss-scale optimizer"):
        tf_mixed.LossScaleOptimizer(inner())


def test_an_unbuilt_wrapper_in_a_tf_function_under_mirrored_is_refused_naming_build(mirrored):
    with mirrored.scope():
        var = keras.Variable(1.0)
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=2.0)

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(var * 2.0)
            return opt.apply(tape.gradient(scaled, [var]), [var])

        return mirrored.run(replica_fn)

    with pytest.raises(ValueError, match=r"must be built before.*optimizer.build"):
        step()


@pytest.mark.slow
def test_a_wrapper_made_every_batch_and_dropped_is_said_once():
    inner = keras.optimizers.SGD(0.1)
    var = keras.Variable(1.0)
    with pytest.warns(MixedPrecisionWarning) as record:
        for _ in range(4):
            opt = tf_mixed.LossScaleOptimizer(inner, initial_scale=4.0)
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(var * 2.0)
            opt.apply(tape.gradient(scaled, [var]), [var])
            del opt, tape, scaled
            gc.collect()
    said = [str(w.message) for w in record if "never adapts" in str(w.message)]
    assert len(said) == 1
    assert "earlier wrapper (now dropped)" in said[0] and "Create the wrapper once" in said[0]
