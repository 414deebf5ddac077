"""tf_mixed.tools.catalog.registry: every keras.layers class is measured or left out with why."""

import inspect

import keras
import pytest

from tf_mixed.tools.catalog import registry


def _classes(names) -> set[type]:
    return {getattr(keras.layers, name) for name in names}


def test_every_keras_layer_class_is_measured_or_left_out_with_a_reason():
    measured = _classes(n for case in registry.keras_cases() for n in (case.layer, *case.covers))
    left_out = _classes(registry.left_out())
    no_float = _classes(registry.NO_FLOAT_COMPUTE)
    everything = {cls for cls in vars(keras.layers).values()
                  if inspect.isclass(cls) and issubclass(cls, keras.layers.Layer)}
    assert measured | left_out | no_float == everything, everything - measured - left_out
    assert not measured & left_out and not measured & no_float and not left_out & no_float
    reasons = {**registry.left_out(), **registry.NO_FLOAT_COMPUTE}
    assert all(reason.strip() for reason in reasons.values())
    # Issue 48's bar: at least 90% of the float-computing classes.
    assert len(measured) / len(measured | left_out) >= 0.9


def test_every_case_builds_under_float32_and_its_keys_are_unique():
    cases = registry.keras_cases()
    keys = [case.key for case in cases]
    assert len(keys) == len(set(keys))
    for case in cases:
        assert case.distribution in registry.DISTRIBUTIONS, case.key
        if not case.per_magnitude:
            assert isinstance(case.make("float32"), keras.layers.Layer), case.key


def test_the_common_configurations_are_there():
    keys = {case.key for case in registry.keras_cases()}
    assert {"Dense[units=4096]", "Dense[inputs=4096]", "LayerNormalization[epsilon=1e-6]",
            "GroupNormalization[groups=4, epsilon=1e-5]", "MultiHeadAttention[attention_mask]",
            "LSTM[mask]", "Softmax[mask]", "BatchNormalization[batch statistics]",
            "BatchNormalization[batch statistics, epsilon=1e-5]",
            "LayerNormalization[offset]", "UnitNormalization[default]"} <= keys


def test_resolve_takes_names_paths_and_classes():
    assert registry.resolve("Dense") is keras.layers.Dense
    assert registry.resolve("keras.layers.Dense") is keras.layers.Dense
    assert registry.resolve(keras.layers.Dense) is keras.layers.Dense


@pytest.mark.parametrize("bad, error, text", [
    ("NoSuchLayer", ValueError, "names neither"),
    ("no_such_module.Layer", ValueError, "names neither"),
    (int, TypeError, "keras.layers.Layer subclasses"),
    (3, TypeError, "of type int"),
])
def test_resolve_refuses_what_is_no_layer_class(bad, error, text, monkeypatch):
    monkeypatch.setattr(registry, "_hub_layers", lambda: None)  # KerasHub stays unimported
    with pytest.raises(error, match=text):
        registry.resolve(bad)


def test_a_user_case_measures_the_class_with_its_arguments():
    case = registry.user_case(keras.layers.Dense, inputs=[(8,)], config={"units": 3},
                              label="units=3")
    assert case.key == "Dense[units=3]" and case.source == "user" and case.inputs == ((8,),)
    assert case.make("mixed_bfloat16").units == 3
