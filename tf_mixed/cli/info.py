"""The text of ``python -m tf_mixed info``: this host and what "auto" picks."""

from __future__ import annotations

import platform

from tf_mixed.policy import global_policy as policy
from tf_mixed.policy import hardware

REPORTED_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def report(info: hardware.HardwareInfo | None = None) -> str:
    """A human-readable report: devices found and what "auto" picks and why.

    Args:
        info: Hardware to describe; defaults to `tf_mixed.policy.hardware.detect()`.

    Returns:
        Multi-line text.
    """
    import keras
    import tensorflow as tf

    info = info or hardware.detect()
    lines = [
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"Python {platform.python_version()}",
        f"CPU: {info.cpu_model or 'unknown'}",
        "  half-precision flags: "
        + (", ".join(f for f in REPORTED_CPU_FLAGS if f in info.cpu_flags) or "none")
        + f"; AMX-BF16 usable: {'yes' if info.amx_bf16_usable else 'no'}",
    ]
    if info.gpus:
        for index, gpu in enumerate(info.gpus):
            cc = gpu.compute_capability
            cc_text = f"{cc[0]}.{cc[1]}" if cc else "unknown"
            lines.append(f"GPU {index}: {gpu.name}, compute capability {cc_text}")
    else:
        lines.append("GPU: none")
    lines.append(f"TPU: {'yes' if info.tpu else 'none'}")
    choice, reason = policy.resolve_auto(info)
    lines.append(f'tf_mixed.enable("auto") picks: {choice}')
    lines.append(f"  because: {reason}")
    lines.append(f"  measured on: {measured_on(info)}")
    return "\n".join(lines)


def measured_on(info: hardware.HardwareInfo) -> str:
    """What auto's host-wide choice was measured on, and where a model's own step is."""
    from tf_mixed.policy import autotune, model_check

    model = model_check.when_checked()
    if info.gpus or info.tpu:
        return f"nothing: GPUs and TPUs follow a rule; {model}"
    if not autotune.measure_by_default():
        return f"nothing: the CPU rule ({autotune.MEASURE_ENV} is off); {model}"
    return ("this host's Dense+Conv2D probe (one 1024-wide Dense, one 64-channel Conv2D), "
            f"not your model; {model}")
