"""Every model-taking API of tf_mixed over the adapted-preprocessing zoo (`zoo.ADAPTED`).

Models whose preprocessing layers were adapted to data, as keras-io's
structured-data examples and its ViT build them: Normalization (a feature
~3e4 wide, whose variance exceeds float16's 65504), Discretization,
StringLookup, IntegerLookup. Keras's own saving carries their state (design
fact 29); so must every copy tf_mixed makes.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from zoo import ADAPTED

import tf_mixed
from tf_mixed.models import cloning


def _np(value):
    return [np.asarray(keras.ops.convert_to_numpy(v), dtype="float32")
            for v in keras.tree.flatten(value)]


def _convert(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_mixed.models.ConversionNote)
        return tf_mixed.convert(model, *args, **kwargs)


def _half_normalization_model():
    """The Normalization model built under mixed_float16 without tf_mixed: its
    Normalization computes in float16 (Keras's behaviour)."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        return ADAPTED["normalization"].ready()
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("name", ADAPTED)
def test_a_copy_computes_exactly_what_the_model_computes(name):
    spec = ADAPTED[name]
    model = spec.ready()
    x, _ = spec.data(16)
    copy = cloning.clone(model, lambda layer: None).model
    for want, got in zip(_np(model(x)), _np(copy(x))):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("name", ADAPTED)
def test_convert_keeps_the_adapted_state_and_computes_it_in_float32(name):
    spec = ADAPTED[name]
    model = spec.ready()
    x, _ = spec.data(16)
    new = _convert(model, "mixed_float16")
    want, = _np(model(x))
    got, = _np(new(x))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    for layer in new.layers:
        if isinstance(layer, (keras.layers.Normalization, keras.layers.Discretization)):
            assert layer.dtype_policy.name == "float32", layer.name
    assert new.get_layer("head").dtype_policy.name == "float32"  # the output layer


def test_enable_keeps_a_new_normalization_float32_and_its_output_right():
    reference = ADAPTED["normalization"].ready()
    x, _ = ADAPTED["normalization"].data(16)
    tf_mixed.enable("mixed_bfloat16", quiet=True)
    model = ADAPTED["normalization"].ready()
    assert model.get_layer("norm").dtype_policy.name == "float32"
    assert model.get_layer("d1").compute_dtype == "bfloat16"
    want, = _np(reference(x))
    got, = _np(model(x))
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2 * np.abs(want).max())


def test_a_float16_normalization_outputs_zero_and_audit_names_it():
    model = _half_normalization_model()
    x, _ = ADAPTED["normalization"].data(4)
    normalized = keras.Model(model.input, model.get_layer("norm").output)
    assert np.all(_np(normalized(x))[0][:, 0] == 0)  # Keras's behaviour: silent zeros
    finding, = tf_mixed.audit(model, check_global_policy=False).by_code("half_range")
    assert finding.severity == "error" and finding.layer == "norm"
    assert "variance" in finding.message and "65504" in finding.message
    assert tf_mixed.audit(ADAPTED["normalization"].ready()).by_code("half_range") == []


def test_probe_names_the_normalization_beyond_float16_first():
    model = _half_normalization_model()
    x, y = ADAPTED["normalization"].data(16)
    report = tf_mixed.probe(model, x, y, loss="mse", half_gradients=False)
    assert len(report.out_of_range) == 1
    assert report.advice == report.out_of_range[0]
    assert report.advice.startswith("Layer 'norm' (Normalization) computes in float16 with its "
                                    "variance")
    assert "keep_float32=['norm']" in report.advice
    # The float32-built model is probed as convert would run it: Normalization float32.
    fine = tf_mixed.probe(ADAPTED["normalization"].ready(), x, y, loss="mse",
                          half_gradients=False)
    assert fine.out_of_range == ()


def test_export_of_an_adapted_model_matches_it(tmp_path):
    model = ADAPTED["normalization"].ready()
    x, _ = ADAPTED["normalization"].data(8)
    report = tf_mixed.export(model, tmp_path / "normalization", precision="float32", sample=x)
    assert report.max_rel_error < 1e-5


@pytest.mark.slow
def test_a_float16_export_keeps_the_normalization_float32(tmp_path):
    model = ADAPTED["normalization"].ready()
    x, _ = ADAPTED["normalization"].data(8)
    report = tf_mixed.export(model, tmp_path / "half", precision="float16", sample=x)
    assert report.max_rel_error <= report.tolerance


@pytest.mark.slow
@pytest.mark.parametrize("name", ["discretization", "integer_lookup"])
def test_export_of_adapted_models_matches_them(name, tmp_path):
    spec = ADAPTED[name]
    x, _ = spec.data(8)
    report = tf_mixed.export(spec.ready(), tmp_path / name, precision="float32", sample=x)
    assert report.max_rel_error < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", ADAPTED)
def test_probe_and_census_take_adapted_models(name):
    from tf_mixed.tools.census import census

    spec = ADAPTED[name]
    x, y = spec.data(16)
    report = tf_mixed.probe(spec.ready(), x, y, loss="mse", half_gradients=False)
    assert report.first_nonfinite is None
    converted = _convert(spec.ready(), "mixed_bfloat16")
    converted.compile(optimizer="sgd", loss="mse")
    if x.dtype.kind == "U":
        x = tf.constant(x)  # as model.fit takes strings (it refuses a NumPy str array)
    assert census(converted, x, y, batch_size=16).by_code("float64_input") == []


def test_a_batchnorm_with_a_large_moving_variance_is_not_out_of_range():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input((2,))
        model = keras.Model(inputs, keras.layers.BatchNormalization(name="bn")(inputs))
    finally:
        keras.config.set_dtype_policy("float32")
    model.get_layer("bn").moving_variance.assign([1e6, 1.0])  # float32 inside the layer
    x = np.array([[1000.0, 1.0]], "float32")
    assert np.isfinite(_np(model(x))[0]).all()
    assert tf_mixed.audit(model, check_global_policy=False).by_code("half_range") == []
