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

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import walk_layers
from tf_mixed.policy import precision_map
from tf_mixed.scaling.attribution import (
    FORWARD,
    GRADIENT_AT_MIN_SCALE,
    KINDS,
    STORE_KEY,
    LayerAttribution,
)

__all__ = ["Decision", "HealRule", "Healer", "HealingLimit", "apply_loaded", "apply_restored",
           "decide", "describe", "heal", "healed_map", "move_to_float32", "moves"]

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


def healed_map(model, names) -> precision_map.PrecisionMap:
    """The map ``model`` computes in with ``names`` healed (rule 6 of
    `tf_mixed.policy.precision_map.RULES` applied to what it computes in now)."""
    return precision_map.observed(model).healed(names)


def heal(model, names) -> tuple:
    """Moves the named layers of a built model to float32 compute, through the map.

    Args:
        model: A built model.
        names: Layer names as `tf_mixed.scaling.attributed_layers` gives them.

    Returns:
        The names among ``names`` whose layer (or a sublayer) moved now.
    """
    change = healed_map(model, names)
    moved = {id(layer) for layer in precision_map.move(model, change)}
    if moved:
        _internals.rider(model, "healing_moves", _Moves).count += 1
    return tuple(n for n, layer in _named(model, names)
                 if any(id(sub) in moved for sub in _internals.sublayers(layer)))


@dataclasses.dataclass
class _Moves:
    """How many times `heal` moved a model's layers (kept on the model)."""

    count: int = 0


def moves(model) -> int:
    """How many times healing moved ``model``'s layers so far.

    A step function traced before a move computes the moved layers in their
    old precision: `tf_mixed.training.make_train_step` compares this count
    at each call and traces its step again when it changed.
    """
    return _internals.rider(model, "healing_moves", _Moves).count


def apply_restored(model, names) -> tuple:
    """Moves the layers a restored healed set names, at once: every restore ends here.

    A ``tf.train.Checkpoint`` of the optimizer (its ``healed_map`` child) and a
    ``.weights.h5``/``.keras`` load of it (`apply_loaded`) both apply the
    healed set through this one function, whatever trains the model next.
    Keras's traced functions (``fit``, ``evaluate``, ``predict``) are traced
    again; a `tf_mixed.training.make_train_step` step traces itself again at
    its next call (`moves`); a step function of the caller's own, traced
    before, must be created again: the warning says so.

    Args:
        model: The built model the optimizer trains.
        names: The healed layer names the restored state holds.

    Returns:
        The names whose layer (or a sublayer) moved now. A name ``model``
        lacks moves nothing (a warning names it): the load goes on.
    """
    from absl import logging

    known = [name for name, _ in _named(model, names)]
    lacking = [name for name in names if name not in known]
    if lacking:
        logging.warning(
            "tf_mixed healing: the restored optimizer state names healed layers model "
            "'%s' lacks: %s; they are not moved. Its layers: %s.", model.name, lacking,
            [name for name, _ in walk_layers(model)])
    moved = heal(model, known) if known else ()
    if not moved:
        return ()
    if any(getattr(model, attribute, None) is not None
           for attribute in ("train_function", "test_function", "predict_function")):
        retrace_keras_functions(model)
    logging.warning(
        "tf_mixed healing: the restored optimizer state moved layers %s to float32 "
        "compute (healed before it was saved). fit and make_train_step retrace; a step "
        "function of your own traced before the restore must be created again.",
        list(moved))
    return moved


def apply_loaded(optimizer) -> tuple:
    """Applies the healed set a ``.keras``/``.weights.h5`` load gave ``optimizer``.

    Called by the optimizer's ``load_own_variables`` once its entries are
    read. With healing attached the set is the attribution's (the file's,
    just assigned) and the model is the attribution's; without, the set
    waits in the optimizer's state for a later `Healer` and the model is
    the one Keras is loading the file into
    (``model.load_weights``, ``keras.saving.load_model``), when it owns
    ``optimizer``; an optimizer loaded on its own moves nothing.

    Returns:
        The names whose layer moved now (`apply_restored`).
    """
    slot = optimizer.step_state.attribution
    if slot.attached is not None:
        model, names = slot.attached.model, slot.attached.read().healed
    else:
        model, names = _internals.keras_model_loading(optimizer), slot.pending_healed()
    if model is None:
        return ()
    return apply_restored(model, names)


def _named(model, names) -> list:
    """``(name, layer)`` for ``names``, in the model's order."""
    wanted = set(names)
    found, seen = [], set()
    for name, layer in walk_layers(model):
        if name in wanted and name not in seen:
            seen.add(name)
            found.append((name, layer))
    return found


def retrace_keras_functions(model) -> None:
    """Forces Keras to trace the model's train, test and predict functions again.

    Keras keeps each traced function until forced: without the last two,
    validation in a ``fit`` and a later evaluate/predict would run moved
    layers in their old precision. ``fit`` reads ``model.train_function`` at
    every step, so the next step runs the new trace.
    """
    model.make_train_function(force=True)
    model.make_test_function(force=True)
    model.make_predict_function(force=True)


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
        self.attribution.state.healed_map = _internals.checkpoint_value(
            self._save_healed, self._restore_healed)
        _internals.restore_deferred(optimizer, STORE_KEY, self.attribution.state)

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
        wanted.update(self.attribution.slot.pending_healed())
        names = [n for n in self.attribution.names if n in wanted]
        moved = self._move(names)
        if names:
            self.attribution.mark_healed(names)
        return moved

    def _save_healed(self) -> dict:
        """The checkpoint's copy of the healed set: the healed map, as JSON."""
        import json

        import tensorflow as tf

        change = {n: FLOAT32 for n in self.healed}
        record = precision_map.PrecisionMap(
            FLOAT32, change, {n: precision_map.HEALED for n in change}).to_dict()
        return {"healed_map": tf.constant(json.dumps(record))}

    def _restore_healed(self, tensors: dict) -> None:
        """A restored checkpoint applies the healed map it holds, at once."""
        import json

        text = keras.ops.convert_to_numpy(tensors["healed_map"]).item()
        record = precision_map.PrecisionMap.from_dict(json.loads(
            text.decode() if isinstance(text, bytes) else text))
        names = [n for n in self.attribution.names if n in record.layers]
        if names:
            self.attribution.mark_healed(names)
        apply_restored(self.attribution.model, names)

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
        now = int(keras.ops.convert_to_numpy(optimizer.iterations)) + int(
            keras.ops.convert_to_numpy(optimizer.skipped_steps))
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
