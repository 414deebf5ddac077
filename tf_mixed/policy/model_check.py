"""Auto's choice checked on the model's own training step: rounds, verdict, cache, move."""

# `enable("auto")` picks a policy for the host from a Dense+Conv2D probe; a
# model's own mix of layers can disagree (docs/policies.md: MobileNetV2 and
# EfficientNetB0 trained 0.57-0.74x float32 in bfloat16 on a host whose probe
# read 2.38x). So where tf_mixed sees the model train (`LossScaleMonitor` in
# `fit`, `tf_mixed.training.make_train_step`), the first steps of training
# are timed alternately in float32 and in the model's half policy, and the
# verdict follows:
#
# * the rounds are real training steps: each is the model's own train step
#   (Keras's ``train_function``, or the custom loop's step) on the batch it
#   would train on anyway, with its layers in one policy or the other. A
#   built layer's policy can change mid-run (Keras 3.15); both traced
#   steps are kept, so alternating costs no retrace. Nothing is thrown away:
#   the cost is the float32 trace plus the slower policy's excess;
# * `StepRounds` schedules them (a warm-up step each, which traces, then
#   rounds in alternating order) and stops starting rounds at `MAX_ROUNDS`,
#   or from `MIN_ROUNDS` on once the interval answers (it lies wholly on one
#   side of 1.00x) or the cost reaches `budget_s` (the smaller of
#   `CHECK_SECONDS` and `CHECK_FRACTION` of the training fit plans); the
#   float32 trace is not started when the half policy's trace, which it
#   would match, is over that budget (the log says so). The cost and the
#   budget are CPU seconds of this process (`time.process_time`): the
#   check's own work, which other jobs on a shared machine do not inflate
#   as they do its wall time;
# * `figures` is the statistic, `tf_mixed._internal.measuring`'s: the median
#   of the per-round ratios float32 / half with its seeded bootstrap
#   interval (90%);
# * `decide` is pure: under "auto" a half policy slower than float32 (median
#   below 1) is replaced by float32; under an explicit policy it is kept and
#   warned about once; the message carries the figures;
# * the verdict's timings are cached per host and model (the key of
#   `tf_mixed.policy.autotune` plus a digest of the model and its batch's
#   shapes), so a second run decides before its first step, at no cost.
#
# Under a multi-worker strategy every worker runs the same fixed number of
# rounds and the figures are averaged across workers (`shared_means`) before
# the decision, so every worker keeps the same policy at the same step (a
# worker that retraced alone would leave its peers in a collective); the cache
# is not read there (a worker with a cache would skip the rounds its peers run).
# Under MirroredStrategy on one machine one process times the step of every
# replica: its decision is the only one.

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import time
from typing import Any, Callable, Mapping, Sequence

import keras
from absl import logging

from tf_mixed._internal import measuring
from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import AUTO, FLOAT32, HALF_DTYPES, half_policy
from tf_mixed.policy import autotune, hardware, precision_map
from tf_mixed.policy import state as policy_state

__all__ = ["CHECK_FRACTION", "CHECK_SECONDS", "Figures", "PlanTrial", "StepRounds",
           "Verdict", "budget_s", "decide", "figures", "half_of", "model_digest",
           "policies_of", "provenance", "set_policies", "when_checked", "with_plan"]

CHECK_FRACTION = 0.05
"""The check's budget: this fraction of the training the loop plans (fit's
epochs x steps; a half policy slower than float32 costs every step alike)..."""
CHECK_SECONDS = 60.0
"""...and at most this many CPU seconds (a keras.applications model's train
step takes 20-35 s of CPU to trace on a 2-core EPYC: docs/policies.md)."""
MIN_ROUNDS = measuring.MIN_PAIRS
"""Rounds always run (one step of each policy a round), whatever the cost."""
MAX_ROUNDS = 7
"""Rounds at most."""
FIXED_ROUNDS = 5
"""Rounds under several workers: every worker runs exactly these (no early stop)."""
MIN_STEPS = 3 + 2 * MIN_ROUNDS + 2
"""A run shorter than this is not checked (the check would be most of it)."""
CHECK_VERSION = 2
"""Bump when the check changes: older cached verdicts then no longer match."""



def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


clock: Callable[[], tuple[float, float]] = _now
"""The clock the loops time steps with: (wall seconds, this process's CPU
seconds) (tests replace it)."""


def since(start: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds from ``start``, a `clock` reading, to now."""
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]

ENV = "TF_MIXED_MODEL_CHECK"
"""Environment variable: "0"/"false"/"no"/"off" turns the check off."""
SECONDS_ENV = "TF_MIXED_MODEL_CHECK_SECONDS"
"""Environment variable: the check's budget in seconds, replacing both bounds."""

Policies = dict[str, str]
"""Layer path -> policy name: where each layer of a model computes (a
`keras.dtype_policies.DTypePolicyMap`-like value; see `policies_of`)."""

PLAN = "plan"
"""The name the check's rounds give a per-layer plan (`Check`'s ``plan_source``)."""
PLAN_COST_FACTOR = 1.5
"""A per-layer plan is predicted to cost this many traces of the train step
in CPU seconds: its per-layer timing (0.35 of a trace on MobileNetV2,
docs/policies.md) and one more trace, its own."""

PlanSource = Callable[[Any, float], "tuple[Sequence[str], str] | str"]
"""``plan_source(model, budget_cpu_s) -> (float32 layer paths, summary)``, or a
str saying why there is no plan: a per-layer plan for a model (in float32 when
called) within that many CPU seconds."""


# ---------------------------------------------------------------- moving a model


def policies_of(model) -> Policies:
    """Every layer's policy name, by path (the model itself included).

    Args:
        model: A built Keras model (or layer).

    Returns:
        `Policies`.
    """
    return {precision_map.layer_path(layer): precision_map.live_policy(layer)
            for layer in _internals.sublayers(model)}


def set_policies(model, policies: Mapping[str, str]) -> list[str]:
    """Moves the model's layers to the given policies (no retrace: the caller's).

    The one "move the model to policy P" step of the check, through
    `tf_mixed.policy.precision_map.move` (the one way tf_mixed moves a built
    model's precision; Keras 3.15's ``Layer.dtype_policy`` setter works on a
    built layer).

    Args:
        model: A built Keras model.
        policies: Layer path -> policy name (`policies_of`'s keys); layers
            not named keep theirs.

    Returns:
        The paths whose policy changed.
    """
    return [precision_map.layer_path(layer) for layer in precision_map.move(model, policies)]


def float32_of(policies: Mapping[str, str]) -> Policies:
    """Every layer of ``policies`` in float32."""
    return {path: FLOAT32 for path in policies}


def half_of(policies: Mapping[str, str]) -> tuple[str | None, str]:
    """The half policy the model computes in, or None with why it is not checked.

    Args:
        policies: `Policies`.

    Returns:
        ``(half policy or None, reason when None)``.
    """
    halves: dict[str, int] = {}
    for name in policies.values():
        policy = keras.dtype_policies.get(name)
        if getattr(policy, "quantization_mode", None):
            return None, (f"its layers are quantized (policy '{name}'): float32 compute "
                          "would undo the quantization")
        if policy.compute_dtype in HALF_DTYPES:
            if policy.variable_dtype in HALF_DTYPES:
                return None, (f"its layers keep variables in {policy.variable_dtype} "
                              f"(policy '{name}'): float32 compute would not move them")
            mixed = half_policy(policy.compute_dtype) or name
            halves[mixed] = halves.get(mixed, 0) + 1
    if not halves:
        return None, "it computes in float32"
    return max(halves, key=lambda n: halves[n]), ""



# ---------------------------------------------------------------- where auto chose


def provenance(model) -> str:
    """"auto" if tf_mixed's auto chose the model's half policy, else "explicit".

    Auto chose it when the model was moved by ``enable("auto", model=...)``
    or made by ``convert(model, "auto")`` (`mark_auto`), or when the
    thread's ``enable`` was "auto" and set the policy the model computes in.
    """
    if getattr(model, "_tf_mixed_auto", False):
        return AUTO
    state = policy_state.thread_state()
    half, _ = half_of(policies_of(model))
    if state.requested == AUTO and half is not None and state.active == half:
        return AUTO
    return "explicit"


def mark_auto(model) -> None:
    """Notes on ``model`` that auto chose its policy (the check then may move it)."""
    object.__setattr__(model, "_tf_mixed_auto", True)


def enabled() -> bool:
    """Whether the check runs (`ENV` unset or true)."""
    value = os.environ.get(ENV, "").strip().lower()
    return value not in ("0", "false", "no", "off")


def describe(model) -> str:
    """What the model computes in, who chose it and what was measured on what (no timing)."""
    if not model.built:
        return f"model '{model.name}' is not built yet"
    half, why = half_of(policies_of(model))
    if half is None:
        return f"model '{model.name}' is not checked against float32: {why}"
    if provenance(model) == AUTO:
        who = ("chosen by tf_mixed's auto from the host's Dense+Conv2D probe (host-wide, "
               "not measured on this model)")
    else:
        who = "requested explicitly (tf_mixed measured nothing for it)"
    then = ("its own training step is checked against float32 in the first steps where "
            f"the check fits its budget (the smaller of {CHECK_SECONDS:.0f} s of CPU and "
            f"{100 * CHECK_FRACTION:.0f}% of the planned training)"
            if enabled() else f"its own step is not checked ({ENV} is off)")
    return f"model '{model.name}' computes in {half}, {who}; {then}"


# ---------------------------------------------------------------- rounds


@dataclasses.dataclass
class StepRounds:
    """Which policy the next training step runs in, and the seconds seen.

    Order: two steps in the half policy (the first traces it; the second
    gives its step time), then, unless the float32 trace would cost more
    than the budget (`trace_too_costly`), one in float32 (its trace), then
    rounds of one step each in `tf_mixed._internal.measuring.rotated` order
    (each policy runs before and after the other equally often), so a drift
    in the machine's speed hits both alike. From `MIN_ROUNDS` on, no round
    starts once the interval answers (`answered`) or the cost reaches the
    budget. The same schedule times a per-layer plan against float32 (``half``
    is then "plan" and float32's warm-up is already in ``warm``).

    Attributes:
        half: The half policy's name (or "plan").
        fixed: Run exactly `FIXED_ROUNDS` rounds, whatever they cost or
            show (multi-worker: every worker must stop at the same step).
        warm: Wall seconds of each policy's first (tracing) step.
        first: Wall seconds of the half policy's second step (None before it).
        seconds: Wall seconds of each policy's step, one per round.
        cpu: CPU seconds of every step of each policy, in order (its
            warm-up first): what `cost` and `trace` count.
        budget_s: The cost (CPU seconds) after which no round starts
            (after `MIN_ROUNDS`).
        max_rounds: The most rounds (`MAX_ROUNDS`, fewer in a short run).
    """

    half: str
    fixed: bool = False
    warm: dict = dataclasses.field(default_factory=dict)
    first: float | None = None
    seconds: dict = dataclasses.field(default_factory=dict)
    cpu: dict = dataclasses.field(default_factory=dict)
    budget_s: float = CHECK_SECONDS
    max_rounds: int = MAX_ROUNDS

    def next_policy(self) -> str | None:
        """The policy of the next step; None when the check is done (or not run)."""
        if self.half not in self.warm or self.first is None:
            return self.half
        if FLOAT32 not in self.warm:
            return None if self.trace_too_costly() else FLOAT32
        f32, hal = self.seconds.get(FLOAT32, []), self.seconds.get(self.half, [])
        if len(f32) != len(hal):
            return FLOAT32 if len(f32) < len(hal) else self.half
        done = len(f32)
        if self.fixed:
            return None if done >= FIXED_ROUNDS else measuring.rotated(
                [FLOAT32, self.half], done)[0]
        enough = done >= MIN_ROUNDS and (self.answered() or self.cost() >= self.budget_s)
        if done >= self.max_rounds or enough:
            return None
        return measuring.rotated([FLOAT32, self.half], done)[0]

    def record(self, name: str, seconds: float, cpu: float | None = None) -> None:
        """Notes the wall (and CPU; default: the wall) seconds of the step
        `next_policy` named."""
        self.cpu.setdefault(name, []).append(float(seconds if cpu is None else cpu))
        if name not in self.warm:
            self.warm[name] = float(seconds)
        elif name == self.half and self.first is None:
            self.first = float(seconds)
        else:
            self.seconds.setdefault(name, []).append(float(seconds))

    def answered(self) -> bool:
        """Whether the rounds' interval lies wholly on one side of 1.00x."""
        paired = self.rounds()
        if not paired[FLOAT32]:
            return False
        fig = figures(paired, self.half)
        return fig.low > 1.0 or fig.high < 1.0

    def trace(self) -> float:
        """The half policy's trace in CPU seconds: its first step beyond its
        second (0 before)."""
        steps = self.cpu.get(self.half, [])
        return max(steps[0] - steps[1], 0.0) if len(steps) >= 2 else 0.0

    def trace_too_costly(self) -> bool:
        """Whether a float32 trace, predicted to cost what the half policy's did,
        is over the budget (never with `fixed` rounds)."""
        return not self.fixed and self.trace() > self.budget_s

    def cost(self) -> float:
        """CPU seconds spent beyond training in the faster policy throughout:
        the float32 trace (its first step beyond its median step) and the
        slower policy's excess in every round."""
        f32 = self.cpu.get(FLOAT32, [])[1:]
        hal = self.cpu.get(self.half, [])[2:]
        n = min(len(f32), len(hal))
        if not n:
            return self.cpu.get(FLOAT32, [0.0])[0]
        trace = max(self.cpu[FLOAT32][0] - measuring.quartiles(f32[:n])[1], 0.0)
        return trace + sum(abs(a - b) for a, b in zip(f32[:n], hal[:n]))

    def rounds(self) -> dict[str, list[float]]:
        """The paired rounds: {"float32": [...], half: [...]}."""
        f32, hal = self.seconds.get(FLOAT32, []), self.seconds.get(self.half, [])
        n = min(len(f32), len(hal))
        return {FLOAT32: list(f32[:n]), self.half: list(hal[:n])}


def rounds_within(planned_steps: int | None) -> int:
    """The most rounds that end two steps before a run of ``planned_steps`` does."""
    if not planned_steps:
        return MAX_ROUNDS
    return max(MIN_ROUNDS, min(MAX_ROUNDS, (planned_steps - 3 - 2) // 2))


def when_checked() -> str:
    """The sentence `info` and `check` say about where a model's own step is checked."""
    return ("each model's own training step is checked against float32 when it trains, "
            f"where the check costs under {100 * CHECK_FRACTION:.0f}% of the planned "
            f"training and {CHECK_SECONDS:.0f} s of CPU (LossScaleMonitor in fit, "
            "tf_mixed.training.make_train_step; docs/policies.md)")


def budget_s(planned_steps: int | None, step_s: float) -> float:
    """The check's budget in seconds.

    `CHECK_SECONDS`, or `CHECK_FRACTION` of ``planned_steps`` steps of
    ``step_s`` seconds (the training the loop plans) if smaller;
    `SECONDS_ENV`, when set, replaces both.

    Raises:
        ValueError: `SECONDS_ENV` is not a number of seconds >= 0.
    """
    explicit = os.environ.get(SECONDS_ENV, "").strip()
    if explicit:
        try:
            value = float(explicit)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise ValueError(f"The environment variable {SECONDS_ENV} must be a number of "
                             f"seconds >= 0, such as 60. Received: {SECONDS_ENV}={explicit!r}.")
        return value
    if not planned_steps:
        return CHECK_SECONDS
    return min(CHECK_SECONDS, CHECK_FRACTION * planned_steps * step_s)


# ---------------------------------------------------------------- figures and verdict


@dataclasses.dataclass(frozen=True)
class Figures:
    """The statistic of the rounds (see `figures`).

    Attributes:
        ratio: Median over rounds of float32's step seconds / the half
            policy's in the same round (above 1: half is faster).
        low: The low end of its bootstrap interval
            (`tf_mixed._internal.measuring.estimate`, 90%).
        high: The high end.
        float32_s: float32's median step seconds.
        half_s: The half policy's median step seconds.
        rounds: Rounds paired.
    """

    ratio: float
    low: float
    high: float
    float32_s: float
    half_s: float
    rounds: int

    def as_list(self) -> list[float]:
        return [self.ratio, self.low, self.high, self.float32_s, self.half_s, float(self.rounds)]

    @classmethod
    def from_list(cls, values: Sequence[float]) -> "Figures":
        ratio, low, high, f32, half, rounds = (float(v) for v in values)
        return cls(ratio, low, high, f32, half, int(round(rounds)))


def figures(rounds: Mapping[str, Sequence[float]], half: str) -> Figures:
    """The median of the per-round ratios float32 / half, with its interval.

    Args:
        rounds: {"float32": seconds per round, half: seconds per round},
            paired by index, at least one round, positive figures.
        half: The half policy's name.

    Returns:
        `Figures` (`tf_mixed._internal.measuring.estimate` of the ratios).

    Raises:
        ValueError: No round, or a figure that is not positive.
    """
    f32, hal = list(rounds[FLOAT32]), list(rounds[half])
    n = min(len(f32), len(hal))
    if not n or any(not v > 0 for v in f32[:n] + hal[:n]):
        raise ValueError(f"The check needs at least one round of positive seconds. "
                         f"Received: rounds={dict(rounds)!r}.")
    found = measuring.estimate(measuring.pair_ratios(hal[:n], f32[:n]))
    return Figures(found.median, found.low, found.high, measuring.quartiles(f32[:n])[1],
                   measuring.quartiles(hal[:n])[1], n)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the check decided.

    Attributes:
        policy: The policy the model trains in from now: the half policy or
            "float32".
        half: The half policy checked.
        requested: "auto" or "explicit" (`provenance`).
        action: "kept" (half not slower), "moved" (auto: to float32),
            "warned" (explicit: kept, slower).
        figures: The `Figures` decided from.
        cost_s: What the check cost (0.0 when read from the cache).
        cached: Whether the figures came from the cache.
        message: One paragraph with the figures (and the fix, when warned).
        plan: The per-layer plan timed after the half policy lost (`PlanTrial`),
            or None when none was.
    """

    policy: str
    half: str
    requested: str
    action: str
    figures: Figures
    cost_s: float
    cached: bool
    message: str
    plan: "PlanTrial | None" = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PlanTrial:
    """A per-layer plan tried on the model's own step after its half policy lost.

    Attributes:
        float32_layers: The paths of the layers the plan computes in float32
            (every other layer keeps the model's own policy); empty when no
            plan was timed.
        summary: What the plan measured per layer, or why none was timed.
        figures: float32 / plan on the model's own step (None: not timed).
        cost_s: CPU seconds the plan cost: its per-layer timing, and its
            steps beyond float32's.
    """

    float32_layers: tuple[str, ...]
    summary: str
    figures: Figures | None = None
    cost_s: float = 0.0

    @property
    def kept(self) -> bool:
        """Whether the plan measured faster than float32 (median above 1.00x)."""
        return self.figures is not None and self.figures.ratio > 1.0


def with_plan(verdict: Verdict, trial: PlanTrial) -> Verdict:
    """The verdict once a per-layer plan was tried (pure).

    A plan faster than float32 on the model's own step (median of the
    per-round ratios float32 / plan above 1.00x) is kept: the model trains in
    its half policy with the plan's layers in float32 (action "planned");
    otherwise the verdict stays float32 and its message says what the plan
    measured, or why none was timed.

    Args:
        verdict: The "moved" `Verdict` of the half policy against float32.
        trial: The `PlanTrial`.

    Returns:
        A `Verdict` with ``plan`` set.
    """
    fig = trial.figures
    if fig is None:
        return dataclasses.replace(verdict, plan=trial, message=(
            f"{verdict.message} A per-layer plan was not timed: {trial.summary}."))
    measured = (f"a per-layer plan ({len(trial.float32_layers)} layers in float32, the rest "
                f"in {verdict.half}; {trial.summary}) measured {fig.ratio:.2f}x float32 on "
                f"the model's own step (plan {1e3 * fig.half_s:.1f} ms, float32 "
                f"{1e3 * fig.float32_s:.1f} ms; median of {fig.rounds} interleaved rounds, "
                f"{100 * measuring.CONFIDENCE:.0f}% interval {fig.low:.2f}-{fig.high:.2f}x; "
                f"it cost {trial.cost_s:.1f} s of CPU more)")
    cost = verdict.cost_s + trial.cost_s
    if not trial.kept:
        return dataclasses.replace(verdict, plan=trial, cost_s=cost, message=(
            f"{verdict.message} Then {measured}: float32 kept."))
    first = verdict.message.split(": the model now trains in float32")[0]
    return dataclasses.replace(verdict, policy=verdict.half, action="planned", plan=trial,
                               cost_s=cost, message=(
        f"{first}; then {measured}: the model now trains with that plan, the fastest "
        f"of the three for it."))


def decide(fig: Figures, half: str, requested: str, *, model_name: str, where: str,
           cost_s: float = 0.0, cached: bool = False) -> Verdict:
    """The rule, pure: a half policy slower than float32 is never kept silently.

    Slower means the median ratio float32 / half below 1.0. Under "auto" the
    model then moves to float32; under an explicit policy it stays, with a
    warning naming the fix. Otherwise the half policy is kept.

    Args:
        fig: The `Figures`.
        half: The half policy checked.
        requested: "auto" or "explicit".
        model_name: The model's name (for the message).
        where: Where the rounds ran (for the message), e.g. "fit's first steps".
        cost_s: The check's cost in seconds.
        cached: Whether `fig` came from the cache.

    Returns:
        A `Verdict`.
    """
    slower = fig.ratio < 1.0
    spread = ("1 round" if fig.rounds == 1 else
              f"median of {fig.rounds} interleaved rounds, "
              f"{100 * measuring.CONFIDENCE:.0f}% interval {fig.low:.2f}-{fig.high:.2f}x")
    resolved = ("" if fig.high < 1.0 or fig.low > 1.0
                else "; the interval holds 1.00x: about float32's speed")
    source = ("read from the cache of an earlier check on this host" if cached
              else f"{where}, check cost {cost_s:.1f} s of CPU")
    measured = (f"{half} measured {fig.ratio:.2f}x float32 on model '{model_name}' itself "
                f"(its own training step: {half} {1e3 * fig.half_s:.1f} ms, float32 "
                f"{1e3 * fig.float32_s:.1f} ms; {spread}{resolved}; {source})")
    if not slower:
        return Verdict(half, half, requested, "kept", fig, cost_s, cached,
                       f"tf_mixed: {measured}: {half} kept.")
    if requested == AUTO:
        return Verdict(FLOAT32, half, requested, "moved", fig, cost_s, cached, (
            f"tf_mixed: auto chose {half} for this host (its probe), but {measured}: "
            f"the model now trains in float32, "
            f"{'the faster for it' if fig.high < 1.0 else 'as fast for it within the interval'}"
            f". For a per-layer "
            f"choice, try tf_mixed.plan(model, x, y)."))
    return Verdict(half, half, requested, "warned", fig, cost_s, cached, (
        f"tf_mixed: model '{model_name}' trains in {half}, requested explicitly, and "
        f"{measured}: it trains {1 / fig.ratio:.2f}x slower than in float32. Fix: "
        f"tf_mixed.enable('auto') (which checks the model and moves it to float32 "
        f"where that is faster) or tf_mixed.enable('float32') before building the "
        f"model; tf_mixed.plan(model, x, y) for a per-layer choice."))


_WARNED: set = set()


def report(verdict: Verdict, key: str) -> None:
    """Logs the verdict: a warning when moved or warned (an explicit policy's
    warning once per process and model), info when kept."""
    if verdict.action == "kept":
        logging.info("%s", verdict.message)
        return
    if verdict.action == "warned":
        if key in _WARNED:
            return
        _WARNED.add(key)
    logging.warning("%s", verdict.message)


# ---------------------------------------------------------------- cache


def model_digest(model, batch) -> str:
    """A digest of the model's config (or its layers) and a batch's shapes and dtypes."""
    try:
        config = json.dumps(model.get_config(), sort_keys=True, default=str)
    except Exception:  # a layer without a config: its names and weight shapes instead
        config = json.dumps([(layer.name, type(layer).__name__,
                              [list(w.shape) for w in layer.weights]) for layer in model.layers])
    shapes = [(list(getattr(t, "shape", ())), str(getattr(t, "dtype", type(t).__name__)))
              for t in keras.tree.flatten(batch)]
    return hashlib.sha256((config + json.dumps(shapes, default=str)).encode()).hexdigest()[:16]


def cache_key(digest: str, half: str, info: hardware.HardwareInfo | None = None) -> dict:
    """What a cached check is valid for: the host (auto's key), the model, the half policy."""
    info = hardware.detect() if info is None else info
    return dict(autotune.cache_key(info), model_check=CHECK_VERSION, model=digest, half=half)


def read_cached(key: Mapping, directory: str | None = None) -> Figures | None:
    """The cached `Figures` for `key`, or None (never raises)."""
    path = measuring.cache_path(key, directory, prefix="model-check")

    def problem(record: dict) -> str:
        fig = Figures(**record["figures"])
        return "" if fig.rounds >= MIN_ROUNDS else "fewer rounds than the check runs"

    record = measuring.read_cache(path, key, problem)
    return None if record is None else Figures(**record["figures"])


def read_cached_plan(key: Mapping, directory: str | None = None) -> PlanTrial | None:
    """The `PlanTrial` cached with the figures for `key`, or None (never raises)."""
    path = measuring.cache_path(key, directory, prefix="model-check")
    record = measuring.read_cache(path, key, lambda record: "")
    trial = None if record is None else record.get("plan")
    if not isinstance(trial, dict):
        return None
    try:
        fig = trial.get("figures")
        return PlanTrial(tuple(trial["float32_layers"]), str(trial["summary"]),
                         None if fig is None else Figures(**fig), float(trial["cost_s"]))
    except (KeyError, TypeError, ValueError):
        return None


def write_cached(key: Mapping, fig: Figures, cost_s: float,
                 directory: str | None = None, plan: PlanTrial | None = None) -> str:
    """Caches `fig` (and the plan tried, if timed) for `key` unless the machine
    is busy; the path written, or ""."""
    if measuring.busy(*measuring.machine_load()):
        return ""
    path = measuring.cache_path(key, directory, prefix="model-check")
    record = {"format": measuring.CACHE_FORMAT, "key": dict(key),
              "figures": dataclasses.asdict(fig), "check_seconds": round(cost_s, 3),
              "plan": (dataclasses.asdict(plan) if plan is not None and plan.figures is not None
                       else None),
              "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds")}
    return path if measuring.write_cache(path, record) else ""


# ---------------------------------------------------------------- strategies


def multi_worker(strategy) -> bool:
    """Whether ``strategy`` spans several workers (the decision needs an all-reduce)."""
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return False
    try:
        local = len(strategy.extended.worker_devices)
    except (AttributeError, RuntimeError):  # the default strategy has none
        return False
    return bool(local) and strategy.num_replicas_in_sync > local


def shared_means(strategy, values: Sequence[float],
                 reduce: Callable[[Any, list[float]], list[float]] | None = None) -> list[float]:
    """``values`` averaged over the workers of a multi-worker strategy.

    Every worker calls this at the same step (the rounds are fixed there),
    so all enter the one small all-reduce together; with one worker the
    values come back as they are.

    Args:
        strategy: The model's distribution strategy.
        values: This worker's figures.
        reduce: ``reduce(strategy, values) -> summed values`` replacing the
            all-reduce (tests).

    Returns:
        The mean over workers of each value.
    """
    if not multi_worker(strategy):
        return list(values)
    import tensorflow as tf

    local = len(strategy.extended.worker_devices)
    workers = strategy.num_replicas_in_sync // local
    if reduce is None:
        share = tf.constant(list(values), tf.float32) / local

        @tf.function
        def summed():
            per_replica = strategy.run(lambda: tf.identity(share))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        total = [float(v) for v in summed().numpy()]
    else:
        total = list(reduce(strategy, list(values)))
    return [v / workers for v in total]


# ---------------------------------------------------------------- the check around a loop


class Check:
    """Runs the rounds around a training loop's steps, then applies the verdict.

    The loop calls `next_policy` before each step (None: train as it is),
    runs the step in that policy, and `record`s its seconds (the step
    finished: its outputs read). `switch(name)` is the loop's: it makes the
    next step run the step function traced for ``name`` (tracing a new one
    the first time, with the layers already moved by `Check`).

    Under "auto", when the half policy loses, a per-layer plan is the third
    candidate (`PlanTrial`, `with_plan`) where the loop gives one
    (``plan_source``), on one worker, and the budget left after the two
    whole-model policies covers its predicted cost (`PLAN_COST_FACTOR` traces
    of the step): its rounds then run on the next steps, against float32.

    Args:
        model: The built model about to train.
        where: Where the rounds run, for the message ("fit's first steps").
        switch: ``switch(policy_name)``, see above ("plan" names the plan).
        strategy: The model's strategy (multi-worker: fixed rounds, shared
            figures, no cache read, no plan).
        planned_steps: The training steps the loop plans (fit: epochs x
            steps), for the budget (None: `CHECK_SECONDS` only).
        batch: A batch (its shapes key the cache with the model); None: the
            model alone.
        directory: The cache directory (default `measuring.cache_dir()`).
        info: The host (default `hardware.detect()`).
        reduce: Replaces the all-reduce of `shared_means` (tests).
        on_verdict: Called with the `Verdict` once it is applied.
        plan_source: A `PlanSource`: a per-layer plan for the model.

    Attributes:
        verdict: The `Verdict` once decided (None before, and when not checked).
        skipped: Why the model is not checked ("" when it is).
    """

    def __init__(self, model, where: str, switch: Callable[[str], None], *, strategy=None,
                 planned_steps: int | None = None, batch=None, directory: str | None = None,
                 info: hardware.HardwareInfo | None = None, reduce=None,
                 on_verdict: Callable[[Verdict], None] | None = None,
                 plan_source: PlanSource | None = None):
        self.model, self.where, self.switch = model, where, switch
        self.strategy, self.planned_steps = strategy, planned_steps
        self.directory, self._reduce, self._on_verdict = directory, reduce, on_verdict
        self._plan_source = plan_source
        self.verdict: Verdict | None = None
        self.rounds: StepRounds | None = None
        self.skipped = ""
        self._current: str | None = None
        self._global: Any = None
        self._pending: tuple[Verdict, Figures, PlanTrial] | None = None
        self._plan: Policies = {}
        self.steps = 0
        self.original = policies_of(model) if model.built else {}
        half, why = half_of(self.original) if model.built else (None, "it is not built yet")
        if not enabled():
            half, why = None, f"{ENV} turns the check off"
        elif half is not None and planned_steps is not None and planned_steps < MIN_STEPS:
            half, why = None, (f"a run of {planned_steps} steps is shorter than the "
                               f"check's {MIN_STEPS}")
        if half is None:
            self.skipped = why
            log = logging.debug if why == "it computes in float32" else logging.info
            log("tf_mixed: model '%s' is not checked on its own step: %s.", model.name, why)
            return
        self.half = half
        self._current = half  # the model is in its own policy, the loop's step traced for it
        self.requested = provenance(model)
        self.key = cache_key(model_digest(model, batch), half, info)
        self._digest = self.key["model"]
        shared = multi_worker(strategy)
        memo = getattr(model, "_tf_mixed_checked", None)  # this process's earlier fit
        if memo is not None and memo[0] == self.original:
            self._finish(memo[1], 0.0, cached=True, trial=memo[2])
            return
        cached = None if shared else read_cached(self.key, directory)
        if cached is not None:
            self._finish(cached, 0.0, cached=True,
                         trial=read_cached_plan(self.key, directory))
            return
        self.rounds = StepRounds(half, fixed=shared, max_rounds=rounds_within(planned_steps))
        logging.info(
            "tf_mixed: model '%s' computes in %s (%s); checking it against float32 on "
            "its own training step in %s: %d to %d rounds, each a real step, new rounds "
            "until the interval answers or the cost reaches its budget, the smaller of "
            "%.0f s of CPU and %.0f%% of the planned training.", model.name, half,
            "chosen by auto from the host probe" if self.requested == AUTO
            else "requested explicitly", where, MIN_ROUNDS, MAX_ROUNDS, CHECK_SECONDS,
            100 * CHECK_FRACTION)

    @property
    def active(self) -> bool:
        """Whether rounds are still to run."""
        return self.rounds is not None and self.verdict is None

    def _policies(self, name: str) -> Policies:
        if name == FLOAT32:
            return float32_of(self.original)
        return self._plan if name == PLAN else self.original

    def next_policy(self) -> str | None:
        """The policy the next step runs in (moved and switched), or None."""
        if not self.active:
            return None
        assert self.rounds is not None
        name = self.rounds.next_policy()
        if name is None:
            return None
        if name != self._current:
            set_policies(self.model, self._policies(name))
            self.switch(name)
            self._current = name
        if name == FLOAT32:
            # Traced under a float32 global policy too: tf_mixed's optimizer
            # warns of a float32 step under a half global policy (a model
            # built before enable), which this step is not.
            self._global = keras.config.dtype_policy()
            keras.config.set_dtype_policy(FLOAT32)
        return name

    def record(self, seconds: float | tuple[float, float]) -> None:
        """The (wall, CPU) seconds (`since`; a float: both) of the step
        `next_policy` named; decides after the last."""
        if not self.active or self._current is None:
            return
        assert self.rounds is not None
        wall, cpu = seconds if isinstance(seconds, tuple) else (seconds, seconds)
        self._restore_global()
        self.steps += 1
        rounds = self.rounds
        rounds.record(self._current, wall, cpu)
        f32_cpu = rounds.cpu.get(FLOAT32, [])[1:]
        if self._pending is not None:
            pass  # the plan's rounds: their budget was set when they began
        elif f32_cpu:
            half_cpu = rounds.cpu[self.half][2:] or rounds.cpu[self.half][1:]
            fastest = min(measuring.quartiles(f32_cpu)[1], measuring.quartiles(half_cpu)[1])
            rounds.budget_s = budget_s(self.planned_steps, fastest)
        elif len(rounds.cpu.get(self.half, [])) >= 2:
            rounds.budget_s = budget_s(self.planned_steps, rounds.cpu[self.half][1])
        if rounds.next_policy() is not None:
            return
        paired = rounds.rounds()
        if self._pending is not None:
            self._plan_done(paired)
        elif not paired[FLOAT32]:
            self._not_run()
        else:
            cost = rounds.cost()
            fig = figures(paired, self.half)
            shared = shared_means(self.strategy, fig.as_list() + [cost], self._reduce)
            self._decided(Figures.from_list(shared[:-1]), shared[-1])

    def _decided(self, fig: Figures, cost: float) -> None:
        """The whole-model verdict; a per-layer plan tried first where worth it."""
        verdict = self._verdict(fig, cost, cached=False)
        trial, to_time = self._plan_trial(verdict, cost)
        if trial is None or not to_time:
            self._finish(fig, cost, cached=False, trial=trial)
            return
        # The plan's rounds, on the next steps: float32 (warm) against the plan.
        assert self.rounds is not None
        f32_cpu = self.rounds.cpu[FLOAT32][1:]
        median = measuring.quartiles(self.rounds.rounds()[FLOAT32])[1]
        left = budget_s(self.planned_steps, measuring.quartiles(f32_cpu)[1]) - cost
        self._pending = (verdict, fig, trial)
        self.rounds = StepRounds(
            PLAN, warm={FLOAT32: median}, cpu={FLOAT32: [measuring.quartiles(f32_cpu)[1]]},
            budget_s=max(left - trial.cost_s, 0.0), max_rounds=self.rounds.max_rounds)

    def _plan_trial(self, verdict: Verdict, cost: float) -> tuple[PlanTrial | None, bool]:
        """(The plan, or why none is timed; whether its rounds are to run)."""
        if verdict.action != "moved" or self._plan_source is None:
            return None, False
        assert self.rounds is not None
        rounds = self.rounds
        f32_cpu = rounds.cpu[FLOAT32][1:]
        step = measuring.quartiles(f32_cpu)[1]
        left = budget_s(self.planned_steps, step) - cost
        trace = max(rounds.trace(), rounds.cpu[FLOAT32][0] - step)
        predicted = PLAN_COST_FACTOR * trace
        steps_left = (None if self.planned_steps is None
                      else self.planned_steps - self.steps - 2)
        if multi_worker(self.strategy):
            return PlanTrial((), "under several workers only whole-model policies are "
                             "checked (each worker's plan could differ)"), False
        if steps_left is not None and steps_left < 2 + 2 * MIN_ROUNDS:
            return PlanTrial((), f"{steps_left} planned steps are left, fewer than its "
                             f"{2 + 2 * MIN_ROUNDS}"), False
        if predicted > left:
            return PlanTrial((), (
                f"it would cost about {predicted:.1f} s of CPU (its layer timing and one more "
                f"trace of the step, {PLAN_COST_FACTOR:g}x the {trace:.1f} s trace seen), over "
                f"the {max(left, 0.0):.1f} s left of the check's budget; "
                f"tf_mixed.plan(model, x, y) times one on its own")), False
        set_policies(self.model, float32_of(self.original))
        start = clock()[1]
        found = self._plan_source(self.model, left)
        spent = clock()[1] - start
        if isinstance(found, str):
            return PlanTrial((), found, None, spent), False
        paths, summary = found
        layers = tuple(sorted(set(paths)))
        self._plan = {path: FLOAT32 if path in layers else policy
                      for path, policy in self.original.items()}
        if self._plan in (self.original, float32_of(self.original)):
            return PlanTrial(layers, f"{summary}; its per-layer choice is one of the two "
                             "whole-model policies", None, spent), False
        return PlanTrial(layers, summary, None, spent), True

    def _plan_done(self, paired: Mapping[str, Sequence[float]]) -> None:
        assert self._pending is not None and self.rounds is not None
        verdict, fig, trial = self._pending
        plan_cpu = self.rounds.cpu.get(PLAN, [])
        f32 = self.rounds.cpu[FLOAT32][0]
        extra = max(sum(plan_cpu) - f32 * len(plan_cpu), 0.0)
        timed = dataclasses.replace(
            trial, figures=figures(paired, PLAN) if paired[FLOAT32] else None,
            cost_s=trial.cost_s + extra)
        if timed.figures is None:
            timed = dataclasses.replace(timed, summary=f"{trial.summary}; its trace on the "
                                        "model's step was over the budget left")
        self._pending = None
        self._finish(fig, verdict.cost_s, cached=False, trial=timed)

    def _not_run(self) -> None:
        """The float32 trace would cost more than the budget: said, nothing moved."""
        assert self.rounds is not None
        trace, budget = self.rounds.trace(), self.rounds.budget_s
        self.rounds = None
        self.skipped = (
            f"model '{self.model.name}' computes in {self.half} ("
            + ("chosen by auto from the host probe" if self.requested == AUTO
               else "requested explicitly")
            + f") and is NOT checked against float32 on its own step: its trace took "
            f"{trace:.1f} s of CPU, so tracing it in float32 would cost about as much again, "
            f"over the check's budget of {budget:.2g} s (the smaller of {CHECK_SECONDS:.0f} s "
            f"and {100 * CHECK_FRACTION:.0f}% of the planned training; {SECONDS_ENV} sets "
            "it). tf_mixed.plan(model, x, y) compares the policies on this model")
        logging.warning("tf_mixed: %s.", self.skipped)

    def _restore_global(self) -> None:
        if self._global is not None:
            keras.config.set_dtype_policy(self._global)
            self._global = None

    def abandon(self, why: str) -> None:
        """Ends unfinished rounds: the model back in its own policy, nothing decided."""
        self._restore_global()
        if not self.active:
            return
        set_policies(self.model, self.original)
        if self._current not in (None, self.half):
            self.switch(self.half)
        self.rounds = None
        self._pending = None
        self.skipped = why
        logging.warning("tf_mixed: the check of model '%s' on its own step did not finish "
                        "(%s): it stays in %s, unchecked.", self.model.name, why, self.half)

    def _verdict(self, fig: Figures, cost: float, *, cached: bool) -> Verdict:
        return decide(fig, self.half, self.requested, model_name=self.model.name,
                      where=self.where, cost_s=cost, cached=cached)

    def _finish(self, fig: Figures, cost: float, *, cached: bool,
                trial: PlanTrial | None = None) -> None:
        verdict = self._verdict(fig, cost, cached=cached)
        if trial is not None and verdict.action == "moved":
            if cached and trial.figures is not None:
                trial = dataclasses.replace(trial, summary="read from the cache")
            verdict = with_plan(verdict, trial)
        if verdict.action == "planned":
            assert trial is not None
            final = {path: FLOAT32 if path in trial.float32_layers else policy
                     for path, policy in self.original.items()}
            name = PLAN
        else:
            final = float32_of(self.original) if verdict.policy == FLOAT32 else self.original
            name = verdict.policy
        set_policies(self.model, final)
        object.__setattr__(self.model, "_tf_mixed_checked", (policies_of(self.model), fig, trial))
        if self._current != name:
            self.switch(name)
            self._current = name
        self.verdict = verdict
        if not cached and not multi_worker(self.strategy):
            write_cached(self.key, fig, verdict.cost_s, self.directory, trial)
        report(verdict, self._digest)
        if self._on_verdict is not None:
            self._on_verdict(verdict)
