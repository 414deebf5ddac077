"""The optimizer's config in the shape Keras's own wrapper loads (tf_mixed/scaling/portable.py).

Keras's wrapper is driven here directly (``keras.optimizers.LossScaleOptimizer.from_config``,
what a process without tf_mixed calls); the fresh-process loads of trained zoo
models are in tests/integration/test_keras_wrapper_resume.py.
"""

import json
import zipfile

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.scaling import portable
from tf_mixed.scaling.optimizer import LossScaleOptimizer

KNOBS = dict(initial_scale=256.0, growth_interval=7, growth_factor=4.0, backoff_factor=0.25,
             min_scale=2.0, max_scale=1024.0, hysteresis=3, communication_dtype="bfloat16")


def _keras_loads(config: dict):
    """What a process without tf_mixed builds from the config (Keras's own class)."""
    return keras.optimizers.LossScaleOptimizer.from_config(json.loads(json.dumps(config)))


def _built(opt, scale=None):
    opt.build([keras.Variable(np.ones(3, np.float32))])
    if scale is not None:
        opt.dynamic_scale.assign(scale)
    return opt


def test_saved_under_keras_wrappers_name_with_keras_wrappers_arguments_at_the_top():
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.125), name="lso", **KNOBS)
    saved = keras.saving.serialize_keras_object(opt)
    assert (saved["module"], saved["class_name"], saved["registered_name"]) == (
        "keras.optimizers", "LossScaleOptimizer", None)
    config = saved["config"]
    assert [k for k in config] == ["name", "inner_optimizer", "initial_scale",
                                   "dynamic_growth_steps"]
    assert (config["name"], config["initial_scale"], config["dynamic_growth_steps"]) == (
        "lso", 256.0, 7)
    assert config["inner_optimizer"][portable.SECTION] == {
        "initial_scale": 256.0, "dynamic_growth_steps": 7, "growth_factor": 4.0,
        "backoff_factor": 0.25, "min_scale": 2.0, "max_scale": 1024.0, "hysteresis": 3,
        "dynamic": True, "communication_dtype": "bfloat16",
        "gradient_accumulation_steps": None, "compensation": None}
    theirs = _keras_loads(config)
    assert type(theirs) is keras.optimizers.LossScaleOptimizer
    assert (theirs.name, theirs.initial_scale, theirs.dynamic_growth_steps) == ("lso", 256.0, 7)
    assert type(theirs.inner_optimizer) is keras.optimizers.Adam
    assert float(theirs.inner_optimizer.learning_rate.numpy()) == 0.125


def test_keras_wrapper_starts_from_the_scale_reached():
    opt = _built(LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=2.0**15), 512.0)
    config = opt.get_config()
    assert config["initial_scale"] == 512.0
    assert portable.constructor_args(config)["initial_scale"] == 2.0**15  # the knob itself
    theirs = _built(_keras_loads(config))
    assert float(theirs.dynamic_scale.numpy()) == 512.0
    # tf_mixed's wrapper rebuilt from it keeps its own initial scale.
    assert LossScaleOptimizer.from_config(config).config.initial_scale == 2.0**15


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "float32"])
def test_a_fixed_scale_never_grows_in_keras_wrapper(policy):
    with tf_mixed.policy_scope(policy):
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD())  # the pass-through: fixed 1.0
    assert (opt.config.dynamic, opt.config.initial_scale) == (False, 1.0)
    theirs = _keras_loads(opt.get_config())
    assert theirs.dynamic_growth_steps == portable.FIXED_SCALE_GROWTH_STEPS == 2**31 - 1
    assert theirs.initial_scale == 1.0
    fixed = LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0, dynamic=False)
    assert LossScaleOptimizer.from_config(fixed.get_config()).get_config() == fixed.get_config()
    assert LossScaleOptimizer.from_config(fixed.get_config()).config == fixed.config


@pytest.mark.parametrize("refused, match", [
    (dict(gradient_accumulation_steps=2),
     "LossScaleOptimizer does not support `gradient_accumulation_steps`"),
    (dict(compensation="kahan"),
     r"LossScaleOptimizer does not support arguments: `compensation`\.$"),
])
def test_keras_wrapper_refuses_what_would_train_another_way_by_name(refused, match):
    opt = LossScaleOptimizer(keras.optimizers.Adam(), **refused)
    config = opt.get_config()
    with pytest.raises(ValueError, match=match):
        _keras_loads(config)
    # It is the only argument Keras's wrapper refuses.
    (key,) = refused
    del config[key]
    assert type(_keras_loads(config)) is keras.optimizers.LossScaleOptimizer
    # tf_mixed's wrapper takes it back.
    again = LossScaleOptimizer.from_config(opt.get_config())
    assert again.get_config() == opt.get_config()


def test_the_name_gives_tf_mixeds_wrapper_for_its_config_and_keras_for_keras():
    """Keras's own wrapper's config still gives Keras's; tf_mixed's flat config of before
    (its registered name) still loads."""
    ours = LossScaleOptimizer(keras.optimizers.Adam(), **KNOBS)
    saved = keras.saving.serialize_keras_object(ours)
    assert saved["module"] == "keras.optimizers"
    back = keras.saving.deserialize_keras_object(saved)
    assert type(back) is LossScaleOptimizer
    assert back.config == ours.config and back.communication_dtype == "bfloat16"
    again = keras.optimizers.deserialize(keras.optimizers.serialize(ours))
    assert type(again) is LossScaleOptimizer and again.config == ours.config
    keras_own = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=64.0)
    theirs = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(keras_own))
    assert type(theirs) is keras.optimizers.LossScaleOptimizer
    assert theirs.initial_scale == 64.0
    # The flat config tf_mixed wrote before, under its registered name, still loads.
    flat = {"name": "lso", "inner_optimizer": keras.saving.serialize_keras_object(
        keras.optimizers.SGD(0.5)), "initial_scale": 256.0, "dynamic_growth_steps": 7,
        "growth_factor": 4.0, "backoff_factor": 0.25, "min_scale": 2.0, "max_scale": 1024.0,
        "hysteresis": 3, "dynamic": True, "communication_dtype": "bfloat16",
        "gradient_accumulation_steps": None, "compensation": None}
    assert portable.constructor_args(flat) == flat
    old = keras.saving.deserialize_keras_object({
        "module": "tf_mixed.scaling.optimizer", "class_name": "LossScaleOptimizer",
        "config": flat, "registered_name": "tf_mixed>LossScaleOptimizer"})
    assert type(old) is LossScaleOptimizer
    expected = LossScaleOptimizer(keras.optimizers.SGD(0.5), name="lso", **KNOBS)
    assert (old.name, old.config, old.communication_dtype) == (
        "lso", expected.config, "bfloat16")
    assert float(old.inner_optimizer.learning_rate.numpy()) == 0.5


def test_a_keras_file_round_trips_exactly_with_tf_mixed_imported(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = LossScaleOptimizer(keras.optimizers.Adam(0.01), **KNOBS)
    model.compile(optimizer=opt, loss="mse")
    x = np.random.default_rng(0).random((16, 4), dtype=np.float32)
    model.fit(x, x[:, :2], batch_size=4, epochs=1, verbose=0)
    opt.dynamic_scale.assign(64.0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    header = json.loads(zipfile.ZipFile(path).read("config.json"))["compile_config"]["optimizer"]
    assert (header["module"], header["registered_name"]) == ("keras.optimizers", None)
    assert header["config"]["initial_scale"] == 64.0
    loaded = keras.models.load_model(path).optimizer
    assert type(loaded) is LossScaleOptimizer
    assert loaded.get_config() == opt.get_config() and loaded.config == opt.config
    assert loaded.loss_scale_state() == opt.loss_scale_state()
    assert len(loaded.variables) == len(opt.variables)
    for ours, theirs in zip(loaded.variables, opt.variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
