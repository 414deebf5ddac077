"""Measured "auto" on hosts without an accelerator: time, decide, cache.

CPU flags do not predict half-precision speed (BUILD_NOTES.md: bfloat16 was
2-3x slower than float32 on one avx512_bf16 Xeon, 2.75x faster on an AMX Xeon,
2.00x faster on a Zen 4 EPYC), so on a CPU-only host `enable("auto")` times
the candidate policies on a small probe, a Dense and a Conv2D forward+backward
(the kernels that decide training speed), and keeps a half policy only when it
is at least `DEFAULT_MARGIN` times float32's speed.

Three pieces, each replaceable on its own:

- `time_policies(policies)` times the probe (the only impure part; tests
  inject their own timer instead);
- `choose_from_timings(timings)` is the pure decision;
- the cache: one small JSON file per machine key (CPU model and flags, TF
  version, oneDNN setting, probe version) in the user's cache directory,
  written atomically. A cache that is missing, corrupt, from another key or
  unreadable, or a directory that cannot be written, only costs a new
  measurement (logged at debug level), never an error.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import tempfile
import time
from typing import Callable, Mapping, Sequence

from absl import logging

from tf_mixed import _validate
from tf_mixed import hardware

from tf_mixed._facts import COMPUTE_DTYPES as _COMPUTE_DTYPE
from tf_mixed._facts import FLOAT32, MIXED_BFLOAT16, MIXED_FLOAT16

DEFAULT_MARGIN = 1.15
"""A half policy must be at least this many times float32's speed to be chosen."""

MEASURE_ENV = "TF_MIXED_AUTO_MEASURE"
"""Environment variable: "0"/"false"/"no"/"off" makes "auto" use the rules only."""

CACHE_DIR_ENV = "TF_MIXED_CACHE_DIR"
"""Environment variable: the directory for the measurement cache."""

# Bump when the probe changes: old cache entries then no longer match.
PROBE_VERSION = 1
_CACHE_FORMAT = 1

# CPU flags meaning native float16 arithmetic (without them TF's float16 CPU
# kernels convert every element and are not worth timing).
_NATIVE_FLOAT16_FLAGS = ("avx512_fp16", "amx_fp16")


_FALSE = ("0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on", "")

# Probe sizes: large enough that oneDNN picks its real kernels (AMX tiles for
# bfloat16 here), small enough that three policies fit in well under 2 s.
_DENSE = (256, 512)          # batch, features (square weight)
_CONV = (8, 16, 16, 16)      # batch, height, width, channels; 3x3 kernel
_MAX_ROUNDS = 6
_STEPS_PER_ROUND = 4
# After one round, a policy this many times slower than the fastest is
# dropped: its first figure already settles the decision (a float16
# Conv2D filter gradient can take 100 ms a step on a CPU).
_HOPELESS = 4.0

# A decision timed while the machine runs more than this many runnable
# processes per CPU is noise-prone: it is used once but not cached.
_BUSY_LOAD_PER_CPU = 1.5

Timer = Callable[[Sequence[str]], Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of `choose_from_timings`.

    Attributes:
        policy: The chosen policy name.
        speedups: Each timed policy's speed relative to float32 (float32's
            seconds per step divided by the policy's), float32 itself 1.0.
        margin: The margin a half policy had to reach.
    """

    policy: str
    speedups: Mapping[str, float]
    margin: float


@dataclasses.dataclass(frozen=True)
class AutoChoice:
    """What measured "auto" chose on this CPU, and from what.

    Attributes:
        policy: The chosen policy.
        reason: One sentence quoting the measurement, the CPU and the cache.
        timings: Seconds per probe step for each candidate policy.
        decision: The `Decision` taken from `timings`.
        cached: Whether the timings came from the cache (no timing was done).
        cache_path: The cache file read or written ("" if none could be).
    """

    policy: str
    reason: str
    timings: Mapping[str, float]
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
    """Picks the fastest half policy if it beats float32 by `margin`, else float32.

    Pure: the same timings always give the same decision.

    Args:
        timings: Seconds per probe step by policy name; must include
            "float32"; every value a positive finite number.
        margin: How many times float32's speed a half policy must reach
            (>= 1.0).

    Returns:
        A `Decision`.

    Raises:
        ValueError: If `timings` lacks float32, holds an unknown policy or a
            value that is not a positive finite number, or `margin` < 1.
    """
    _validate.number(margin, "margin", rule=lambda v: v >= 1.0,
                     valid="a number >= 1.0")
    if FLOAT32 not in timings:
        raise ValueError(
            "`timings` must include 'float32', the baseline. "
            f"Received: timings={dict(timings)!r}."
        )
    for name, seconds in timings.items():
        if name not in _COMPUTE_DTYPE:
            raise ValueError(
                f"`timings` holds an unknown policy {name!r}. Valid names: "
                f"{', '.join(_COMPUTE_DTYPE)}. Received: timings={dict(timings)!r}."
            )
        _validate.number(seconds, f"timings[{name!r}]",
                         rule=lambda v: 0 < v < math.inf,
                         valid="a positive number of seconds")
    base = float(timings[FLOAT32])
    speedups = {name: base / float(seconds) for name, seconds in timings.items()}
    halves = [name for name in speedups if name != FLOAT32]
    best = max(halves, key=lambda name: speedups[name], default=None)
    if best is not None and speedups[best] >= margin:
        return Decision(best, speedups, float(margin))
    return Decision(FLOAT32, speedups, float(margin))


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


def cache_dir() -> str:
    """The measurement cache's directory.

    Returns:
        `CACHE_DIR_ENV` if set, else ``$XDG_CACHE_HOME/tf_mixed``, else
        ``~/.cache/tf_mixed``.
    """
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "tf_mixed")


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


def cache_path(key: Mapping, directory: str | None = None) -> str:
    """The cache file for `key` in `directory` (default `cache_dir()`)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(directory or cache_dir(), f"auto-policy-{digest}.json")


def read_cache(path: str, key: Mapping) -> dict | None:
    """The cached record at `path` if it is whole and made for `key`.

    Never raises for a bad file: anything unusable is logged at debug level
    and gives None.

    Args:
        path: The cache file.
        key: The expected `cache_key`.

    Returns:
        The record (with "timings_s" for every candidate), or None.
    """
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as error:
        logging.debug("tf_mixed: ignoring the auto-policy cache %s: %s", path, error)
        return None
    problem = _record_problem(record, key)
    if problem:
        logging.debug("tf_mixed: ignoring the auto-policy cache %s: %s", path, problem)
        return None
    return record


def _record_problem(record: object, key: Mapping) -> str:
    if not isinstance(record, dict) or record.get("format") != _CACHE_FORMAT:
        return f"not a format-{_CACHE_FORMAT} record"
    if record.get("key") != dict(key):
        return f"made for {record.get('key')!r}, not {dict(key)!r}"
    timings = record.get("timings_s")
    if not isinstance(timings, dict) or set(timings) != set(key["candidates"]):
        return "timings missing or for other policies"
    try:
        choose_from_timings(timings)
    except ValueError as error:
        return str(error)
    return ""


def write_cache(path: str, record: Mapping) -> bool:
    """Writes `record` to `path` atomically (temporary file, then rename).

    Never raises for an unwritable place: it logs at debug level, leaves no
    temporary file behind and returns False.

    Args:
        path: The cache file.
        record: JSON-able dict.

    Returns:
        Whether the file was written.
    """
    directory = os.path.dirname(path) or "."
    tmp = ""
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".auto-policy-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return True
    except (OSError, TypeError, ValueError) as error:  # unwritable, or not JSON-able
        logging.debug("tf_mixed: cannot write the auto-policy cache %s: %s", path, error)
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


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
        timer: Called with the candidate policy names, returns seconds per
            probe step for each; default `time_policies`.
        directory: Cache directory; default `cache_dir()`.
        margin: See `choose_from_timings`.

    Returns:
        An `AutoChoice`. A measurement taken while the machine is busy (load
        average above 1.5 per CPU) is used but not cached.
    """
    key = cache_key(info)
    path = cache_path(key, directory)
    record = read_cache(path, key)
    cached = record is not None
    busy = ""
    if record is not None:
        timings = {name: float(value) for name, value in record["timings_s"].items()}
        measured_at = str(record.get("measured_at", "an earlier run"))
    else:
        names = candidates(info)
        load, cpus = _machine_load()
        start = time.perf_counter()
        timings = dict((timer or time_policies)(names))
        elapsed = time.perf_counter() - start
        choose_from_timings(timings, margin)  # validates the timer's output first
        measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        if load is not None and load > _BUSY_LOAD_PER_CPU * cpus:
            busy = f"load average {load:.1f} on {cpus} CPUs"
            path = ""
        elif not write_cache(path, {
            "format": _CACHE_FORMAT,
            "key": key,
            "timings_s": timings,
            "measured_at": measured_at,
            "probe_seconds": round(elapsed, 3),
        }):
            path = ""
    decision = choose_from_timings(timings, margin)
    reason = _reason(decision, info, cached=cached, path=path, measured_at=measured_at,
                     busy=busy)
    return AutoChoice(decision.policy, reason, timings, decision, cached, path)


def _machine_load() -> tuple[float | None, int]:
    """(1-minute load average or None where unknown, CPU count)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return load, os.cpu_count() or 1


def _reason(
    decision: Decision, info, *, cached: bool, path: str, measured_at: str, busy: str
) -> str:
    cpu = info.cpu_model or "unknown model"
    others = ", ".join(
        f"{name} {decision.speedups[name]:.2f}x"
        for name in decision.speedups if name not in (FLOAT32, decision.policy)
    )
    if decision.policy == FLOAT32:
        head = (
            f"no GPU or TPU; on this CPU ({cpu}) no half policy reached "
            f"{decision.margin:.2f}x float32 on the Dense+Conv2D training probe "
            f"({others}); force one with tf_mixed.enable('mixed_bfloat16')"
        )
    else:
        head = (
            f"no GPU or TPU; {decision.policy} measured "
            f"{decision.speedups[decision.policy]:.2f}x float32 on this CPU ({cpu}) "
            f"on the Dense+Conv2D training probe (needs >= {decision.margin:.2f}x"
            + (f"; {others}" if others else "") + ")"
        )
    if cached:
        tail = f"cached result measured {measured_at}, read from {path}"
    elif busy:
        tail = (
            f"measured now while the machine was busy ({busy}), so not cached: "
            "the next call measures again"
        )
    elif path:
        tail = f"measured now, cached in {path}"
    else:
        tail = "measured now, not cached (cache directory not writable)"
    return f"{head}; {tail}"


def time_policies(
    policies: Sequence[str], *, budget_s: float = 0.3
) -> dict[str, float]:
    """Times one probe training step under each policy on this host.

    The probe is a Dense layer (matmul) and a 3x3 Conv2D, forward and
    backward, with float32 weights cast to the compute dtype as a mixed
    policy does. Rounds alternate between policies so that load on the
    machine hits all of them alike; each policy's fastest step is kept
    (load from other processes only ever adds time). A
    policy far slower than the fastest after the first round is not timed
    again. float16 is traced with Grappler's remapping off, as
    `enable("mixed_float16")` runs it on a CPU.

    Args:
        policies: Policy names (of "float32", "mixed_bfloat16",
            "mixed_float16").
        budget_s: Seconds for the timed rounds (warm-up not included); a
            round always completes, so a very slow policy can exceed it by
            one step.

    Returns:
        Seconds per step (the fastest step), by policy.
    """
    import tensorflow as tf

    inputs = _probe_inputs(tf)
    steps = {name: _probe_step(tf, _COMPUTE_DTYPE[name]) for name in policies}
    for name in policies:  # trace and optimise once, outside the timing
        _first_call(steps[name], inputs, remapping_off=name == MIXED_FLOAT16)
    rounds: dict[str, list[float]] = {name: [] for name in policies}
    active = list(policies)
    slice_s = budget_s / (_MAX_ROUNDS * max(len(policies), 1))
    start = time.perf_counter()
    for _ in range(_MAX_ROUNDS):
        for name in active:
            rounds[name].append(_time_steps(steps[name], inputs, slice_s))
        fastest = min(min(rounds[name]) for name in active)
        active = [n for n in active if min(rounds[n]) <= _HOPELESS * fastest]
        if time.perf_counter() - start >= budget_s:
            break
    # The fastest step of all rounds (see _time_steps).
    return {name: min(values) for name, values in rounds.items()}


def _probe_inputs(tf):
    seed = (1, 2)
    batch, features = _DENSE
    n, h, w, c = _CONV
    return (
        tf.random.stateless_normal((batch, features), seed),
        tf.Variable(tf.random.stateless_normal((features, features), seed) * 0.05),
        tf.random.stateless_normal((n, h, w, c), seed),
        tf.Variable(tf.random.stateless_normal((3, 3, c, c), seed) * 0.05),
    )


def _probe_step(tf, dtype: str):
    @tf.function
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

    return step


def _run(step, inputs) -> None:
    step(*inputs).numpy()


def _first_call(step, inputs, remapping_off: bool) -> None:
    from tf_mixed import policy_state

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


def _time_steps(step, inputs, slice_s: float) -> float:
    """The fastest single step in a slice: preemption by other processes only
    ever lengthens a step, so the fastest is the closest to the true cost."""
    best, count, start = math.inf, 0, time.perf_counter()
    while True:
        before = time.perf_counter()
        _run(step, inputs)
        best = min(best, time.perf_counter() - before)
        count += 1
        if count >= _STEPS_PER_ROUND or time.perf_counter() - start >= slice_s:
            return best
