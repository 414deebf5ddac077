"""The host's large-matmul speed in half precision against float32."""

# `measure_ratio` times one square matmul in float32 and in a half dtype, in
# alternating rounds, and reports the median of the per-round ratios: the most
# a matmul-bound model can gain on this host, the reference line the main
# job's table and plot put beside each model's own ratio.

from __future__ import annotations

import functools
import statistics
from typing import Any

import tensorflow as tf

from tf_mixed._internal import measuring

CPU_SIZE = 1024
GPU_SIZE = 4096


def measure_ratio(dtype: str, *, size: int = 0, rounds: int = 3,
                  repeats: int = 3) -> dict[str, Any]:
    """Times a ``size`` x ``size`` matmul in float32 and ``dtype``, rounds alternating.

    Args:
        dtype: "bfloat16" or "float16".
        size: Matrix side; 0: `GPU_SIZE` on a GPU, `CPU_SIZE` on a CPU.
        rounds: Alternating rounds (float32 then ``dtype``).
        repeats: Matmuls per timing.

    Returns:
        ``{"dtype", "size", "ratio", "ratios", "float32_gflops", "half_gflops"}``:
        ``ratio`` is the median of the rounds' half/float32 speed ratios.
    """
    gpu = bool(tf.config.list_logical_devices("GPU"))
    size = size or (GPU_SIZE if gpu else CPU_SIZE)
    flops = 2.0 * size**3 * repeats
    steps = {name: _step(name, size, repeats) for name in ("float32", dtype)}
    for step in steps.values():
        step()  # trace and warm up
    seconds = measuring.interleaved_rounds(  # each dtype leads in turn
        {name: functools.partial(measuring.fastest, step, 1) for name, step in steps.items()},
        rounds)
    ratios = [f / h for f, h in zip(seconds["float32"], seconds[dtype])]
    return {
        "dtype": dtype,
        "size": size,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "float32_gflops": flops / statistics.median(seconds["float32"]) / 1e9,
        "half_gflops": flops / statistics.median(seconds[dtype]) / 1e9,
    }


def _step(dtype: str, size: int, repeats: int):
    a = tf.cast(tf.random.stateless_uniform((size, size), seed=(1, 2)), dtype)
    b = tf.cast(tf.random.stateless_uniform((size, size), seed=(3, 4)), dtype)

    @tf.function
    def run():
        return tf.cast(tf.linalg.matmul(a, b)[0, 0], tf.float32)

    def timed():
        for _ in range(repeats):
            float(run())  # waits for the device

    return timed
