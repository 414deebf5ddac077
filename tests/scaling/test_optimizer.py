"""The optimizer is built in one pass: each concern is checked once.

Every path of `wrap_optimizer` (loss scaling, pass-through, float16 wire,
pure bfloat16 with compensation, a Keras wrapper converted) validates the
knobs into one frozen config and checks the tf-keras question, the
communication dtype, the accumulation steps and the compensation rule
exactly once; `wrap_optimizer` chooses a config and calls the constructor.
"""

import collections

import keras
import pytest

import tf_mixed
from tf_mixed._internal import tf_keras_check
from tf_mixed.scaling import accumulation, allreduce, compensated, optimizer, scale_state


@pytest.fixture
def calls(monkeypatch):
    counts = collections.Counter()

    def counting(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counting(tf_keras_check, "check_objects")
    counting(allreduce, "validate_communication_dtype")
    counting(accumulation, "steps_to_take_over")
    counting(compensated, "compensation_of")
    real_post_init = scale_state.LossScaleConfig.__post_init__

    def post_init(self):
        counts["LossScaleConfig"] += 1
        real_post_init(self)

    monkeypatch.setattr(scale_state.LossScaleConfig, "__post_init__", post_init)
    return counts


ONCE = {"check_objects": 1, "validate_communication_dtype": 1, "steps_to_take_over": 1,
        "compensation_of": 1, "LossScaleConfig": 1}


@pytest.mark.parametrize("policy, force, knobs", [
    ("mixed_float16", False, {"initial_scale": 8.0, "communication_dtype": "float16"}),
    ("float32", True, {"dynamic_growth_steps": 4, "gradient_accumulation_steps": 2}),
    ("float32", False, {"initial_scale": 8.0, "hysteresis": 2}),
    ("mixed_bfloat16", False, {"communication_dtype": "float16"}),
    ("bfloat16", False, {}),
], ids=["scaling", "forced", "pass-through", "wire", "bfloat16-compensated"])
def test_every_concern_is_checked_once(calls, policy, force, knobs):
    with tf_mixed.policy_scope(policy):
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5), force=force, **knobs)
    assert dict(calls) == ONCE
    if policy in ("float32", "mixed_bfloat16") and not force:
        assert opt.config in (scale_state.LossScaleConfig.pass_through(),
                              scale_state.LossScaleConfig.wire())
    if policy == "bfloat16":
        assert compensated.compensation_of(opt.inner_optimizer).method == "kahan"


def test_the_constructor_checks_once_too(calls):
    optimizer.LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=4.0)
    assert dict(calls) == ONCE


def test_a_keras_wrapper_is_converted_in_one_pass(calls):
    keras_lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                                    initial_scale=64.0)
    calls.clear()
    opt = tf_mixed.wrap_optimizer(keras_lso)
    assert dict(calls) == ONCE
    assert opt.config.initial_scale == 64.0


def test_pass_through_knobs_are_still_validated_once(calls):
    with tf_mixed.policy_scope("float32"):
        with pytest.raises(ValueError, match="growth_factor"):
            tf_mixed.wrap_optimizer(keras.optimizers.SGD(), growth_factor=0.5)
    assert calls["LossScaleConfig"] == 1 and calls["check_objects"] == 0


def test_config_and_knobs_are_one_or_the_other():
    config = scale_state.LossScaleConfig(initial_scale=4.0)
    opt = optimizer.LossScaleOptimizer(keras.optimizers.SGD(), config=config)
    assert opt.config is config and opt.get_config()["initial_scale"] == 4.0
    with pytest.raises(ValueError, match="both `config` and knobs"):
        optimizer.LossScaleOptimizer(keras.optimizers.SGD(), config=config, hysteresis=2)
    with pytest.raises(TypeError, match="`config` must be"):
        optimizer.LossScaleOptimizer(keras.optimizers.SGD(), config={"initial_scale": 4.0})


def test_config_and_formats_live_with_the_class():
    """get_config/from_config/from_keras and the .keras hooks are defined on
    the class itself; the older layouts are plain functions in formats.py."""
    from tf_mixed.scaling import formats

    own = vars(optimizer.LossScaleOptimizer)
    for name in ("get_config", "from_config", "from_keras", "save_own_variables",
                 "load_own_variables", "finalize_variable_values"):
        assert name in own, name
    assert callable(formats.load_listed_layout) and callable(formats.load_unsplit_layout)
