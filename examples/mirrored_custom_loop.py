"""MirroredStrategy GradientTape loop where only replica 1 overflows.

    python examples/mirrored_custom_loop.py [--steps=30] [--overflow_at=10]
        [--compare_keras]

On a host without GPUs the CPU is split into two logical devices, so this
runs anywhere. At step ``--overflow_at`` only the examples that land on
replica 1 get an infinite loss. tf_mixed skips the step on both replicas;
with ``--compare_keras`` the same loop also runs with
``keras.optimizers.LossScaleOptimizer``, which applies the step and leaves
non-finite weights (it checks only replica 0's local gradients).
"""

import numpy as np
import tensorflow as tf
from absl import app, flags

_STEPS = flags.DEFINE_integer("steps", 30, "Training steps.")
_OVERFLOW_AT = flags.DEFINE_integer(
    "overflow_at", 10, "Step where replica 1's examples overflow (0: never).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Global batch size (even).")
_COMPARE = flags.DEFINE_bool(
    "compare_keras", False, "Also run keras.optimizers.LossScaleOptimizer.")


def make_strategy():
    """Two GPUs if present, else the CPU split into two logical devices."""
    # Physical, not logical, devices: listing logical ones would initialise
    # TF and forbid the split below.
    if len(tf.config.list_physical_devices("GPU")) >= 2:
        return tf.distribute.MirroredStrategy(["GPU:0", "GPU:1"])
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])


def train(strategy, wrapper):
    import keras

    import tf_mixed

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(1),
        ])
        optimizer = wrapper(keras.optimizers.SGD(0.05))
        optimizer.build(model.trainable_variables)

    def loss_fn(y, pred):
        # y[:, 1] == 1 marks an example whose loss overflows.
        blow_up = tf.where(y[:, 1:] > 0, np.inf, 1.0)
        return tf.reduce_mean(tf.square(pred - y[:, :1]) * blow_up)

    step = tf_mixed.training.make_train_step(model, loss_fn, optimizer,
                                             strategy=strategy)
    rng = np.random.default_rng(0)
    half = _BATCH.value // 2
    for number in range(1, _STEPS.value + 1):
        x = rng.standard_normal((_BATCH.value, 8)).astype("float32")
        y = np.zeros((_BATCH.value, 2), "float32")
        y[:, 0] = x.sum(axis=1)
        if number == _OVERFLOW_AT.value:
            y[half:, 1] = 1.0  # the second half is replica 1's shard
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(_BATCH.value)
        batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
        result = step(*batch)
        if number % 10 == 0 or number == _OVERFLOW_AT.value:
            state = tf_mixed.loss_scale_state(optimizer)
            # Keras's wrapper reports no skip signal, so only ours shows it.
            applied = (f"applied {bool(result['applied'])!s:5} "
                       if isinstance(optimizer, tf_mixed.LossScaleOptimizer) else "")
            print(f"  step {number:3d} loss {float(result['loss']):10.4f} "
                  f"{applied}scale {state.scale:8.0f}")
    return all(np.isfinite(w).all() for w in model.get_weights())


def main(argv):
    del argv
    import keras

    import tf_mixed

    strategy = make_strategy()
    print(f"{strategy.num_replicas_in_sync} replicas")
    print("tf_mixed.LossScaleOptimizer:")
    ok = train(strategy, lambda inner: tf_mixed.LossScaleOptimizer(inner))
    print(f"  weights finite: {ok}")
    if _COMPARE.value:
        print("keras.optimizers.LossScaleOptimizer:")
        keras_ok = train(strategy, keras.optimizers.LossScaleOptimizer)
        print(f"  weights finite: {keras_ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    app.run(main)
