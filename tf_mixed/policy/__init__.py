"""The dtype policy: `enable`, `disable`, `policy_scope`, "auto" (hardware, autotune), `keep_float32`, and the one owner of hidden policy state.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.policy.hardware import (  # noqa: F401
    GpuInfo,
    HardwareInfo,
    detect,
    parse_cpuinfo,
    read_host,
)
from tf_mixed.policy.keep_float32 import (  # noqa: F401
    KeepFloat32,
    Spec,
    activate,
    active,
    argument,
    parse,
)
from tf_mixed.policy.global_policy import (  # noqa: F401
    Enabled,
    POLICY_NAMES,
    PolicyStatus,
    canonical_name,
    choose_auto,
    current,
    disable,
    enable,
    policy_scope,
    resolve_auto,
    status,
)
from tf_mixed.policy.state import (  # noqa: F401
    ThreadState,
    hold_remapping,
    keep_rules,
    release_remapping,
    remapping_holders,
    reset,
    scope_marker,
    set_keep_rules,
    set_remapping_hold,
    thread_state,
)

__all__ = [
    "Enabled",
    "GpuInfo",
    "HardwareInfo",
    "KeepFloat32",
    "POLICY_NAMES",
    "PolicyStatus",
    "Spec",
    "ThreadState",
    "activate",
    "active",
    "argument",
    "canonical_name",
    "choose_auto",
    "current",
    "detect",
    "disable",
    "enable",
    "hold_remapping",
    "keep_rules",
    "parse",
    "parse_cpuinfo",
    "policy_scope",
    "read_host",
    "release_remapping",
    "remapping_holders",
    "reset",
    "resolve_auto",
    "scope_marker",
    "set_keep_rules",
    "set_remapping_hold",
    "status",
    "thread_state",
]
