"""tf_mixed.models.conversion (tf_mixed.convert): float32-built models made mixed."""

import warnings

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.models.conversion import ConversionNote


def _cnn():
    inputs = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    outputs = keras.layers.Dense(4, activation="softmax", name="probs")(x)
    return keras.Model(inputs, outputs, name="cnn")


def _images(n=16):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), np.arange(n) % 4


def _convert_quietly(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionNote)
        return tf_mixed.convert(model, *args, **kwargs)


def _policies(model):
    return {layer.name: layer.dtype_policy.name for layer in model.layers}


@pytest.mark.slow
def test_functional_cnn_converts_agrees_and_trains():
    model = _cnn()
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = _images()
    model.fit(x, y, batch_size=8, verbose=0)  # trained BN statistics too
    weights = [w.copy() for w in model.get_weights()]
    expected = model.predict(x, verbose=0)

    tf_mixed.enable("mixed_float16", quiet=True)  # after building: the mistake
    with pytest.warns(ConversionNote, match="state .* is not carried"):
        mixed = tf_mixed.convert(model)

    policies = _policies(mixed)
    assert policies["conv2d"] == "mixed_float16"
    assert policies["probs_logits"] == "mixed_float16"
    assert policies["probs"] == "float32"
    assert type(mixed.get_layer("probs")).__name__ == "OutputActivation"
    assert mixed.output_names == ["probs"]
    assert mixed.dtype_policy.name == "mixed_float16"
    assert keras.backend.standardize_dtype(mixed.outputs[0].dtype) == "float32"
    got = mixed.predict(x, verbose=0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=2e-3)

    # The original is untouched.
    assert set(_policies(model).values()) == {"float32"}
    assert model.compiled and model.dtype_policy.name == "float32"
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)
    np.testing.assert_array_equal(model.predict(x, verbose=0), expected)

    # The converted model is compiled with a loss-scaling optimizer and trains.
    assert isinstance(mixed.optimizer, tf_mixed.LossScaleOptimizer)
    assert mixed.optimizer.inner_optimizer.learning_rate.numpy() == \
        pytest.approx(0.1)
    history = mixed.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert "accuracy" in history.history
    moved = mixed.get_layer("probs_logits").get_weights()[0]
    assert not np.array_equal(moved, model.get_layer("probs").get_weights()[0])


def test_sequential_sigmoid_to_bfloat16():
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(3, activation="sigmoid", name="out"),
    ], name="seq")
    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    mixed = _convert_quietly(model, "bf16")
    assert isinstance(mixed, keras.Sequential)
    assert [layer.name for layer in mixed.layers] == ["hidden", "out_logits", "out"]
    assert _policies(mixed)["hidden"] == "mixed_bfloat16"
    np.testing.assert_allclose(mixed.predict(x, verbose=0),
                               model.predict(x, verbose=0), atol=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["softmax", "sigmoid", "log_softmax"])
def test_audits_squashing_output_is_what_convert_splits(activation):
    # audit reports a half-precision squashing output and advises convert;
    # convert must then give that output a float32 head, for every
    # activation audit reports (log_softmax included).
    def build():
        inputs = keras.Input((5,))
        h = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
        outputs = keras.layers.Dense(4, activation=activation, name="out")(h)
        return keras.Model(inputs, outputs, name="m")

    model = build()
    with tf_mixed.policy_scope("mixed_float16"):
        built_mixed = build()
    finding, = tf_mixed.audit(built_mixed).by_code("half_output_activation")
    assert "tf_mixed.convert(model)" in finding.fix
    mixed = _convert_quietly(model, "mixed_float16")
    assert [layer.name for layer in mixed.layers] == [
        mixed.layers[0].name, "hidden", "out_logits", "out"]
    head = mixed.get_layer("out")
    assert isinstance(head, tf_mixed.OutputActivation)
    assert head.activation.__name__ == activation
    assert tf_mixed.audit(mixed).by_code("half_output_activation") == []
    x = np.random.default_rng(1).normal(size=(4, 5)).astype("float32")
    got = mixed.predict(x, verbose=0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, model.predict(x, verbose=0), atol=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("build", ["functional", "sequential"])
def test_the_users_model_is_never_written_to(build, monkeypatch):
    model = _cnn() if build == "functional" else keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="mse")
    writes = []
    original = type(model).__setattr__

    def spy(self, name, value):
        if self is model:
            writes.append(name)
        original(self, name, value)

    monkeypatch.setattr(type(model), "__setattr__", spy)
    mixed = _convert_quietly(model, "mixed_float16")
    assert writes == []
    assert model.compiled and mixed.compiled
    assert model.dtype_policy.name == "float32"


def test_regression_and_activation_outputs_stay_float32():
    inputs = keras.Input((4,))
    h = keras.layers.Dense(8, name="hidden")(inputs)
    value = keras.layers.Dense(1, name="value")(h)
    probs = keras.layers.Activation("softmax", name="probs")(
        keras.layers.Dense(3, name="logits")(h))
    model = keras.Model(inputs, {"value": value, "probs": probs})
    mixed = _convert_quietly(model, "mixed_float16")
    policies = _policies(mixed)
    assert policies["value"] == "float32"
    assert policies["probs"] == "float32"
    assert policies["logits"] == "mixed_float16"
    out = mixed.predict(np.ones((2, 4), "float32"), verbose=0)
    assert set(out) == {"value", "probs"}
    assert out["value"].dtype == np.float32 and out["probs"].dtype == np.float32


def test_keep_float32_layers():
    model = _cnn()
    mixed = _convert_quietly(model, "mixed_float16", keep_float32=["conv2d"])
    assert _policies(mixed)["conv2d"] == "float32"
    assert _policies(mixed)["dense"] == "mixed_float16"


def test_named_dict_inputs_still_work():
    a, b = keras.Input((2,), name="a"), keras.Input((3,), name="b")
    x = keras.layers.Concatenate()([a, b])
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(2)(x))
    mixed = _convert_quietly(model, "mixed_bfloat16")
    feed = {"a": np.ones((1, 2), "float32"), "b": np.ones((1, 3), "float32")}
    np.testing.assert_allclose(mixed.predict(feed, verbose=0),
                               model.predict(feed, verbose=0), atol=2e-2)


def test_nested_model_converted_with_weights():
    inner_in = keras.Input((4,))
    inner = keras.Model(inner_in, keras.layers.Dense(8, name="inner_dense")(
        inner_in), name="inner")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(inner(inputs)))
    mixed = _convert_quietly(model, "mixed_float16")
    inner_clone = mixed.get_layer("inner")
    assert inner_clone.get_layer("inner_dense").dtype_policy.name == "mixed_float16"
    np.testing.assert_array_equal(
        inner_clone.get_layer("inner_dense").get_weights()[0],
        inner.get_layer("inner_dense").get_weights()[0])


def test_uncompiled_model_has_no_notes():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionNote)
        mixed = tf_mixed.convert(_cnn(), "mixed_float16")
    assert mixed.conversion_notes == ()
    assert not mixed.compiled


def test_compiled_state_that_cannot_be_carried_is_noted():
    def my_loss(y_true, y_pred):  # not registered: cannot be deserialised
        return keras.ops.mean(keras.ops.square(y_true - y_pred))

    model = _cnn()
    model.compile(optimizer="sgd", loss=my_loss)
    with pytest.warns(ConversionNote, match="could not carry the compiled state"):
        mixed = tf_mixed.convert(model, "mixed_float16")
    assert not mixed.compiled
    assert model.compiled  # the original keeps its compiled state
    assert "compile()" in mixed.conversion_notes[0]


def test_default_policy_is_the_global_one():
    model = _cnn()
    tf_mixed.enable("mixed_bfloat16", quiet=True)
    mixed = _convert_quietly(model)
    assert _policies(mixed)["conv2d"] == "mixed_bfloat16"


# ---------------------------------------------------------------- bad input


def test_subclassed_model_raises_with_the_fix():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    net = Net()
    net(np.zeros((1, 3), "float32"))
    with pytest.raises(TypeError, match=r"subclassed.*tf_mixed.enable\(\) before"):
        tf_mixed.convert(net, "mixed_float16")


@pytest.mark.slow
@pytest.mark.parametrize("thing", [None, "model.keras", keras.layers.Dense(2)])
def test_not_a_model(thing):
    with pytest.raises(TypeError, match="Received: model="):
        tf_mixed.convert(thing, "mixed_float16")


def test_unbuilt_sequential():
    with pytest.raises(ValueError, match="not built"):
        tf_mixed.convert(keras.Sequential([keras.layers.Dense(2)]),
                         "mixed_float16")


def test_policy_none_under_float32_global():
    with pytest.raises(ValueError, match="policy=None.*tf_mixed.enable"):
        tf_mixed.convert(_cnn())


def test_unknown_policy():
    with pytest.raises(ValueError, match="fp17"):
        tf_mixed.convert(_cnn(), "fp17")


def test_unknown_keep_float32_layer():
    with pytest.raises(ValueError, match="keep_float32.*'nope'"):
        tf_mixed.convert(_cnn(), "mixed_float16", keep_float32=["nope"])
