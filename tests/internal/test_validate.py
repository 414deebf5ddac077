"""tf_mixed._internal.validate: one check for numbers and flags, one exception per kind of error."""

import math

import numpy as np
import pytest

from tf_mixed._internal.validate import ArgumentTypeError, boolean, number


def test_a_wrong_type_is_both_a_type_error_and_a_value_error():
    assert issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ArgumentTypeError, ValueError)


@pytest.mark.slow
@pytest.mark.parametrize("value", [True, np.bool_(False), "2", None, [1]])
def test_non_numbers_are_refused_with_name_value_and_type(value):
    with pytest.raises(ArgumentTypeError) as info:
        number(value, "patience", valid="an integer >= 1", owner="LossScaleMonitor")
    assert str(info.value) == (
        f"LossScaleMonitor argument `patience` must be an integer >= 1. "
        f"Received: patience={value!r} (of type {type(value).__name__}).")


def test_a_broken_rule_is_a_value_error_only():
    with pytest.raises(ValueError) as info:
        number(0, "patience", integer=True, rule=lambda v: v >= 1,
               valid="an integer >= 1")
    assert type(info.value) is ValueError
    assert str(info.value) == "`patience` must be an integer >= 1. Received: patience=0."


def test_integers_and_integral_floats():
    assert number(np.int64(3), "n", integer=True, valid="x") == 3
    assert type(number(np.int64(3), "n", integer=True, valid="x")) is int
    with pytest.raises(ArgumentTypeError):
        number(3.0, "n", integer=True, valid="x")
    assert number(3.0, "n", integer=True, integral_floats=True, valid="x") == 3
    for bad in (3.5, math.inf, math.nan):
        with pytest.raises(ArgumentTypeError):
            number(bad, "n", integer=True, integral_floats=True, valid="x")


def test_floats_are_converted_and_nan_fails_a_range_rule():
    value = number(np.float32(0.5), "f", valid="x")
    assert value == 0.5 and type(value) is float
    with pytest.raises(ValueError):
        number(math.nan, "f", rule=lambda v: 0 < v <= 1, valid="x")


def test_flags():
    assert boolean(False, "unscaled") is False
    with pytest.raises(ArgumentTypeError) as info:
        boolean(1, "unscaled", owner="apply()", hint=" Pass True.")
    assert str(info.value) == (
        "apply() argument `unscaled` must be True or False. Received: "
        "unscaled=1 (of type int). Pass True.")


def _bool_callers():
    """Every public numeric argument, each called with True (issue 27)."""
    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed import training
    from tf_mixed.distribute import workers as launch
    from tf_mixed.scaling import scale_state

    def model():
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])

    calls = {f"LossScaleConfig({name}=True)":
             (lambda n=name: scale_state.LossScaleConfig(**{n: True}))
             for name, *_ in scale_state.KNOBS}
    calls.update({
        "apply_scaled_gradients(clip_norm=True)": lambda: training.apply_scaled_gradients(
            tf.GradientTape(), tf.constant(1.0), [], keras.optimizers.SGD(), clip_norm=True),
        "make_train_step(clip_norm=True)": lambda: training.make_train_step(
            model(), keras.losses.MeanSquaredError(), keras.optimizers.SGD(), clip_norm=True),
        "LossScaleMonitor(patience=True)": lambda: tf_mixed.LossScaleMonitor(patience=True),
        "LossScaleMonitor(max_skip_fraction=True)":
            lambda: tf_mixed.LossScaleMonitor(max_skip_fraction=True),
        "LossScaleMonitor(min_scale=True)": lambda: tf_mixed.LossScaleMonitor(min_scale=True),
        "audit(batch_size=True)": lambda: tf_mixed.audit(model(), batch_size=True),
        "run_local_workers(num_workers=True)": lambda: launch.run_local_workers(True, ["x"]),
        "run_local_workers(timeout=True)": lambda: launch.run_local_workers(1, ["x"], timeout=True),
    })
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("call", list(_bool_callers()))
def test_every_numeric_argument_refuses_a_bool(call):
    with pytest.raises(TypeError, match=r"=True \(of type bool\)"):
        _bool_callers()[call]()
