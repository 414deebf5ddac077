"""What this host has: GPUs with their compute capability, TPUs, CPU flags.

`detect()` reads it once per process (``python -m tf_mixed info`` prints it).
Everything the "auto" policy choice needs is
in the `HardwareInfo` value, so the choice can be tested on faked hardware.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import platform

_CPUINFO = "/proc/cpuinfo"

# Linux x86-64: arch_prctl(ARCH_GET_XCOMP_SUPP) lists the extended CPU states
# the kernel supports; AMX needs XTILEDATA (bit 18) on top of the cpuinfo flag,
# otherwise oneDNN cannot use the tiles even though the CPU has them.
_SYS_ARCH_PRCTL = 158
_ARCH_GET_XCOMP_SUPP = 0x1021
_XFEATURE_XTILEDATA = 18


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU as TensorFlow sees it.

    Attributes:
        name: Device name, e.g. ``"NVIDIA A100-SXM4-40GB"``.
        compute_capability: CUDA compute capability ``(major, minor)``, or
            ``None`` when TensorFlow does not report one (e.g. ROCm).
    """

    name: str
    compute_capability: tuple[int, int] | None = None

    @property
    def has_tensor_cores(self) -> bool:
        """Whether float16 Tensor Cores exist (compute capability >= 7.0)."""
        return (
            self.compute_capability is not None
            and tuple(self.compute_capability) >= (7, 0)
        )


@dataclasses.dataclass(frozen=True)
class HardwareInfo:
    """A description of the host, enough to choose a precision policy.

    Attributes:
        gpus: The GPUs TensorFlow can use, in device order.
        tpu: Whether a TPU is attached.
        cpu_model: The CPU's model name from /proc/cpuinfo ("" if unknown).
        cpu_flags: The CPU feature flags from /proc/cpuinfo.
        amx_bf16_usable: Whether the CPU has AMX-BF16 *and* the kernel lets a
            process use the AMX tile state (so oneDNN can run bfloat16 on it).
    """

    gpus: tuple[GpuInfo, ...] = ()
    tpu: bool = False
    cpu_model: str = ""
    cpu_flags: frozenset[str] = frozenset()
    amx_bf16_usable: bool = False

    @property
    def has_gpu(self) -> bool:
        """Whether at least one GPU is present."""
        return bool(self.gpus)


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Reads the first processor's model name and flags from cpuinfo text.

    Args:
        text: Contents of /proc/cpuinfo.

    Returns:
        ``(model_name, flags)``; empty values for fields that are missing.
    """
    model: str = ""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
        if model and flags:
            break
    return model, flags


def _kernel_allows_amx_tiles() -> bool:
    """Whether the Linux kernel supports the AMX tile-data state for processes."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        supported = ctypes.c_uint64(0)
        status = libc.syscall(
            _SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_SUPP, ctypes.byref(supported)
        )
    except (OSError, AttributeError):
        return False
    return status == 0 and bool(supported.value & (1 << _XFEATURE_XTILEDATA))


def _read_cpu() -> tuple[str, frozenset[str]]:
    try:
        with open(_CPUINFO, encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return platform.processor(), frozenset()


def _tf_accelerators() -> tuple[tuple[GpuInfo, ...], bool]:
    import tensorflow as tf

    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        try:
            details = tf.config.experimental.get_device_details(device)
        except (ValueError, RuntimeError):
            details = {}
        capability = details.get("compute_capability")
        gpus.append(
            GpuInfo(
                name=details.get("device_name", device.name),
                compute_capability=tuple(capability) if capability else None,
            )
        )
    tpu = bool(tf.config.list_physical_devices("TPU"))
    return tuple(gpus), tpu


def read_host() -> HardwareInfo:
    """Describes this host afresh (`detect` caches this for the process).

    Listing physical devices does not initialise TensorFlow's runtime, so this
    may be called before logical devices are configured.

    Returns:
        A `HardwareInfo`.
    """
    gpus, tpu = _tf_accelerators()
    model, flags = _read_cpu()
    amx = "amx_bf16" in flags and "amx_tile" in flags and _kernel_allows_amx_tiles()
    return HardwareInfo(
        gpus=gpus, tpu=tpu, cpu_model=model, cpu_flags=flags, amx_bf16_usable=amx
    )


@functools.lru_cache(maxsize=1)
def detect() -> HardwareInfo:
    """Describes this host; the result is cached for the process.

    Everything that decides by the hardware calls this (tests fake it).

    Returns:
        A `HardwareInfo` (see `read_host`).
    """
    return read_host()

