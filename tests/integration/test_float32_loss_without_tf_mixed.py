"""A model compiled with ``tf_mixed.float32_loss``, saved as ``.keras``, loads
compiled (``load_model(path)``, ``compile=True``) in a fresh process that never
imports tf_mixed: each wrapped loss as Keras's loss function wrapper with
``dtype="float32"``, the same loss values, and it trains a step
(`_float32_loss_without_tf_mixed.py`); a wrapped loss Keras's wrapper cannot
express fails there with Keras's error naming Float32Loss. Here, with tf_mixed
imported, the same files load as Float32Loss (tf_mixed/_internal/portable_loss.py)."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed.layers import Float32Loss

WORKER = os.path.join(os.path.dirname(__file__), "_float32_loss_without_tf_mixed.py")


@keras.saving.register_keras_serializable(package="tf_mixed_test")
class OwnCallLoss(keras.losses.Loss):
    """A Loss with its own ``call`` (not registered in the child process)."""

    def call(self, y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)


def _saved(directory, name, policy, loss, metrics=None) -> dict:
    spec = ZOO[name]
    with tf_mixed.policy_scope(policy):
        model = spec.ready()
    # tf_mixed's wrapper (loss scaling under mixed_float16, the pass-through under
    # mixed_bfloat16): each file names Keras's own wrapper.
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01),
                                        force=policy == "mixed_float16")
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
    x, y = spec.data(16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    path = os.path.join(directory, f"{name}_{policy}.keras")
    model.save(path)
    ys = y if isinstance(y, list) else [y]
    data = os.path.join(directory, f"{name}_{policy}.npz")
    np.savez(data, x=x, **{f"y{i}": v for i, v in enumerate(ys)})
    # With tf_mixed imported the file gives Float32Loss back, as before.
    loaded = keras.models.load_model(path)
    for ours, theirs in zip(keras.tree.flatten(model.loss), keras.tree.flatten(loaded.loss)):
        assert type(theirs) is type(ours)
        if isinstance(ours, Float32Loss):
            assert theirs.get_config() == ours.get_config()
    return {"path": path, "data": data, "policy": policy,
            "scale": float(optimizer.dynamic_scale.numpy()),
            "evaluate": model.evaluate(x, y, verbose=0, return_dict=True)}


@pytest.mark.slow  # one fresh process for every file
def test_a_model_compiled_with_float32_loss_loads_compiled_without_tf_mixed(tmp_path):
    directory = str(tmp_path)
    multi = _saved(directory, "multi_output", "mixed_bfloat16",
                   [tf_mixed.float32_loss("mse"), "sparse_categorical_crossentropy"],
                   metrics=[[], ["accuracy"]])
    single = _saved(directory, "nested", "mixed_float16",
                    tf_mixed.float32_loss(keras.losses.MeanSquaredError(reduction="sum")))
    own = _saved(directory, "functional", "mixed_bfloat16",
                 tf_mixed.float32_loss(OwnCallLoss(name="own")))
    records = [multi, single, own]
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(records))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)  # the child cannot import tf_mixed
    done = subprocess.run([sys.executable, WORKER, str(manifest)], capture_output=True,
                          text=True, env=env, cwd=directory, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])

    got = results[multi["path"]]
    assert got["losses"] == [["LossFunctionWrapper", "float32", "sum_over_batch_size",
                              "mean_squared_error"], "sparse_categorical_crossentropy"]
    assert got["optimizer"] == "LossScaleOptimizer"  # Keras's own, the pass-through's file
    assert got["evaluate"] == multi["evaluate"]  # the losses and the metric, exactly
    assert np.isfinite(got["step"])

    got = results[single["path"]]
    assert single["scale"] > 1  # tf_mixed's loss scaling, loaded as Keras's wrapper
    assert got["losses"] == [["LossFunctionWrapper", "float32", "sum", "mean_squared_error"]]
    assert got["optimizer"] == "LossScaleOptimizer"
    assert got["evaluate"] == single["evaluate"]
    assert np.isfinite(got["step"])

    # Keras's wrapper cannot express a Loss with its own call: Keras says it
    # cannot locate tf_mixed's class instead of loading another loss.
    error = results[own["path"]]["error"]
    assert "Could not locate class 'Float32Loss'" in error, error
