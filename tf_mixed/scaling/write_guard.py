"""What a step writes, checked before it is written: the verdict's reasons and bounds."""

# The loss-scale verdict used to read only the incoming gradients. Under every
# policy a step can write a non-finite value with finite gradients: Adam's
# second moment squares a gradient above ~1.8e19 to inf (and ``inf - inf``
# is NaN in the next update), and BatchNormalization's moving
# statistics of a batch with huge activations overflow while its normalised
# output, and so every gradient, stays finite. `StepGuard` extends the one
# verdict of `tf_mixed.scaling.pipeline` to every write of the step, checked
# *before* anything is written, so a failing step is skipped under the same
# contract as a float16 overflow (docs/skipped-step.md):
#
# * **input**: the batch's own floating-point inputs hold NaN/inf (noted by
#   the train step that saw them: `tf_mixed.callbacks.skip_contract` in
#   ``fit``, ``tf_mixed.training.make_train_step``). Bad data: never
#   attributed to a layer, never a reason to heal one;
# * **forward**: the forward state handed over with ``track_forward_state``
#   (BatchNormalization's moving statistics) is not finite after the
#   forward pass; it is rolled back with the rest of the step;
# * **gradients**: a reduced gradient is not finite (the float16 overflow
#   the verdict always caught);
# * **update**: every gradient is finite, but one is larger than the
#   optimizer's update can take (`update_bound`: for an optimizer that
#   squares gradients into a slot, ``|g|`` whose square overflows the slot's
#   dtype; a bound, checked on the reduced gradients before the inner
#   optimizer runs, not the candidate values after it);
# * **spike** (only with `tf_mixed.scaling.spike.guard_spikes`, off by
#   default): the gradient norm is far above its recent history.
#
# One verdict everywhere, no extra collective: the input and forward flags are
# each replica's own, so they ride the step's one gradient all-reduce as two
# more floats of its buffer (summed: > 0 on any replica means bad); the
# update bound reads the reduced gradients, the same bytes
# on every replica. The first reason that holds, in `REASONS` order, is the
# step's reason; its code (`REASONS` index + 1, 0 for an applied step) is
# written to ``last_reason`` and counted per reason in ``counts``.

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import HALF_DTYPES, dtype_limits
from tf_mixed.scaling import spike as _spike

__all__ = ["REASONS", "SkipReasons", "StepGuard", "inputs_flag", "update_bound"]

REASONS = ("input", "forward", "gradients", "update", "spike")
"""Why a step was skipped; a reason's code is its index + 1 (0: applied)."""

APPLIED = 0
INPUT, FORWARD, GRADIENTS, UPDATE, SPIKE = range(1, len(REASONS) + 1)

COUNTS_KEY = "skip_reasons"
"""The ``.keras`` entry and checkpoint child of the per-reason counts."""
LAST_KEY = "last_skip_reason"
"""The ``.keras`` entry and checkpoint child of the last skipped step's reason code."""


class SkipReasons(NamedTuple):
    """Skipped steps counted per reason (Python ints; `REASONS` order).

    Attributes:
        input: The batch's inputs held NaN/inf (bad data).
        forward: The forward state the batch wrote (BatchNormalization's
            moving statistics) was not finite.
        gradients: A reduced gradient was not finite.
        update: Every gradient was finite but the update would overflow
            (Adam squares |g| > ~1.8e19 to inf).
        spike: The gradient norm broke the spike rule
            (`tf_mixed.scaling.spike`; only when turned on).
    """

    input: int
    forward: int
    gradients: int
    update: int
    spike: int


# Keras optimizers whose writes are linear in the gradient (or in |g|): no
# square to overflow, so only a non-finite gradient can make them write one.
# Any other optimizer, Keras's, a user's or a subclass of these, gets the
# square bound (the safe side: it may skip a step of |g| > ~1.8e19 that it
# could have taken).
_LINEAR = frozenset({"SGD", "Lion", "Adamax"})


def update_bound(inner, variable) -> float:
    """The largest ``|g|`` the inner optimizer's update of ``variable`` can take.

    For an optimizer that squares gradients into a slot (Adam, AdamW, Nadam,
    RMSprop, Adagrad, Adadelta, Adafactor, Lamb, Ftrl, and any optimizer not
    known to be linear): the largest value whose square is finite in the
    slot's dtype, which is the variable's (Keras makes slots like their
    variable; the gradient is cast to it before the square): about 1.8e19
    for float32, 1.8375e19 for bfloat16 (2**64, float32's bound rounded,
    squares to inf in bfloat16), 255.875 for float16 (float32's for a
    float64 variable: the safe side). For SGD, Lion and Adamax: infinity
    (only a non-finite gradient is refused).

    Args:
        inner: The inner Keras optimizer.
        variable: The variable the gradient updates.

    Returns:
        The bound, a Python float.
    """
    kind = type(inner)  # a subclass may override the update: not known linear
    if kind.__name__ in _LINEAR and kind.__module__.startswith("keras."):
        return math.inf
    return _largest_square_root(_slot_dtype(variable))


def _slot_dtype(variable) -> str:
    """The dtype the update squares in: a half variable's own, else float32.

    float64 slots keep float32's bound (the safe side: the verdict compares
    in float32, where a float64 gradient above float32's range is inf).
    """
    name = tf.as_dtype(getattr(variable, "dtype", tf.float32)).name
    return name if name in HALF_DTYPES else "float32"


def _largest_square_root(name: str) -> float:
    """The largest value of dtype ``name`` whose square in that dtype is finite."""
    dtype = tf.as_dtype(name).as_numpy_dtype  # ml_dtypes' type for bfloat16
    x = dtype(np.sqrt(np.float64(dtype_limits(name).max)))
    with np.errstate(over="ignore"):
        while not np.isfinite(x * x):
            x = np.nextafter(x, dtype(0))
    return float(x)


def inputs_flag(data) -> tf.Tensor | None:
    """True when any floating-point tensor of ``data`` holds NaN/inf.

    Args:
        data: A batch as a train step receives it (nested tensors; integer
            and string entries are ignored).

    Returns:
        A scalar bool tensor, or None when ``data`` holds no float tensor.
    """
    checks = []
    for value in tf.nest.flatten(data):
        if value is None or isinstance(value, (str, bytes)):
            continue
        if isinstance(value, tf.SparseTensor):
            value = value.values
        if isinstance(value, tf.RaggedTensor):
            value = value.flat_values
        try:
            tensor = tf.convert_to_tensor(value)
        except (TypeError, ValueError):
            continue
        if tensor.dtype.is_floating:
            checks.append(tf.reduce_all(tf.math.is_finite(tensor)))
    if not checks:
        return None
    return tf.logical_not(checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks)))


class StepGuard:
    """The write guard's state, owned by one ``tf_mixed.LossScaleOptimizer``.

    The optimizer creates it with its forward state and hands it to each
    stage of `tf_mixed.scaling.pipeline` as an argument. Not a Trackable: a
    part of the optimizer's `tf_mixed.scaling.step_state.StepState` that
    saves (``.keras`` entries `COUNTS_KEY` and `LAST_KEY`, the same names
    as ``tf.train.Checkpoint`` children), so a resumed run goes on counting
    from the saved counts; a file written before they were saved loads
    with zeros.

    Attributes:
        forward: The optimizer's `tf_mixed.scaling.rollback.ForwardState`
            (its tracked variables are checked after the forward pass).
        counts: int64 ``[len(REASONS)]`` variable, skipped steps per reason
            (after `build`).
        last_reason: int64 scalar variable, the reason code of the latest
            skipped step (written on skipped steps only: read it beside
            ``last_step_skipped``).
        window: float32 ``[2]`` variable when accumulating: this replica's
            input and forward flags since its window opened.
        spike: The `tf_mixed.scaling.spike.SpikeGuard`, or None (off, the
            default; `tf_mixed.scaling.spike.guard_spikes` turns it on).
        pending_spike: A spike history read from a file before the guard
            was turned on (taken over by ``guard_spikes``), or None.
        pending: ``{key: saved array}`` read from a ``.keras`` file before
            `build` (written into the variables there).
    """

    def __init__(self, forward) -> None:
        self.forward = forward
        self.counts: Any = None
        self.last_reason: Any = None
        self.window: Any = None
        self.spike: Any = None
        self.pending_spike: Any = None
        self.pending: dict[str, np.ndarray] = {}
        # Per thread: under MirroredStrategy each replica's train step runs in its own
        # thread and notes its own batch for the optimizer step of that thread.
        self._noted: dict[int, Any] = {}

    def build(self, optimizer, accumulating: bool) -> None:
        """Creates the variables (in ``optimizer.build``, under the strategy's scope).

        Counts read earlier (a ``.keras`` file, a ``tf.train.Checkpoint``
        restored before the build) are written into them.

        Args:
            optimizer: The owning ``tf_mixed.LossScaleOptimizer`` (a checkpoint
                read before the build keeps the counts queued on it), or None.
            accumulating: Whether the optimizer accumulates gradients (a
                window's flags are then kept).
        """
        def variable(value, dtype):
            return tf.Variable(tf.constant(value, dtype), trainable=False,
                               synchronization=tf.VariableSynchronization.ON_WRITE,
                               aggregation=tf.VariableAggregation.NONE)

        self.counts = variable([0] * len(REASONS), tf.int64)
        self.last_reason = variable(0, tf.int64)
        for key, saved in self._saved_variables().items():
            if key in self.pending:
                saved.assign(self.pending.pop(key))
            if optimizer is not None:
                _internals.restore_deferred(optimizer, key, saved)
        if accumulating:
            self.window = variable([0.0, 0.0], tf.float32)

    # ------------------------------------------------------- inputs, noted

    def note_inputs(self, data) -> None:
        """Notes this replica's batch for the step about to run (this thread).

        The train step that sees the batch calls it just before the step's
        forward pass; the optimizer step in the same thread takes it.
        """
        self._noted[threading.get_ident()] = inputs_flag(data)

    def _take_inputs(self):
        flag = self._noted.pop(threading.get_ident(), None)
        if flag is None or not _usable_here(flag):
            return None
        return flag

    # ------------------------------------------------------------ the stages

    def local_flags(self) -> tf.Tensor | None:
        """This replica's float32 ``[input, forward]`` flags (1.0: bad), or None.

        None when there is nothing to check (no inputs noted, no forward
        state tracked, not accumulating): the step then builds no operation
        for them. With accumulation, the flags of the whole window so far.
        """
        forward = [tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v)))
                   for v in self.forward.variables]
        inputs = self._take_inputs()
        if not forward and inputs is None and self.window is None:
            return None
        forward_bad = (tf.logical_not(tf.reduce_all(tf.stack(forward)))
                       if forward else tf.constant(False))
        inputs = tf.constant(False) if inputs is None else inputs
        flags = tf.cast(tf.stack([inputs, forward_bad]), tf.float32)
        if self.window is not None:
            flags = tf.maximum(flags, self.window.read_value())
            self.window.assign(flags)
        return flags

    def end_window(self) -> None:
        """After a window's last micro-step: its flags start again at 0 (none: nothing)."""
        if self.window is not None:
            self.window.assign(tf.zeros([2], tf.float32))

    @staticmethod
    def bounds(inner, variables) -> list:
        """`update_bound` of each variable (None for those Keras overwrites)."""
        return [None if getattr(v, "overwrite_with_gradient", False)
                else update_bound(inner, v) for v in variables]

    def applied(self, within, flags, grads, divisor=None) -> tf.Tensor:
        """The verdict: every gradient finite and within its bound, no flag raised.

        Args:
            within: From the all-reduce: every reduced gradient finite and
                within its `update_bound` (the same on every replica).
            flags: The summed ``[input, forward]`` flags, or None.
            grads: The reduced gradients (the spike rule's norm).
            divisor: The scale they still carry, or None.

        Returns:
            A scalar bool tensor, True when the step is applied.
        """
        verdict = within if flags is None else tf.logical_and(
            within, tf.reduce_all(flags <= 0.0))
        if self.spike is not None:
            verdict = tf.logical_and(verdict, tf.logical_not(
                self.spike.breaks(grads, divisor)))
        return verdict

    def skip_code(self, flags, grads, within=None) -> tf.Tensor:
        """The reason code of a step known to be skipped (a scalar int64 tensor).

        Args:
            flags: The summed ``[input, forward]`` flags, or None.
            grads: The reduced gradients (a skip whose gradients are all
                finite was an update out of bounds).
            within: The all-reduce's bound check (with a spike rule: a skip
                within bounds was a spike).
        """
        code = tf.where(_all_finite(grads), tf.constant(UPDATE, tf.int64),
                        tf.constant(GRADIENTS, tf.int64))
        if self.spike is not None:
            code = tf.where(within, tf.constant(SPIKE, tf.int64), code)
        if flags is not None:
            code = tf.where(flags[1] > 0, tf.constant(FORWARD, tf.int64), code)
            code = tf.where(flags[0] > 0, tf.constant(INPUT, tf.int64), code)
        return code

    def branches(self, flags, grads, within=None) -> tuple:
        """What the verdict's two branches write: ``(on_applied, on_skipped)``.

        Run inside the loss-scale state's own cond
        (`tf_mixed.scaling.pipeline.advance_state`), so an applied step pays
        for no cond of the guard's: on a skip the reason is worked out and
        ``last_reason`` and ``counts`` written; on an applied step only the
        spike rule's history (when on) takes the norm.
        """
        def on_applied():
            if self.spike is not None:
                self.spike.observe()

        def on_skipped():
            code = self.skip_code(flags, grads, within)
            self.last_reason.assign(code)
            self.counts.assign_add(tf.one_hot(code - 1, len(REASONS), dtype=tf.int64))

        return on_applied, on_skipped

    def settle(self, applied, flags, grads, within=None) -> tf.Tensor:
        """`branches` in a cond of their own; returns the code (0: applied)."""
        on_applied, on_skipped = self.branches(flags, grads, within)

        def kept():
            on_applied()
            return tf.constant(APPLIED, tf.int64)

        def skipped():
            on_skipped()
            return tf.convert_to_tensor(self.last_reason)

        return tf.cond(applied, kept, skipped)

    # ------------------------------------------------------- its files

    store_keys = (COUNTS_KEY, LAST_KEY, _spike.STORE_KEY)

    def _saved_variables(self) -> dict:
        """``{key: variable}`` of the counts (``{}`` before `build`)."""
        if self.counts is None:
            return {}
        return {COUNTS_KEY: self.counts, LAST_KEY: self.last_reason}

    def save_into(self, store) -> None:
        """Adds the counts (after `build`) and the spike history (if on) to a
        ``.keras``/``.weights.h5`` store."""
        for key, variable in self._saved_variables().items():
            store[key] = np.asarray(variable.numpy(), np.int64).reshape(-1)
        if self.spike is not None:
            store[_spike.STORE_KEY] = self.spike.saved()

    def load_from(self, store) -> None:
        """Reads saved counts (kept for `build` when not built yet) and a
        spike history (kept for ``guard_spikes`` when off); an entry the
        file lacks (written before it was saved) is left as it is."""
        keys = list(store.keys())
        variables = self._saved_variables()
        for key, shape in ((COUNTS_KEY, (len(REASONS),)), (LAST_KEY, ())):
            if key not in keys:
                continue
            saved = np.asarray(store[key][...], np.int64).reshape(shape)
            if variables:
                variables[key].assign(saved)
            else:
                self.pending[key] = saved
        if _spike.STORE_KEY not in keys:
            return
        spike_saved = np.asarray(store[_spike.STORE_KEY][...], np.float64)
        if self.spike is None:
            self.pending_spike = spike_saved
        else:
            self.spike.assign_saved(spike_saved)

    def checkpoint_children(self) -> dict:
        """The counts' ``tf.train.Checkpoint`` children (after `build`) and
        the spike history's (if on)."""
        children = dict(self._saved_variables())
        if self.spike is not None:
            children.update(spike_guard_norms=self.spike.norms,
                            spike_guard_seen=self.spike.seen)
        return children

    def read(self) -> SkipReasons:
        """The counts in Python ints (one host read; before `build`, those
        read from a file, else zeros)."""
        if self.counts is None:
            pending = self.pending.get(COUNTS_KEY)
            return SkipReasons(*(int(c) for c in (
                pending if pending is not None else [0] * len(REASONS))))
        return SkipReasons(*(int(c) for c in np.asarray(self.counts.numpy())))


def _all_finite(grads) -> tf.Tensor:
    checks = [tf.reduce_all(tf.math.is_finite(
        g.values if isinstance(g, tf.IndexedSlices) else g)) for g in grads if g is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def attributable(code) -> tf.Tensor:
    """True when layer attribution should *not* look for a culprit.

    Only a skip for non-finite forward state or gradients has a layer to
    name; bad input or an update bound has none.
    """
    return tf.logical_not(tf.logical_or(tf.equal(code, FORWARD),
                                        tf.equal(code, GRADIENTS)))


def _usable_here(flag) -> bool:
    """Whether ``flag`` belongs to the graph being built now (or is eager)."""
    if not tf.is_tensor(flag) or not hasattr(flag, "graph"):
        return True
    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if flag.graph is graph:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False
