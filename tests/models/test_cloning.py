"""tf_mixed.models.cloning: the one way a model is re-created in another dtype."""

import keras
import numpy as np
import pytest
from zoo import REAL, ZOO

from tf_mixed.models import cloning


def _to(policy):
    return lambda layer: policy


def _np(value):
    return [np.asarray(keras.ops.convert_to_numpy(v)) for v in keras.tree.flatten(value)]


@pytest.mark.slow
@pytest.mark.parametrize("inline", [False, True], ids=["nested", "inlined"])
@pytest.mark.parametrize("name", ["keras_ops", "transformer", "vit"])
def test_a_float32_clone_computes_exactly_what_the_model_computes(name, inline):
    spec = REAL[name]
    model = spec.ready()
    x, _ = spec.data(4)
    copy = cloning.clone(model, _to("float32"), inline_nested=inline)
    for want, got in zip(_np(model(x, training=False)), _np(copy.model(x, training=False))):
        np.testing.assert_array_equal(got, want)
    # Keras ops on tensors are re-created, never shared with the original.
    assert not {id(op) for op in model.operations} & {id(op) for op in copy.model.operations}


def test_keras_ops_clone_in_bfloat16_calls_a_shared_layer_twice():
    model = REAL["keras_ops"].ready()
    copy = cloning.clone(model, _to("mixed_bfloat16"))
    assert [name for name, _, _ in copy.layers] == ["d1", "shared", "head"]
    shared = copy.model.get_layer("shared")
    assert shared.dtype_policy.name == "mixed_bfloat16"
    # One layer called twice, as in the original: no second copy of its weights.
    assert [layer.name for layer in copy.model.layers].count("shared") == 1
    assert len(copy.model.weights) == len(model.weights)
    np.testing.assert_array_equal(shared.get_weights()[0],
                                  model.get_layer("shared").get_weights()[0])


def test_nested_models_stay_nested_or_are_inlined_with_qualified_names():
    model = ZOO["nested"].ready()
    nested = cloning.clone(model, _to("mixed_bfloat16"))
    assert isinstance(nested.model.get_layer("encoder"), keras.Model)
    assert [n for n, _, _ in nested.layers] == ["encoder/enc_d1", "encoder/enc_d2", "head"]
    flat = cloning.clone(model, _to("mixed_bfloat16"), inline_nested=True)
    assert not any(isinstance(layer, keras.Model) for layer in flat.model.layers)
    assert [n for n, _, _ in flat.layers] == ["encoder/enc_d1", "encoder/enc_d2", "head"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sequential_no_input", "lambda_lambda", "multi_input",
                                  "multi_output", "batchnorm"])
def test_zoo_kinds_clone_with_their_weights(name):
    spec = ZOO[name]
    model = spec.ready()
    x, _ = spec.data(4)
    copy = cloning.clone(model, _to("float32"))
    assert type(copy.model) is type(model) or not isinstance(model, keras.Sequential)
    for want, got in zip(_np(model(x, training=False)), _np(copy.model(x, training=False))):
        np.testing.assert_array_equal(got, want)


def test_weights_are_cast_to_the_clones_variable_dtype():
    model = ZOO["functional"].ready()
    copy = cloning.clone(model, _to("bfloat16"))
    kernel = copy.model.get_layer("d1").kernel
    assert kernel.dtype == "bfloat16"
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(keras.ops.cast(kernel, "float32")),
        keras.ops.convert_to_numpy(keras.ops.cast(
            keras.ops.cast(model.get_layer("d1").kernel, "bfloat16"), "float32")))


class NoKwargs(keras.layers.Layer):
    """A custom layer written as keras-io writes them: no **kwargs."""

    def __init__(self, units):
        super().__init__()
        self.inner = keras.layers.Dense(units, kernel_initializer="ones")

    def call(self, x):
        return self.inner(x) * 2.0


class Unrebuildable(keras.layers.Layer):
    """No **kwargs, and a constructor argument Keras cannot record."""

    def __init__(self, scales):
        super().__init__()
        self.scales = scales

    def call(self, x):
        return x * self.scales[0]


def _with(layer):
    inputs = keras.Input((3,), name="x")
    return keras.Model(inputs, layer(inputs), name="custom")


def test_a_layer_without_kwargs_is_cloned_from_the_object_in_memory():
    model = _with(NoKwargs(2))
    copy = cloning.clone(model, _to("mixed_bfloat16"))
    layer = copy.model.layers[1]
    assert type(layer) is NoKwargs and layer.name == model.layers[1].name
    assert layer.dtype_policy.name == "mixed_bfloat16"
    assert layer.inner.dtype_policy.name == "mixed_bfloat16"  # built under its policy
    x = np.ones((1, 3), "float32")
    np.testing.assert_array_equal(_np(copy.model(x))[0], [[6.0, 6.0]])


def test_a_layer_that_cannot_be_rebuilt_is_refused_in_one_sentence():
    model = _with(Unrebuildable([np.float32(2.0)]))
    with pytest.raises(TypeError) as caught:
        cloning.clone(model, _to("mixed_bfloat16"))
    message = str(caught.value)
    assert "class Unrebuildable" in message and "**kwargs" in message
    assert message.endswith(".") and ". " not in message, message


def test_a_clone_can_be_cloned_again():
    """A re-created custom layer keeps Keras's auto-config (convert, then probe)."""

    class Plain(keras.layers.Layer):  # no __init__: Keras records its config itself
        def call(self, x):
            return x * 2.0

    inputs = keras.Input((4,))
    model = keras.Model(inputs, Plain(name="plain")(keras.layers.Dense(4, name="d")(inputs)))
    first = cloning.recreate(model.get_layer("plain"), "float32")
    assert first.get_config()["name"] == "plain"
    second = cloning.recreate(first, "mixed_float16")
    assert (second.dtype_policy.name, second.get_config()["name"]) == ("mixed_float16", "plain")
