"""The float8 agreement tests' model, data and runs, shared with the worker script.

A functional model of three float8 Dense layers (16 -> 32 -> 32 -> 16, all
quantized: ``keep_float32=[]``), seeded. Each step's global batch has 8
rows; the second half (replica 1's or worker 1's shard) is 10x larger, so
per-replica amaxes differ by about 10x.
"""

import keras
import numpy as np
import tensorflow as tf

import tf_mixed

GLOBAL_BATCH = 8
FEATURES = 16
KINDS = ("inputs", "kernel", "outputs_grad")
LAYERS = ("a", "b", "c")


def build_model(**quantize_args):
    """The seeded model, quantized to float8 (every Dense)."""
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(32, name="a",
                           kernel_initializer=keras.initializers.GlorotUniform(1))(inputs)
    h = keras.layers.Dense(32, name="b", activation="relu",
                           kernel_initializer=keras.initializers.GlorotUniform(2))(h)
    outputs = keras.layers.Dense(16, name="c",
                                 kernel_initializer=keras.initializers.GlorotUniform(3))(h)
    model = keras.Model(inputs, outputs)
    tf_mixed.float8.quantize(model, keep_float32=[], **quantize_args)
    return model


def batches(steps, seed=0):
    """``steps`` global batches (x, y); rows 4..7 of x are 10x larger."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, GLOBAL_BATCH, FEATURES)).astype("float32")
    x[:, GLOBAL_BATCH // 2:] *= 10.0
    y = rng.normal(size=(steps, GLOBAL_BATCH, FEATURES)).astype("float32")
    return x, y


def loss_fn(y, pred):
    return tf.reduce_mean(tf.square(tf.cast(pred, tf.float32) - y))


def float8_values(model):
    """{layer/kind_scale: [copies...], layer/kind_amax_history: [...]} as lists."""
    out = {}
    for name in LAYERS:
        layer = model.get_layer(name)
        for kind in KINDS:
            for suffix in ("scale", "amax_history"):
                variable = getattr(layer, f"{kind}_{suffix}")
                value = variable.value
                parts = value.values if isinstance(
                    value, tf.distribute.DistributedValues) else [value]
                out[f"{name}/{kind}_{suffix}"] = [
                    np.asarray(p.numpy(), np.float32).ravel().tolist() for p in parts]
    return out


def shard(strategy, array):
    """Replica r of ``strategy`` gets rows [r*n, (r+1)*n) of ``array``."""
    n = array.shape[0] // strategy.num_replicas_in_sync

    def piece(context):
        r = context.replica_id_in_sync_group
        return tf.constant(array[r * n:(r + 1) * n])

    return strategy.experimental_distribute_values_from_function(piece)


def one_device_run(steps, optimizer_fn, seed=0, **quantize_args):
    """The reference: one device, the global batch, ``steps`` steps."""
    model = build_model(**quantize_args)
    optimizer = optimizer_fn()
    step = tf_mixed.training.make_train_step(model, loss_fn, optimizer)
    x, y = batches(steps, seed)
    for i in range(steps):
        step(tf.constant(x[i]), tf.constant(y[i]))
    return model, optimizer
