"""tf_mixed._facts: the shared tables and the one layer walker."""

import ast
import pathlib

import keras
import pytest

import tf_mixed
from tf_mixed import _facts

PACKAGE_DIR = pathlib.Path(tf_mixed.__file__).resolve().parent


def _nested():
    inner_in = keras.Input((4,), name="inner_in")
    inner = keras.Model(
        inner_in, keras.layers.Dense(4, name="inner_dense")(inner_in), name="inner")
    inputs = keras.Input((4,), name="x")
    h = inner(inputs)
    rnn_in = keras.layers.Reshape((2, 2), name="reshape")(h)
    out = keras.layers.Bidirectional(keras.layers.LSTM(2), name="bi")(rnn_in)
    return keras.Model(inputs, out, name="outer")


def test_walk_layers_is_pre_order_qualified_and_enters_models_only():
    names = [name for name, _ in _facts.walk_layers(_nested())]
    assert names == ["x", "inner", "inner/inner_in", "inner/inner_dense",
                     "reshape", "bi"]  # Bidirectional: one layer, not entered


def test_walk_layers_yields_a_shared_layer_at_each_place():
    shared = keras.layers.Dense(4, name="shared")
    a_in = keras.Input((4,))
    a = keras.Model(a_in, shared(a_in), name="a")
    inputs = keras.Input((4,))
    outer = keras.Model(inputs, a(shared(inputs)), name="outer")
    walked = [(name, layer) for name, layer in _facts.walk_layers(outer)
              if layer is shared]
    assert [name for name, _ in walked] == ["shared", "a/shared"]


@pytest.mark.parametrize("layer, expected", [
    (keras.layers.Softmax(), "softmax"),
    (keras.layers.Dense(2, activation="log_softmax"), "log_softmax"),
    (keras.layers.Activation("sigmoid"), "sigmoid"),
    (keras.layers.Dense(2), "linear"),
    (keras.layers.Reshape((2,)), None),
])
def test_activation_name(layer, expected):
    assert _facts.activation_name(layer) == expected


def test_model_outputs():
    assert len(_facts.model_outputs(_nested())) == 1

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    assert _facts.model_outputs(Subclassed()) == []


def test_every_table_is_written_once():
    # A module restating a table (as a tuple/list/set literal) instead of
    # importing it from _facts fails here.
    tables = {
        name: set(value) for name, value in vars(_facts).items()
        if name.isupper() and isinstance(value, tuple)
    }
    assert set(tables) == {"HALF_DTYPES", "FLOAT32_HEADS", "SQUASHING_ACTIVATIONS",
                           "FLOAT_POLICIES"}
    for path in PACKAGE_DIR.rglob("*.py"):
        if path.name == "_facts.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and all(
                    isinstance(e, ast.Constant) for e in node.elts):
                values = {e.value for e in node.elts}
                for name, table in tables.items():
                    assert values != table, (
                        f"{path.name}:{node.lineno} restates _facts.{name}")
