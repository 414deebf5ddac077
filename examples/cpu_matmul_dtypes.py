"""Raw matmul throughput per dtype: does this CPU have fast half precision?

    python examples/cpu_matmul_dtypes.py [--size=1024] [--repeats=20]

Prints GFLOP/s for float32, bfloat16 and float16 and the hardware report, so
the "auto" choice (tf_mixed.policy.hardware / tf_mixed.policy) can be checked against
what the kernels really do on this host. Run with ONEDNN_VERBOSE=1 to see which
oneDNN implementation (e.g. brg_matmul:avx10_1_512_amx) each dtype used.
"""

import time

import tensorflow as tf
from absl import app, flags

from tf_mixed.cli import info

_SIZE = flags.DEFINE_integer("size", 1024, "Square matrix size.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed matmuls per dtype.")


def gflops(dtype: tf.DType) -> float:
    """Mean throughput of `repeats` square matmuls in `dtype`."""
    size = _SIZE.value
    a = tf.cast(tf.random.stateless_normal((size, size), seed=(1, 2)), dtype)
    matmul = tf.function(lambda x: tf.matmul(x, x))
    matmul(a).numpy()
    start = time.perf_counter()
    for _ in range(_REPEATS.value):
        result = matmul(a)
    result.numpy()
    seconds = (time.perf_counter() - start) / _REPEATS.value
    return 2 * size**3 / seconds / 1e9


def main(argv):
    del argv
    print(info.report())  # what `python -m tf_mixed info` prints
    base = gflops(tf.float32)
    for dtype in (tf.float32, tf.bfloat16, tf.float16):
        value = base if dtype == tf.float32 else gflops(dtype)
        print(f"matmul {_SIZE.value}x{_SIZE.value} {dtype.name:9s} "
              f"{value:8.1f} GFLOP/s ({value / base:.2f}x float32)")


if __name__ == "__main__":
    app.run(main)
