"""A GradientTape loop with tf_mixed's loss scaling, on one device.

    python examples/custom_loop.py [--policy=mixed_float16] [--steps=60]
        [--overflow_at=20] [--batch_size=64]

Trains a small MLP classifier on two Gaussian blobs generated in process. At
step ``--overflow_at`` the loss is multiplied by infinity, as a float16
overflow would do: the step is skipped (weights untouched), the scale halves,
and training carries on. Prints loss, scale and skipped steps as it goes.
"""

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import tf_mixed

_POLICY = flags.DEFINE_enum("policy", "mixed_float16", list(tf_mixed.policy.POLICY_NAMES),
                            "Mixed-precision policy.")
_STEPS = flags.DEFINE_integer("steps", 60, "Training steps.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Examples per step.")
_OVERFLOW_AT = flags.DEFINE_integer(
    "overflow_at", 20, "Step whose loss is made infinite (0: never).")


def make_data(n, seed=0):
    """Two 16-dimensional Gaussian blobs, labels 0 and 1."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.standard_normal((n, 16)) + 1.5 * y[:, None]
    return x.astype("float32"), y.astype("int32")


def main(argv):
    del argv
    enabled = tf_mixed.enable(_POLICY.value)
    print(f"policy {enabled.policy}: {enabled.reason}")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(2),
        tf_mixed.OutputActivation("softmax"),  # softmax in float32
    ])
    # Always wrapped here, so the skip is visible under every policy.
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.1), force=True,
                                        growth_interval=25)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    x_all, y_all = make_data(_STEPS.value * _BATCH.value)
    dataset = tf.data.Dataset.from_tensor_slices((x_all, y_all)).batch(
        _BATCH.value)

    @tf.function
    def train_step(x, y, blow_up):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) * blow_up
        applied = tf_mixed.training.apply_scaled_gradients(
            tape, loss, model.trainable_variables, optimizer, clip_norm=5.0)
        return loss, applied

    for step, (x, y) in enumerate(dataset, start=1):
        blow_up = tf.constant(np.inf if step == _OVERFLOW_AT.value else 1.0)
        loss, applied = train_step(x, y, blow_up)
        if step % 10 == 0 or not bool(applied):
            print(f"step {step:3d}  loss {float(loss):8.4f}  applied "
                  f"{bool(applied)!s:5}  scale {float(optimizer.loss_scale):8.0f}"
                  f"  skipped {int(optimizer.skipped_steps)}")
    weights_finite = all(np.isfinite(w).all() for w in model.get_weights())
    print(f"weights finite: {weights_finite}")
    tf_mixed.disable()
    return 0 if weights_finite else 1


if __name__ == "__main__":
    app.run(main)
