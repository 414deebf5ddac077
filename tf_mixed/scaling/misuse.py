"""Custom-loop mistakes, each said once, at the step where it happens."""

# ``tf_mixed.LossScaleOptimizer`` calls these checks; they never change the
# arithmetic of a step. What is said, and how (`MixedPrecisionWarning`, or an
# error where the step cannot run or training would be silently wrong):
#
# * an ``apply`` of gradients whose loss never went through ``scale_loss``
#   while the optimizer divides by a scale other than 1: a warning (tf-keras
#   warned too; a hand-made gradient is legitimate in tests);
# * a second wrapper around an inner optimizer that a live, built wrapper
#   already drives (one made every batch: its scale never adapts): a warning
#   at its first step; when the earlier wrappers were dropped, a warning once
#   per inner optimizer;
# * float16 variables updated by a wrapper that does not scale the loss (the
#   pass-through ``wrap_optimizer`` returns under a float32 global policy): a
#   warning; with float32 variables, a step that computes in float16
#   (`tf_mixed.scaling.float16_seen`, said once with the loop helpers);
# * a model built before ``tf_mixed.enable()`` used under a half global policy
#   (a traced step whose matrix products all compute in float32): a warning;
# * a first step inside a ``tf.function`` under several replicas by an
#   optimizer not built yet: a ``ValueError`` naming ``build`` (TensorFlow's
#   own error is "You must feed a value for placeholder");
# * a skipped step whose forward pass wrote floating-point state that no
#   rollback protects (BatchNormalization statistics without
#   ``track_forward_state``): an error at the first such skip, naming
#   ``opt.track_forward_state(model)`` and, for ``fit``,
#   ``tf_mixed.LossScaleMonitor`` (`forward_state_guard`); state declared with
#   ``track_forward_state(model, roll_back=False)`` is left alone.
#
# The checks run when a step is traced (once per ``tf.function`` trace) or, in
# eager mode, at every step; each warning is given once per optimizer.

from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import Any

import keras
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import HALF_DTYPES
from tf_mixed._internal.warning import MixedPrecisionWarning
from tf_mixed.scaling import float16_seen

__all__ = ["InnerLedger", "Ledger", "check_step", "float32_on_purpose", "forward_state_guard",
           "note_scaled", "note_unscaled", "note_wrapper", "scales", "take_unscaled"]


@dataclasses.dataclass(eq=False)
class Ledger:
    """What the checks remember between calls of one wrapper (its `StepState` part).

    Attributes:
        scaled_since_apply: ``scale_loss`` calls since the last ``apply``.
        unscaled_since_apply: ``unscale_gradients`` calls since the last
            ``apply`` (only to refuse an ``apply`` that does not say what it
            got; it never changes arithmetic).
        tf_keras_unscaled: tf-keras's ``get_unscaled_gradients`` was called
            since the last ``apply`` (`tf_mixed.scaling.keras_compat`).
        forward_ops_end: Where the traced forward pass ended (the graph's
            operation count at ``scale_loss``), or None.
        said: The keys of the warnings already given (each is said once).
    """

    scaled_since_apply: int = 0
    unscaled_since_apply: int = 0
    tf_keras_unscaled: bool = False
    forward_ops_end: int | None = None
    said: set = dataclasses.field(default_factory=set)


class InnerLedger:
    """What a user's inner optimizer remembers of the wrappers around it.

    Several wrappers may drive one inner optimizer (one made every batch),
    and an earlier one may be gone: only the inner optimizer outlives them,
    so this lives on it (`tf_mixed._internal.shims.rider`), not in a
    registry keyed by it.
    """

    def __init__(self) -> None:
        self._wrappers: list = []  # weak references to the wrappers around it
        self.stepped_by: Any = None  # weak reference to the last wrapper that stepped it
        self.told_dropped = False

    def add(self, wrapper) -> None:
        self._wrappers = [w for w in self._wrappers if w() is not None] + [weakref.ref(wrapper)]

    def wrappers(self) -> list:
        """The live wrappers around the inner optimizer."""
        return [w for w in (ref() for ref in self._wrappers) if w is not None]


def inner_ledger(inner) -> InnerLedger:
    """The `InnerLedger` kept on the inner optimizer ``inner``."""
    return _internals.rider(inner, "wrappers", InnerLedger)


_ASSIGNS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")

FORWARD_STATE_ERROR = (
    "A step was skipped (non-finite gradients) after its forward pass wrote "
    "{names}, which the optimizer does not roll back: they now hold the "
    "skipped batch's values (inf/NaN after an overflow) and the next "
    "evaluation would read them. Received: no forward state handed to the "
    "optimizer. With model.fit: pass "
    "`callbacks=[tf_mixed.LossScaleMonitor()]` (it hands the model's forward "
    "state over), or call `model.optimizer.track_forward_state(model)` before "
    "fit. In a custom loop: call `opt.track_forward_state(model)` once before "
    "the first step (under `strategy.scope()` under a strategy); "
    "tf_mixed.training.make_train_step does it for you."
)


def scales(optimizer) -> bool:
    """Whether ``optimizer`` multiplies the loss by something other than 1."""
    return bool(optimizer.config.dynamic or optimizer.config.initial_scale != 1.0)


def _warn_once(ledger: Ledger, key: str, message: str) -> None:
    if key not in ledger.said:
        ledger.said.add(key)
        warnings.warn(message, MixedPrecisionWarning, stacklevel=4)


def float32_on_purpose(ledger: Ledger) -> None:
    """Notes that the model the wrapper of ``ledger`` trains computes in float32 on purpose.

    Auto's check on the model's own step moved it there
    (`tf_mixed.policy.model_check`): the warning of a model built before
    ``enable`` is not said for it.
    """
    ledger.said.add("built_before_enable")


def note_wrapper(wrapper) -> None:
    """Records ``wrapper`` as one of its inner optimizer's wrappers."""
    inner_ledger(wrapper.inner_optimizer).add(wrapper)


def note_scaled(ledger: Ledger) -> None:
    """Notes a ``scale_loss`` call (and where the traced graph stood)."""
    ledger.scaled_since_apply += 1
    if not tf.executing_eagerly():
        ledger.forward_ops_end = len(tf.compat.v1.get_default_graph().get_operations())


def note_unscaled(ledger: Ledger, *, tf_keras: bool = False) -> None:
    """Notes an ``unscale_gradients`` call (``tf_keras``: ``get_unscaled_gradients``)."""
    if tf_keras:
        ledger.tf_keras_unscaled = True
    else:
        ledger.unscaled_since_apply += 1


UNSAID_UNSCALED = (
    "LossScaleOptimizer.apply() got gradients after unscale_gradients() was "
    "called, and no `unscaled=` to say which ones they are. Received: unscaled=None. "
    "Pass unscaled=True if they are what unscale_gradients() returned (clipped or "
    "not): without it they would be divided by the loss scale again and the step "
    "would be that many times too small (torch's unscale_()-then-step() habit). "
    "Pass unscaled=False if you only inspected the unscaled copy and pass the "
    "scaled gradients."
)


def take_unscaled(ledger: Ledger, unscaled: bool | None) -> bool:
    """``apply``'s ``unscaled``, refusing None right after ``unscale_gradients``.

    Args:
        ledger: The wrapper's `Ledger` (its notes since the last ``apply``
            start again).
        unscaled: What ``apply`` was told.

    Raises:
        ValueError: ``unscaled`` is None after ``unscale_gradients``.
    """
    pending, ledger.unscaled_since_apply = ledger.unscaled_since_apply, 0
    ledger.tf_keras_unscaled = False
    if unscaled is None and pending:
        raise ValueError(UNSAID_UNSCALED)
    return bool(unscaled)


def check_step(optimizer, ledger: Ledger, trainable_variables, unscaled: bool) -> None:
    """The checks of one ``apply``, before anything is built or changed.

    Args:
        optimizer: The wrapper (its config, name, inner optimizer).
        ledger: Its `Ledger`.
        trainable_variables, unscaled: ``apply``'s, checked.

    Raises:
        ValueError: for an unbuilt optimizer whose first step is traced in a
            ``tf.function`` under several replicas.
    """
    strategy = tf.distribute.get_strategy()
    if (not optimizer.built and strategy.num_replicas_in_sync > 1
            and not tf.executing_eagerly()):
        raise ValueError(
            f"{type(optimizer).__name__} '{optimizer.name}' must be built before "
            "its first step runs inside a tf.function under "
            f"{type(strategy).__name__} ({strategy.num_replicas_in_sync} "
            "replicas): its state variables cannot be created there. Received: "
            "an unbuilt optimizer. Call `optimizer.build(model.trainable_variables)` "
            "under `strategy.scope()` before the first step (model.fit does).")
    scaled, ledger.scaled_since_apply = ledger.scaled_since_apply, 0
    if not unscaled and not scaled and scales(optimizer):
        _warn_once(ledger, "unscaled_loss", (
            f"{type(optimizer).__name__}.apply() got gradients of a loss that "
            "never went through scale_loss() (or get_scaled_loss()), yet it divides "
            f"them by the loss scale (now {optimizer.config.initial_scale:g} at "
            "the start): the steps are that many times too small and the run "
            "learns nothing. Scale the loss on the tape: "
            "`scaled = opt.scale_loss(loss)` and differentiate `scaled`, or use "
            "tf_mixed.training.apply_scaled_gradients(tape, loss, variables, opt)."))
    others = [w for w in inner_ledger(optimizer.inner_optimizer).wrappers()
              if w is not optimizer and w.built]
    if others:
        _warn_once(ledger, "second_wrapper", (
            f"{type(optimizer).__name__} '{optimizer.name}' wraps inner optimizer "
            f"'{optimizer.inner_optimizer.name}', which the built wrapper "
            f"'{others[0].name}' already drives: each new wrapper starts its "
            "loss scale again, so the scale never adapts (a wrapper made every "
            "batch?). Create the wrapper once, before the loop, and reuse it."))
    else:
        _check_dropped_wrapper(optimizer)
    _check_built_before_enable(ledger)
    if not scales(optimizer) and any(
            keras.backend.standardize_dtype(v.dtype) == "float16"
            for v in trainable_variables):
        _warn_once(ledger, "float16_unscaled", (
            f"{type(optimizer).__name__} '{optimizer.name}' does not scale the "
            "loss (a fixed scale of 1: the pass-through wrap_optimizer() returns "
            f"under the global policy '{keras.config.dtype_policy().name}'), but "
            "it updates float16 variables, whose small gradients flush to zero. "
            "Use tf_mixed.wrap_optimizer(optimizer, force=True), or "
            "tf_mixed.LossScaleOptimizer(optimizer)."))
    elif not scales(optimizer) and not float16_seen.told(optimizer):
        float16 = float16_seen.float16_in_step(trainable_variables, optimizer)
        if float16 is not None:  # float16 computed with float32 variables
            float16_seen.tell(optimizer, f"{type(optimizer).__name__}.apply() (the step "
                              "of model.fit or of a loop)", float16, pass_through=True)


def _check_dropped_wrapper(optimizer) -> None:
    """Says once per inner optimizer that an earlier, dropped wrapper stepped it.

    A wrapper made every batch, the previous one dropped: no live wrapper is
    left to compare with, so the inner optimizer remembers who stepped it.
    """
    inner = optimizer.inner_optimizer
    ledger = inner_ledger(inner)
    before, ledger.stepped_by = ledger.stepped_by, weakref.ref(optimizer)
    # A dead reference: the wrapper that stepped it before was dropped.
    if before is None or before() is optimizer or ledger.told_dropped:
        return
    ledger.told_dropped = True
    warnings.warn(
        f"{type(optimizer).__name__} '{optimizer.name}' is a new wrapper around "
        f"inner optimizer '{inner.name}', which an earlier wrapper (now dropped) "
        "already stepped: each new wrapper starts its loss scale again at "
        f"initial_scale ({optimizer.config.initial_scale:g}), so the scale never "
        "adapts (a wrapper made every batch?). Create the wrapper once, before "
        "the loop, and reuse it. (Said once per inner optimizer.)",
        MixedPrecisionWarning, stacklevel=4)


_PRODUCTS = ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D",
             "DepthwiseConv2dNative", "Einsum")


def _check_built_before_enable(ledger: Ledger) -> None:
    """Warns once when a half global policy meets a step computed in float32.

    A layer takes the global policy when it is created: a model built before
    ``tf_mixed.enable()`` keeps computing in float32 under it. Seen in the
    traced forward pass (the ops before ``scale_loss``): matrix products, and
    none of them in a half dtype. Eagerly no graph is kept: not checked.
    """
    end = ledger.forward_ops_end
    half = keras.config.dtype_policy().compute_dtype
    if tf.executing_eagerly() or end is None or half not in HALF_DTYPES:
        return
    products = [op for op in tf.compat.v1.get_default_graph().get_operations()[:end]
                if op.type in _PRODUCTS and op.outputs]
    if not products or any(op.outputs[0].dtype in (tf.float16, tf.bfloat16)
                           for op in products):
        return
    _warn_once(ledger, "built_before_enable", (
        f"The global dtype policy is '{keras.config.dtype_policy().name}', but "
        f"this step's forward pass computed all {len(products)} of its matrix "
        "products in float32 (e.g. "
        f"'{products[0].name}'): the model was built before tf_mixed.enable() "
        "(a layer takes the policy when it is created), so it gets none of the "
        "half-precision speed. Call tf_mixed.enable() before building the model, "
        "or convert it: model = tf_mixed.convert(model)."))


# ------------------------------------------------------------ forward state


def _handle_in(graph, variable):
    """``variable``'s handle as the traced ``graph`` sees it (its capture), or None.

    A nested ``tf.function`` (``fit``'s step inside its loop) captures the
    eager handle directly or the enclosing graph's capture of it: both count.
    """
    chain = []
    current = graph
    while current is not None and hasattr(current, "captures"):
        chain.append(current)
        current = getattr(current, "outer_graph", None)
    handles = {id(variable.handle)}
    for enclosing in reversed(chain):  # outermost first
        for captured, internal in enclosing.captures:
            if id(captured) in handles:
                handles.add(id(internal))
    for captured, internal in graph.captures:
        if id(captured) in handles:
            return internal
    return None


def _plain(variables) -> list:
    """The tf.Variables under Keras variables and distributed ones, every copy."""
    strategy = tf.distribute.get_strategy()
    plain = []
    for variable in variables:
        inner = variable.value if isinstance(variable, keras.Variable) else variable
        plain.extend(strategy.experimental_local_results(inner))
    return plain


def _reduced_on_read(variable) -> bool:
    """Whether ``variable`` is ``ON_READ`` (every replica's copy is): Keras
    metrics' accumulators (``loss/total``), which ``fit`` updates between the
    forward pass and ``scale_loss``; metrics are not forward state
    (`tf_mixed.scaling.rollback.forward_variables`)."""
    return (getattr(variable, "synchronization", None)
            == tf.VariableSynchronization.ON_READ)


def _untracked_writes(optimizer, state) -> list:
    """Floating variables the traced forward pass wrote and no rollback holds."""
    read = _internals.variables_read_so_far()
    if read is None:
        return []
    graph = tf.compat.v1.get_default_graph()
    ops = graph.get_operations()[:state.ledger.forward_ops_end]
    written = {id(op.inputs[0]) for op in ops if op.type in _ASSIGNS}
    if not written:
        return []
    tally = state.tally
    known = _plain(list(optimizer.variables)
                   + list(state.forward.variables)
                   + list(state.forward.declined)
                   + list(state.forward.backups)
                   + ([v for v in vars(tally).values() if isinstance(v, tf.Variable)]
                      if tally is not None else []))
    known_ids = {id(v) for v in known} | {id(getattr(v, "handle", None)) for v in known}
    found = []
    for variable in read:
        if (variable.trainable or not variable.dtype.is_floating
                or id(variable) in known_ids or id(variable.handle) in known_ids
                or _reduced_on_read(variable)):
            continue
        handle = _handle_in(graph, variable)
        if handle is not None and id(handle) in written:
            found.append(variable)
    return found


def forward_state_guard(optimizer, state, finite) -> None:
    """Refuses the first skipped step that leaves forward state unprotected.

    Traced in a ``tf.function``: when the forward pass of this step wrote
    floating-point variables (BatchNormalization's moving statistics) that
    ``track_forward_state`` did not hand over, the step fails at run time
    the first time its verdict is "skip", with `FORWARD_STATE_ERROR`.
    Eagerly TensorFlow keeps no record of what the forward pass wrote: the
    first skipped step without tracked forward state gives a
    `MixedPrecisionWarning` saying so.

    Args:
        optimizer: The wrapper (its own variables are not forward state).
        state: Its `tf_mixed.scaling.step_state.StepState`.
        finite: The step's global verdict.
    """
    if tf.executing_eagerly():
        if (not state.forward.variables and not state.forward.declined
                and not bool(finite)):
            _warn_once(state.ledger, "eager_forward_state", (
                "A step was skipped (non-finite gradients) and no forward state "
                "is handed to the optimizer: if the model has BatchNormalization "
                "(or any layer whose forward pass writes non-trainable state), "
                "that state now holds the skipped batch's values. Eagerly, "
                "tf_mixed cannot see what the forward pass wrote (inside a "
                "tf.function it refuses the step). Call "
                "`opt.track_forward_state(model)` once before the first step."))
        return
    untracked = _untracked_writes(optimizer, state)
    if not untracked:
        return
    names = ", ".join(f"'{v.name}'" for v in untracked[:3])
    if len(untracked) > 3:
        names += f" and {len(untracked) - 3} more"
    tf.debugging.Assert(finite, [tf.constant(FORWARD_STATE_ERROR.format(names=names))])
