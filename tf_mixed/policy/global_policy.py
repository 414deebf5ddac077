"""Policy names, `enable` / `disable` / `policy_scope`, and the "auto" choice."""

# One table (`tf_mixed._internal.facts.POLICY_ALIASES`) lists every accepted name; the parser and
# every error message are built from it. `enable()` changes two pieces of state, with the scope
# each really has: the Keras dtype policy, which Keras keeps per thread, so tf_mixed remembers it
# per thread too; and (for float16 on a CPU-only host) TensorFlow's Grappler "remapping" option,
# which is per process, so each thread takes a counted hold on it and it comes back only when no
# thread needs it off. All of that state lives in `tf_mixed.policy.state`. `policy_scope` also
# tells asyncio tasks apart (a context variable) and refuses to interleave their scopes, since
# they share their thread's Keras policy.
#
# "auto" follows rules on GPUs and TPUs and measures on CPUs (`tf_mixed.policy.autotune`).

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import keras
from absl import logging

from tf_mixed._internal import tf_keras_check
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import (
    AUTO,
    BFLOAT16,
    FLOAT32,
    MIXED_BFLOAT16,
    MIXED_FLOAT16,
    POLICY_ALIASES,
    POLICY_NAMES,
)
from tf_mixed.policy import autotune, hardware
from tf_mixed.policy import keep_float32 as keep_float32_rules
from tf_mixed.policy import state as policy_state
from tf_mixed.policy.state import ThreadState

_CPU_FLOAT16_WARNING = (
    "tf_mixed: mixed_float16 was requested on a host with no GPU. TensorFlow's "
    "CPU float16 kernels can be far slower than float32: on TF 2.21 the fused "
    "MatMul+BiasAdd kernel made a Dense model train from about 3x to about 300x "
    "slower depending on the CPU (BUILD_NOTES.md; `python "
    "examples/cpu_float16_remapping.py` measures it on this host), and the "
    "Conv2D filter gradient is slower still. tf_mixed has turned off TF's "
    "'remapping' graph pass, so Dense layers train at about half float32's "
    "speed instead; convolution training stays slow. Use "
    "tf_mixed.enable('auto') or 'float32' on this host, or 'mixed_bfloat16' on "
    "a CPU with AMX-BF16."
)


@dataclasses.dataclass(frozen=True)
class Enabled:
    """What `enable` did.

    Attributes:
        policy: The Keras policy now active: "mixed_float16",
            "mixed_bfloat16", "float32" or "bfloat16" (pure: variables in
            bfloat16 too).
        reason: Why this policy, in one sentence a user can act on.
        requested: The name that was passed to `enable`, as given.
    """

    policy: str
    reason: str
    requested: str

    def __str__(self) -> str:
        return f"{self.policy} ({self.reason})"


def canonical_name(name: object) -> str:
    """Resolves a policy name or alias to its canonical form.

    Args:
        name: One of `POLICY_NAMES`.

    Returns:
        "auto", "mixed_float16", "mixed_bfloat16", "float32" or "bfloat16".

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
    if key not in POLICY_ALIASES:
        raise ValueError(
            f"Unknown policy {name!r}. Valid names: {', '.join(POLICY_NAMES)}. "
            "Use 'auto' to let tf_mixed choose for this hardware."
        )
    return POLICY_ALIASES[key]


def choose_auto(info: hardware.HardwareInfo) -> tuple[str, str]:
    """Chooses a policy for the given hardware by rule, without timing anything.

    `enable("auto")` uses these rules for GPUs and TPUs, and for CPUs only
    when measuring is turned off (see `resolve_auto`). Rules, first match
    wins: a CUDA GPU with compute capability >= 7.0 gives mixed_float16; any
    other GPU gives float32; a TPU gives mixed_bfloat16; a CPU whose AMX-BF16
    units the kernel enables gives mixed_bfloat16; anything else gives
    float32, because TF's CPU half-precision kernels are slower than float32
    there.

    Args:
        info: The host description, e.g. `hardware.detect()`.

    Returns:
        ``(policy, reason)``.
    """
    force_hint = "force one with tf_mixed.enable('mixed_float16') or 'mixed_bfloat16'"
    gpu_rule = "GPU rule: compute capability >= 7.0 gives mixed_float16; GPUs are not timed"
    if info.gpus:
        gpu = min(info.gpus, key=lambda g: g.compute_capability or (0, 0))
        index = info.gpus.index(gpu)
        if gpu.compute_capability is None:
            return FLOAT32, (
                f"GPU {index} ({gpu.name}) reports no CUDA compute capability, so "
                f"Tensor Core support is unknown; {force_hint} ({gpu_rule})"
            )
        major, minor = gpu.compute_capability
        if gpu.has_tensor_cores:
            return MIXED_FLOAT16, (
                f"GPU {index} has compute capability {major}.{minor} (Tensor Cores) "
                f"({gpu_rule})"
            )
        return FLOAT32, (
            f"GPU {index} has compute capability {major}.{minor}, below 7.0: no "
            f"Tensor Cores, so float16 brings little speed; {force_hint} ({gpu_rule})"
        )
    if info.tpu:
        return MIXED_BFLOAT16, (
            "a TPU is attached; TPUs compute natively in bfloat16 (TPU rule; not timed)"
        )
    if info.amx_bf16_usable:
        return MIXED_BFLOAT16, (
            "no GPU; the CPU has AMX-BF16 tile units (amx_bf16 in /proc/cpuinfo, "
            "enabled by the kernel), which oneDNN uses for bfloat16 matmuls "
            "(CPU rule, not measured)"
        )
    return FLOAT32, (
        "no GPU, TPU or AMX-BF16 CPU: by the CPU rule (not measured) float32, "
        "as half precision on CPUs without AMX is often slower than float32; "
        f"measure with tf_mixed.enable('auto', measure=True), or {force_hint}"
    )


def resolve_auto(
    info: hardware.HardwareInfo | None = None, *, measure: bool | None = None
) -> tuple[str, str]:
    """What `enable("auto")` picks on this host, and why.

    GPUs and TPUs follow `choose_auto`'s rules. On a CPU-only host the
    candidate policies are timed on a small probe (about a second, once per
    machine: the result is cached; see `tf_mixed.policy.autotune`), unless
    `measure` is False.

    Args:
        info: The host; default `hardware.detect()`.
        measure: Whether to time the CPU; None reads the environment variable
            TF_MIXED_AUTO_MEASURE (measuring unless it is "0", "false", "no"
            or "off").

    Returns:
        ``(policy, reason)``.

    Raises:
        TypeError: If `measure` is not a bool or None.
        ValueError: If TF_MIXED_AUTO_MEASURE holds an unknown value.
    """
    measure = _validated_measure(measure)
    info = hardware.detect() if info is None else info
    if info.gpus or info.tpu or not measure:
        return choose_auto(info)
    choice = autotune.measured_choice(info)
    return choice.policy, choice.reason


def _validated_measure(measure: object) -> bool:
    if measure is None:
        return autotune.measure_by_default()
    return _validate.boolean(
        measure, "measure",
        valid="a bool (or None for the TF_MIXED_AUTO_MEASURE environment variable)",
        hint=" Pass measure=False to choose by rule without timing the CPU.")


def _explicit_reason(name: str, info: hardware.HardwareInfo | None) -> str:
    if name == FLOAT32:
        return "float32 requested explicitly"
    if name == BFLOAT16:
        return (
            "bfloat16 requested explicitly: variables, gradients and compute in "
            "bfloat16; wrap_optimizer applies compensated updates so small "
            "steps are not rounded away"
        )
    if name == MIXED_FLOAT16 and info is not None and not info.has_gpu:
        return (
            "mixed_float16 requested explicitly; no GPU, so TF's remapping pass "
            "is off to avoid the slow fused float16 CPU kernel"
        )
    return f"{name} requested explicitly"


def enable(
    policy: str = AUTO,
    *,
    quiet: bool = False,
    measure: bool | None = None,
    keep_float32=(),
    plan=None,
    model=None,
) -> Enabled:
    """Sets Keras's dtype policy, in this thread, to a mixed-precision policy.

    Layers built after this call compute in the policy's dtype and keep their
    variables in float32; under "bfloat16" (pure) the variables are bfloat16
    too, and `wrap_optimizer` then applies compensated updates
    (`tf_mixed.bf16_update`). Calling `enable` again switches policy; `disable`
    then restores what was active before the first call. Keras keeps the
    policy per thread (so does tf_mixed's bookkeeping): enable in the thread
    that builds the model. `keras.backend.clear_session()` resets the policy
    of every thread to float32; the next `enable`/`disable` logs a warning
    when it finds that, and `status()` reports it.

    Args:
        policy: One of `POLICY_NAMES`; "auto" chooses for this host (see
            `resolve_auto`: GPU/TPU rules; a cached measurement on CPUs). An
            explicit name is always honoured.
        quiet: If True, do not log the choice (warnings are still logged).
        measure: For "auto" on a CPU-only host: True times the CPU (once per
            machine, then cached), False chooses by rule; None (default)
            measures unless TF_MIXED_AUTO_MEASURE is "0"/"false"/"no"/"off".
        keep_float32: Layers to keep computing in float32 in models built
            afterwards: layer names, layer classes, predicates ``layer ->
            bool``, or a list of these (see `tf_mixed.policy.keep_float32`).
        plan: With "auto" only: a `tf_mixed.plan` result (opt-in). Its
            policy is set and its float32 layers are kept by name (with
            `keep_float32`'s) instead of auto's whole-model choice; build the
            model with the layer names the plan was made for.
        model: A model built before this call (a built Keras model, or None):
            its layers move to the chosen policy now (`keep_float32`'s
            layers, and float32 heads, stay float32), and its policy counts
            as auto's, so its own training step is checked against float32
            when it trains (`LossScaleMonitor` in ``fit``,
            `tf_mixed.training.make_train_step`; docs/policies.md).

    With ``keras_hub`` imported, `enable` also warns that KerasHub's
    ``from_preset`` then loads float presets in the new policy
    (`from_preset_note`).

    Returns:
        An `Enabled` with the active policy and the reason for it.

    Raises:
        TypeError: If `policy` is not a string, `measure` not a bool,
            `keep_float32` holds something that is not a name, class or
            predicate, or `model` is not a built Keras model.
        ValueError: If `policy` is not a known name. The global policy is left
            exactly as it was.

    Example:

        >>> enabled = tf_mixed.enable("bf16")
        >>> enabled.policy
        'mixed_bfloat16'
    """
    tf_keras_check.check("tf_mixed.enable")
    name = canonical_name(policy)  # validates before anything changes
    measure = _validated_measure(measure)
    keep = keep_float32_rules.parse(keep_float32)  # applied once the policy is set
    planned = _checked_plan(plan, name)
    _check_model(model)
    if planned is not None:
        keep = keep_float32_rules.KeepFloat32(
            tuple(dict.fromkeys(keep.names + planned[1])), keep.classes, keep.predicates)
    state = policy_state.thread_state()
    _warn_if_reset(state, "enable")
    info = hardware.detect() if name in (AUTO, MIXED_FLOAT16) or planned else None
    if planned is not None:
        name, reason = planned[0], planned[2]
    elif name == AUTO:
        name, reason = resolve_auto(info, measure=measure)
    else:
        reason = _explicit_reason(name, info)

    if state.saved_policy is None:
        state.saved_policy = keras.config.dtype_policy()
    cpu_float16 = name == MIXED_FLOAT16 and info is not None and not info.has_gpu
    # Fact measured on TF 2.21: Grappler fuses MatMul+BiasAdd into a float16
    # _FusedMatMul whose CPU kernel can be >1000x slower than the plain matmul
    # (a Dense model trained 3x to 300x slower by CPU; see BUILD_NOTES.md). The option is
    # per process, so it is held off until no thread needs it off.
    policy_state.set_remapping_hold(state, cpu_float16)
    if cpu_float16 and canonical_name(policy) == MIXED_FLOAT16:
        logging.warning(_CPU_FLOAT16_WARNING)
    elif cpu_float16:  # "auto" measured float16 fastest on this CPU
        logging.info("tf_mixed: auto picked mixed_float16 on this CPU (%s); "
                     "TF's 'remapping' graph pass is off, whose fused float16 "
                     "MatMul+BiasAdd CPU kernel is very slow.", reason)
    keras.mixed_precision.set_dtype_policy(name)
    keep_float32_rules.activate(keep)
    state.active = name
    state.requested = canonical_name(policy)
    if model is not None:
        _move_model(model, name, keep, auto=state.requested == AUTO)
        reason += (f"; model '{model.name}' moved to {name} now"
                   + ("; its own training step is checked against float32 when it trains"
                      if state.requested == AUTO and name != FLOAT32 else ""))

    enabled = Enabled(policy=name, reason=reason, requested=policy)
    if not quiet:
        logging.info("tf_mixed: policy %s, because %s", enabled.policy, enabled.reason)
    note = from_preset_note(name)
    if note:
        logging.warning(note)  # even when quiet: it changes what a later load gives
    return enabled


def _check_model(model) -> None:
    if model is None:
        return
    if not isinstance(model, keras.Model) or not model.built:
        raise TypeError(
            "`model` must be a built Keras model (or None): enable() moves its layers "
            f"to the chosen policy. Received: model={model!r} of type "
            f"{type(model).__name__}"
            + (" (not built: call it on a batch, or give it a keras.Input)"
               if isinstance(model, keras.Model) else "") + ".")


def _move_model(model, name: str, keep, *, auto: bool) -> None:
    """Moves a built model's layers to `name` (kept layers and float32 heads stay)."""
    from tf_mixed._internal.facts import FLOAT32_HEADS
    from tf_mixed.policy import model_check

    wanted = {}
    for path, layer in _layers_by_path(model):
        if type(layer).__name__ in FLOAT32_HEADS or keep.matches(layer):
            wanted[path] = FLOAT32
        elif keras.DTypePolicy(model_check.policies_of(layer)[path]).variable_dtype == FLOAT32:
            wanted[path] = name
    model_check.set_policies(model, wanted)
    if auto:
        model_check.mark_auto(model)


def _layers_by_path(model):
    from tf_mixed._internal import shims

    for layer in shims.sublayers(model):
        yield (getattr(layer, "path", None) or layer.name), layer


def _checked_plan(plan, name: str) -> tuple[str, tuple[str, ...], str] | None:
    """``(policy, float32 layer names, reason)`` from a `tf_mixed.plan` result, or None."""
    if plan is None:
        return None
    policy = getattr(plan, "policy", None)
    names = getattr(plan, "keep_float32", None)
    if (not isinstance(policy, str) or policy not in POLICY_NAMES
            or not isinstance(names, tuple) or not all(isinstance(n, str) for n in names)):
        raise TypeError(
            "`plan` must be what tf_mixed.plan(model, x, y) returns (a "
            f"tf_mixed.tools.planning.Plan), or None. Received: plan={plan!r} of type "
            f"{type(plan).__name__}.")
    if name != AUTO:
        raise ValueError(
            f"`plan` is applied by enable('auto', plan=...); an explicit policy would "
            f"contradict it. Received: policy={name!r} with a plan for "
            f"{policy}. Call tf_mixed.enable('auto', plan=plan).")
    summary = getattr(plan, "summary", "")
    model_name = getattr(plan, "model_name", "?")
    reason = f"the per-layer plan of model '{model_name}' (tf_mixed.plan): {summary}"
    return policy, names, reason


def from_preset_note(name: str) -> str | None:
    """What `enable(name)` changes in KerasHub's ``from_preset``, once keras_hub is imported.

    KerasHub 0.32 loads a preset saved in a float dtype under Keras's global
    policy (keras-hub PR #2367), so after `enable` a
    ``from_preset`` call without ``dtype=`` gives a model in that policy, not
    in the preset's own dtype. Said by `enable` when ``keras_hub`` is
    already imported (``import keras_hub`` after `enable` is not seen).

    Returns:
        One sentence, or None when keras_hub is not imported or ``name``
        is float32.
    """
    import sys

    if "keras_hub" not in sys.modules or name == FLOAT32:
        return None
    policy = keras.DTypePolicy(name)
    return (f"tf_mixed: KerasHub's from_preset() now loads a float preset under "
            f"'{name}' (variables in {policy.variable_dtype}, computing in "
            f"{policy.compute_dtype}), not in the preset's own dtype: pass dtype= to "
            "from_preset() to choose, such as dtype='bfloat16' for bfloat16 weights.")


def disable() -> None:
    """Restores, in this thread, the policy that was active before `enable`.

    Also gives back this thread's hold on Grappler's remapping option: the
    option returns to its earlier value once no thread has float16 on a CPU
    enabled. Does nothing if `enable` has not been called in this thread (or
    was already undone).
    """
    state = policy_state.thread_state()
    _warn_if_reset(state, "disable")
    if state.saved_policy is None:
        return
    keras.config.set_dtype_policy(state.saved_policy)
    policy_state.set_remapping_hold(state, False)
    state.saved_policy, state.active, state.requested = None, None, None


@dataclasses.dataclass(frozen=True)
class PolicyStatus:
    """What tf_mixed has set in this thread, and whether Keras still has it.

    Attributes:
        keras_policy: Keras's dtype policy in this thread now.
        enabled: The policy tf_mixed set in this thread (None if none).
        reset_since_enable: True when Keras's policy is no longer the one
            tf_mixed set, e.g. after `keras.backend.clear_session()`.
        remapping_holders: Threads (and scopes) holding Grappler's remapping
            option off for float16 on a CPU, in the whole process.
    """

    keras_policy: str
    enabled: str | None
    reset_since_enable: bool
    remapping_holders: int

    def __str__(self) -> str:
        if self.enabled is None:
            return f"{self.keras_policy} (tf_mixed.enable not in effect in this thread)"
        if self.reset_since_enable:
            return (
                f"{self.keras_policy}, not {self.enabled} as tf_mixed.enable set it: "
                "reset since (keras.backend.clear_session()?); call tf_mixed.enable() again"
            )
        return f"{self.keras_policy} (set by tf_mixed.enable)"


def status() -> PolicyStatus:
    """Reports this thread's policy and whether a reset undid `enable`.

    Returns:
        A `PolicyStatus`.
    """
    state = policy_state.thread_state()
    keras_policy = keras.config.dtype_policy().name
    return PolicyStatus(
        keras_policy=keras_policy,
        enabled=state.active,
        reset_since_enable=state.active is not None and keras_policy != state.active,
        remapping_holders=policy_state.remapping_holders(),
    )


def _warn_if_reset(state: ThreadState, caller: str) -> None:
    if state.active is None:
        return
    now = keras.config.dtype_policy().name
    if now != state.active:
        # Said to the call that comes after the reset: advice to call enable()
        # again would tell an enable() call to do what it is doing.
        then = ("this call sets the policy again" if caller == "enable" else
                "call tf_mixed.enable() right after clear_session() to keep it")
        logging.warning(
            "tf_mixed.%s(): Keras's dtype policy in this thread is %r, not %r as "
            "tf_mixed.enable() set it: keras.backend.clear_session() (or "
            "keras.config.set_dtype_policy) reset it since, so layers built since "
            "compute in %s; %s.",
            caller, now, state.active, now, then,
        )


@dataclasses.dataclass
class _Scope:
    marker: object
    keras_policy: keras.DTypePolicy
    saved: ThreadState


_SCOPE_MISUSE = (
    "tf_mixed.policy_scope: {what}. Keras keeps one dtype policy per thread, "
    "so asyncio tasks (or generators) that interleave policy_scope blocks in one "
    "thread would build layers under each other's policy. Build each model "
    "inside one scope without awaiting in between, run the tasks one after "
    "another, or give each its own thread (asyncio.to_thread)."
)


@contextlib.contextmanager
def policy_scope(policy: str, *, measure: bool | None = None) -> Iterator[Enabled]:
    """Enables `policy` for the body of a ``with`` block, in this thread.

    On exit, also when the body raises, the thread's policy, its hold on the
    remapping option and the `enable`/`disable` bookkeeping are exactly as
    they were on entry. Scopes nest. Because Keras keeps the policy per
    thread, two asyncio tasks on one thread must not have scopes open at the
    same time: entering a scope while another task's scope is open, or
    leaving scopes out of order, raises `RuntimeError`.

    Args:
        policy: One of `POLICY_NAMES`.
        measure: As for `enable`.

    Yields:
        The `Enabled` result.

    Raises:
        TypeError, ValueError: As `enable`, before anything changes.
        RuntimeError: When scopes of different asyncio tasks interleave in
            one thread (see above).

    Example:

        >>> with tf_mixed.policy_scope("mixed_bfloat16"):
        ...     model = build_model()
    """
    canonical_name(policy)
    tf_keras_check.check("tf_mixed.policy_scope")
    _validated_measure(measure)
    state = policy_state.thread_state()
    if state.scopes and state.scopes[-1].marker is not policy_state.scope_marker.get():
        raise RuntimeError(_SCOPE_MISUSE.format(
            what="entered while a scope of another asyncio task (or context) is "
            "open in this thread"))
    scope = _Scope(
        marker=object(),
        keras_policy=keras.config.dtype_policy(),
        saved=dataclasses.replace(state, scopes=[]),
    )
    state.scopes.append(scope)
    token = policy_state.scope_marker.set(scope.marker)
    # This scope's enable() saves the state on entry; the outer bookkeeping
    # (and hold) comes back on exit.
    state.saved_policy, state.active = None, None
    try:
        yield enable(policy, quiet=True, measure=measure)
    finally:
        _leave_scope(state, scope)
        try:
            policy_state.scope_marker.reset(token)
        except ValueError:  # left in another context: already reported
            pass


def _leave_scope(state: ThreadState, scope: _Scope) -> None:
    if scope not in state.scopes:
        return  # already unwound by an out-of-order exit
    index = state.scopes.index(scope)
    in_order = index == len(state.scopes) - 1
    del state.scopes[index:]
    keras.config.set_dtype_policy(scope.keras_policy)
    policy_state.set_remapping_hold(state, scope.saved.holds_remapping)
    state.saved_policy, state.active = scope.saved.saved_policy, scope.saved.active
    # The scope's own enable() replaced this thread's keep_float32 rules: the
    # outer enable's rules come back with its policy (they live as long as it).
    state.keep, state.keep_bound = scope.saved.keep, scope.saved.keep_bound
    state.requested = scope.saved.requested
    if not in_order:
        raise RuntimeError(_SCOPE_MISUSE.format(
            what="left while a scope opened after it is still open (scopes of "
            "different asyncio tasks interleaved); both are closed now and the "
            "policy is back to what it was before this scope"))


def current() -> str:
    """The name of Keras's dtype policy in this thread, e.g. "mixed_float16".

    See `status()` to know whether tf_mixed set it and whether
    `keras.backend.clear_session()` has reset it since.
    """
    return keras.config.dtype_policy().name
