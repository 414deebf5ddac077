"""LossScaleMonitor's fit-start check finds half-precision state the dtype cannot hold
or resolve, whoever set the precision (issue 45)."""

import warnings

import keras
import numpy as np
import pytest
from zoo import ADAPTED

import tf_mixed
from tf_mixed.callbacks import MixedPrecisionWarning


@pytest.fixture(autouse=True)
def _float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


def _wide_model(how):
    dtype = None
    if how == "set_dtype_policy":
        keras.config.set_dtype_policy("mixed_float16")
    elif how == "dtype_argument":
        dtype = "mixed_float16"
    else:
        dtype = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
        dtype["norm"] = keras.DTypePolicy("mixed_float16")
    norm = keras.layers.Normalization(mean=[1.0e4, 0.0], variance=[100.0, 1.0], dtype=dtype,
                                      name="norm")
    inputs = keras.Input((2,), name="x")
    outputs = keras.layers.Dense(1, dtype="float32", name="head")(
        keras.layers.Dense(8, name="d1")(norm(inputs)))
    return keras.Model(inputs, outputs, name="wide")


def _fit_warnings(model, x, y) -> list[str]:
    model.compile(optimizer=tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[tf_mixed.LossScaleMonitor()])
    return [str(w.message) for w in record if issubclass(w.category, MixedPrecisionWarning)]


@pytest.mark.parametrize("how", ["set_dtype_policy", "dtype_argument", "policy_map"])
def test_fit_is_told_of_a_normalization_float16_cannot_resolve(how):
    x = np.stack([np.linspace(9980, 10020, 16), np.zeros(16)], 1).astype("float32")
    said = [m for m in _fit_warnings(_wide_model(how), x, np.zeros((16, 1), "float32"))
            if "half_resolution" in m or "[error] norm:" in m]
    assert len(said) == 1, said
    assert said[0].startswith(
        "Model 'wide': [error] norm: Normalization computes in float16 with a mean of 10000 "
        "against a spread (standard deviation) of 10: float16 holds values near 1e+04 only "
        "to the nearest 8, so its output is off by up to 0.40 standard deviations")
    assert "Fix: keep 'norm' in float32: create it with dtype='float32'" in said[0]


def test_fit_is_told_of_a_variance_beyond_float16s_range():
    keras.config.set_dtype_policy("mixed_float16")  # Keras's switch, not tf_mixed's
    spec = ADAPTED["normalization"]
    model = spec.ready()
    said = [m for m in _fit_warnings(model, *spec.data(16)) if "[error] norm:" in m]
    assert len(said) == 1, said
    assert "beyond float16's largest value 65504" in said[0]
