"""Float8 scales every replica and worker agrees on: the optimizer's side."""

# Keras's float8 layers (``model.quantize("float8")``, Dense and EinsumDense)
# keep, per quantized tensor (``inputs``, ``kernel``, ``outputs_grad``), a
# scale and an amax history. Their backward pass returns the *new* scale and
# history as the "gradients" of those variables, and the optimizer writes them
# over the variables (``overwrite_with_gradient``). Under a
# ``tf.distribute`` strategy each replica writes its own local values into its
# own copy (aggregation NONE, before any all-reduce), so replicas drift apart
# (measured on TF 2.21: docs/float8.md). Here the optimizer takes the float8 pairs out of the
# gradient list and writes them itself:
#
# 1. ``split``: each replica reads its local amax of this step (element 0 of
#    the new history Keras computed) for every quantized tensor; an output-
#    gradient amax is divided by the loss scale of the step, so histories are
#    kept in unscaled units whatever the loss scale does.
# 2. ``payload``: the amaxes are laid out in this replica's own slot of a
#    ``[tensors x replicas]`` float32 buffer, zeros elsewhere, non-finite
#    amaxes written as -1 (an amax is never negative). A SUM all-reduce of
#    that buffer is an exact all-gather (``x + 0 = x``), so it rides the
#    single gradient all-reduce as one more float32 piece of the buffer; when
#    the gradients travel in float16/bfloat16 it takes one small float32
#    collective of its own (amaxes must not be rounded).
# 3. ``finite``: a non-finite amax anywhere makes the step's verdict
#    non-finite, read from the same gathered bytes on every replica. The
#    casts saturate (an inf becomes the format's largest value times the
#    scale), so the gradients alone would hide it: an inf input would be
#    trained on, clipped, and an output gradient that overflowed in a layer
#    without bias would never back the loss scale off. Keras's wrapper skips
#    such a step too (its finite check reads the history "gradients").
# 4. ``finish``: every replica reads the same gathered bytes, takes the MAX
#    per tensor (the amax of the global batch), and writes, in its own replica
#    context, the same new history and scale into its own copy. A skipped
#    step writes nothing but the loss scale's change into the output-gradient
#    scale (below); a non-finite amax is counted, never entered.
#
# The scale follows Keras's rule and timing exactly (the scale written at step
# ``t`` comes from the history *before* step ``t``'s amax), with the margin
# and amax algorithm of `Float8Scaling`. The output-gradient scale variable is
# what Keras's layer divides the *loss-scaled* gradient by, so it holds the
# unscaled scale times the loss scale of the next step.
#
# Per tensor the optimizer also keeps counters (not saved in checkpoints):
# steps whose global amax, over the scale in use, went beyond what the cast
# rounds to its largest value (`clipping_overflow`: values were clipped, not
# just rounded), non-finite amaxes, and the last agreed amax;
# `tf_mixed.float8.state` reads them. The margin and amax
# algorithm live in variables the step reads (`Float8Sync.refresh_scaling`),
# so changing them on a trained model takes effect at the next step.

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import dtype_limits

__all__ = [
    "ALGORITHMS",
    "FORMATS",
    "KINDS",
    "SATURATION_LIMITS",
    "Float8Scaling",
    "Float8Sync",
    "Slot",
    "clipping_overflow",
    "find_slots",
    "next_scale",
    "scaling_of",
    "set_scaling",
]

# The quantized tensors of a Keras float8 layer, in Keras's variable order,
# and the float8 format each one is cast to (keras/src/layers/core/dense.py).
KINDS = _internals.FLOAT8_KINDS
FORMATS = {"inputs": "float8_e4m3fn", "kernel": "float8_e4m3fn",
           "outputs_grad": "float8_e5m2"}
# Largest finite value and smallest positive subnormal of each format.
FORMAT_LIMITS = {name: (limits.max, limits.smallest_subnormal)
                 for name in ("float8_e4m3fn", "float8_e5m2")
                 for limits in [dtype_limits(name)]}
# Where the clip to the largest finite value starts to change a value by more
# than the cast's own rounding would: the largest finite value plus half the
# spacing below it (448 + 32/2 = 464; 57344 + 8192/2 = 61440). A scaled value
# below this would round to the largest finite value anyway; beyond it, it is
# clipped.
SATURATION_LIMITS = {name: limits.max + 2.0 ** math.floor(math.log2(limits.max)) * limits.eps / 2
                     for name in ("float8_e4m3fn", "float8_e5m2")
                     for limits in [dtype_limits(name)]}
# How the amax that sets the scale is taken from the history.
ALGORITHMS = ("max", "most_recent")

_SCALING_ATTRIBUTE = "_tf_mixed_float8_scaling"


@dataclasses.dataclass(frozen=True)
class Float8Scaling:
    """How a float8 layer's scales follow its amax history.

    Attributes:
        margin: The scale leaves ``2**margin`` of headroom above the amax
            (Transformer Engine's ``margin``); 0 is Keras's behaviour.
        amax_compute_algo: ``"max"`` (the largest amax of the history,
            Keras's behaviour) or ``"most_recent"`` (the last one).
    """

    margin: int = 0
    amax_compute_algo: str = "max"

    def __post_init__(self):
        _validate.number(self.margin, "margin", integer=True,
                         rule=lambda m: m >= 0, owner="Float8Scaling",
                         valid="an integer >= 0 (the scale keeps 2**margin of "
                               "headroom), such as 0 or 1")
        if self.amax_compute_algo not in ALGORITHMS:
            raise ValueError(
                "`amax_compute_algo` must be one of "
                f"{', '.join(repr(a) for a in ALGORITHMS)}. Received: "
                f"amax_compute_algo={self.amax_compute_algo!r}.")


class Slot(NamedTuple):
    """One quantized tensor of one float8 layer, as the optimizer sees it.

    Attributes:
        layer: The layer's path (the variables' path without the name).
        kind: ``"inputs"``, ``"kernel"`` or ``"outputs_grad"``.
        scale: The scale variable.
        history: The amax-history variable.
        scaling: Its `Float8Scaling`.
    """

    layer: str
    kind: str
    scale: Any
    history: Any
    scaling: Float8Scaling


def set_scaling(layer, scaling: Float8Scaling) -> None:
    """Records ``scaling`` for a float8 layer's variables (read by the optimizer).

    Kept on the layer's history variables (a tf_mixed attribute), not in the
    ``.keras`` file: after loading a model, call
    `tf_mixed.float8.quantize` on it again to set a non-default scaling.
    """
    for kind in KINDS:
        _, history = _internals.float8_variables(layer, kind)
        setattr(history, _SCALING_ATTRIBUTE, scaling)


def scaling_of(history_variable) -> Float8Scaling:
    """The `Float8Scaling` of an amax-history variable (Keras's by default)."""
    return getattr(history_variable, _SCALING_ATTRIBUTE, Float8Scaling())


def _name(variable) -> str:
    return getattr(variable, "path", None) or variable.name


def find_slots(variables: Sequence) -> list[Slot]:
    """The float8 scale/history pairs among ``variables``, in their order.

    A pair is recognised by Keras's variable names (``<kind>_scale`` and
    ``<kind>_amax_history`` of the same layer path) and Keras's
    ``overwrite_with_gradient`` flag.

    Args:
        variables: Keras variables (an optimizer's trainable variables).

    Returns:
        One `Slot` per quantized tensor whose two variables are both present.
    """
    by_path = {}
    for variable in variables:
        if not getattr(variable, "overwrite_with_gradient", False):
            continue
        layer, _, name = _name(variable).rpartition("/")
        by_path[(layer, name)] = variable
    slots = []
    for (layer, name), history in by_path.items():
        for kind in KINDS:
            if name == f"{kind}_amax_history" and (layer, f"{kind}_scale") in by_path:
                slots.append(Slot(layer, kind, by_path[(layer, f"{kind}_scale")],
                                  history, scaling_of(history)))
    return slots


def _scale_from(history, scale, kind: str, margin, most_recent):
    """`next_scale` with the knobs as tensors (read when the step runs)."""
    amax = tf.where(most_recent, history[0], tf.reduce_max(history, axis=0))
    top = tf.constant(FORMAT_LIMITS[FORMATS[kind]][0], tf.float32)
    return keras.quantizers.compute_float8_scale(amax, scale, top,
                                                 margin=margin)


def next_scale(history, scale, kind: str, scaling: Float8Scaling):
    """Keras's new scale from a history, with margin and algorithm.

    The same function Keras's layer calls
    (``keras.quantizers.compute_float8_scale``), so with the default
    scaling the value is bit-identical to Keras's: ``amax * 2**margin /
    format_max``, or ``scale`` unchanged when the amax is 0 or not finite.

    Args:
        history: The amax history (unscaled units), a float32 vector.
        scale: The scale in use (unscaled units).
        kind: Which tensor, for its float8 format.
        scaling: The `Float8Scaling`.

    Returns:
        The new scale, a float32 scalar tensor.
    """
    return _scale_from(history, scale, kind,
                       tf.constant(float(scaling.margin), tf.float32),
                       tf.constant(scaling.amax_compute_algo == "most_recent"))


def clipping_overflow(kind: str) -> float:
    """The ``amax / (scale * largest value)`` beyond which a cast clips values.

    A step *saturates* a tensor when its amax, divided by the scale in use,
    lies beyond `SATURATION_LIMITS` of its format: some value then lost
    more to the clip than the cast's rounding would take (1.0357 for
    e4m3fn, 1.0714 for e5m2). An amax just above the largest value (a
    kernel that grew by less than that, or the one-ulp rounding of an
    unchanged kernel's scale) rounds to the largest value anyway.
    """
    fmt = FORMATS[kind]
    return SATURATION_LIMITS[fmt] / FORMAT_LIMITS[fmt][0]


def _roll_in(history, amax):
    """Keras's history update: roll left by one, newest amax at index 0."""
    rolled = tf.roll(history, shift=-1, axis=0)
    return tf.tensor_scatter_nd_update(rolled, [[0]], tf.reshape(amax, [1]))


class Float8Step(NamedTuple):
    """What `Float8Sync.split` took out of one step's gradients."""

    amax: tf.Tensor  # [K] float32, this replica's amaxes, -1 where non-finite


class Float8Sync:
    """Agrees float8 scales and histories across replicas; held by the optimizer.

    Args:
        slots: The quantized tensors (`find_slots`).
    """

    def __init__(self, slots: Sequence[Slot]):
        self.slots = tuple(slots)
        self._variables = {id(v) for s in self.slots for v in (s.scale, s.history)}
        k = len(self.slots)
        # The overflow (amax over scale times the format's largest value)
        # beyond which values were clipped, not just rounded, per slot.
        self._clipping_overflow = [clipping_overflow(s.kind) for s in self.slots]

        def counter(dtype, value=0):
            return tf.Variable(tf.fill([k], tf.constant(value, dtype)),
                               trainable=False,
                               aggregation=tf.VariableAggregation.NONE)

        # Identical on every replica: written from the gathered amaxes.
        self.saturated_steps = counter(tf.int64)
        self.nonfinite_amax = counter(tf.int64)
        self.last_amax = counter(tf.float32, -1.0)
        self.last_overflow = counter(tf.float32, 0.0)
        # The knobs of every slot, as variables: a step reads them when it
        # runs, so `refresh_scaling` takes effect without a retrace.
        # (Initial values, not an assign: built inside a traced step, an
        # assign would run again at every step.)
        def knob(values, dtype):
            return tf.Variable(tf.constant(values, dtype, shape=[k]),
                               trainable=False,
                               aggregation=tf.VariableAggregation.NONE)

        self.margin = knob([float(s.scaling.margin) for s in self.slots],
                           tf.float32)
        self.most_recent = knob(
            [s.scaling.amax_compute_algo == "most_recent" for s in self.slots],
            tf.bool)
        # Consecutive applied steps in which some tensor saturated, and the
        # longest such run since `reset_streaks` (the optimizer's build, or
        # the start of a fit under `Float8Monitor`).
        self.streak = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                  aggregation=tf.VariableAggregation.NONE)
        self.longest_streak = tf.Variable(
            tf.constant(0, tf.int64), trainable=False,
            aggregation=tf.VariableAggregation.NONE)

    def refresh_scaling(self) -> None:
        """Reads every slot's `Float8Scaling` again (after `set_scaling`).

        `tf_mixed.float8.quantize` calls it on a trained model's optimizer,
        so a new margin or amax algorithm takes effect from the next step,
        in a step already traced too. Call it eagerly.
        """
        self.slots = tuple(slot._replace(scaling=scaling_of(slot.history))
                           for slot in self.slots)
        self.margin.assign([float(s.scaling.margin) for s in self.slots])
        self.most_recent.assign(
            [s.scaling.amax_compute_algo == "most_recent" for s in self.slots])

    def reset_streaks(self) -> None:
        """Starts the saturation streaks afresh (the other counters keep counting).

        ``Float8Monitor`` calls it at the start of every ``fit``, so a streak
        of an earlier run never stops a later one. Call it eagerly.
        """
        self.streak.assign(tf.zeros_like(self.streak))
        self.longest_streak.assign(tf.zeros_like(self.longest_streak))

    @classmethod
    def for_variables(cls, variables, accumulation_steps: int | None = None
                      ) -> Float8Sync | None:
        """A sync for the float8 pairs among ``variables``, or None if none.

        Args:
            variables: The optimizer's trainable variables.
            accumulation_steps: The optimizer's gradient accumulation window
                (None: none).

        Raises:
            ValueError: if ``variables`` hold float8 pairs and
                ``accumulation_steps`` is set (not supported yet).
        """
        slots = find_slots(variables)
        if not slots:
            return None
        if accumulation_steps is not None:
            raise ValueError(
                "LossScaleOptimizer cannot yet accumulate gradients of a model with "
                "float8 layers: the float8 scales would not be agreed across "
                "replicas. Received: gradient_accumulation_steps="
                f"{accumulation_steps} and {len(slots)} float8 "
                "tensors. Train the float8 model without accumulation.")
        return cls(slots)

    def owns(self, variable) -> bool:
        """Whether ``variable`` is a scale or history this sync writes."""
        return id(variable) in self._variables

    # ------------------------------------------------------------ per step

    def split(self, grads, variables, loss_scale, divided: bool = False):
        """Takes the float8 pairs out of a step's gradients.

        Args:
            grads: One gradient per variable.
            variables: The variables.
            loss_scale: The loss scale this step's loss was multiplied by
                (1 when none).
            divided: Whether every gradient, these included, was already
                divided by ``loss_scale`` (``unscale_gradients`` before
                ``apply(..., unscaled=True)``).

        Returns:
            ``(grads, variables, step)``: the other gradients and variables,
            in order, and a `Float8Step` with this replica's amaxes.
        """
        index = {id(v): i for i, v in enumerate(variables)}
        amaxes = []
        for slot in self.slots:
            i = index.get(id(slot.history))
            if i is None or grads[i] is None:
                raise ValueError(
                    f"Float8 layer '{slot.layer}' has no {slot.kind} amax "
                    "history gradient in this step: a float8 layer must take "
                    "part in every step of the model it was built for. "
                    f"Received: gradient=None for '{_name(slot.history)}'.")
            amax = tf.cast(_internals.float8_newest_amax(
                tf.convert_to_tensor(grads[i])), tf.float32)
            scale = tf.cast(loss_scale, tf.float32)
            # Only the output gradient carries the loss scale; a division of
            # every gradient by it is undone for the inputs and kernel.
            if slot.kind == "outputs_grad" and not divided:
                amax = amax / scale
            elif slot.kind != "outputs_grad" and divided:
                amax = amax * scale
            amaxes.append(amax)
        amax = tf.stack(amaxes)
        amax = tf.where(tf.math.is_finite(amax), amax, -tf.ones_like(amax))
        keep = [i for i, v in enumerate(variables) if not self.owns(v)]
        return ([grads[i] for i in keep], [variables[i] for i in keep],
                Float8Step(amax))

    def payload(self, step: Float8Step, replica_context) -> tf.Tensor:
        """This replica's amaxes in its slot of a ``[K * replicas]`` buffer."""
        replicas = _replicas(replica_context)
        if replicas == 1:
            return step.amax
        replica = tf.cast(replica_context.replica_id_in_sync_group, tf.int32)
        mine = tf.one_hot(replica, replicas, dtype=tf.float32)
        return tf.reshape(step.amax[:, None] * mine[None, :], [-1])

    def gather(self, step: Float8Step, replica_context) -> tf.Tensor:
        """The payload all-reduced on its own (one small float32 collective)."""
        buffer = self.payload(step, replica_context)
        if _replicas(replica_context) == 1:
            return buffer
        return replica_context.all_reduce(tf.distribute.ReduceOp.SUM, buffer)

    def finite(self, gathered) -> tf.Tensor:
        """True when every gathered amax is finite (non-finite ones are -1).

        Args:
            gathered: The all-reduced payload (identical on every replica).

        Returns:
            A scalar bool tensor, the same on every replica and worker.
        """
        return tf.reduce_all(tf.cast(gathered, tf.float32) >= 0.0)

    def finish(self, gathered, applied, loss_scale, next_loss_scale) -> None:
        """Writes the agreed histories and scales into this replica's copies.

        Args:
            gathered: The all-reduced payload (identical on every replica).
            applied: Scalar bool, the step's global verdict.
            loss_scale: The loss scale of this step.
            next_loss_scale: The loss scale of the next step.
        """
        k = len(self.slots)
        table = tf.reshape(tf.cast(gathered, tf.float32), [k, -1])
        bad = tf.reduce_any(table < 0, axis=1)
        amax = tf.reduce_max(table, axis=1)
        applied = tf.convert_to_tensor(applied)
        advance = tf.logical_and(applied, tf.logical_not(bad))
        before = tf.cast(loss_scale, tf.float32)
        after = tf.cast(next_loss_scale, tf.float32)
        overflow = []
        for i, slot in enumerate(self.slots):
            history = tf.convert_to_tensor(slot.history.value)
            in_use = tf.convert_to_tensor(slot.scale.value)
            if slot.kind == "outputs_grad":
                in_use = in_use / before
            top = FORMAT_LIMITS[FORMATS[slot.kind]][0]
            overflow.append(tf.where(bad[i], 0.0, amax[i] / (in_use * top)))
            new_scale = tf.where(applied, _scale_from(
                history, in_use, slot.kind, self.margin[i],
                self.most_recent[i]), in_use)
            new_history = tf.where(advance[i], _roll_in(history, amax[i]),
                                   history)
            if slot.kind == "outputs_grad":
                new_scale = new_scale * after
            slot.history.assign(new_history)
            slot.scale.assign(new_scale)
        overflow = tf.stack(overflow)
        saturated = tf.logical_and(
            applied, overflow > tf.constant(self._clipping_overflow, tf.float32))
        self.saturated_steps.assign_add(tf.cast(saturated, tf.int64))
        streak = tf.where(
            applied,
            tf.where(tf.reduce_any(saturated), self.streak + 1,
                     tf.zeros_like(self.streak)),
            self.streak)
        self.streak.assign(streak)
        self.longest_streak.assign(tf.maximum(self.longest_streak, streak))
        self.nonfinite_amax.assign_add(tf.cast(bad, tf.int64))
        self.last_amax.assign(tf.where(bad, -1.0, amax))
        self.last_overflow.assign(overflow)


def _replicas(replica_context) -> int:
    if replica_context is None:
        return 1
    return int(replica_context.num_replicas_in_sync)
