"""Worker: the documented training paths, run from this file (AutoGraph reads its source).

``fit`` with ``LossScaleMonitor`` and ``make_train_step``, each with and
without ``jit_compile=True``, under ``tf_mixed.enable(POLICY)`` (argv[1]), as
README.md and docs/fit.md and docs/custom-loops.md write them. A batch is
made to overflow in each so the skip path is traced and run too.
tests/test_no_alarms.py reads the output for TensorFlow and Keras alarms.
"""

import sys

import keras
import numpy as np
import tensorflow as tf

import tf_mixed

POLICY = sys.argv[1] if len(sys.argv) > 1 else "mixed_float16"


def build():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(4),
        tf_mixed.OutputActivation("softmax"),
    ])


def main():
    tf_mixed.enable(POLICY)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((192, 16)).astype("float32")
    y = rng.integers(0, 4, 192)
    bad = x.copy()
    bad[:8] = 1e30  # inf in float16: a skipped step
    for jit in (False, True):
        model = build()
        model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam()),
                      loss="sparse_categorical_crossentropy", jit_compile=jit)
        model.fit(np.concatenate([bad[:16], x]), np.concatenate([y[:16], y]), batch_size=16,
                  epochs=2,
                  verbose=0, callbacks=[tf_mixed.LossScaleMonitor()])
        model.evaluate(x, y, verbose=0)
        model.predict(x, verbose=0)
        print(f"fit jit_compile={jit}: done", flush=True)
    for jit in (False, True):
        model = build()
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))
        step = tf_mixed.training.make_train_step(
            model, keras.losses.SparseCategoricalCrossentropy(), opt, jit_compile=jit)
        for batch in (bad[:16], x[:16], x[16:32]):
            out = step(tf.constant(batch), tf.constant(y[:16]))
        print(f"make_train_step jit_compile={jit}: applied={bool(out['applied'])}", flush=True)
    strategy = tf_mixed.training.shared_mirrored_strategy(["CPU:0", "CPU:1"])
    with strategy.scope():
        model = build()
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))
        opt.build(model.trainable_variables)
    step = tf_mixed.training.make_train_step(
        model, keras.losses.SparseCategoricalCrossentropy(), opt, strategy=strategy)
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((np.concatenate([bad[:16], x[:32]]), np.concatenate(
            [y[:16], y[:32]]))).batch(16))
    for batch in data:
        step(*batch)
    print("make_train_step under MirroredStrategy: done", flush=True)


if __name__ == "__main__":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    main()
