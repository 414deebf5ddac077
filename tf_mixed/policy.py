"""Policy names, `enable` / `disable` / `policy_scope`, and the "auto" choice.

One table (`_POLICIES`) lists every accepted name; the parser and every error
message are built from it. `enable()` changes two pieces of global state, the
Keras dtype policy and (for float16 on a CPU-only host) TensorFlow's Grappler
"remapping" pass, and remembers both as they were so `disable()` can put them
back exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import keras
import tensorflow as tf
from absl import logging

from tf_mixed import hardware
from tf_mixed import keep_float32 as keep_float32_rules

AUTO = "auto"
MIXED_FLOAT16 = "mixed_float16"
MIXED_BFLOAT16 = "mixed_bfloat16"
FLOAT32 = "float32"

# name -> canonical Keras policy name ("auto" resolves per host).
_POLICIES = {
    AUTO: AUTO,
    MIXED_FLOAT16: MIXED_FLOAT16,
    MIXED_BFLOAT16: MIXED_BFLOAT16,
    FLOAT32: FLOAT32,
    "fp16": MIXED_FLOAT16,
    "bf16": MIXED_BFLOAT16,
    "fp32": FLOAT32,
}

POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)
"""Every name `enable` accepts: canonical names first, then short aliases."""

_CPU_FLOAT16_WARNING = (
    "tf_mixed: mixed_float16 was requested on a host with no GPU. TensorFlow's "
    "CPU float16 kernels are far slower than float32 (measured on TF 2.21: "
    "a Dense model ~300x slower with the fused MatMul+BiasAdd kernel, the "
    "Conv2D filter gradient ~600x slower): TF has no fast float16 CPU kernels "
    "for these ops. tf_mixed has turned off TF's 'remapping' graph pass, so "
    "Dense layers train at about half float32's speed instead; convolution "
    "training stays slow. Use "
    "tf_mixed.enable('auto') or 'float32' on this host, or 'mixed_bfloat16' on "
    "a CPU with AMX-BF16."
)


@dataclasses.dataclass(frozen=True)
class Enabled:
    """What `enable` did.

    Attributes:
        policy: The Keras policy now active: "mixed_float16",
            "mixed_bfloat16" or "float32".
        reason: Why this policy, in one sentence a user can act on.
        requested: The name that was passed to `enable`, as given.
    """

    policy: str
    reason: str
    requested: str

    def __str__(self) -> str:
        return f"{self.policy} ({self.reason})"


@dataclasses.dataclass(frozen=True)
class _GlobalState:
    """The global settings `enable` may change, as they were before."""

    keras_policy: keras.DTypePolicy
    remapping: bool | None  # None: TF's default (not set explicitly)

    @classmethod
    def capture(cls) -> "_GlobalState":
        options = tf.config.optimizer.get_experimental_options()
        return cls(keras.config.dtype_policy(), options.get("remapping"))

    def restore(self) -> None:
        keras.config.set_dtype_policy(self.keras_policy)
        # An option that was unset before goes back to TF's default (on).
        remapping = True if self.remapping is None else self.remapping
        tf.config.optimizer.set_experimental_options({"remapping": remapping})


# State before the first `enable()` that has not been undone yet.
_saved: _GlobalState | None = None


def canonical_name(name: object) -> str:
    """Resolves a policy name or alias to its canonical form.

    Args:
        name: One of `POLICY_NAMES`.

    Returns:
        "auto", "mixed_float16", "mixed_bfloat16" or "float32".

    Raises:
        TypeError: If `name` is not a string.
        ValueError: If `name` is not one of `POLICY_NAMES`.
    """
    if not isinstance(name, str):
        raise TypeError(
            "The policy must be a string, such as 'mixed_float16'. "
            f"Received: policy={name!r} (of type {type(name).__name__}). "
            f"Valid names: {', '.join(POLICY_NAMES)}."
        )
    key = name.strip().lower()
    if key not in _POLICIES:
        raise ValueError(
            f"Unknown policy {name!r}. Valid names: {', '.join(POLICY_NAMES)}. "
            "Use 'auto' to let tf_mixed choose for this hardware."
        )
    return _POLICIES[key]


def choose_auto(info: hardware.HardwareInfo) -> tuple[str, str]:
    """Chooses the fastest safe policy for the given hardware.

    Rules, first match wins: a CUDA GPU with compute capability >= 7.0 gives
    mixed_float16; any other GPU gives float32; a TPU gives mixed_bfloat16; a
    CPU whose AMX-BF16 units the kernel enables gives mixed_bfloat16; anything
    else gives float32, because TF's CPU half-precision kernels are slower
    than float32 there.

    Args:
        info: The host description, e.g. `hardware.detect()`.

    Returns:
        ``(policy, reason)``.
    """
    force_hint = "force one with tf_mixed.enable('mixed_float16') or 'mixed_bfloat16'"
    if info.gpus:
        gpu = min(info.gpus, key=lambda g: g.compute_capability or (0, 0))
        index = info.gpus.index(gpu)
        if gpu.compute_capability is None:
            return FLOAT32, (
                f"GPU {index} ({gpu.name}) reports no CUDA compute capability, so "
                f"Tensor Core support is unknown; {force_hint}"
            )
        major, minor = gpu.compute_capability
        if gpu.has_tensor_cores:
            return MIXED_FLOAT16, (
                f"GPU {index} has compute capability {major}.{minor} (Tensor Cores)"
            )
        return FLOAT32, (
            f"GPU {index} has compute capability {major}.{minor}, below 7.0: no "
            f"Tensor Cores, so float16 brings little speed; {force_hint}"
        )
    if info.tpu:
        return MIXED_BFLOAT16, "a TPU is attached; TPUs compute natively in bfloat16"
    if info.amx_bf16_usable:
        return MIXED_BFLOAT16, (
            "no GPU; the CPU has AMX-BF16 tile units (amx_bf16 in /proc/cpuinfo, "
            "enabled by the kernel), which oneDNN uses for bfloat16 matmuls"
        )
    return FLOAT32, (
        "no GPU, TPU or AMX-BF16 CPU: TensorFlow's float16/bfloat16 CPU kernels "
        f"are slower than float32 here; {force_hint}"
    )


def _explicit_reason(name: str, info: hardware.HardwareInfo | None) -> str:
    if name == FLOAT32:
        return "float32 requested explicitly"
    if name == MIXED_FLOAT16 and info is not None and not info.has_gpu:
        return (
            "mixed_float16 requested explicitly; no GPU, so TF's remapping pass "
            "is off to avoid the slow fused float16 CPU kernel"
        )
    return f"{name} requested explicitly"


def enable(policy: str = AUTO, *, quiet: bool = False, keep_float32=()) -> Enabled:
    """Sets Keras's global dtype policy to a mixed-precision policy.

    Layers built after this call compute in the policy's dtype and keep their
    variables in float32. Calling `enable` again switches policy; `disable`
    then restores what was active before the first call.

    Args:
        policy: One of `POLICY_NAMES`; "auto" chooses from the hardware (see
            `choose_auto`). An explicit name is always honoured.
        quiet: If True, do not log the choice (warnings are still logged).
        keep_float32: Layers to keep computing in float32 in models built
            afterwards: layer names, layer classes, predicates ``layer ->
            bool``, or a list of these (see `tf_mixed.keep_float32`).

    Returns:
        An `Enabled` with the active policy and the reason for it.

    Raises:
        TypeError: If `policy` is not a string, or `keep_float32` holds
            something that is not a name, class or predicate.
        ValueError: If `policy` is not a known name. The global policy is left
            exactly as it was.

    Example:

        >>> enabled = tf_mixed.enable("bf16")
        >>> enabled.policy
        'mixed_bfloat16'
    """
    global _saved
    name = canonical_name(policy)  # validates before anything changes
    keep_float32_rules.activate(keep_float32)  # validates; applies once the policy is set
    info = hardware.detect() if name in (AUTO, MIXED_FLOAT16) else None
    if name == AUTO:
        name, reason = choose_auto(info)
    else:
        reason = _explicit_reason(name, info)

    if _saved is None:
        _saved = _GlobalState.capture()
    # Every enable starts from the state saved before the first one, so that
    # switching e.g. fp16 -> bf16 also gives back the remapping pass.
    _saved.restore()
    if name == MIXED_FLOAT16 and not info.has_gpu:
        # Fact measured on TF 2.21: Grappler fuses MatMul+BiasAdd into a float16
        # _FusedMatMul whose CPU kernel is >1000x slower than the plain matmul
        # (a Dense model trains ~300x slower; see BUILD_NOTES.md).
        tf.config.optimizer.set_experimental_options({"remapping": False})
        logging.warning(_CPU_FLOAT16_WARNING)
    keras.mixed_precision.set_dtype_policy(name)

    enabled = Enabled(policy=name, reason=reason, requested=policy)
    if not quiet:
        logging.info("tf_mixed: policy %s, because %s", enabled.policy, enabled.reason)
    return enabled


def disable() -> None:
    """Restores the policy and TF options that were active before `enable`.

    Does nothing if `enable` has not been called (or was already undone).
    """
    global _saved
    if _saved is None:
        return
    _saved.restore()
    _saved = None


@contextlib.contextmanager
def policy_scope(policy: str) -> Iterator[Enabled]:
    """Enables `policy` for the body of a ``with`` block.

    On exit, also when the body raises, the global policy, TF options and
    `enable`/`disable` bookkeeping are exactly as they were on entry.

    Args:
        policy: One of `POLICY_NAMES`.

    Yields:
        The `Enabled` result.

    Raises:
        TypeError, ValueError: As `enable`, before anything changes.

    Example:

        >>> with tf_mixed.policy_scope("mixed_bfloat16"):
        ...     model = build_model()
    """
    global _saved
    canonical_name(policy)
    outer_state, outer_saved = _GlobalState.capture(), _saved
    _saved = None  # this scope's enable() must save the state on entry
    try:
        yield enable(policy, quiet=True)
    finally:
        outer_state.restore()
        _saved = outer_saved


def current() -> str:
    """The name of Keras's global dtype policy, e.g. "mixed_float16"."""
    return keras.config.dtype_policy().name


def _reset_for_tests() -> None:
    """Forgets any saved state (the test fixture restores globals itself)."""
    global _saved
    _saved = None
