"""Measured "auto" on hosts without an accelerator: time, decide, cache."""

# CPU flags do not predict half-precision speed (BUILD_NOTES.md: bfloat16 was
# 2-3x slower than float32 on one avx512_bf16 Xeon, 2.75x faster on an AMX Xeon,
# 2.00x faster on a Zen 4 EPYC), so on a CPU-only host `enable("auto")` times
# the candidate policies on a probe, a 1024-wide Dense and a 64-channel 3x3
# Conv2D forward+backward (the kernels that decide training speed, sized so that
# arithmetic, not op dispatch, fills the step: a ~2 ms probe read bfloat16 at
# 0.91x-1.52x float32 on a Zen 4 host where real models ran 1.5-1.7x faster),
# and keeps a half policy only when it is at least `DEFAULT_MARGIN`
# times float32's speed.
#
# The statistic is the median, over interleaved rounds, of each round's ratio
# float32 / policy: both policies of a round run within a few hundred
# milliseconds of each other, so load from other processes slows both alike and
# cancels in the ratio, and the median ignores the rounds it did not. The
# 90% bootstrap interval of that median (`measuring.estimate`) is what the
# reason quotes; a measurement of fewer than 5 rounds, or whose interval
# reaches across the margin, decides this
# call but is not cached (the next process measures again).
#
# Three pieces, each replaceable on its own:
#
# - `time_rounds(policies)` times the probe (the only impure part; tests
#   inject their own timer instead);
# - `choose_from_rounds(timings)` is the pure decision;
# - the cache: one small JSON file per machine key (CPU model and flags, TF
#   version, oneDNN setting, probe version) in the user's cache directory,
#   written atomically by `tf_mixed._internal.measuring` (shared with the
#   plan: rounds, quartiles, load and cache). A cache that is missing,
#   corrupt, from another key or unreadable, or a directory that cannot be
#   written, only costs a new measurement (logged at debug level), never an
#   error.

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import math
import os
import time
from typing import Callable, Mapping, Sequence

from tf_mixed._internal import measuring
from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import COMPUTE_DTYPES as _COMPUTE_DTYPE
from tf_mixed._internal.facts import FLOAT32, MIXED_BFLOAT16, MIXED_FLOAT16
from tf_mixed.policy import hardware

DEFAULT_MARGIN = 1.15
"""A half policy must be at least this many times float32's speed to be chosen."""

MEASURE_ENV = "TF_MIXED_AUTO_MEASURE"
"""Environment variable: "0"/"false"/"no"/"off" makes "auto" use the rules only."""

# Bump when the probe changes: old cache entries then no longer match.
PROBE_VERSION = 2

# CPU flags meaning native float16 arithmetic (without them TF's float16 CPU
# kernels convert every element and are not worth timing).
_NATIVE_FLOAT16_FLAGS = ("avx512_fp16", "amx_fp16")


_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on", "")

# The probe: arithmetic-bound (about 25-50 ms a float32 step on a 2-core Zen 4
# host, where a 1024-wide Dense + 64-channel Conv measured 1.5-1.8x in
# bfloat16 like the models users train).
_DENSE = (256, 1024)         # batch, features (square weight)
_CONV = (8, 32, 32, 64)      # batch, height, width, channels; 3x3 kernel
# The screen: the old ~2 ms probe, timed once per policy before the probe. A
# policy this many times slower than the fastest there is not run on the
# probe at all: a float16 Conv2D filter gradient without native kernels takes
# 40x float32's time on a CPU without native float16, seconds a step at the
# probe's size.
_SCREEN_DENSE = (256, 512)
_SCREEN_CONV = (8, 16, 16, 16)
_HOPELESS = 4.0
ROUNDS = 7
"""Interleaved rounds `time_rounds` times by default."""
_STEPS_PER_ROUND = 3  # a round's figure is the fastest of these (preemption only adds)

# A measurement is cached only when settled: at least this many rounds, and
# the median's 90% interval (`measuring.estimate`) on one side of the margin.
_MIN_ROUNDS_TO_CACHE = 5

Rounds = Mapping[str, Sequence[float]]
"""Seconds per probe step by policy, one figure per interleaved round (index i
of every policy is the same round). A policy with a single figure was dropped
after the screen (see `time_rounds`)."""

Timer = Callable[[Sequence[str]], Rounds]


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of `choose_from_timings`.

    Attributes:
        policy: The chosen policy name.
        speedups: Each timed policy's speed relative to float32: the median
            over rounds of float32's seconds per step divided by the
            policy's in the same round; float32 itself 1.0.
        margin: The margin a half policy had to reach.
        spreads: Each policy's (first quartile, third quartile) of those
            per-round ratios; float32 (1.0, 1.0).
        rounds: How many rounds each policy's figure pairs.
        unsettled: Why the measurement should not be cached ("" if it may
            be): too few rounds, or an interval that reaches across the margin.
        intervals: Each policy's 90% bootstrap interval of the median ratio
            (`measuring.estimate`); float32 (1.0, 1.0).
    """

    policy: str
    speedups: Mapping[str, float]
    margin: float
    spreads: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    rounds: Mapping[str, int] = dataclasses.field(default_factory=dict)
    unsettled: str = ""
    intervals: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AutoChoice:
    """What measured "auto" chose on this CPU, and from what.

    Attributes:
        policy: The chosen policy.
        reason: One sentence quoting the measurement, the CPU and the cache.
        timings: Seconds per probe step of each candidate policy, one
            figure per interleaved round (`Rounds`).
        decision: The `Decision` taken from `timings`.
        cached: Whether the timings came from the cache (no timing was done).
        cache_path: The cache file read or written ("" if none could be).
    """

    policy: str
    reason: str
    timings: Rounds
    decision: Decision
    cached: bool
    cache_path: str


def candidates(info: hardware.HardwareInfo) -> tuple[str, ...]:
    """The policies worth timing on this CPU.

    float32 and mixed_bfloat16 always; mixed_float16 only with native float16
    arithmetic (avx512_fp16 or AMX-FP16).

    Args:
        info: The host description.

    Returns:
        Policy names, float32 first.
    """
    names = [FLOAT32, MIXED_BFLOAT16]
    if any(flag in info.cpu_flags for flag in _NATIVE_FLOAT16_FLAGS):
        names.append(MIXED_FLOAT16)
    return tuple(names)


def choose_from_timings(
    timings: Mapping[str, float], margin: float = DEFAULT_MARGIN
) -> Decision:
    """`choose_from_rounds` for one figure per policy (a single round).

    Args:
        timings: Seconds per probe step by policy name; must include
            "float32"; every value a positive finite number.
        margin: See `choose_from_rounds`.

    Returns:
        A `Decision` (unsettled: one round).

    Raises:
        ValueError: As `choose_from_rounds`.
    """
    _check_margin(margin)
    for name, seconds in _checked_names(timings).items():
        _validate.number(seconds, f"timings[{name!r}]", rule=lambda v: 0 < v < math.inf,
                         valid="a positive number of seconds")
    return choose_from_rounds({name: [seconds] for name, seconds in timings.items()}, margin)


def _check_margin(margin: object) -> None:
    _validate.number(margin, "margin", rule=lambda v: v >= 1.0, valid="a number >= 1.0")


def _checked_names(timings: Mapping) -> Mapping:
    if not isinstance(timings, Mapping) or FLOAT32 not in timings:
        raise ValueError(
            "`timings` must include 'float32', the baseline. "
            f"Received: timings={_shown(timings)}."
        )
    for name in timings:
        if name not in _COMPUTE_DTYPE:
            raise ValueError(
                f"`timings` holds an unknown policy {name!r}. Valid names: "
                f"{', '.join(_COMPUTE_DTYPE)}. Received: timings={_shown(timings)}."
            )
    return timings


def _shown(value: object) -> str:
    return repr(dict(value)) if isinstance(value, Mapping) else repr(value)


def choose_from_rounds(timings: Rounds, margin: float = DEFAULT_MARGIN) -> Decision:
    """Picks the fastest half policy if it beats float32 by `margin`, else float32.

    Each half policy's speedup is the median over rounds of float32's time
    divided by the policy's time in the same round (rounds paired by index,
    as many as both have). Pure: the same timings always give the same
    decision.

    Args:
        timings: `Rounds`: seconds per probe step of each policy in each
            round; must include "float32"; every figure a positive finite
            number, at least one per policy.
        margin: How many times float32's speed a half policy must reach
            (>= 1.0).

    Returns:
        A `Decision`, with each policy's spread and whether it is settled.

    Raises:
        ValueError: If `timings` lacks float32, holds an unknown policy, a
            policy with no figure, or a figure that is not a positive finite
            number, or `margin` < 1.
    """
    _check_margin(margin)
    for name, figures in _checked_names(timings).items():
        if isinstance(figures, (str, bytes)) or not isinstance(figures, Sequence) or not figures:
            raise ValueError(
                f"`timings[{name!r}]` must be a non-empty list of positive numbers of "
                f"seconds (one per round). Received: {figures!r}."
            )
        for i, seconds in enumerate(figures):
            _validate.number(seconds, f"timings[{name!r}][{i}]",
                             rule=lambda v: 0 < v < math.inf,
                             valid="a positive number of seconds")
    base = timings[FLOAT32]
    speedups, spreads, rounds = {FLOAT32: 1.0}, {FLOAT32: (1.0, 1.0)}, {FLOAT32: len(base)}
    intervals = {FLOAT32: (1.0, 1.0)}
    for name, figures in timings.items():
        if name == FLOAT32:
            continue
        ratios = [float(b) / float(h) for b, h in zip(base, figures)]
        low, median, high = measuring.quartiles(ratios)
        speedups[name], spreads[name], rounds[name] = median, (low, high), len(ratios)
        estimate = measuring.estimate(ratios)
        intervals[name] = (estimate.low, estimate.high)
    halves = [name for name in speedups if name != FLOAT32]
    best = max(halves, key=lambda name: speedups[name], default=None)
    chosen = best if best is not None and speedups[best] >= margin else FLOAT32
    unsettled = ""
    if best is not None:
        low, high = intervals[best]
        if rounds[best] < _MIN_ROUNDS_TO_CACHE:
            unsettled = f"{rounds[best]} round(s), fewer than {_MIN_ROUNDS_TO_CACHE}"
        elif low < margin <= high:
            unsettled = (f"the 90% interval {low:.2f}-{high:.2f}x reaches across the "
                         f"{margin:.2f}x margin")
    return Decision(chosen, speedups, float(margin), spreads, rounds, unsettled, intervals)


def measure_by_default() -> bool:
    """Whether "auto" measures when `measure` is not given (`MEASURE_ENV`).

    Returns:
        False if the variable is "0", "false", "no" or "off"; True if unset,
        empty, "1", "true", "yes" or "on".

    Raises:
        ValueError: For any other value, naming the variable.
    """
    value = os.environ.get(MEASURE_ENV, "").strip().lower()
    if value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise ValueError(
        f"The environment variable {MEASURE_ENV} must be one of "
        f"{', '.join(_FALSE + _TRUE[:-1])} (or unset). Received: "
        f"{MEASURE_ENV}={os.environ[MEASURE_ENV]!r}. Unset it, or set it to 0 "
        "to make enable('auto') use the hardware rules without timing."
    )


def cache_key(info: hardware.HardwareInfo) -> dict:
    """What a cached measurement is valid for.

    Args:
        info: The host description.

    Returns:
        A JSON-able dict: probe version, CPU model, a digest of the CPU
        flags, TF version, the oneDNN setting and the candidate policies.
    """
    import tensorflow as tf

    flags = " ".join(sorted(info.cpu_flags))
    return {
        "probe": PROBE_VERSION,
        "cpu_model": info.cpu_model,
        "cpu_flags_sha256": hashlib.sha256(flags.encode()).hexdigest()[:16],
        "tensorflow": tf.__version__,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default"),
        "candidates": list(candidates(info)),
    }


def read_cache(path: str, key: Mapping) -> dict | None:
    """Auto's cached record at `path` (`measuring.read_cache`), if whole, for `key`
    and settled: timings for every candidate that still make a settled decision.

    Args:
        path: The cache file.
        key: The expected `cache_key`.

    Returns:
        The record, or None.
    """
    return measuring.read_cache(path, key, _auto_problem(key))


def _auto_problem(key: Mapping) -> Callable[[dict], str]:
    def problem(record: dict) -> str:
        timings = record.get("rounds_s")
        if not isinstance(timings, dict) or set(timings) != set(key["candidates"]):
            return "timings missing or for other policies"
        if choose_from_rounds(timings).unsettled:
            return "an unsettled measurement"
        return ""

    return problem


def measured_choice(
    info: hardware.HardwareInfo,
    *,
    timer: Timer | None = None,
    directory: str | None = None,
    margin: float = DEFAULT_MARGIN,
) -> AutoChoice:
    """Chooses a policy on a CPU-only host from cached or new timings.

    Args:
        info: The host description (CPU model and flags key the cache).
        timer: Called with the candidate policy names, returns `Rounds`
            (seconds per probe step of each, per interleaved round);
            default `time_rounds`.
        directory: Cache directory; default `measuring.cache_dir()`.
        margin: See `choose_from_timings`.

    Returns:
        An `AutoChoice`. A measurement that is unsettled (see `Decision`) or
        taken while the machine is busy (load average above 1.5 per CPU) is
        used but not cached.
    """
    key = cache_key(info)
    path = measuring.cache_path(key, directory)
    record = read_cache(path, key)
    cached = record is not None
    not_cached = ""
    if record is not None:
        timings = {name: [float(v) for v in values]
                   for name, values in record["rounds_s"].items()}
        measured_at = str(record.get("measured_at", "an earlier run"))
    else:
        names = candidates(info)
        load, cpus = measuring.machine_load()
        start = time.perf_counter()
        timings = {name: [float(v) for v in values]
                   for name, values in dict((timer or time_rounds)(names)).items()}
        elapsed = time.perf_counter() - start
        unsettled = choose_from_rounds(timings, margin).unsettled  # validates first
        measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        not_cached = measuring.busy(load, cpus) or unsettled
        new_record = {
            "format": measuring.CACHE_FORMAT,
            "key": key,
            "rounds_s": timings,
            "measured_at": measured_at,
            "probe_seconds": round(elapsed, 3),
        }
        if not_cached or not measuring.write_cache(path, new_record):
            path = ""
    decision = choose_from_rounds(timings, margin)
    reason = _reason(decision, info, cached=cached, path=path, measured_at=measured_at,
                     not_cached=not_cached)
    return AutoChoice(decision.policy, reason, timings, decision, cached, path)


def _spread(decision: Decision, name: str) -> str:
    rounds = decision.rounds[name]
    if rounds == 1:
        return "1 round"
    low, high = decision.intervals.get(name) or decision.spreads[name]
    return f"90% interval {low:.2f}-{high:.2f}x over {rounds} interleaved rounds"


def _reason(
    decision: Decision, info, *, cached: bool, path: str, measured_at: str, not_cached: str
) -> str:
    cpu = info.cpu_model or "unknown model"
    others = ", ".join(
        f"{name} {decision.speedups[name]:.2f}x ({_spread(decision, name)})"
        for name in decision.speedups if name not in (FLOAT32, decision.policy)
    )
    if decision.policy == FLOAT32:
        head = (
            f"no GPU or TPU; on this CPU ({cpu}) no half policy reached "
            f"{decision.margin:.2f}x float32 on the Dense+Conv2D training probe "
            f"(median of per-round ratios: {others}); force one with "
            "tf_mixed.enable('mixed_bfloat16')"
        )
    else:
        head = (
            f"no GPU or TPU; {decision.policy} measured "
            f"{decision.speedups[decision.policy]:.2f}x float32 on this CPU ({cpu}) "
            f"on the Dense+Conv2D training probe (median of per-round ratios, "
            f"{_spread(decision, decision.policy)}; needs >= {decision.margin:.2f}x"
            + (f"; {others}" if others else "") + ")"
        )
    if cached:
        tail = f"cached result measured {measured_at}, read from {path}"
    elif not_cached:
        tail = f"measured now, not cached ({not_cached}): the next call measures again"
    elif path:
        tail = f"measured now, cached in {path}"
    else:
        tail = "measured now, not cached (cache directory not writable)"
    return f"{head}; {tail}"


def time_rounds(
    policies: Sequence[str], *, rounds: int = ROUNDS, budget_s: float | None = None
) -> dict[str, list[float]]:
    """Times one probe training step under each policy, in interleaved rounds.

    The probe is a Dense layer (matmul) and a 3x3 Conv2D, forward and
    backward, with float32 weights cast to the compute dtype as a mixed
    policy does. First each policy runs once on a small screen probe; a
    policy `_HOPELESS` times slower than the fastest there gets that one
    figure (scaled to the probe by float32's own probe/screen ratio) and is
    not run on the probe. The others then run in `rounds` rounds
    (`measuring.interleaved_rounds`: each policy once a round, the order
    rotating), so that load on the machine hits all of them alike; a round's
    figure is a policy's fastest of a few steps.
    float16 is traced with Grappler's remapping off, as
    `enable("mixed_float16")` runs it on a CPU.

    Args:
        policies: Policy names (of "float32", "mixed_bfloat16",
            "mixed_float16"); "float32" must be one of them.
        rounds: Interleaved rounds.
        budget_s: If given, no new round starts after this many seconds of
            rounds (at least one round always runs).

    Returns:
        `Rounds`: seconds per step by policy, one figure per round.
    """
    import tensorflow as tf

    screen_inputs = _probe_inputs(tf, _SCREEN_DENSE, _SCREEN_CONV)
    screen = {}
    for name in policies:
        step = _probe_step(tf, _COMPUTE_DTYPE[name])
        first_call(step, screen_inputs, remapping_off=name == MIXED_FLOAT16)
        screen[name] = time_steps(step, screen_inputs, 1)
    fastest = min(screen.values())
    active = [name for name in policies if screen[name] <= _HOPELESS * fastest]
    if FLOAT32 not in active:
        active.insert(0, FLOAT32)
    inputs = _probe_inputs(tf, _DENSE, _CONV)
    steps = {name: _probe_step(tf, _COMPUTE_DTYPE[name]) for name in active}
    for name in active:  # trace and optimise once, outside the timing
        first_call(steps[name], inputs, remapping_off=name == MIXED_FLOAT16)
    figures = measuring.interleaved_rounds(
        {name: functools.partial(time_steps, steps[name], inputs, _STEPS_PER_ROUND)
         for name in active}, rounds, budget_s=budget_s)
    scale = measuring.quartiles(figures[FLOAT32])[1] / screen[FLOAT32]
    for name in policies:
        if name not in figures:
            figures[name] = [screen[name] * scale]
    return {name: figures[name] for name in policies}


def time_policies(
    policies: Sequence[str], *, rounds: int = ROUNDS, budget_s: float | None = None
) -> dict[str, float]:
    """`time_rounds` summarised: each policy's median seconds per step.

    Args:
        policies: As `time_rounds`.
        rounds: As `time_rounds`.
        budget_s: As `time_rounds`.

    Returns:
        Seconds per step by policy.
    """
    return {name: measuring.quartiles(values)[1] for name, values in
            time_rounds(policies, rounds=rounds, budget_s=budget_s).items()}


def _probe_inputs(tf, dense, conv):
    seed = (1, 2)
    batch, features = dense
    n, h, w, c = conv
    return (
        tf.random.stateless_normal((batch, features), seed),
        tf.Variable(tf.random.stateless_normal((features, features), seed) * 0.05),
        tf.random.stateless_normal((n, h, w, c), seed),
        tf.Variable(tf.random.stateless_normal((3, 3, c, c), seed) * 0.05),
    )


def _probe_step(tf, dtype: str):
    # One function per policy and size, each traced once: not the mistake
    # TF's retracing warning is for (`tf_mixed._internal.shims.distinct_function`).
    def step(x, kernel, images, filters):
        with tf.GradientTape() as tape:
            hidden = tf.nn.relu(tf.matmul(tf.cast(x, dtype), tf.cast(kernel, dtype)))
            conv = tf.nn.relu(tf.nn.conv2d(
                tf.cast(images, dtype), tf.cast(filters, dtype), 1, "SAME"))
            loss = (tf.reduce_sum(tf.cast(hidden, "float32"))
                    + tf.reduce_sum(tf.cast(conv, "float32")))
        grads = tape.gradient(loss, [kernel, filters])
        # One scalar that depends on both gradients: fetching it waits for them.
        return tf.reduce_sum(grads[0][0]) + tf.reduce_sum(grads[1][0, 0])

    return _internals.distinct_function(step)


def _run(step, inputs) -> None:
    step(*inputs).numpy()


def first_call(step, inputs, remapping_off: bool) -> None:
    """Runs `step` once (its trace), with remapping held off for float16 (shared with plan)."""
    from tf_mixed.policy import state as policy_state

    if remapping_off:
        # Grappler optimises a function on its first call: hold the option
        # off only for that call, as enable("mixed_float16") would on a CPU.
        policy_state.hold_remapping()
        try:
            _run(step, inputs)
        finally:
            policy_state.release_remapping()
    else:
        _run(step, inputs)


def time_steps(step, inputs, count: int) -> float:
    """The fastest of `count` steps (`measuring.fastest`)."""
    return measuring.fastest(lambda: _run(step, inputs), count)
