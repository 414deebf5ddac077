"""The healing rule: a layer that keeps overflowing moves to float32 compute."""

# `HealRule` holds the knobs (checked once), `decide` is the rule as a pure
# function of what `tf_mixed.scaling.attribution` read, `move_to_float32` sets
# a layer's and its sublayers' dtype policy to float32 (Keras 3.15's
# ``Layer.dtype_policy`` setter works on a built layer: under a mixed policy
# the variables are float32 already, so only the compute dtype changes), and
# `Healer` puts the three together for ``fit`` (`tf_mixed.callbacks.Heal`) and
# for `tf_mixed.training.make_train_step`. The retrace is the caller's.
#
# Every value the rule reads is the same on every replica and worker (the
# counters follow the all-reduced verdict and flags), so every worker takes the
# same decision at the same step: none moves a layer or retraces alone.


from __future__ import annotations

import dataclasses
import math

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate
from tf_mixed.policy import precision_map
from tf_mixed.scaling.attribution import (
    FORWARD,
    GRADIENT_AT_MIN_SCALE,
    KINDS,
    STORE_KEY,
    LayerAttribution,
)
from tf_mixed.scaling.healed_set import (
    apply_restored,
    from_tensors,
    heal,
    healed_map,
    resolve,
    to_tensors,
)

__all__ = ["Decision", "HealRule", "Healer", "HealingLimit", "decide", "describe", "heal",
           "healed_map", "move_to_float32"]

FLOAT32 = "float32"


class HealingLimit(RuntimeError):
    """A healing would move more of the model than `HealRule.max_fraction` allows."""


@dataclasses.dataclass(frozen=True)
class HealRule:
    """When a layer moves to float32 compute (defaults: docs/healing.md).

    Attributes:
        skips: A layer moves once it is the culprit of this many skipped
            steps within ``window`` steps. Only culprits that a lower loss
            scale cannot cure count: forward outputs, and gradients at the
            minimum scale.
        window: The steps (applied and skipped) the count looks back over.
        max_fraction: At most this fraction of the attributed layers may
            move (at least one layer). A decision that would move more stops
            the run instead, with the evidence.
    """

    skips: int = 5
    window: int = 50
    max_fraction: float = 0.25

    def __post_init__(self):
        def check(name, value, valid, rule, integer):
            object.__setattr__(self, name, _validate.number(
                value, name, valid=valid, rule=rule, integer=integer, owner="HealRule"))

        check("skips", self.skips, "an integer >= 1, such as 5", lambda v: v >= 1, True)
        check("window", self.window, "an integer >= 1, such as 50", lambda v: v >= 1, True)
        check("max_fraction", self.max_fraction, "a number in (0, 1], such as 0.25",
              lambda v: 0.0 < v <= 1.0, False)
        if self.window < self.skips:
            raise ValueError(
                "HealRule needs window >= skips (a window shorter than the count "
                f"can never fill). Received: skips={self.skips}, window={self.window}.")

    def limit(self, layers: int) -> int:
        """How many of ``layers`` attributed layers may move."""
        return max(1, math.floor(self.max_fraction * layers))


@dataclasses.dataclass(frozen=True)
class Decision:
    """What `decide` found.

    Attributes:
        move: Layers to move now, in the model's order.
        evidence: Per layer, the attributed skips that count.
        stop: Why the run must stop instead (None: it goes on).
        step: The optimizer step the decision was taken at.
    """

    move: tuple = ()
    evidence: dict = dataclasses.field(default_factory=dict)
    stop: str | None = None
    step: int = 0


def decide(rule: HealRule, skips, healed, names, now: int) -> Decision:
    """The rule as a pure function.

    Args:
        rule: The `HealRule`.
        skips: `tf_mixed.scaling.attribution.AttributedSkip` records.
        healed: Names already moved.
        names: Every attributed layer's name, in the model's order.
        now: The latest optimizer step (applied + skipped).

    Returns:
        A `Decision`.
    """
    counting = [s for s in skips
                if s.kind in (FORWARD, GRADIENT_AT_MIN_SCALE)
                and s.step > now - rule.window and s.layer not in healed]
    evidence: dict = {}
    for s in counting:
        evidence.setdefault(s.layer, []).append(s)
    move = tuple(n for n in names if len(evidence.get(n, ())) >= rule.skips)
    evidence = {n: tuple(evidence[n]) for n in move}
    if not move:
        return Decision()
    limit = rule.limit(len(names))
    if len(healed) + len(move) > limit:
        return Decision(move=(), evidence=evidence, step=now, stop=(
            f"at step {now} healing would move {len(healed) + len(move)} of {len(names)} layers to "
            f"float32, past the limit of {limit} (max_fraction={rule.max_fraction}); "
            f"already moved: {list(healed) or 'none'}; culprits now: "
            + "; ".join(describe(n, evidence[n]) for n in move)))
    return Decision(move=move, evidence=evidence, step=now)


def describe(name: str, skips) -> str:
    """``'name': N skipped steps (steps a, b, c; forward output)``."""
    kinds = sorted({KINDS[s.kind] for s in skips})
    steps = ", ".join(str(s.step) for s in skips)
    return f"'{name}': {len(skips)} skipped steps (steps {steps}; {', '.join(kinds)})"


def move_to_float32(layer) -> list:
    """Sets ``layer``'s and its sublayers' dtype policy to float32.

    Through `tf_mixed.policy.precision_map.move`, the one way a built
    model's precision moves.

    Args:
        layer: A built Keras layer whose variables are float32 (a mixed
            policy).

    Returns:
        The layers whose policy changed.

    Raises:
        ValueError: if the layer keeps variables in a half dtype (pure
            float16/bfloat16): moving its compute would not move its
            weights.
    """
    return precision_map.move(layer, {precision_map.layer_path(sub): FLOAT32
                                      for sub in _internals.sublayers(layer)})


class Healer:
    """Reads the attribution, applies the rule, moves layers (no retrace).

    Args:
        model: A built model.
        optimizer: Its ``tf_mixed.LossScaleOptimizer``.
        rule: A `HealRule`.

    Raises:
        TypeError: if ``optimizer`` is not a ``tf_mixed.LossScaleOptimizer``.
        ValueError: as `tf_mixed.scaling.attribution.LayerAttribution.attach`.
    """

    def __init__(self, model, optimizer, rule: HealRule | None = None):
        from tf_mixed.scaling.optimizer import LossScaleOptimizer

        if not isinstance(optimizer, LossScaleOptimizer):
            raise TypeError(
                "Healing needs a tf_mixed.LossScaleOptimizer (its step holds the "
                "all-reduce the attribution flags ride). Received: optimizer="
                f"{type(optimizer).__name__}. Compile with "
                "optimizer=tf_mixed.wrap_optimizer(...).")
        self.rule = rule or HealRule()
        self.attribution = LayerAttribution.attach(model, optimizer)
        self._seen = -1
        # A tf.train.Checkpoint of the optimizer holds the healed map beside the
        # attribution's counters and applies it when restored (or, restored
        # before this call, when this child is first listed).
        state = self.attribution.state
        state.healed_map = _internals.checkpoint_value(
            lambda: to_tensors(self.healed), self._restore_healed)
        _internals.restore_deferred(optimizer, STORE_KEY, state)
        # Read before healing was attached, a checkpoint's counters wait on
        # the child the optimizer listed then (`AttributionSlot.waiting`).
        waiting = self.attribution.slot.waiting
        if waiting is not None:
            for name, child in _internals.trackable_children(state).items():
                _internals.restore_deferred(waiting, name, child)

    @property
    def healed(self) -> tuple:
        """Names of the layers moved so far (read from the optimizer's state)."""
        return self.attribution.read().healed

    def healed_map(self) -> precision_map.PrecisionMap:
        """The precision the model computes in with its healed set applied."""
        return healed_map(self.attribution.model, self.healed)

    def _move(self, names) -> tuple:
        """Heals ``names`` through the map (`moves` counts a change)."""
        return heal(self.attribution.model, names)

    def reapply(self) -> tuple:
        """Moves the layers the state says were healed (a resumed run).

        Returns:
            Names of the layers whose policy changed now (the caller retraces
            when any did).
        """
        wanted = set(self.attribution.read().healed)
        slot = self.attribution.slot
        wanted.update(resolve(self.attribution.model, slot.pending_healed(),
                              (slot.pending or {}).get("layers")).names.values())
        names = [n for n in self.attribution.names if n in wanted]
        moved = self._move(names)
        if names:
            self.attribution.mark_healed(names)
        return moved

    def _restore_healed(self, tensors: dict) -> None:
        """A restored checkpoint applies the healed map it holds, at once."""
        saved = from_tensors(tensors)
        healed = resolve(self.attribution.model, saved).names.values()
        names = [n for n in self.attribution.names if n in healed]
        if names:
            self.attribution.mark_healed(names)
        apply_restored(self.attribution.model, saved)

    def check(self) -> Decision:
        """Applies the rule to what the step recorded; moves the layers it names.

        A cheap read (one scalar) when no skip was attributed since the last
        check.

        Returns:
            The `Decision` (``move`` empty when nothing moved; ``stop`` set
            when the limit was reached: nothing moves then).
        """
        size = self.attribution.log_size()
        if size == self._seen:
            return Decision()
        self._seen = size
        reading = self.attribution.read()
        optimizer = self.attribution.optimizer
        now = int(optimizer.iterations.numpy()) + int(optimizer.skipped_steps.numpy())
        decision = decide(self.rule, reading.skips, reading.healed,
                          self.attribution.names, now)
        if decision.move:
            self._move(decision.move)
            self.attribution.mark_healed(decision.move)
        return decision

    def message(self, decision: Decision) -> str:
        """The log line of a healing: layers, evidence, step."""
        return (f"tf_mixed healing at step {decision.step}: moved to float32 compute: "
                + "; ".join(describe(n, decision.evidence[n]) for n in decision.move)
                + f". Healed layers now: {list(self.healed)}. The step is retraced.")
