"""Statistics a half-precision layer cannot resolve, whoever set its precision (issue 45)."""

import keras
import numpy as np
import pytest
from zoo import ADAPTED, HUB, ZOO

import tf_mixed
from tf_mixed.tools import half_resolution

WIDE_MEAN, WIDE_STD = 1.0e4, 10.0  # float16's spacing at 1e4 is 8


@pytest.fixture(autouse=True)
def _float32_policy():
    yield
    tf_mixed.disable()
    keras.config.set_dtype_policy("float32")


def _norm(dtype=None, invert=False, **kwargs):
    layer = keras.layers.Normalization(mean=[WIDE_MEAN, 0.0], variance=[WIDE_STD**2, 1.0],
                                       invert=invert, dtype=dtype, name="norm", **kwargs)
    layer.build((None, 2))
    return layer


def _model(how):
    """A model whose Normalization computes in float16, the precision set ``how``."""
    dtype = None
    if how == "set_dtype_policy":
        keras.config.set_dtype_policy("mixed_float16")
    elif how == "dtype_argument":
        dtype = "mixed_float16"
    elif how == "policy_map":
        dtype = keras.dtype_policies.DTypePolicyMap(default_policy="float32")
        dtype["norm"] = keras.DTypePolicy("mixed_float16")
    elif how == "enable_with_explicit_dtype":
        tf_mixed.enable("mixed_float16", quiet=True)
        dtype = "mixed_float16"  # an explicit dtype: enable keeps nothing in float32
    inputs = keras.Input((2,), name="x")
    hidden = keras.layers.Dense(8, name="d1")(_norm(dtype)(inputs))
    outputs = keras.layers.Dense(1, dtype="float32", name="head")(hidden)
    return keras.Model(inputs, outputs, name="wide")


HOWS = ["set_dtype_policy", "dtype_argument", "policy_map", "enable_with_explicit_dtype"]


@pytest.mark.parametrize("how", HOWS)
def test_audit_names_the_layer_the_measured_error_and_the_fix(how):
    model = _model(how)
    assert keras.backend.standardize_dtype(model.get_layer("norm").compute_dtype) == "float16"
    (finding,) = tf_mixed.audit(model).by_code("half_resolution")
    assert (finding.severity, finding.layer) == ("error", "norm")
    assert finding.message == (
        "Normalization computes in float16 with a mean of 10000 against a spread (standard "
        "deviation) of 10: float16 holds values near 1e+04 only to the nearest 8, so its "
        "output is off by up to 0.40 standard deviations (measured on its own statistics "
        "against float32).")
    assert finding.fix.startswith("keep 'norm' in float32: create it with dtype='float32'")


def test_the_error_is_measured_through_the_layer():
    # Probes at the mean +- 2 standard deviations, 1 apart; float16 rounds them
    # to multiples of 8: at most 4 off, 0.4 of the spread, plus the output's rounding.
    found = half_resolution.measure(_norm("mixed_float16"))
    assert (found.unit, found.what, found.value, found.spread, found.feature) == (
        "std", "mean", WIDE_MEAN, WIDE_STD, 0)
    assert found.spacing == 8.0
    assert found.error == pytest.approx(0.4, abs=1e-3)
    assert half_resolution.measure(_norm("mixed_float16", invert=True)).error == \
        pytest.approx(0.4, abs=1e-6)
    # bfloat16's spacing at 1e4 is 64: the mean itself moves 1.6 spreads.
    bf16 = half_resolution.measure(_norm("mixed_bfloat16"))
    assert bf16.spacing == 64.0 and bf16.error > 3


def test_an_adapted_normalization_is_measured_on_its_adapted_statistics():
    rng = np.random.default_rng(0)
    data = np.stack([WIDE_MEAN + WIDE_STD * rng.standard_normal(512),
                     rng.standard_normal(512)], axis=1).astype("float32")
    layer = keras.layers.Normalization(dtype="mixed_float16")
    layer.adapt(data)
    found = half_resolution.measure(layer)
    assert found.value == pytest.approx(float(data[:, 0].astype("float64").mean()), rel=1e-6)
    assert found.spread == pytest.approx(float(data[:, 0].astype("float64").std()), rel=1e-4)
    assert 0.3 < found.error < 0.5


def test_statistics_the_dtype_resolves_are_not_reported():
    layer = keras.layers.Normalization(mean=[0.0, 5.0], variance=[1.0, 4.0],
                                       dtype="mixed_float16")
    layer.build((None, 2))
    assert half_resolution.measure(layer).error < half_resolution.WARN_AT
    assert half_resolution.findings([("n", layer)]) == []


def test_a_float32_layer_or_one_out_of_range_is_not_measured():
    assert half_resolution.measure(_norm("float32")) is None
    beyond = keras.layers.Normalization(mean=[0.0], variance=[1.0e6], dtype="mixed_float16")
    beyond.build((None, 1))
    assert half_resolution.measure(beyond) is None  # half_range says it, as given
    from tf_mixed._internal.facts import out_of_range

    assert out_of_range(beyond) == ("variance", 1.0e6, 65504.0)


def test_discretization_is_measured_and_keras_bucketizes_in_float32():
    layer = keras.layers.Discretization(bin_boundaries=[1.0e4, 1.0e4 + 3, 1.0e4 + 6],
                                        dtype="mixed_float16")
    layer.build((None, 1))
    found = half_resolution.measure(layer)
    assert (found.unit, found.error) == ("bins", 0.0)  # Keras 3.15: no cast, no error
    assert half_resolution.findings([("bins", layer)]) == []


class _Statistics(keras.layers.Layer):
    """A custom statistics layer: ``(x - mean) / sqrt(variance)``."""

    def build(self, input_shape):
        self.mean = self.add_weight(shape=(1,), initializer=keras.initializers.Constant(1e4),
                                    trainable=False, name="mean")
        self.variance = self.add_weight(shape=(1,), trainable=False, name="variance",
                                        initializer=keras.initializers.Constant(100.0))

    def call(self, x):
        return (x - keras.ops.cast(self.mean, x.dtype)) / keras.ops.sqrt(
            keras.ops.cast(self.variance, x.dtype))


def test_another_statistics_layer_is_measured_by_its_mean_and_variance():
    layer = _Statistics(dtype="mixed_float16", name="stats")
    layer.build((None, 1))
    (finding,) = half_resolution.findings([("stats", layer)])
    assert finding[:3] == ("error", "half_resolution", "stats")
    assert "a mean of 10000 against a spread (standard deviation) of 10" in finding[3]
    assert "off by up to 0.40 standard deviations" in finding[3]


@pytest.mark.parametrize("name", ZOO)
def test_the_zoo_under_keras_mixed_float16_raises_no_false_alarm(name):
    keras.config.set_dtype_policy("mixed_float16")
    model = ZOO[name].ready()
    assert tf_mixed.audit(model).by_code("half_resolution") == []


@pytest.mark.parametrize("name", ADAPTED)
def test_the_adapted_zoo_under_keras_mixed_float16(name):
    keras.config.set_dtype_policy("mixed_float16")
    report = tf_mixed.audit(ADAPTED[name].ready())
    # The wide Normalization's variance is beyond float16's range: half_range, once.
    assert [f.layer for f in report.by_code("half_range")] == (
        ["norm"] if name == "normalization" else [])
    assert report.by_code("half_resolution") == []


@pytest.mark.slow
@pytest.mark.parametrize("name", HUB)
def test_kerashub_models_given_dtype_raise_no_false_alarm(name):
    model = HUB[name].build(*(["mixed_float16"] if name.startswith("gemma") else []))
    if not name.startswith("gemma"):
        keras.config.set_dtype_policy("mixed_float16")
        model = HUB[name].build()
    report = tf_mixed.audit(model)
    assert report.by_code("half_resolution") == [] and report.by_code("half_range") == []
