"""Peak memory of this process: resident set (Linux VmHWM) and TensorFlow's GPU allocator."""

from __future__ import annotations

import tensorflow as tf


def reset() -> bool:
    """Resets the peak-memory counters this process can reset.

    Returns:
        True when the resident-set peak was reset (Linux), False otherwise.
    """
    for gpu in tf.config.list_logical_devices("GPU"):
        try:
            tf.config.experimental.reset_memory_stats(gpu.name)
        except (ValueError, RuntimeError):
            pass
    try:  # Linux: "5" resets VmHWM (peak RSS) to the current RSS.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident memory in MiB since the last `reset` (Linux), else the lifetime peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource  # fallback: lifetime peak (cannot be reset)

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_gpu_mb() -> float | None:
    """TensorFlow's peak allocated GPU memory in MiB over every GPU; None without a GPU."""
    peaks = []
    for gpu in tf.config.list_logical_devices("GPU"):
        try:
            peaks.append(tf.config.experimental.get_memory_info(gpu.name)["peak"])
        except (ValueError, RuntimeError):
            pass
    return sum(peaks) / 2**20 if peaks else None
