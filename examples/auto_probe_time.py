"""How long enable("auto") takes on a CPU: the first call (timing) and a cached one.

    python examples/auto_probe_time.py

Uses a fresh temporary cache directory (TF_MIXED_CACHE_DIR), so the first
call always measures; prints both wall times, the policy picked and the
reason (which quotes the measured ratio). TensorFlow is imported before the
clock starts, so the figures are tf_mixed's cost, not TF's start-up.
"""

import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402,F401  (TF start-up outside the timing)

import tf_mixed  # noqa: E402


def main():
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TF_MIXED_CACHE_DIR"] = cache
        os.environ.pop("TF_MIXED_AUTO_MEASURE", None)
        tf_mixed.hardware.detect()  # device listing outside the timing too
        start = time.perf_counter()
        first = tf_mixed.enable("auto", quiet=True)
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        second = tf_mixed.enable("auto", quiet=True)
        second_s = time.perf_counter() - start
    print(f"first enable('auto') (measures): {first_s:.3f} s -> {first.policy}")
    print(f"  reason: {first.reason}")
    print(f"second enable('auto') (cached):  {second_s * 1000:.1f} ms -> {second.policy}")
    print(f"  reason: {second.reason}")


if __name__ == "__main__":
    main()
