"""probe of a model `convert` fixed: the fix is read from the model, not re-reported."""

import warnings

import keras
import numpy as np

import tf_mixed


def _overflowing_model():
    """'big' overflows float16 (outputs ~4e5); the head is small and linear."""
    inputs = keras.Input((4,), name="x")
    big = keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(1e4),
                             name="big")(inputs)
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(1e-6),
                              name="head")(big)
    return keras.Model(inputs, head, name="overflowing")


def test_probe_of_a_model_convert_left_without_half_layers_reports_nothing_to_fix():
    x = np.full((8, 4), 10.0, "float32")
    y = np.zeros((8, 1), "float32")
    model = _overflowing_model()
    assert tf_mixed.probe(model, x, y, loss="mse", half_gradients=False).first_nonfinite == "big"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_mixed.models.ConversionNote)
        fixed = tf_mixed.convert(model, "mixed_float16", keep_float32=["big"])
    assert [layer.compute_dtype for layer in fixed.layers[1:]] == ["float32", "float32"]
    assert fixed.dtype_policy.name == "mixed_float16"  # what probe reads the fix from
    report = tf_mixed.probe(fixed, x, y, loss="mse", half_gradients=False)
    assert report.policy == "mixed_float16"
    assert report.first_nonfinite is None
    assert all(s.compute_dtype == "float32" for s in report.layers)
