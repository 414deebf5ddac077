"""A model trained with tf_mixed, saved as .keras, loads and predicts the same in a
fresh process that never imports tf_mixed (`_load_without_tf_mixed.py`)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed.tools.planning import LayerTiming, Measurement
from tf_mixed.tools.planning.layer_timing import layer_graph

SCRIPT = os.path.join(os.path.dirname(__file__), "_load_without_tf_mixed.py")
SAFE_MODE_OFF = ("lambda_lambda",)  # a Python lambda: Keras asks for safe_mode=False


def _record(directory, name, model, x, safe_mode=True) -> dict:
    path = os.path.join(directory, f"{name}.keras")
    model.save(path)
    xs = x if isinstance(x, list) else [x]
    np.savez(os.path.join(directory, f"{name}_x.npz"), **{str(i): a for i, a in enumerate(xs)})
    preds = keras.tree.flatten(model.predict(x, verbose=0))
    np.savez(os.path.join(directory, f"{name}_y.npz"),
             **{str(i): np.asarray(p, np.float64) for i, p in enumerate(preds)})
    return {"path": path, "x": os.path.join(directory, f"{name}_x.npz"),
            "expected": os.path.join(directory, f"{name}_y.npz"), "safe_mode": safe_mode,
            "policies": {layer.name: layer.dtype_policy.name for layer in model.layers
                         # A nested model's own policy is not saved: its layers carry theirs.
                         if not isinstance(layer, (keras.layers.InputLayer, keras.Model))}}


def _load_elsewhere(directory, records) -> dict:
    manifest = os.path.join(directory, "manifest.json")
    with open(manifest, "w") as f:
        json.dump(records, f)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, SCRIPT, manifest], capture_output=True, text=True,
                          env=env, cwd=directory, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fast_timer(model, batch, precisions, half_policy):
    timed, producers, followers = layer_graph(model)
    return Measurement(tuple(precisions), tuple(
        LayerTiming(layer.name, type(layer).__name__, producers[layer.name],
                    {p: (1e-3 if p == "float32" else 5e-4,) * 3 for p in precisions},
                    (1e-5,) * 3) for layer in timed), followers)


def _trained_with_everything():
    """float32 heads (OutputActivation, Float32Output), keep_float32, adapted
    statistics, a plan applied, a healed layer: trained one step under tf_mixed."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(32, 8)) * 100).astype("float32")
    inputs = keras.Input((8,), name="x")
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(x)
    h = keras.layers.Dense(16, activation="relu", name="h1")(norm(inputs))
    h = keras.layers.Dense(16, activation="relu", name="kept")(h)
    h = keras.layers.Dense(16, activation="relu", name="h2")(h)
    probs = keras.layers.Dense(3, activation="softmax", name="probs")(h)
    value = tf_mixed.Float32Output(name="value")(keras.layers.Dense(1, name="value_half")(h))
    model = keras.Model(inputs, [probs, value], name="everything")
    planned = tf_mixed.plan(model, x, [np.zeros(32), np.zeros((32, 1))],
                            loss=["sparse_categorical_crossentropy", "mse"],
                            policy="mixed_bfloat16", timer=_fast_timer, probe_report={},
                            step_check=False, cache=False)
    mixed = planned.apply(model)
    mixed = tf_mixed.convert(mixed, "mixed_bfloat16", keep_float32=["kept"])
    tf_mixed.training.heal_layers(mixed, ["h2"])
    mixed.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam()),
                  loss=["sparse_categorical_crossentropy", "mse"])
    mixed.fit(x, [rng.integers(0, 3, 32), rng.normal(size=(32, 1))], epochs=1, verbose=0)
    return mixed, x


@pytest.mark.slow  # a fresh process: about 4 s of CPU, near the fast tier's 5 s
def test_a_small_model_trained_with_tf_mixed_loads_and_predicts_without_it(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype("float32")
    inputs = keras.Input((4,), name="x")
    h = keras.layers.Dense(8, activation="relu", name="h")(inputs)
    h = keras.layers.Dense(8, name="kept")(h)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="probs")(h))
    mixed = tf_mixed.convert(model, "mixed_bfloat16", keep_float32=["kept"])
    tf_mixed.training.heal_layers(mixed, ["h"])
    mixed.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD()),
                  loss="sparse_categorical_crossentropy")
    mixed.train_on_batch(x, np.arange(8) % 3)
    assert isinstance(mixed.get_layer("probs"), tf_mixed.OutputActivation)
    worst = _load_elsewhere(str(tmp_path), [_record(str(tmp_path), "small", mixed, x)])
    assert list(worst.values()) == [0.0]


@pytest.mark.slow
def test_a_model_trained_with_everything_loads_and_predicts_without_it(tmp_path):
    model, x = _trained_with_everything()
    policies = {layer.name: layer.dtype_policy.name for layer in model.layers}
    assert policies["kept"] == policies["h2"] == policies["norm"] == "float32"
    assert policies["h1"] == "mixed_bfloat16"
    assert isinstance(model.get_layer("probs"), tf_mixed.OutputActivation)
    worst = _load_elsewhere(str(tmp_path), [_record(str(tmp_path), "everything", model, x)])
    assert list(worst.values()) == [0.0]


def test_the_float32_heads_save_as_keras_layers_with_dtype_float32():
    head = tf_mixed.OutputActivation("softmax", name="probs")
    cast = tf_mixed.Float32Output(name="out")
    saved = [keras.saving.serialize_keras_object(layer) for layer in (head, cast)]
    assert [(c["module"], c["class_name"]) for c in saved] == [
        ("keras.layers", "Activation"), ("keras.layers", "Identity")]
    back = [keras.saving.deserialize_keras_object(c) for c in saved]
    assert [b.dtype_policy.name for b in back] == ["float32", "float32"]
    half = keras.ops.cast(np.array([[0.0, 30.0, -30.0]]), "bfloat16")
    np.testing.assert_array_equal(back[0](half), head(half))
    assert back[1]({"a": half, "i": np.arange(2)})["a"].dtype == "float32"


@pytest.mark.slow
def test_the_zoo_trained_with_tf_mixed_loads_without_it(tmp_path):
    records = []
    for name, spec in ZOO.items():
        x, y = spec.data(16)
        with tf_mixed.policy_scope("mixed_bfloat16"):
            built = spec.ready()  # per-layer precisions from enable's rules
        converted = tf_mixed.convert(spec.ready(), "mixed_bfloat16")  # heads
        for kind, model in (("built", built), ("converted", converted)):
            model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD()),
                          loss=spec.loss)
            model.fit(x, y, epochs=1, verbose=0)
            records.append(_record(str(tmp_path), f"{name}_{kind}", model, x,
                                   safe_mode=name not in SAFE_MODE_OFF))
    worst = _load_elsewhere(str(tmp_path), records)
    assert len(worst) == 2 * len(ZOO)
    assert max(worst.values()) == 0.0, worst
