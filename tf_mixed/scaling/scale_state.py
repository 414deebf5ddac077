"""Loss-scale state as a value: the knobs, the state record, one transition."""

# Like ``jmp.DynamicLossScale`` and optax's transforms, the loss-scale rule is a
# pure function of a frozen configuration and a state record::
#
#     config = LossScaleConfig(initial_scale=1024.0, growth_interval=100)
#     state = initial_state(config)
#     for finite in (True, False, True):
#         state = next_state(config, state, finite)
#
# ``next_state`` is written once and runs on plain Python values (as above, for
# tests and for reasoning) and on TensorFlow tensors (the optimizer calls it
# inside its training step with the all-reduced ``finite`` verdict), so the rule
# the optimizer follows is the rule the tests check.
#
# The rule, for one step whose gradients were ``finite`` (on every replica):
#
# * finite: ``good_steps`` grows by one; after ``growth_interval`` of them in a
#   row the scale is multiplied by ``growth_factor`` (capped at ``max_scale``)
#   and ``good_steps`` restarts at 0. ``overflow_streak`` and
#   ``min_scale_skips`` restart at 0.
# * not finite: the step is skipped; ``skipped_steps`` grows by one,
#   ``good_steps`` restarts at 0, ``overflow_streak`` grows by one and after
#   ``hysteresis`` of them in a row the scale is multiplied by
#   ``backoff_factor`` (floored at ``min_scale``) and the streak restarts.
#   ``min_scale_skips`` counts the consecutive skipped steps that ran at the
#   lowest scale (``scale <= min_scale``, or any scale when it is fixed).
# * With ``dynamic=False`` the scale never changes; non-finite steps are still
#   skipped and counted.

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import numpy as np

from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import dtype_limits

__all__ = [
    "LossScaleConfig",
    "LossScaleState",
    "from_values",
    "initial_state",
    "next_state",
    "validate_knob",
]


# One row per knob: (name, kind, rule, description of the valid values).
# Every error message about a knob is built from this table.
KNOBS: tuple[tuple[str, type, Any, str], ...] = (
    ("initial_scale", float, lambda v: 0 < v < math.inf,
     "a finite number > 0"),
    ("growth_interval", int, lambda v: v >= 1, "an integer >= 1"),
    ("growth_factor", float, lambda v: 1 < v < math.inf,
     "a finite number > 1"),
    ("backoff_factor", float, lambda v: 0 < v < 1, "a number in (0, 1)"),
    ("min_scale", float, lambda v: 0 < v < math.inf, "a finite number > 0"),
    ("max_scale", float, lambda v: 0 < v < math.inf, "a finite number > 0"),
    ("hysteresis", int, lambda v: v >= 1, "an integer >= 1"),
)
_KNOB_ROWS = {row[0]: row for row in KNOBS}


def validate_knob(name: str, value: Any, owner: str = "LossScaleOptimizer"):
    """Checks one knob against its row in `KNOBS`; returns it as float/int.

    Numpy scalars (``np.float32(1024)``, ``np.int64(100)``) are accepted;
    bools, strings, None, NaN and infinities are refused.

    Args:
        name: The knob's name, a key of `KNOBS`.
        value: The value received.
        owner: The function or class named in the error message.

    Returns:
        The value as a Python ``float`` or ``int`` (the knob's kind).

    Raises:
        ValueError: if the value breaks its rule, or is not a number of the
            knob's kind (then a `tf_mixed._internal.validate.ArgumentTypeError`, both
            a TypeError and a ValueError). The message names the argument,
            the value and the rule.
    """
    _, kind, rule, valid = _KNOB_ROWS[name]
    # ValueError for every bad knob (ArgumentTypeError is one too): one
    # `except ValueError` catches them all, whatever was wrong with the value.
    return _validate.number(value, name, valid=valid, rule=rule,
                            integer=kind is int, integral_floats=True,
                            owner=owner)


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
    """The knobs of dynamic loss scaling, validated, frozen.

    Args:
        initial_scale: First loss scale, a finite number > 0 between
            ``min_scale`` and ``max_scale``. Powers of two keep the unscaling
            exact.
        growth_interval: Consecutive finite steps before the scale grows.
            Keras calls it ``dynamic_growth_steps``.
        growth_factor: Multiplier when the scale grows, ``> 1``.
        backoff_factor: Multiplier when the scale backs off, in ``(0, 1)``.
        min_scale: Lowest scale backoff reaches.
        max_scale: Highest scale growth reaches.
        hysteresis: Consecutive non-finite steps before the scale backs off
            (each one is still skipped). 1 backs off on every overflow.
        dynamic: False keeps ``initial_scale`` for ever (tf-keras's
            ``dynamic=False``); non-finite steps are still skipped.

    Raises:
        ValueError: a knob breaks its rule (the message names it, the value
            and the rule), or ``initial_scale`` is outside
            ``[min_scale, max_scale]``.
    """

    initial_scale: float = 2.0**15
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    hysteresis: int = 1
    dynamic: bool = True

    def __post_init__(self):
        for name, *_ in KNOBS:
            object.__setattr__(self, name,
                               validate_knob(name, getattr(self, name)))
        if not isinstance(self.dynamic, (bool, np.bool_)):
            raise _validate.ArgumentTypeError(
                "LossScaleOptimizer argument `dynamic` must be True or False. "
                f"Received: dynamic={self.dynamic!r} (of type "
                f"{type(self.dynamic).__name__})."
            )
        object.__setattr__(self, "dynamic", bool(self.dynamic))
        if self.dynamic and not (
                self.min_scale <= self.initial_scale <= self.max_scale):
            raise ValueError(
                "LossScaleOptimizer needs min_scale <= initial_scale <= "
                f"max_scale. Received: min_scale={self.min_scale}, "
                f"initial_scale={self.initial_scale}, max_scale="
                f"{self.max_scale}. Raise max_scale or lower min_scale to "
                "include initial_scale."
            )

    @classmethod
    def pass_through(cls) -> "LossScaleConfig":
        """Scale 1, never changes: for float32/bfloat16, skips only bad steps."""
        return cls(initial_scale=1.0, min_scale=1.0, dynamic=False)

    @classmethod
    def wire(cls) -> "LossScaleConfig":
        """At most 1, halved while a float16 gradient wire overflows.

        For a model that needs no loss scaling (float32/bfloat16 compute)
        whose gradients travel in float16 (``communication_dtype``): a mean
        gradient above 65504 overflows the wire, and with `pass_through`'s
        fixed scale every later step would be skipped too. This scale backs
        off (down to 2**-24) until the wire holds the gradients, then grows
        back towards 1 after ``growth_interval`` clean steps.
        """
        return cls(initial_scale=1.0, min_scale=dtype_limits("float16").smallest_subnormal,
                   max_scale=1.0)

    def to_dict(self) -> dict[str, Any]:
        """The knobs as a dict of Python values (for ``get_config``)."""
        return dataclasses.asdict(self)


class LossScaleState(NamedTuple):
    """The loss-scale state after some steps.

    ``loss_scale_state()`` returns it with Python numbers; inside the
    training step the same record holds tensors. A field is None when the
    optimizer it was read from does not keep that counter (Keras's own
    ``LossScaleOptimizer`` keeps only the scale and ``good_steps``).

    Attributes:
        scale: The loss scale the next step multiplies the loss by.
        good_steps: Consecutive finite steps since the scale last grew or a
            step was skipped (Keras's ``step_counter``).
        overflow_streak: Consecutive skipped steps not yet answered by a
            backoff (below ``hysteresis``).
        skipped_steps: Skipped steps in total.
        last_step_skipped: Whether the most recent step was skipped.
        min_scale_skips: Consecutive skipped steps, up to the most recent
            one, that ran at the lowest scale: loss scaling can do nothing
            more for them.
        skip_reasons: Skipped steps counted per reason, a
            `tf_mixed.scaling.write_guard.SkipReasons` (input, forward,
            gradients, update, spike); None where the optimizer does not
            count them. Not part of the scale rule: `next_state` passes it on.
        calibration_skips: Skipped steps that were the scale's calibration:
            before the first applied step, above ``min_scale``, for
            non-finite gradients (`tf_mixed.scaling.calibration`); None where
            the optimizer does not count them. Not part of the scale rule:
            `next_state` passes it on.
    """

    scale: Any
    good_steps: Any
    overflow_streak: Any
    skipped_steps: Any
    last_step_skipped: Any
    min_scale_skips: Any
    skip_reasons: Any = None
    calibration_skips: Any = None


RULE_FIELDS = 6
"""The first fields of `LossScaleState`, those `next_state` computes."""


def initial_state(config: LossScaleConfig) -> LossScaleState:
    """The state before the first step, in Python numbers."""
    return LossScaleState(
        scale=config.initial_scale, good_steps=0, overflow_streak=0,
        skipped_steps=0, last_step_skipped=False, min_scale_skips=0,
    )


def from_values(values, skip_reasons=None, calibration_skips=None) -> LossScaleState:
    """The state from its six variables' host values, in `LossScaleState` order."""
    return LossScaleState(
        scale=float(values[0]), good_steps=int(values[1]),
        overflow_streak=int(values[2]), skipped_steps=int(values[3]),
        last_step_skipped=bool(values[4]), min_scale_skips=int(values[5]),
        skip_reasons=skip_reasons, calibration_skips=calibration_skips)


def _value(x):
    """``x``, or what it computes when it is a function (a lazy value)."""
    return x() if callable(x) else x


class _PythonOps:
    """The few operations `next_state` needs, on Python values."""

    @staticmethod
    def where(condition, a, b):
        return _value(a) if condition else _value(b)

    and_ = staticmethod(lambda a, b: bool(a) and bool(_value(b)))
    or_ = staticmethod(lambda a, b: bool(a) or bool(_value(b)))
    not_ = staticmethod(lambda a: not a)
    maximum = staticmethod(max)
    minimum = staticmethod(min)


def _is_python(value) -> bool:
    return isinstance(value, (bool, int, float, np.generic))


class _TensorOps:
    """The same operations on TensorFlow tensors (imported lazily).

    A Python bool condition is decided here, in Python: no operation is built.
    """

    def __init__(self):
        import tensorflow as tf

        self.tf = tf

    def where(self, condition, a, b):
        if _is_python(condition):
            return _value(a) if condition else _value(b)
        a, b = _value(a), _value(b)
        tf = self.tf
        reference = a if tf.is_tensor(a) else b
        dtype = reference.dtype if tf.is_tensor(reference) else None
        a = tf.convert_to_tensor(a, dtype)
        b = tf.convert_to_tensor(b, a.dtype)
        return tf.where(condition, a, b)

    def and_(self, a, b):
        if _is_python(a):
            return _value(b) if a else False
        b = _value(b)
        if _is_python(b):
            return a if b else False
        return self.tf.logical_and(a, b)

    def or_(self, a, b):
        return self.tf.logical_or(a, _value(b))

    def not_(self, a):
        return (not a) if _is_python(a) else self.tf.logical_not(a)

    def maximum(self, a, b):
        return self.tf.maximum(a, self.tf.cast(b, a.dtype))

    def minimum(self, a, b):
        return self.tf.minimum(a, self.tf.cast(b, a.dtype))


def next_state(config: LossScaleConfig, state: LossScaleState,
               finite) -> LossScaleState:
    """The state after one step whose gradients were ``finite``.

    Pure: returns a new record and changes nothing. Runs on Python values
    (``finite`` a bool) and on tensors (``finite`` a scalar bool tensor,
    the state's fields tensors), with the same arithmetic.

    Args:
        config: The knobs.
        state: The state before the step.
        finite: Whether every gradient on every replica was finite, i.e.
            whether the step is applied. A Python bool with tensor fields
            builds only that verdict's operations (the optimizer's two
            branches); a field the verdict leaves alone is returned as given.

    Returns:
        The `LossScaleState` after the step.
    """
    ops = (_PythonOps if _is_python(finite) and all(map(_is_python, state[:RULE_FIELDS]))
           else _TensorOps())
    # A `lambda` is a value `ops.where` computes only when it may be chosen.
    skipped = ops.not_(finite)
    good_steps = ops.where(finite, lambda: state.good_steps + 1, 0)
    overflow_streak = ops.where(finite, 0, lambda: state.overflow_streak + 1)
    scale = state.scale
    # A fixed scale is its own minimum. (Annotated here, not inside the branch:
    # AutoGraph gives up on a function with an annotated assignment in a branch.)
    at_min: Any = True
    if config.dynamic:
        grow = ops.and_(finite, lambda: good_steps >= config.growth_interval)
        back_off = ops.and_(skipped, lambda: overflow_streak >= config.hysteresis)
        scale = ops.where(
            back_off,
            lambda: ops.maximum(scale * config.backoff_factor, config.min_scale),
            lambda: ops.where(grow,
                              lambda: ops.minimum(scale * config.growth_factor,
                                                  config.max_scale),
                              scale),
        )
        good_steps = ops.where(grow, 0, good_steps)
        overflow_streak = ops.where(back_off, 0, overflow_streak)
        at_min = lambda: state.scale <= config.min_scale  # noqa: E731
    min_scale_skips = ops.where(
        ops.and_(skipped, at_min), lambda: state.min_scale_skips + 1, 0)
    return LossScaleState(
        scale=scale,
        good_steps=good_steps,
        overflow_streak=overflow_streak,
        skipped_steps=ops.where(skipped, lambda: state.skipped_steps + 1,
                                state.skipped_steps),
        last_step_skipped=skipped,
        min_scale_skips=min_scale_skips,
        skip_reasons=state.skip_reasons,
        calibration_skips=state.calibration_skips,
    )
