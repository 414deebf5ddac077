"""Tests for tf_mixed.policy.hardware and the "auto" policy rules on faked hardware."""

import pytest

from tf_mixed.policy import global_policy as policy
from tf_mixed.policy import hardware
from tf_mixed.policy.hardware import GpuInfo, HardwareInfo

# The real, cached detect(), taken before any fixture fakes it.
_REAL_DETECT = hardware.detect

CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme avx2 avx512f avx512_bf16 amx_bf16 amx_tile
processor\t: 1
model name\t: second cpu is ignored
flags\t\t: fpu
"""


def test_parse_cpuinfo_reads_first_processor():
    model, flags = hardware.parse_cpuinfo(CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert flags == frozenset(
        {"fpu", "vme", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    )


def test_parse_cpuinfo_empty():
    assert hardware.parse_cpuinfo("") == ("", frozenset())


@pytest.mark.slow
@pytest.mark.parametrize(
    "info, expected, reason_part",
    [
        (HardwareInfo(gpus=(GpuInfo("P100", (6, 1)),)), "float32", "6.1, below 7.0"),
        (HardwareInfo(gpus=(GpuInfo("V100", (7, 0)),)), "mixed_float16", "7.0 (Tensor Cores)"),
        (HardwareInfo(gpus=(GpuInfo("A100", (8, 0)),)), "mixed_float16",
         "GPU 0 has compute capability 8.0 (Tensor Cores)"),
        # The weakest GPU decides: MirroredStrategy runs on all of them.
        (HardwareInfo(gpus=(GpuInfo("A100", (8, 0)), GpuInfo("P100", (6, 1)))),
         "float32", "GPU 1 has compute capability 6.1"),
        (HardwareInfo(gpus=(GpuInfo("ROCm", None),)), "float32", "no CUDA compute capability"),
        (HardwareInfo(tpu=True), "mixed_bfloat16", "TPU"),
        (HardwareInfo(cpu_flags=frozenset({"amx_bf16", "amx_tile"}), amx_bf16_usable=True),
         "mixed_bfloat16", "AMX-BF16"),
        # The flag alone is not enough: the kernel must enable the tile state.
        (HardwareInfo(cpu_flags=frozenset({"amx_bf16", "amx_tile"}), amx_bf16_usable=False),
         "float32", "CPU rule (not measured)"),
        (HardwareInfo(cpu_flags=frozenset({"avx512_bf16", "avx512_fp16"})),
         "float32", "CPU rule (not measured)"),
        (HardwareInfo(), "float32", "CPU rule (not measured)"),
    ],
)
def test_choose_auto_on_faked_hardware(info, expected, reason_part):
    chosen, reason = policy.choose_auto(info)
    assert chosen == expected
    assert reason_part in reason


@pytest.mark.slow
@pytest.mark.parametrize(
    "info",
    [HardwareInfo(), HardwareInfo(gpus=(GpuInfo("P100", (6, 1)),))],
)
def test_float32_reason_says_how_to_force(info):
    chosen, reason = policy.choose_auto(info)
    assert chosen == "float32"
    assert "tf_mixed.enable('mixed_float16')" in reason


def test_gpu_tensor_cores_property():
    assert GpuInfo("x", (7, 5)).has_tensor_cores
    assert not GpuInfo("x", (6, 1)).has_tensor_cores
    assert not GpuInfo("x", None).has_tensor_cores


def test_detect_matches_proc_cpuinfo():
    # The real detect, not a faked one (TF_MIXED_FAKE_HARDWARE=gpu fakes it).
    info = hardware.read_host()
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        model, flags = hardware.parse_cpuinfo(f.read())
    assert info.cpu_model == model
    assert info.cpu_flags == flags
    if "amx_bf16" not in flags:
        assert not info.amx_bf16_usable


def test_detect_lists_the_gpus_tensorflow_sees(monkeypatch):
    """Whatever this host has: GPUs come from TF's device list, in order."""
    monkeypatch.setattr(
        hardware, "_tf_accelerators",
        lambda: ((GpuInfo("A", (8, 0)), GpuInfo("B", (7, 5))), False),
    )
    info = hardware.read_host()
    assert [g.name for g in info.gpus] == ["A", "B"]
    assert info.has_gpu and not info.tpu


def test_fake_hardware_mode_is_in_effect_or_detect_is_real():
    """TF_MIXED_FAKE_HARDWARE=gpu (conftest.py) runs tests as on a GPU host."""
    import os

    if os.environ.get("TF_MIXED_FAKE_HARDWARE") == "gpu":
        info = hardware.detect()
        assert [g.compute_capability for g in info.gpus] == [(8, 0)]
        assert "TF_MIXED_FAKE_HARDWARE" in info.gpus[0].name
        assert policy.choose_auto(info)[0] == "mixed_float16"
    else:
        assert hardware.detect is _REAL_DETECT  # conftest faked nothing


def test_detect_reads_the_host_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(hardware, "_tf_accelerators",
                        lambda: calls.append(1) or ((GpuInfo("A", (8, 0)),), False))
    _REAL_DETECT.cache_clear()
    try:
        first = _REAL_DETECT()
        assert _REAL_DETECT() is first
        assert calls == [1] and [g.name for g in first.gpus] == ["A"]
    finally:
        _REAL_DETECT.cache_clear()  # the next caller reads the real host
