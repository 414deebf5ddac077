"""See what mixed precision is doing in `model.fit`: audit, monitor, TensorBoard.

    python examples/fit_callback.py [--policy=mixed_float16] [--epochs=3]
        [--logdir=/tmp/tf_mixed_fit] [--nocollapse]

Runs on a CPU in well under a minute, with data generated in process:

1. builds a small MLP the *wrong* way (float32, before ``enable()``), audits
   it, then ``tf_mixed.convert``s it to the mixed policy and audits again;
2. trains it with ``LossScaleMonitor`` writing ``loss_scale``,
   ``skipped_steps`` and ``skipped_fraction`` into the logs, which the
   progress bar, ``History`` and Keras's ``TensorBoard`` callback pick up
   (``tensorboard --logdir ...`` to look; skipped with a note when the
   tensorboard package is not installed);
3. unless ``--nocollapse``, trains a model whose gradients overflow on every
   step and shows the monitor stopping it, with the reason, once the loss
   scale has sat at its minimum for ``patience`` steps.
"""

import importlib.util
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import tf_mixed
from tf_mixed.callbacks import LossScaleMonitor

_POLICY = flags.DEFINE_enum("policy", "mixed_float16",
                            list(tf_mixed.policy.POLICY_NAMES), "Mixed-precision policy.")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Training epochs.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Examples per step.")
_LOGDIR = flags.DEFINE_string(
    "logdir", os.path.join(tempfile.gettempdir(), "tf_mixed_fit"),
    "TensorBoard log directory.")
_COLLAPSE = flags.DEFINE_boolean(
    "collapse", True, "Also show the monitor stopping a collapsing run.")


def make_data(n, seed=0):
    """Two 16-dimensional Gaussian blobs, labels 0 and 1."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.standard_normal((n, 16)) + 1.5 * y[:, None]
    return x.astype("float32"), y.astype("int32")


def build_model():
    return keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(100, activation="relu"),   # 100: not a multiple of 8
        keras.layers.Dense(2, activation="softmax"),  # softmax at the output
    ], name="mlp")


class OverflowingGradient(keras.layers.Layer):
    """Identity whose gradient is infinite: every step overflows."""

    def call(self, x):
        @tf.custom_gradient
        def identity(v):
            return tf.identity(v), lambda dy: dy * tf.cast(float("inf"), dy.dtype)

        return identity(x)


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    model = build_model()  # the common mistake: built before enable()
    enabled = tf_mixed.enable(_POLICY.value)
    print(f"policy {enabled.policy}: {enabled.reason}\n")

    print("== audit of the model as built (float32, before enable) ==")
    print(tf_mixed.audit(model, batch_size=_BATCH.value), "\n")
    if enabled.policy != "float32":
        model = tf_mixed.convert(model)
        print("== audit after tf_mixed.convert(model) ==")
        print(tf_mixed.audit(model, batch_size=_BATCH.value), "\n")

    model.compile(
        optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam(1e-2)),
        loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks = [LossScaleMonitor()]  # before TensorBoard, so it sees the values
    if importlib.util.find_spec("tensorboard") is not None:
        callbacks.append(keras.callbacks.TensorBoard(_LOGDIR.value))
        print(f"TensorBoard logs: {_LOGDIR.value}")
    else:
        print("(tensorboard is not installed: pip install tensorboard to "
              "write TensorBoard logs; History still has the values)")
    x, y = make_data(32 * _BATCH.value)
    history = model.fit(x, y, batch_size=_BATCH.value, epochs=_EPOCHS.value,
                        verbose=2, callbacks=callbacks)
    for key in ("loss_scale", "skipped_steps", "skipped_fraction"):
        print(f"History {key}: {history.history[key]}")

    if not _COLLAPSE.value:
        return
    print("\n== a run whose gradients overflow on every step ==")
    broken = keras.Sequential([
        keras.Input((16,)), keras.layers.Dense(8), OverflowingGradient(),
        keras.layers.Dense(2), tf_mixed.OutputActivation("softmax")])
    broken.compile(
        optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.1), force=True,
                                          initial_scale=2.0**4),
        loss="sparse_categorical_crossentropy")
    monitor = LossScaleMonitor(patience=5)
    history = broken.fit(x, y, batch_size=_BATCH.value, epochs=5, verbose=0,
                         callbacks=[monitor])
    print(f"stopped after {len(history.history['loss'])} epoch(s); "
          f"{monitor.total_skipped_steps} steps skipped")
    print(f"reason: {monitor.stop_reason}")


if __name__ == "__main__":
    app.run(main)
