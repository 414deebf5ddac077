"""tf_mixed._internal.facts: the shared tables and the one layer walker."""

import ast
import pathlib

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed._internal import facts as _facts

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


@pytest.mark.slow
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


def _tables():
    """Every table of _facts: upper-case tuples and dicts."""
    _facts.EPSILON  # made on first use  # noqa: B018
    return {name: value for name, value in vars(_facts).items()
            if name.isupper() and isinstance(value, (tuple, dict))}


def _restatements(source: str, tables: dict) -> list[str]:
    """Literals in ``source`` restating a table (or part of a dict table).

    A tuple/list/set of constants equal to a tuple table as a set; a dict of
    constants sharing two or more (key, value) pairs with a dict table, in
    either direction (``{"float16": "mixed_float16"}`` restates the inverse
    of ``COMPUTE_DTYPES``).
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
                isinstance(e, ast.Constant) for e in node.elts):
            values = {e.value for e in node.elts}
            found += [f"{node.lineno}: {name}" for name, table in tables.items()
                      if isinstance(table, tuple) and values == set(table)]
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(e, ast.Constant) for e in node.keys + node.values):
            pairs = {(k.value, v.value) for k, v in zip(node.keys, node.values)}
            for name, table in tables.items():
                if isinstance(table, dict):
                    items = set(table.items())
                    inverse = {(v, k) for k, v in items}
                    if len(pairs & items) >= 2 or len(pairs & inverse) >= 2:
                        found.append(f"{node.lineno}: {name}")
    return found


def test_the_check_sees_restated_tuples_and_dicts():
    tables = _tables()
    planted = {
        'HALVES = ("bfloat16", "float16")': "HALF_DTYPES",
        'NAMES = {"fp16": "mixed_float16", "bf16": "mixed_bfloat16"}': "POLICY_ALIASES",
        'HALF = {"float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}': "COMPUTE_DTYPES",
    }
    for source, table in planted.items():
        assert [f.split(": ")[1] for f in _restatements(source, tables)] == [table], source
    assert _restatements('ONE = {"fp16": "mixed_float16"}', tables) == []


def test_every_table_is_written_once():
    tables = _tables()
    assert set(tables) == {"HALF_DTYPES", "FLOAT32_HEADS", "SAVED_FLOAT32_HEADS",
                           "SQUASHING_ACTIVATIONS",
                           "FLOAT_POLICIES", "POLICY_ALIASES", "COMPUTE_DTYPES", "EPSILON",
                           "TILE_MULTIPLES", "FLOAT32_STATISTICS_NORMS", "POLICY_NAMES",
                           "EXPORT_FORMATS", "EXPORT_PRECISIONS", "POLICY_FIXES",
                           "CATALOG_EVIDENCE"}
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if path.relative_to(PACKAGE_DIR).as_posix() == "_internal/facts.py":
            continue
        offenders += [f"{path.relative_to(PACKAGE_DIR)}:{f}"
                      for f in _restatements(path.read_text(), tables)]
    assert not offenders, offenders


def _library_sources():
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        yield path.relative_to(PACKAGE_DIR).as_posix(), path.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("fact, text, home", [
    ("the input-layer test", "layers.InputLayer", "_internal/facts.py"),
    ("the model-kind message", "needs a keras.Model", "_internal/facts.py"),
    ("the policy aliases", '"fp16":', "_internal/facts.py"),
    ("the number check's message", "must be {valid}", "_internal/validate.py"),
])
def test_each_fact_is_written_in_one_module(fact, text, home):
    holders = [name for name, source in _library_sources() if text in source]
    assert holders == [home], f"{fact} is written in {holders}"


def test_numbers_are_checked_by_the_one_helper():
    """``isinstance(x, bool)`` (the "a number, not a bool" test) lives in _validate."""
    allowed = {
        "distribute/cluster.py",  # a field of the TF_CONFIG JSON, reported as TF_CONFIG
        "tools/auditing.py",  # reads a layer attribute (units) for advice, not an argument
    }
    users = set()
    for name, source in _library_sources():
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
                    and len(node.args) == 2 and getattr(node.args[1], "id", None) == "bool"):
                users.add(name)
    assert users - allowed == {"_internal/validate.py"}, users


# ------------------------------------------------------------- dtype limits


def test_dtype_limits_come_from_ml_dtypes():
    from tf_mixed._internal.facts import EPSILON, dtype_limits

    half = dtype_limits("float16")
    assert (half.max, half.smallest_normal, half.smallest_subnormal) == (
        65504.0, 2.0**-14, 2.0**-24)
    assert half.eps == 2.0**-10 and half.largest_exact_integer == 2048
    bf16 = dtype_limits("bfloat16")
    assert bf16.eps == 2.0**-7 and bf16.largest_exact_integer == 256
    assert bf16.smallest_subnormal == 2.0**-133
    assert dtype_limits("float8_e4m3fn")[:3] == (448.0, 2.0**-6, 2.0**-9)
    assert dtype_limits("float8_e5m2").max == 57344.0
    assert EPSILON == {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
    with pytest.raises(ValueError, match=r"dtype must name a float format.*'int8'"):
        dtype_limits("int8")
    with pytest.raises(ValueError, match="Received: dtype='nope'"):
        dtype_limits("nope")


# Values only a dtype table can explain: each float format's max and its
# smallest normal/subnormal powers of two.
_HAND_WRITTEN_LIMITS = {65504.0, 448.0, 57344.0, 3.3895313892515355e38, 3.4028234663852886e38}
_LIMIT_POWERS = {-14, -24, -126, -133, -149, -9, -16}


def _hand_written_limits(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, float) \
                and node.value in _HAND_WRITTEN_LIMITS:
            lines.append(node.lineno)
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)
                and isinstance(node.left, ast.Constant) and node.left.value == 2
                and isinstance(node.right, ast.UnaryOp)
                and isinstance(node.right.operand, ast.Constant)
                and -node.right.operand.value in _LIMIT_POWERS):
            lines.append(node.lineno)
    return lines


def test_no_module_writes_a_dtype_limit_by_hand():
    assert _hand_written_limits("x = 65504.0\ny = 2.0**-24\n") == [1, 2]  # the check can fail
    offenders = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        found = _hand_written_limits(path.read_text())
        if found:
            offenders[str(path.relative_to(PACKAGE_DIR))] = found
    assert not offenders, offenders


@pytest.mark.parametrize("value, largest", [
    (np.array([1.0, np.inf, -3.0, np.nan]), 3.0),  # finite values only
    (np.array([], "float32"), 0.0),
    (np.array([5, -7]), 7.0),  # integers
    (np.array([-70000.0], "float32"), 70000.0),
])
def test_largest_finite_reduces_on_the_device(value, largest):
    from tf_mixed._internal.facts import _largest_finite

    assert _largest_finite(value) == largest


def test_published_architectures_are_known_by_origin():
    import keras

    from tf_mixed._internal.facts import published_layers, published_origin

    keras.utils.set_random_seed(1)
    app = keras.applications.MobileNetV3Small(weights=None, input_shape=(32, 32, 3), classes=5,
                                              include_preprocessing=False)
    assert published_origin(app) == "keras.applications"
    assert set(published_layers(app).values()) == {"keras.applications"}
    assert len(published_layers(app)) == len(app.layers)

    class HubLayer(keras.layers.Layer):
        def call(self, x):
            return x

    HubLayer.__module__ = "keras_hub.src.layers.modeling.fake"  # as KerasHub's classes read
    inputs = keras.Input((4,))
    x = HubLayer(name="hub")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(x), name="mine")
    assert published_origin(model) == ""
    assert published_layers(model) == {"hub": "KerasHub"}
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="resnet_like")
    assert published_layers(plain) == {}
