"""How long "auto" takes on a CPU: the first call (it times) and a cached one.

    python examples/auto_probe_time.py

Uses a fresh temporary cache directory (TF_MIXED_CACHE_DIR), so the first
call always measures: `autotune.measured_choice`, which is what
`enable("auto")` runs on a host without GPU or TPU. The second call is
`tf_mixed.enable("auto")` itself, reading the cache. Prints both wall times,
the policy and the reason (which quotes the measured ratio). TensorFlow is
imported and the hardware detected before the clock starts, so the figures
are tf_mixed's cost, not TF's start-up. A measurement that is not settled
(wide spread, or a spread across the margin) or taken on a busy machine (load
average above 1.5 per CPU) is not cached: the second call then measures
again, and its reason says so.
"""

import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402,F401  (TF start-up outside the timing)

import tf_mixed  # noqa: E402
from tf_mixed.policy import autotune  # noqa: E402


def main():
    info = tf_mixed.policy.hardware.detect()
    if info.gpus or info.tpu:
        print("This host has a GPU or TPU: enable('auto') uses the rules, nothing is timed.")
        return
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TF_MIXED_CACHE_DIR"] = cache
        os.environ.pop("TF_MIXED_AUTO_MEASURE", None)
        start = time.perf_counter()
        first = autotune.measured_choice(info)
        first_s = time.perf_counter() - start
        print(f"first call (measures): {first_s:.3f} s -> {first.policy}")
        print(f"  reason: {first.reason}")
        start = time.perf_counter()
        second = tf_mixed.enable("auto", quiet=True)
        second_s = time.perf_counter() - start
    print(f"second call, enable('auto'): {second_s * 1000:.2f} ms -> {second.policy}")
    print(f"  reason: {second.reason}")


if __name__ == "__main__":
    main()
