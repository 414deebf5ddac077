"""The optional spike guard: a step whose gradient norm leaps above its history is skipped."""

# Large-scale trainers (OLMo, MaxText, levanter) skip by hand a step whose
# gradient norm spikes, for the weights only.
# `tf_mixed.scaling.optimizer.guard_spikes` does it inside
# the step, under the write guard's contract (`tf_mixed.scaling.write_guard`:
# reason "spike"; weights, slots, iterations, forward state, metrics and loss
# left as they were). Off by default.
#
# The rule (`SpikeRule`, pure arithmetic, `is_spike`): once ``window`` applied
# steps have been seen, a step is a spike when its global gradient norm
# (the reduced, unscaled gradients: the same bytes on every replica, so every
# replica and worker agrees without a collective) is above
#
#     mean + threshold * max(std, 0.01 * mean)
#
# over the norms of the last ``window`` applied steps (the floor keeps a flat
# history from calling every wobble a spike); a non-finite norm is a spike
# too. A skipped step's norm does not join the history, so a run of spikes
# is judged against the steps before it. The history (``norms``, a ring of
# ``window`` float32 values, and ``seen``, applied steps counted) is in the
# optimizer's ``tf.train.Checkpoint`` (children ``spike_guard_norms`` and
# ``spike_guard_seen``) and in its ``.keras``/``.weights.h5`` entry
# (`STORE_KEY`).

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import tensorflow as tf

from tf_mixed._internal import validate as _validate

__all__ = ["STORE_KEY", "SpikeGuard", "SpikeRule", "is_spike", "turn_on"]

STORE_KEY = "spike_guard"
_FLOOR = 0.01  # the std's floor, as a fraction of the mean


@dataclasses.dataclass(frozen=True)
class SpikeRule:
    """When a gradient norm is a spike (see the module's rule).

    Args:
        window: Applied steps whose norms form the history (and the warm-up:
            no step is judged before that many were seen). Integer >= 2.
        threshold: How many standard deviations above the mean a norm may
            reach. A finite number > 0.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range.
    """

    window: int = 100
    threshold: float = 6.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", _validate.number(
            self.window, "window", owner="SpikeRule", integer=True,
            rule=lambda v: v >= 2, valid="an integer >= 2, such as 100"))
        object.__setattr__(self, "threshold", _validate.number(
            self.threshold, "threshold", owner="SpikeRule",
            rule=lambda v: 0 < v < math.inf, valid="a finite number > 0, such as 6.0"))


def is_spike(rule: SpikeRule, history, norm) -> bool:
    """The rule on plain numbers: is ``norm`` a spike after ``history``?

    Args:
        rule: The rule.
        history: The norms of the applied steps so far, oldest first.
        norm: This step's gradient norm.

    Returns:
        True when the step would be skipped.
    """
    recent = np.asarray(list(history)[-rule.window:], np.float64)
    if len(list(history)) < rule.window:
        return False
    if not math.isfinite(norm):
        return True
    mean, std = float(recent.mean()), float(recent.std())
    return norm > mean + rule.threshold * max(std, _FLOOR * mean)


class SpikeGuard:
    """The rule and its history variables (aggregation none: every replica
    writes the same values, computed from the reduced gradients)."""

    def __init__(self, rule: SpikeRule) -> None:
        self.rule = rule

        def variable(value, dtype):
            return tf.Variable(tf.constant(value, dtype), trainable=False,
                               aggregation=tf.VariableAggregation.NONE)

        self.norms = variable([0.0] * rule.window, tf.float32)
        self.seen = variable(0, tf.int64)
        self.norm: Any = None  # this step's norm, between `breaks` and `observe`

    def breaks(self, grads, divisor=None) -> tf.Tensor:
        """Whether this step's gradients break the rule (a scalar bool tensor)."""
        squares = [tf.reduce_sum(tf.square(tf.cast(
            g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32)))
            for g in grads if g is not None]
        norm = tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0)
        if divisor is not None:
            norm = norm / tf.cast(divisor, tf.float32)
        self.norm = norm
        mean = tf.reduce_mean(self.norms)
        std = tf.math.reduce_std(self.norms)
        limit = mean + self.rule.threshold * tf.maximum(std, _FLOOR * mean)
        warm = self.seen >= self.rule.window
        return tf.logical_and(warm, tf.logical_not(norm <= limit))

    def observe(self) -> None:
        """After an applied step: its norm joins the history."""
        slot = tf.one_hot(self.seen % self.rule.window, self.rule.window)
        self.norms.assign(self.norms * (1.0 - slot) + slot * self.norm)
        self.seen.assign_add(1)

    def saved(self) -> np.ndarray:
        """The history as one float64 vector: ``[seen, *norms]``."""
        return np.concatenate([[float(self.seen.numpy())],
                               np.asarray(self.norms.numpy(), np.float64)])

    def assign_saved(self, saved) -> None:
        """Restores `saved` output; refuses a history of another window."""
        saved = np.asarray(saved, np.float64)
        if saved.shape != (self.rule.window + 1,):
            raise ValueError(
                f"The saved spike history holds {saved.shape[0] - 1} norms; this "
                f"SpikeRule's window is {self.rule.window}. Pass "
                f"SpikeRule(window={saved.shape[0] - 1}) to guard_spikes().")
        self.seen.assign(int(saved[0]))
        self.norms.assign(saved[1:].astype(np.float32))


def turn_on(guard, rule: SpikeRule | None = None) -> SpikeGuard:
    """Puts a `SpikeGuard` of ``rule`` into a write guard (`guard_spikes`'s work).

    Args:
        guard: A `tf_mixed.scaling.write_guard.StepGuard`.
        rule: The `SpikeRule`; None: ``SpikeRule()`` (window 100, threshold 6).

    Returns:
        The `SpikeGuard`, holding any history read from a file before.

    Raises:
        TypeError: ``rule`` is not a `SpikeRule`.
        ValueError: a history read from a file has another window.
    """
    rule = SpikeRule() if rule is None else rule
    if not isinstance(rule, SpikeRule):
        raise TypeError(
            "guard_spikes() argument `rule` must be a SpikeRule or None. "
            f"Received: rule={rule!r:.80} (of type {type(rule).__name__}).")
    spike = SpikeGuard(rule)
    if guard.pending_spike is not None:
        spike.assign_saved(guard.pending_spike)
        guard.pending_spike = None
    guard.spike = spike
    return spike
