"""A fresh process of tests/integration/test_resume_keras_file.py.

    python _resume_worker.py whole|resume DIR

``whole``: `tf_mixed.enable("mixed_float16")`, one epoch, save ``DIR/mid.keras``,
a second epoch, write ``DIR/whole.json``. ``resume``: only ``import tf_mixed``
(no `enable`), load ``DIR/mid.keras``, the second epoch, write
``DIR/resume.json``. Each epoch's second batch overflows float16 (skipped, the
BatchNormalization statistics it wrote rolled back). The JSON holds every
weight (moving statistics included), every optimizer variable (loss scale and
counters included), the remapping option and the global policy.
"""

import json
import os
import sys

import numpy as np

BATCH = 4


def data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 6)).astype("float32")
    y = (x @ rng.standard_normal((6, 1)) + 0.5).astype("float32")
    x[BATCH, 0] = 1e5  # batch 2: inf in float16
    return x, y


def build(keras, tf_mixed):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(8, activation="tanh"),
        keras.layers.Dense(1),
        tf_mixed.Float32Output(),
    ])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam(1e-2)), loss="mse")
    return model


def main(mode, directory):
    import keras
    import tensorflow as tf

    import tf_mixed

    x, y = data()
    path = os.path.join(directory, "mid.keras")
    fit = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    if mode == "whole":
        tf_mixed.enable("mixed_float16", quiet=True)
        model = build(keras, tf_mixed)
        model.fit(x, y, callbacks=[tf_mixed.LossScaleMonitor()], **fit)
        model.save(path)
    else:
        model = keras.models.load_model(path)
    model.fit(x, y, callbacks=[tf_mixed.LossScaleMonitor()], **fit)
    result = {
        "weights": [w.ravel().tolist() for w in model.get_weights()],
        # In order (their paths carry layer names, numbered per process).
        "optimizer": [np.asarray(v.numpy()).ravel().tolist() for v in model.optimizer.variables],
        "loss_scale": float(model.optimizer.loss_scale.numpy()),
        "skipped_steps": int(model.optimizer.skipped_steps.numpy()),
        "remapping": tf.config.optimizer.get_experimental_options().get("remapping"),
        "global_policy": keras.config.dtype_policy().name,
        "layer_policies": [layer.dtype_policy.name for layer in model.layers],
    }
    with open(os.path.join(directory, f"{mode}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
