"""The dtype policy (`tf_mixed.enable`): its names, its status, the tf-keras error."""

from tf_mixed._internal import moved as _moved
from tf_mixed._internal.facts import POLICY_NAMES  # noqa: F401
from tf_mixed._internal.tf_keras_check import TfKerasError  # noqa: F401

__all__ = [
    "POLICY_NAMES",
    "TfKerasError",
    "status",
]

# Names this face handed on before it kept only the documented ones; and, lazily,
# `status` and the submodules, which load Keras: the policy names load no TensorFlow
# (the command line checks its arguments with them before TensorFlow loads).
__getattr__ = _moved.face_getattr(__name__, {
    "Enabled": "tf_mixed",
    "GpuInfo": "tf_mixed.policy.hardware",
    "HardwareInfo": "tf_mixed.policy.hardware",
    "KeepFloat32": "tf_mixed.policy.keep_float32",
    "PolicyStatus": "tf_mixed.policy.global_policy",
    "Spec": "tf_mixed.policy.keep_float32",
    "ThreadState": "tf_mixed.policy.state",
    "activate": "tf_mixed.policy.keep_float32",
    "active": "tf_mixed.policy.keep_float32",
    "argument": "tf_mixed.policy.keep_float32",
    "canonical_name": "tf_mixed.policy.global_policy",
    "choose_auto": "tf_mixed.policy.global_policy",
    "current": "tf_mixed.policy.global_policy",
    "detect": "tf_mixed.policy.hardware",
    "disable": "tf_mixed",
    "enable": "tf_mixed",
    "hold_remapping": "tf_mixed.policy.state",
    "keep_rules": "tf_mixed.policy.state",
    "parse": "tf_mixed.policy.keep_float32",
    "parse_cpuinfo": "tf_mixed.policy.hardware",
    "policy_scope": "tf_mixed",
    "read_host": "tf_mixed.policy.hardware",
    "release_remapping": "tf_mixed.policy.state",
    "remapping_holders": "tf_mixed.policy.state",
    "reset": "tf_mixed.policy.state",
    "resolve_auto": "tf_mixed.policy.global_policy",
    "scope_marker": "tf_mixed.policy.state",
    "set_keep_rules": "tf_mixed.policy.state",
    "set_remapping_hold": "tf_mixed.policy.state",
    "thread_state": "tf_mixed.policy.state",
}, lazy={
    "status": "tf_mixed.policy.global_policy",
    **dict.fromkeys(("autotune", "global_policy", "half_kernels", "hardware", "keep_float32",
                     "state")),
})
