"""tf_mixed.convert(..., pad_to=N): hidden Dense widths padded, outputs unchanged."""

import warnings

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.models import padding
from tf_mixed.policy import precision_map


def _model():
    inp = keras.Input((16,))
    h = keras.layers.Dense(1001, activation="sigmoid", name="wide")(inp)
    h = keras.layers.Dense(20, activation="relu", name="mid")(h)
    skip = keras.layers.Dense(12, name="side")(inp)  # read by Concatenate: not padded
    h = keras.layers.Concatenate()([h, skip])
    out = keras.layers.Dense(3, name="out")(h)
    return keras.Model(inp, out)


def test_plan_pads_only_dense_layers_read_by_dense_layers():
    model = _model()
    found = precision_map.survey(model)
    assert padding.plan(found, 16) == {"wide": 1008}
    assert padding.plan(found, 4) == {"wide": 1004}


def test_padded_model_computes_the_same_outputs():
    model = _model()
    x = np.random.default_rng(0).normal(size=(8, 16)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_mixed.models.ConversionNote)
        padded = tf_mixed.convert(model, "float32", pad_to=16)
    assert padded.get_layer("wide").units == 1008
    assert padded.get_layer("mid").kernel.shape == (1008, 20)
    # sigmoid(0) = 0.5 in the extra units, read through zero rows.
    np.testing.assert_allclose(padded(x), model(x), rtol=1e-5, atol=1e-6)
    assert any("padded 'wide' to units=1008" in n for n in padded.conversion_notes)


@pytest.mark.slow
def test_census_finds_no_misfit_after_padding():
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_mixed.models.ConversionNote)
        padded = tf_mixed.convert(model, "mixed_bfloat16", pad_to=16)
    x, y = np.ones((16, 16), "float32"), np.zeros((16, 3), "float32")
    before = tf_mixed.census(tf_mixed.convert(model, "mixed_bfloat16"), x, y, loss="mse",
                             batch_size=16)
    after = tf_mixed.census(padded, x, y, loss="mse", batch_size=16)
    assert [f.layer for f in before.by_code("tile_misfit")] == ["wide", "mid", "side"]
    assert [f.layer for f in after.by_code("tile_misfit")] == ["mid", "side"]


@pytest.mark.slow
@pytest.mark.parametrize("bad", [0, -8, 2.5, True, "16"])
def test_pad_to_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=rf"`pad_to` must be.*Received: pad_to={bad!r}"):
        tf_mixed.convert(_model(), "mixed_bfloat16", pad_to=bad)


def test_census_marks_only_paddable_misfits_automatic():
    keras.config.set_dtype_policy("mixed_bfloat16")
    report = tf_mixed.census(_model(), np.ones((16, 16), "float32"),
                             np.zeros((16, 3), "float32"), loss="mse", batch_size=16)
    assert {f.layer: f.automatic for f in report.by_code("tile_misfit")} == {
        "wide": True, "mid": False, "side": False}


def test_copy_weights_pads_a_widened_layer_and_copies_any_other_as_is():
    source = keras.layers.Dense(3, name="d")
    source.build((None, 2))
    source.set_weights([np.arange(6, dtype="float32").reshape(2, 3), np.ones(3, "float32")])
    wide = keras.layers.Dense(8, name="d")
    wide.build((None, 2))
    padding.copy_weights(source, wide)
    kernel, bias = wide.get_weights()
    np.testing.assert_array_equal(kernel[:, :3], source.get_weights()[0])
    assert not kernel[:, 3:].any() and list(bias) == [1.0] * 3 + [0.0] * 5
    same = keras.layers.Dense(3, name="d", dtype="mixed_bfloat16")
    same.build((None, 2))
    padding.copy_weights(source, same)
    for a, b in zip(same.get_weights(), source.get_weights()):
        np.testing.assert_array_equal(a, b)
