"""A model trained with tf_mixed's optimizer, saved as ``.keras``, loads with plain
``keras.models.load_model(path)`` (``compile=True``) in a fresh process that never
imports tf_mixed, as Keras's own wrapper around the restored inner optimizer with
the scale reached, and keeps training (`_fit_without_tf_mixed.py`); the same file
loaded here, with tf_mixed imported, gives tf_mixed's wrapper back exactly
(tf_mixed/scaling/portable.py)."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from zoo import REAL, ZOO

import tf_mixed
from tf_mixed.scaling.optimizer import LossScaleOptimizer

WORKER = pathlib.Path(__file__).with_name("_fit_without_tf_mixed.py")
# A Sequential, a model with BatchNormalization, a keras.applications model
# (weights=None, 32x32 input; BatchNormalization too).
MODELS = {"sequential_input": ZOO["sequential_input"], "batchnorm": ZOO["batchnorm"],
          "mobilenet_v3_small": REAL["mobilenet_v3_small"]}


def _trained(spec, policy, directory) -> dict:
    """Trains `spec` under `policy` with tf_mixed's wrapper, saves it; the manifest record."""
    with tf_mixed.policy_scope(policy):
        model = spec.ready()
        model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam(1e-3)),
                      loss=spec.loss)
    x, y = spec.data(32)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=[tf_mixed.LossScaleMonitor(check_setup=False)])
    optimizer = model.optimizer
    assert type(optimizer) is LossScaleOptimizer
    path = os.path.join(directory, f"{spec.name}.keras")
    model.save(path)
    inner = optimizer.inner_optimizer
    np.savez(os.path.join(directory, f"{spec.name}_inner.npz"),
             **{str(i): v.numpy() for i, v in enumerate(inner.variables)})
    np.savez(os.path.join(directory, f"{spec.name}_data.npz"), x=x, y=y)

    # With tf_mixed imported the file gives tf_mixed's wrapper back, exactly.
    loaded = keras.models.load_model(path).optimizer
    assert type(loaded) is LossScaleOptimizer
    assert loaded.get_config() == optimizer.get_config()
    # (The step guard's reason counters are not saved, as before.)
    assert (loaded.loss_scale_state()._replace(skip_reasons=None)
            == optimizer.loss_scale_state()._replace(skip_reasons=None))
    for ours, theirs in zip(loaded.variables, optimizer.variables):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())

    return {"path": path, "scale": float(optimizer.dynamic_scale.numpy()),
            "iterations": int(inner.iterations.numpy()),
            "inner": os.path.join(directory, f"{spec.name}_inner.npz"),
            "data": os.path.join(directory, f"{spec.name}_data.npz")}


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_keras_alone_loads_compiled_and_keeps_training(tmp_path, policy):
    records = [_trained(spec, policy, str(tmp_path)) for spec in MODELS.values()]
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(records))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)  # the child cannot import tf_mixed
    done = subprocess.run([sys.executable, str(WORKER), str(manifest)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for record in records:
        got = results[record["path"]]
        assert np.isfinite(got["loss"]), (record["path"], got)
        assert got["all_changed"], (record["path"], got)
        assert got["iterations"] > record["iterations"], (record["path"], got)
