"""The plan's choice: a precision per layer from a `Measurement` and the probe's errors."""

# Pure: the same measurement and errors always give the same choices, so
# tests pass timings in and assert exact choices.
#
# 1. A layer whose error in the half dtype (the probe's relative error of its
#    output) exceeds the tolerance, or whose half output or output gradient
#    is not finite, may only be float32.
# 2. The step's time under an assignment of precisions, in one round, is the
#    sum of each timed layer's time in its precision plus, for each layer
#    whose precision's dtype differs from a producer's (a model input is
#    float32; float8 layers take and give the half dtype), the layer's cast
#    time.
# 3. The start is a whole-model policy: the half dtype everywhere (layers of
#    step 1 float32) when, over the rounds, float32's step divided by that
#    step has its first quartile above 1 (faster in three rounds of four);
#    otherwise float32 everywhere.
# 4. Then, layer by layer in the model's order (until a pass changes
#    nothing, at most `MAX_PASSES`), a layer moves to another allowed
#    precision when the per-round change of the whole step, casts included,
#    has its third quartile below 0: a difference larger than the rounds'
#    spread. Of several such precisions the largest median saving wins.
#    Otherwise the layer keeps the whole-model choice (the simpler plan).
#
# `probed_errors` reads step 1's errors from a probe's report (the numerics
# catalog's are read by tf_mixed/tools/planning/catalog_errors.py).

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from tf_mixed._internal.measuring import quartiles
from tf_mixed.tools.planning.layer_timing import FLOAT8, Measurement

__all__ = ["Choice", "MAX_PASSES", "choose", "probed_errors"]

MAX_PASSES = 3
FLOAT32 = "float32"


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `choose` decided.

    Attributes:
        precisions: Timed layer -> its precision ("float32", the half
            dtype, or "float8").
        whys: Timed layer -> why, one short sentence.
        start: The whole-model precision the choice started from.
        step_seconds: Median seconds per step (sum over timed layers, casts
            included) of "float32" everywhere, the half dtype everywhere
            (numerically unsafe layers float32) and "plan".
        unsettled: Why the measurement should not be cached ("" if it may
            be): too few rounds, or the whole-model ratio's spread is wide.
        medians: Timed layer -> ``(precision -> median seconds of its
            step, median seconds of its cast)``: the figures the plan's
            table shows for it.
    """

    precisions: Mapping[str, str]
    whys: Mapping[str, str]
    start: str
    step_seconds: Mapping[str, float]
    unsettled: str = ""
    medians: Mapping[str, tuple[Mapping[str, float], float]] = dataclasses.field(
        default_factory=dict)


def _io(precision: str, half: str) -> str:
    return FLOAT32 if precision == FLOAT32 else half


def _step(measurement: Measurement, assign: Mapping[str, str], half: str, r: int) -> float:
    total = 0.0
    for layer in measurement.layers:
        mine = assign[layer.name]
        total += layer.seconds[mine][r]
        io = _io(mine, half)
        sources = [_io(assign[p], half) if p else FLOAT32 for p in layer.producers]
        if any(s != io for s in sources):
            total += layer.cast_seconds[r]
    return total


def _steps(measurement, assign, half, rounds) -> list[float]:
    return [_step(measurement, assign, half, r) for r in range(rounds)]


def _ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"


def choose(measurement: Measurement, blocked: Mapping[str, str] | None = None) -> Choice:
    """Chooses each timed layer's precision (see the module for the rule).

    Args:
        measurement: The timings; every layer must hold "float32" and the
            half dtype for the same number of rounds (float8 optional).
        blocked: Timed layer -> why it may only be float32 (its error).

    Returns:
        A `Choice`.

    Raises:
        ValueError: A layer lacks float32 or the half dtype, or a figure is
            not a positive finite number of seconds (a cast may be 0).
    """
    blocked = dict(blocked or {})
    halves = [p for p in measurement.precisions if p not in (FLOAT32, FLOAT8)]
    if FLOAT32 not in measurement.precisions or len(halves) != 1:
        raise ValueError(
            "`measurement.precisions` must hold 'float32' and exactly one half dtype "
            f"('bfloat16' or 'float16'), and may hold 'float8'. Received: "
            f"{list(measurement.precisions)}.")
    half = halves[0]
    rounds = measurement.rounds
    for layer in measurement.layers:
        for p in (FLOAT32, half):
            if p not in layer.seconds:
                raise ValueError(
                    f"`measurement` has no {p} timing for layer '{layer.name}'. Received: "
                    f"precisions {sorted(layer.seconds)}.")
        for p, figures in layer.seconds.items():
            if not all(0 < s < math.inf for s in figures):
                raise ValueError(
                    f"`measurement` holds a time for layer '{layer.name}' in {p} that is not "
                    f"a positive number of seconds. Received: {list(figures)}.")
        if len(layer.cast_seconds) < rounds or not all(0 <= s < math.inf
                                                       for s in layer.cast_seconds):
            raise ValueError(
                f"`measurement` holds cast times for layer '{layer.name}' that are not one "
                f"number of seconds >= 0 per round. Received: {list(layer.cast_seconds)}.")
    if rounds < 1:
        raise ValueError("`measurement` holds no rounds: time at least one.")
    names = [layer.name for layer in measurement.layers]
    allowed = {
        layer.name: [p for p in measurement.precisions if p in layer.seconds
                     and (p == FLOAT32 or layer.name not in blocked)]
        for layer in measurement.layers}
    all32 = {n: FLOAT32 for n in names}
    allhalf = {n: (FLOAT32 if n in blocked else half) for n in names}
    base32 = _steps(measurement, all32, half, rounds)
    basehalf = _steps(measurement, allhalf, half, rounds)
    ratios = [a / b for a, b in zip(base32, basehalf)]
    low, median, high = quartiles(ratios)
    start = half if low > 1.0 else FLOAT32
    assign = dict(allhalf if start == half else all32)
    whole = (f"whole-model {half} {median:.2f}x float32 "
             f"(interquartile {low:.2f}-{high:.2f}x over {rounds} rounds)")
    whys: dict[str, str] = {}
    for name in names:
        if name in blocked:
            whys[name] = blocked[name]
        else:
            whys[name] = f"{whole}: {'kept' if start == half else 'not taken'}"
    for _ in range(MAX_PASSES):
        changed = False
        for name in names:
            current = _steps(measurement, assign, half, rounds)
            best, best_saving, best_text = None, 0.0, ""
            for p in allowed[name]:
                if p == assign[name]:
                    continue
                trial = dict(assign, **{name: p})
                deltas = [t - c for t, c in zip(_steps(measurement, trial, half, rounds), current)]
                d_low, d_median, d_high = quartiles(deltas)
                if d_high < 0 and -d_median > best_saving:
                    best, best_saving = p, -d_median
                    best_text = (f"{p} saves {_ms(-d_median)} a step, casts included "
                                 f"(interquartile {_ms(-d_high)}-{_ms(-d_low)})")
            if best is not None:
                assign[name] = best
                whys[name] = best_text
                changed = True
        if not changed:
            break
    unsettled = ""
    if rounds < 3:
        unsettled = f"{rounds} round(s), fewer than 3"
    elif high - low > 0.2 * median:
        unsettled = (f"the whole-model ratio's rounds spread {low:.2f}-{high:.2f}x, more than "
                     "20% of the median")
    plan_steps = _steps(measurement, assign, half, rounds)
    step_seconds = {FLOAT32: quartiles(base32)[1], half: quartiles(basehalf)[1],
                    "plan": quartiles(plan_steps)[1]}
    medians = {layer.name: ({p: quartiles(v)[1] for p, v in layer.seconds.items()},
                            quartiles(layer.cast_seconds)[1]) for layer in measurement.layers}
    return Choice(assign, whys, start, step_seconds, unsettled, medians)


def probed_errors(report, tolerance: float,
                  names: Sequence[str]) -> tuple[dict[str, float | None], dict[str, str]]:
    """Each timed layer's worst error in a probe's report, and why the unsafe ones stay float32.

    Args:
        report: A `tf_mixed.tools.probe_report.ProbeReport`, a mapping layer
            name -> relative error, or None (no errors known).
        tolerance: The largest error of a half-precision layer.
        names: The timed top-level layers (a nested model's error is the
            worst of the layers inside it).

    Returns:
        ``(errors, blocked)``: layer -> its worst finite error (None: none),
        and layer -> why it stays float32 (not finite, or above ``tolerance``).
    """
    if report is None:
        return {name: None for name in names}, {}
    if isinstance(report, Mapping):
        rows = [(str(k), float(v), 0.0, None) for k, v in report.items()]
    else:
        rows = [(s.name, s.rel_error, s.nonfinite, s.grad_nonfinite) for s in report.layers]
    errors: dict[str, float | None] = {}
    blocked: dict[str, str] = {}
    for name in names:
        mine = [r for r in rows if r[0] == name or r[0].startswith(name + "/")]
        finite = [r[1] for r in mine if r[1] == r[1]]  # NaN: a float32 output of zeros
        worst = max(finite) if finite else None
        errors[name] = worst
        if any(r[2] or r[3] for r in mine):
            blocked[name] = "not finite in half precision (probe): float32"
        elif worst is not None and worst > tolerance:
            blocked[name] = (f"error {worst:.2g} above the tolerance {tolerance:g} "
                             "(probe): float32")
    return errors, blocked
