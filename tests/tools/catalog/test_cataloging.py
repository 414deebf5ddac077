"""tf_mixed.catalog: one layer in seconds; the known half-precision defects, flagged or cleared."""

import math

import keras
import pytest

import tf_mixed
from tf_mixed.tools.catalog import cataloging, registry

GRID = (1e-5, 1e-4, 1e-3, 1e-2, 1.0, 1e2, 1e4)


@pytest.fixture(scope="module")
def unit_norm():
    return tf_mixed.catalog(["UnitNormalization"], magnitudes=GRID)


def test_keras_23546_unit_normalization_under_float16_is_flagged(unit_norm):
    # keras#23546: gradient -inf at inputs of 1e-3, output inf at 1e-4 (Keras 3.15.1).
    (f16,) = unit_norm.find("UnitNormalization", "mixed_float16")
    at = dict(zip(GRID, range(len(GRID))))
    assert f16.status[at[1e-3]] == "overflow" and f16.gradient[at[1e-3]] == math.inf
    assert f16.forward[at[1e-4]] == math.inf
    assert f16.safe.low == 1e-2 and f16.safe.below == "overflow"
    (bf16,) = unit_norm.find("UnitNormalization", "mixed_bfloat16")
    assert bf16.safe.low == 1e-5 and bf16.safe.below == ""  # safe to the grid's end


def test_keras_22586_group_normalization_with_a_tiny_epsilon_is_fixed_above_flagged_below():
    found = tf_mixed.catalog(["GroupNormalization"], magnitudes=GRID, policies="mixed_float16")
    (row,) = found.find("GroupNormalization", config="epsilon=1e-12")
    assert row.safe.contains(1e-2) and row.safe.contains(1e4)  # large inputs: fixed
    # Small inputs: the input gradient (~1/magnitude) overflows float16 (Keras 3.15.1).
    assert row.safe.low == 1e-3 and row.safe.below == "overflow"


def test_the_table_names_the_range_and_the_picture_is_a_png(unit_norm, tmp_path):
    text = str(unit_norm)
    assert "UnitNormalization[default]  0.01 .. 1 (o|u)" in text or "UnitNormalization" in text
    assert unit_norm.plot(str(tmp_path / "c.png"))[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_a_user_class_is_measured_by_name_and_by_case():
    class Twice(keras.layers.Layer):
        def call(self, x):
            return x * 2.0

    by_class = tf_mixed.catalog([Twice], magnitudes=(1.0, 2.0), policies="mixed_bfloat16")
    assert [row.source for row in by_class.rows] == ["user"]
    assert by_class.rows[0].safe.text() == "<=1 .. >=2"
    case = registry.user_case("keras.layers.Dense", inputs=[(4,)], config={"units": 2})
    by_case = tf_mixed.catalog(case, magnitudes=(1.0, 2.0), policies="mixed_bfloat16")
    assert by_case.rows[0].key == "Dense[default]" and by_case.rows[0].source == "user"


def test_progress_lines_name_each_configuration():
    lines = []
    tf_mixed.catalog(["Softmax"], magnitudes=(1.0, 2.0), policies="mixed_bfloat16",
                     progress=lines.append)
    assert lines == ["1/2 Softmax[default]", "2/2 Softmax[mask]"]


@pytest.mark.parametrize("kwargs, error, text", [
    ({"policies": ["float32"]}, ValueError, "policies must be one or more of"),
    ({"magnitudes": [1.0]}, ValueError, "at least two positive finite numbers"),
    ({"magnitudes": [2.0, 1.0]}, ValueError, "increasing order"),
    ({"magnitudes": "ab"}, TypeError, "sequence of positive numbers"),
    ({"tolerance": 0}, ValueError, "tolerance"),
    ({"tolerance": "8"}, TypeError, "tolerance"),
])
def test_bad_arguments_are_named(kwargs, error, text):
    with pytest.raises(error, match=text):
        tf_mixed.catalog(["Identity"], **kwargs)


def test_cases_for_defaults_to_every_keras_class():
    names = {c.layer for c in cataloging.cases_for(None, hub=False)}
    assert {"Dense", "UnitNormalization", "MultiHeadAttention"} <= names
    assert all(c.source == "keras" for c in cataloging.cases_for(None, hub=False))


def test_python_and_numpy_random_states_are_restored():
    import random

    import numpy as np

    random.seed(3)
    np.random.seed(3)
    expected = (random.random(), np.random.rand())
    random.seed(3)
    np.random.seed(3)
    tf_mixed.catalog(["Identity"], magnitudes=(1.0, 2.0), policies="mixed_bfloat16")
    assert (random.random(), np.random.rand()) == expected
