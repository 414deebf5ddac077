"""`losses.resolve_named`: a loss resolved on output names the caller already
has (a survey's), None meaning the compiled loss, with the caller named."""

import keras
import numpy as np
import pytest

from tf_mixed._internal import losses


def _two_heads():
    inputs = keras.Input((4,), name="x")
    a = keras.layers.Dense(1, kernel_initializer="ones", name="a")(inputs)
    b = keras.layers.Dense(1, kernel_initializer="zeros", name="b")(inputs)
    return keras.Model(inputs, [a, b], name="heads")


def test_the_given_names_key_a_loss_dict_exactly():
    model = _two_heads()
    x = np.ones((2, 4), "float32")  # a = 4, b = 0
    y = {"a": np.zeros((2, 1), "float32"), "b": np.ones((2, 1), "float32")}
    fn = losses.resolve_named({"a": "mse", "b": "mae"}, ("a", "b"), model, "tf_mixed.plan()")
    assert float(fn(y, model(x))) == 16.0 + 1.0
    only_b = losses.resolve_named({"b": "mae"}, ("a", "b"), model, "tf_mixed.plan()")
    assert float(only_b([y["a"], y["b"]], model(x))) == 1.0


def test_the_names_are_the_ones_given_not_read_from_the_model():
    model = _two_heads()
    with pytest.raises(ValueError, match=r"^tf_mixed.plan\(\): the loss dict names outputs "
                                         r"model 'heads' does not have: \['a'\]"):
        losses.resolve_named({"a": "mse"}, ("p", "q"), model, "tf_mixed.plan()")


def test_none_is_the_compiled_loss():
    model = _two_heads()
    model.compile(optimizer="sgd", loss=["mse", "mse"])
    x = np.ones((2, 4), "float32")
    y = [np.zeros((2, 1), "float32"), np.ones((2, 1), "float32")]
    fn = losses.resolve_named(None, ("a", "b"), model, "probe()")
    assert float(fn(y, model(x))) == 16.0 + 1.0


@pytest.mark.parametrize("caller", ["probe()", "tf_mixed.plan()"])
def test_none_for_an_uncompiled_model_is_refused_naming_the_caller(caller):
    with pytest.raises(ValueError, match=rf"^{caller.replace('(', '[(]').replace(')', '[)]')} "
                                         "needs a loss to differentiate.*Received: loss=None"):
        losses.resolve_named(None, ("a", "b"), _two_heads(), caller)


def test_resolve_reads_the_names_from_the_model_as_before():
    model = _two_heads()
    x = np.ones((2, 4), "float32")
    y = [np.zeros((2, 1), "float32"), np.ones((2, 1), "float32")]
    assert float(losses.resolve(["mse", "mae"], model)(y, model(x))) == 17.0
    with pytest.raises(ValueError, match="1 losses for the 2 output"):
        losses.resolve(["mse"], model)
