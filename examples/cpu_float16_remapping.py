"""Measures why tf_mixed.enable("mixed_float16") turns off remapping on a CPU.

Trains the same Dense model for one epoch three ways and prints samples/s:

1. float32;
2. mixed_float16 set with plain Keras (TF's Grappler "remapping" pass fuses
   MatMul+BiasAdd into a float16 _FusedMatMul whose CPU kernel is very slow);
3. mixed_float16 set with tf_mixed.enable (remapping off).

    python examples/cpu_float16_remapping.py
    python examples/cpu_float16_remapping.py --samples=4096 --width=1024

The slow case runs on `--slow_samples` samples only, so the default finishes in
well under a minute.
"""

import time

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import tf_mixed

_SAMPLES = flags.DEFINE_integer("samples", 4096, "Samples per timed epoch.")
_SLOW_SAMPLES = flags.DEFINE_integer(
    "slow_samples", 512, "Samples per timed epoch for the slow (remapping on) case."
)
_WIDTH = flags.DEFINE_integer("width", 512, "Units of each hidden Dense layer.")
_BATCH = flags.DEFINE_integer("batch_size", 128, "Batch size.")


def samples_per_second(samples: int) -> float:
    """Builds a fresh model under the current policy and times one epoch."""
    rng = np.random.default_rng(0)
    x = rng.random((samples, 784), dtype=np.float32)
    y = rng.integers(0, 10, samples)
    model = keras.Sequential(
        [keras.Input((784,))]
        + [keras.layers.Dense(_WIDTH.value, activation="relu") for _ in range(2)]
        + [keras.layers.Dense(10), tf_mixed.OutputActivation("softmax")]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    batch = _BATCH.value
    model.fit(x[:batch], y[:batch], batch_size=batch, verbose=0)  # trace, warm up
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    return samples / (time.perf_counter() - start)


def main(argv):
    del argv
    results = {}
    with tf_mixed.policy_scope("float32"):
        results["float32"] = samples_per_second(_SAMPLES.value)
    keras.mixed_precision.set_dtype_policy("mixed_float16")  # plain Keras
    tf.config.optimizer.set_experimental_options({"remapping": True})
    results["mixed_float16, remapping on (plain Keras)"] = samples_per_second(
        _SLOW_SAMPLES.value
    )
    keras.mixed_precision.set_dtype_policy("float32")
    with tf_mixed.policy_scope("mixed_float16"):
        results["mixed_float16, tf_mixed.enable (remapping off)"] = (
            samples_per_second(_SAMPLES.value)
        )
    base = results["float32"]
    print(f"Dense 784-{_WIDTH.value}-{_WIDTH.value}-10, batch {_BATCH.value}, "
          f"TF {tf.__version__}")
    for name, value in results.items():
        print(f"{name:48s} {value:10.0f} samples/s  ({value / base:.3f}x float32)")


if __name__ == "__main__":
    app.run(main)
