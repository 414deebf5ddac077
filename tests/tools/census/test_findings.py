"""Census findings that link to the audit (issue 37)."""

import types

import keras
import numpy as np
import pytest

import tf_mixed


@pytest.mark.slow
def test_a_plain_softmax_head_under_bfloat16_is_a_finding():
    # README: keep softmax in float32. A plain Dense(10, activation="softmax")
    # head under bfloat16 computes it in bfloat16: the census says so.
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax", name="head")])
    x, y = np.ones((16, 16), "float32"), np.zeros(16, "int32")
    report = tf_mixed.census(model, x, y, loss="sparse_categorical_crossentropy", batch_size=16)
    (finding,) = report.by_code("half_output_activation")
    assert (finding.layer, finding.severity, finding.audit) == ("head", "warning",
                                                                "half_output_activation")
    assert "tf_mixed.OutputActivation('softmax')" in finding.fix
    # The same head kept in float32 (tf_mixed.OutputActivation): no finding.
    kept = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, name="logits"),
                             tf_mixed.OutputActivation("softmax")])
    report = tf_mixed.census(kept, x, y, loss="sparse_categorical_crossentropy", batch_size=16)
    assert report.by_code("half_output_activation") == []


def _base(name):
    """A small functional model named as keras.applications names its models."""
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(12, 3, name="conv")(inputs)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D(name="pool")(x), name=name)


def _census_with_misfits(model, *layers):
    from tf_mixed.tools.census.step_census import Misfit

    misfits = [Misfit(layer, "Conv2D" if "conv" in layer else "Dense", "bfloat16", "n", 12, 16,
                      False) for layer in layers]
    return types.SimpleNamespace(islands=[], casts=[], misfits=misfits, policy="mixed_bfloat16")


def test_a_published_architecture_is_not_told_to_resize():
    """Issue 46: doctor advised resizing layers of a keras.applications/KerasHub model."""
    from tf_mixed.tools.census import findings

    inputs = keras.Input((8, 8, 3))
    x = _base("mobilenetv2_1.00_8")(inputs)  # the name keras.applications gives it
    x = keras.layers.Dense(12, name="mine")(x)
    model = keras.Model(inputs, keras.layers.Dense(5, name="out")(x), name="user_model")
    found = findings.find(_census_with_misfits(model, "mobilenetv2_1.00_8/conv", "mine"), model)
    published, mine = found
    assert published.layer == "mobilenetv2_1.00_8/conv" and not published.automatic
    assert published.fix == (
        "nothing to resize: 'mobilenetv2_1.00_8/conv' belongs to a keras.applications "
        "architecture, whose widths its design and pretrained weights fix (pad only layers you "
        "added).")
    assert mine.layer == "mine" and mine.fix == "use units=16." and mine.automatic
