"""A custom loop that forgot the loss-scale wrapper is told, once (issue 45)."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from repo_paths import ROOT
from zoo import HUB, ZOO

import tf_mixed
from tf_mixed._internal import losses
from tf_mixed.callbacks import MixedPrecisionWarning
from tf_mixed.scaling import unscaled_loop

_X = np.linspace(-1, 1, 32, dtype="float32").reshape(8, 4)
_Y = np.arange(8, dtype="float32").reshape(8, 1) / 8


@pytest.fixture(autouse=True)
def _float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


def _model(dtype=None):
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, dtype=dtype, name="d1"),
                             keras.layers.Dense(1, dtype="float32", name="head")],
                            name="loop")


def _said(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, MixedPrecisionWarning)
            and "does not scale the loss" in str(w.message)]


def _traced_steps(model, opt, n=3):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = tf.reduce_mean(tf.cast(loss, "float32"))
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, model.trainable_variables, opt)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        applied = [bool(step(_X, _Y)) for _ in range(n)]
    return applied, _said(record)


@pytest.mark.parametrize("how", ["global_policy", "dtype_argument", "policy_map"])
def test_a_plain_optimizer_on_a_float16_model_is_told_once_in_a_traced_loop(how):
    if how == "global_policy":
        keras.config.set_dtype_policy("mixed_float16")
        model = _model()
    elif how == "dtype_argument":
        model = _model("mixed_float16")
    else:
        policies = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
        policies["loop/d1"] = keras.DTypePolicy("mixed_float16")
        model = _model(policies)
    opt = keras.optimizers.SGD(0.01)
    applied, said = _traced_steps(model, opt)
    assert applied == [True] * 3
    assert len(said) == 1, said
    message = said[0]
    assert message.startswith("tf_mixed.training.apply_scaled_gradients(): the model "
                              "computes in float16 (the traced step computes ")
    assert "the optimizer SGD" in message
    assert "Fix: opt = tf_mixed.LossScaleOptimizer(opt)" in message
    assert "(applied is True every step)" in message


def test_eagerly_the_global_policy_says_float16():
    keras.config.set_dtype_policy("mixed_float16")
    model = _model()
    opt = keras.optimizers.SGD(0.01)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.cast(
                    keras.losses.mean_squared_error(_Y, model(_X)), "float32"))
            tf_mixed.training.apply_scaled_gradients(
                tape, loss, model.trainable_variables, opt)
    said = _said(record)
    assert len(said) == 1 and "(the global dtype policy is 'mixed_float16')" in said[0], said


def _eager_steps(model, opt, x=_X, y=_Y, loss="mse", n=2):
    loss_fn = keras.losses.get(loss)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(n):
            with tf.GradientTape() as tape:
                value = tf.reduce_mean(tf.cast(loss_fn(y, model(x, training=True)), "float32"))
            tf_mixed.training.apply_scaled_gradients(
                tape, value, model.trainable_variables, opt)
    return _said(record)


def test_eagerly_a_dtype_argument_under_a_float32_global_policy_is_told():
    model = _model("mixed_float16")  # the global policy stays float32
    said = _eager_steps(model, keras.optimizers.SGD(0.01))
    assert said == [said[0]] and said[0].startswith(
        "tf_mixed.training.apply_scaled_gradients(): the model computes in float16 "
        "(1 layer(s) owning its variables compute in float16, e.g. 'd1')"), said


def test_eagerly_the_pass_through_wrapper_on_a_dtype_argument_model_is_told():
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))  # passes through here
    said = _eager_steps(_model("mixed_float16"), opt)
    assert len(said) == 1 and "tf_mixed's pass-through LossScaleOptimizer" in said[0], said


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_eagerly_a_model_without_float16_is_not_told(dtype):
    assert _eager_steps(_model(dtype), keras.optimizers.SGD(0.01)) == []


def _float16_zoo_model(name):
    """Zoo model ``name`` built in mixed_float16, the global policy float32 again."""
    keras.config.set_dtype_policy("mixed_float16")  # as a dtype= argument would
    model = ZOO[name].ready()
    keras.config.set_dtype_policy("float32")
    return model


@pytest.mark.parametrize("name", ZOO)
def test_eagerly_every_zoo_model_built_in_float16_is_told_under_a_float32_policy(name):
    model = _float16_zoo_model(name)
    x, y = ZOO[name].data(4)
    loss_fn = losses.resolve(ZOO[name].loss, model)
    said = _eager_steps(model, keras.optimizers.SGD(0.01), x, y, loss_fn)
    assert len(said) == 1 and "owning its variables compute in float16" in said[0], said


@pytest.mark.slow  # 5.4-6.5 s of CPU: it traces a loop step
def test_the_pass_through_wrapper_on_a_float16_model_is_told_with_its_own_fix():
    model = _model("mixed_float16")  # the global policy stays float32
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))  # passes through here
    assert not unscaled_loop.scales_loss(opt)
    _, said = _traced_steps(model, opt)
    assert len(said) == 1
    assert "tf_mixed's pass-through LossScaleOptimizer" in said[0]
    assert "Fix: opt = tf_mixed.LossScaleOptimizer(opt.inner_optimizer)" in said[0]


@pytest.mark.parametrize("make", [
    lambda: tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01)),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)),
    lambda: keras.optimizers.SGD(0.01, loss_scale_factor=128.0),
], ids=["tf_mixed", "keras_wrapper", "static_factor"])
def test_an_optimizer_that_scales_is_not_told(make):
    opt = make()
    assert unscaled_loop.scales_loss(opt)
    assert _traced_steps(_model("mixed_float16"), opt, n=1)[1] == []


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_a_model_without_float16_is_not_told(dtype):
    assert _traced_steps(_model(dtype), keras.optimizers.SGD(0.01), n=1)[1] == []


def test_make_train_step_reads_the_model_and_tells_once_at_construction():
    model = _model("mixed_float16")
    opt = keras.optimizers.SGD(0.01)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        step = tf_mixed.training.make_train_step(model, "mse", opt)
        built = _said(record)
        for _ in range(2):
            step(_X, _Y)
    said = _said(record)
    assert len(built) == 1 and said == built
    assert said[0].startswith("tf_mixed.training.make_train_step(): the model computes in "
                              "float16 (1 layer(s) compute in float16, e.g. 'd1')")


def test_make_train_step_under_a_strategy_tells_once():
    strategy = tf_mixed.training.shared_mirrored_strategy(["CPU:0", "CPU:1"])
    with strategy.scope():
        model = _model("mixed_float16")
        opt = keras.optimizers.SGD(0.01)
        opt.build(model.trainable_variables)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        step = tf_mixed.training.make_train_step(model, "mse", opt, strategy=strategy)
        data = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((_X, _Y)).batch(8))
        out = step(*next(iter(data)))
    assert bool(out["applied"])
    assert len(_said(record)) == 1


def test_the_docs_list_of_loop_mistakes_names_it():
    text = (ROOT / "docs" / "custom-loops.md").read_text()
    mistakes = text[text.index("**Mistakes said once**"):]
    mistakes = " ".join(mistakes[:mistakes.index("\n\n")].split())
    assert ("`apply_scaled_gradients` or `make_train_step` with an optimizer that does "
            "not scale the loss") in mistakes


def _fit_said(model, optimizer, x=_X, y=_Y, loss="mse", callbacks=()):
    model.compile(optimizer=optimizer, loss=loss)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=list(callbacks))
    return [str(w.message) for w in record if issubclass(w.category, MixedPrecisionWarning)
            and "float16" in str(w.message)]


def test_fit_with_the_pass_through_on_a_dtype_argument_model_is_told_once():
    # Keras's compile sees a LossScaleOptimizer already: it does not wrap it.
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))  # passes through here
    said = _fit_said(_model("mixed_float16"), opt)
    assert len(said) == 1, said
    assert said[0].startswith("LossScaleOptimizer.apply() (the step of model.fit or of a "
                              "loop): the model computes in float16 (the traced step "
                              "computes "), said
    assert "tf_mixed's pass-through LossScaleOptimizer" in said[0]
    assert "tf_mixed.wrap_optimizer(inner, force=True)" in said[0]


def test_fit_with_the_monitor_is_told_once_in_all():
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))
    said = _fit_said(_model("mixed_float16"), opt, callbacks=[tf_mixed.LossScaleMonitor()])
    assert len(said) == 1 and said[0].startswith("Model 'loop' computes in float16"), said


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_fit_with_the_pass_through_and_no_float16_is_not_told(dtype):
    assert _fit_said(_model(dtype), tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))) == []


def test_a_loops_own_apply_with_the_pass_through_is_told_once():
    model = _model("mixed_float16")
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x, training=True)))
            scaled = opt.scale_loss(tf.cast(loss, "float32"))
        opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            step(_X, _Y)
    said = _said(record)
    assert len(said) == 1 and said[0].startswith("LossScaleOptimizer.apply()"), said


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_fit_of_every_zoo_model_built_in_float16_with_the_pass_through_is_told(name):
    x, y = ZOO[name].data(8)
    said = _fit_said(_float16_zoo_model(name), tf_mixed.wrap_optimizer(
        keras.optimizers.SGD(0.01)), x, y, ZOO[name].loss)
    assert len(said) == 1 and "tf_mixed's pass-through" in said[0], said


@pytest.mark.slow
def test_fit_of_a_kerashub_task_model_given_float16_with_the_pass_through_is_told():
    # Plain Keras would have wrapped it in its own LossScaleOptimizer (the
    # model's policy is mixed_float16); tf_mixed's pass-through stops that.
    spec = HUB["gemma_causal_lm"]
    model = spec.build("mixed_float16")
    x, y = spec.data(4)
    said = _fit_said(model, tf_mixed.wrap_optimizer(keras.optimizers.Adam(1e-3)), x, y,
                     keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert len(said) == 1 and "tf_mixed's pass-through" in said[0], said
