"""Measuring, in one place: rounds, quartiles, intervals, the machine's load, the cache."""

# Every figure tf_mixed measures (`enable("auto")`'s probe, the plan's layer
# and step timings, `doctor --measure`, the main job and every bench suite)
# rests on these primitives, so a rule about noise is stated once:
#
# - **Interleaved rounds** (`interleaved_rounds`, `grouped_rounds`, `rotated`):
#   each candidate runs once per round, the order rotating so that every
#   candidate runs before and after every other equally often; load from other
#   processes then lands on every side of a ratio alike. Grouped rounds (the
#   plan's layers, each with its precisions) rotate the groups and, within
#   each, its candidates.
# - **Paired ratios** (`pair_ratios`): round i of one side over round i of the
#   other (the pair shares the host's load at that moment).
# - **A median with its interval** (`estimate`, an `Estimate`): the median of
#   the paired ratios and a seeded percentile-bootstrap interval for it; the
#   interval, not a spread threshold, says whether the figure answers "is it
#   faster here, and by about how much" (`Estimate.answers`). The overhead
#   suite's pooled form (`pooled_ratio`, `ratio_interval`) resamples round pairs
#   of raw step times.
# - **Quartiles** (`quantile`, `quartiles`, `spread`, `relative_spread`): the
#   one quantile function of the package (linear interpolation, statistics'
#   "inclusive"); the quartiles and the main job's 90th percentile are its.
# - **The machine's load** (`machine_load`, `load_averages`), read here only.
# - **The per-host cache** (`cache_dir`, `cache_path`, `read_cache`,
#   `write_cache`): one small JSON record per key, written atomically; a cache
#   that is missing, corrupt, from another key or unwritable only costs a new
#   measurement (logged at debug level), never an error.
#
# Standard library and absl logging only: the command line imports it before
# TensorFlow loads.

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import statistics
import tempfile
import time
from typing import Callable, Mapping, Sequence

from absl import logging

__all__ = [
    "BUSY_LOAD_PER_CPU", "CACHE_DIR_ENV", "CACHE_FORMAT", "CONFIDENCE", "Estimate",
    "MIN_PAIRS", "NARROW", "RESAMPLES", "busy", "cache_dir", "cache_path", "estimate",
    "fastest", "grouped_rounds", "interleaved_rounds", "load_averages", "machine_load",
    "pair_ratios", "pooled_ratio", "quantile", "quartiles", "ratio_interval", "read_cache",
    "relative_spread", "rotated", "spread", "write_cache",
]

CONFIDENCE = 0.9
"""The bootstrap interval's default coverage."""

RESAMPLES = 2000
"""Bootstrap draws by default."""

MIN_PAIRS = 3
"""Fewer paired rounds than this never make a verdict (`Estimate.answers`)."""

NARROW = 0.10
"""An interval whose high end is at most this fraction above its low end
answers "about how much" even where it holds 1 ("no faster here")."""

BUSY_LOAD_PER_CPU = 1.5
"""A measurement taken while the machine runs more than this many runnable
processes per CPU is used once but not cached."""

CACHE_DIR_ENV = "TF_MIXED_CACHE_DIR"
"""Environment variable: the directory for the measurement cache."""

CACHE_FORMAT = 2
"""The format every cache record carries; records of another format are ignored."""


# --- quartiles ----------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``, interpolating linearly between ranks.

    Position ``q * (n - 1)`` in the sorted values (statistics' "inclusive"
    method): ``q=0`` is the minimum, ``q=1`` the maximum, ``q=0.5`` the
    median; one value is every quantile of itself.

    Args:
        values: The figures, at least one.
        q: The fraction below, in [0, 1].

    Returns:
        The quantile.

    Raises:
        ValueError: For no values or a ``q`` outside [0, 1].
    """
    return _at(sorted(values), q)


def _at(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        raise ValueError("a quantile of no values: at least one figure is needed.")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile() needs 0 <= q <= 1. Received: q={q!r}.")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile): `quantile` at 0.25, 0.5 and 0.75.

    The same as ``statistics.quantiles(values, n=4, method="inclusive")``
    with the median between; one value is its own quartiles.

    Raises:
        ValueError: For no values.
    """
    ordered = sorted(values)
    return _at(ordered, 0.25), _at(ordered, 0.5), _at(ordered, 0.75)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min, max and count of ``values`` (`quartiles`).

    Raises:
        ValueError: For an empty ``values``.
    """
    if not values:
        raise ValueError("spread of no values: at least one round must be timed")
    ordered = sorted(values)
    q1, median, q3 = quartiles(ordered)
    return {"median": median, "q1": q1, "q3": q3,
            "min": ordered[0], "max": ordered[-1], "n": len(ordered)}


def relative_spread(summary: Mapping[str, float]) -> float:
    """A `spread`'s width over its median: the IQR from 4 values on, else max - min."""
    width = summary["q3"] - summary["q1"] if summary["n"] >= 4 else summary["max"] - summary["min"]
    return width / summary["median"] if summary["median"] else float("inf")


# --- rounds -------------------------------------------------------------------------


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """The order ``names`` run in round ``round_index``: each name leads in turn.

    Round r starts at name ``r % len(names)``; every other cycle of
    ``len(names)`` rounds runs backwards, so over two cycles every name runs
    before and after every other equally often (a path that always ran
    first, right after another's data pipeline, would carry that alone).

    Raises:
        ValueError: For no names or a negative ``round_index``.
    """
    if not names or round_index < 0:
        raise ValueError(f"rotated() needs names and a round index >= 0. Received: "
                         f"names={list(names)!r}, round_index={round_index!r}.")
    start = round_index % len(names)
    order = [*names[start:], *names[:start]]
    return order[::-1] if (round_index // len(names)) % 2 else order


def fastest(call: Callable[[], object], count: int,
            clock: Callable[[], float] = time.perf_counter) -> float:
    """The fastest of ``count`` calls of ``call``, in seconds.

    Preemption by other processes only ever lengthens a call, so the fastest
    is the closest to the true cost.
    """
    best = math.inf
    for _ in range(max(1, count)):
        before = clock()
        call()
        best = min(best, clock() - before)
    return best


def interleaved_rounds(
    measures: Mapping[str, Callable[[], float]],
    rounds: int,
    *,
    budget_s: float | None = None,
    min_rounds: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    on_round: Callable[[int], object] | None = None,
) -> dict[str, list[float]]:
    """Runs each measure once per round, in `rotated` order, and collects the figures.

    Args:
        measures: Name -> a call returning one figure (seconds of a step,
            say); index i of every list returned is the same round.
        rounds: Rounds to run, at least 1.
        budget_s: If given, no new round starts after this many seconds
            (the first ``min_rounds`` rounds always run).
        min_rounds: Rounds that run whatever ``budget_s`` (at least one
            always does).
        clock: Seconds, for the budget.
        on_round: Called with each round's index before it runs (a
            progress line, say).

    Returns:
        Name -> its figures, one per round run, in the order of ``measures``.

    Raises:
        ValueError: For no measures or ``rounds`` < 1.
    """
    if not measures or rounds < 1:
        raise ValueError("interleaved_rounds() needs at least one measure and rounds >= 1. "
                         f"Received: {len(measures)} measures, rounds={rounds!r}.")
    return _rounds({"": measures}, rounds, budget_s, min_rounds, clock, on_round)[""]


def grouped_rounds(
    groups: Mapping[str, Mapping[str, Callable[[], float]]],
    rounds: int,
    *,
    budget_s: float | None = None,
    min_rounds: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    on_round: Callable[[int], object] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """`interleaved_rounds` of groups of measures, both levels in `rotated` order.

    Each round runs the groups in `rotated` order and, within each group,
    its measures back to back in `rotated` order: candidates compared within
    a group (a layer's precisions and its cast, in the plan) run next to each
    other, so load from other processes lands on them alike, and each leads
    its group in turn.

    Args:
        groups: Group name -> (name -> a call returning one figure); a
            group may hold other names than another.
        rounds, budget_s, min_rounds, clock, on_round: As `interleaved_rounds`.

    Returns:
        Group name -> name -> its figures, one per round run, in the order
        of ``groups``.

    Raises:
        ValueError: For no groups, an empty group or ``rounds`` < 1.
    """
    empty = [name for name, measures in groups.items() if not measures]
    if not groups or empty or rounds < 1:
        raise ValueError("grouped_rounds() needs at least one group, each with at least one "
                         f"measure, and rounds >= 1. Received: {len(groups)} groups"
                         f"{f' ({empty[0]!r} empty)' if empty else ''}, rounds={rounds!r}.")
    return _rounds(groups, rounds, budget_s, min_rounds, clock, on_round)


def _rounds(groups, rounds, budget_s, min_rounds, clock, on_round):
    group_names = list(groups)
    names = {group: list(measures) for group, measures in groups.items()}
    figures = {group: {name: [] for name in names[group]} for group in group_names}
    start = clock()
    for index in range(rounds):
        if on_round is not None:
            on_round(index)
        for group in rotated(group_names, index):
            for name in rotated(names[group], index):
                figures[group][name].append(float(groups[group][name]()))
        if index + 1 >= min_rounds and budget_s is not None and clock() - start >= budget_s:
            break
    return figures


def pair_ratios(base_rounds: Sequence[float], rounds: Sequence[float]) -> list[float]:
    """Round i of a side over round i of the baseline, for every pair both have."""
    return [r / b for r, b in zip(rounds, base_rounds)]


# --- a median with its interval ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The median of paired ratios with a bootstrap interval.

    Attributes:
        median: The median of the ratios.
        low, high: The interval's ends (the middle ``confidence`` of the
            bootstrap medians).
        pairs: How many paired rounds it rests on.
        confidence: The interval's coverage.
    """

    median: float
    low: float
    high: float
    pairs: int
    confidence: float = CONFIDENCE

    @property
    def width(self) -> float:
        """The interval's width over its median (0 for a point)."""
        return (self.high - self.low) / self.median if self.median else math.inf

    def answers(self, threshold: float = 1.0) -> bool:
        """Whether the interval answers "is it faster, and by about how much".

        True when it rests on at least `MIN_PAIRS` pairs and lies wholly on
        one side of ``threshold`` (faster, or slower), or is narrow (its high
        end at most `NARROW` above its low end: about the same speed).
        """
        if self.pairs < MIN_PAIRS:
            return False
        one_side = self.low > threshold or self.high < threshold
        return one_side or self.high <= self.low * (1.0 + NARROW)

    def text(self) -> str:
        """``"1.52x (90% interval 1.41-1.63x, 9 pairs)"``."""
        return (f"{self.median:.2f}x ({100 * self.confidence:.0f}% interval "
                f"{self.low:.2f}-{self.high:.2f}x, {self.pairs} pair"
                f"{'s' if self.pairs != 1 else ''})")

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "low": self.low, "high": self.high,
                "pairs": self.pairs, "confidence": self.confidence}


def estimate(ratios: Sequence[float], *, confidence: float = CONFIDENCE,
             resamples: int = RESAMPLES, seed: int = 0) -> Estimate:
    """The median of ``ratios`` with a seeded percentile-bootstrap interval.

    The ratios are drawn with replacement ``resamples`` times; the interval
    holds the middle ``confidence`` of the drawn medians. The same ratios
    always give the same `Estimate`.

    Args:
        ratios: Paired-round ratios (`pair_ratios`), at least one, each finite
            and positive.
        confidence: The interval's coverage, in (0, 1).
        resamples: Bootstrap draws, at least 1.
        seed: The draws' seed.

    Returns:
        An `Estimate`.

    Raises:
        ValueError: For no ratios, a ratio that is not a positive finite
            number, or a bad ``confidence`` or ``resamples``.
    """
    values = [float(r) for r in ratios]
    if not values or not all(0.0 < v < math.inf for v in values):
        raise ValueError("estimate() needs at least one ratio, each a positive finite number. "
                         f"Received: ratios={list(ratios)!r}.")
    _check_draws(confidence, resamples, "estimate")
    draw = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(values[draw.randrange(n)] for _ in range(n))
                     for _ in range(resamples))
    low, high = _middle(medians, confidence)
    return Estimate(statistics.median(values), low, high, n, float(confidence))


def _check_draws(confidence: float, resamples: int, name: str) -> None:
    if not 0.0 < confidence < 1.0 or resamples < 1:
        raise ValueError(f"{name}() needs 0 < confidence < 1 and resamples >= 1. "
                         f"Received: confidence={confidence!r}, resamples={resamples!r}.")


def _middle(ordered: Sequence[float], confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0
    count = len(ordered)
    return ordered[int(tail * count)], ordered[min(count - 1, int((1.0 - tail) * count))]


def pooled_ratio(base_rounds: Sequence[Sequence[float]],
                 rounds: Sequence[Sequence[float]]) -> float:
    """The median of all of ``rounds``' values over the median of all of ``base_rounds``'.

    Raises:
        ValueError: For round lists of different lengths or an empty round.
    """
    _check_pairs(base_rounds, rounds)
    return _pooled(base_rounds, rounds)


def _pooled(base_rounds, rounds) -> float:
    return (statistics.median(v for r in rounds for v in r)
            / statistics.median(v for r in base_rounds for v in r))


def _check_pairs(base_rounds, rounds) -> None:
    if len(base_rounds) != len(rounds) or not rounds:
        raise ValueError("base_rounds and rounds must hold the same number of rounds, at "
                         f"least one. Received: {len(base_rounds)} and {len(rounds)} rounds.")
    for name, side in (("base_rounds", base_rounds), ("rounds", rounds)):
        empty = [i for i, r in enumerate(side) if not len(r)]
        if empty:
            raise ValueError(f"{name}[{empty[0]}] is an empty round: every round needs at "
                             "least one time.")


def ratio_interval(base_rounds: Sequence[Sequence[float]], rounds: Sequence[Sequence[float]],
                   *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                   seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap interval for `pooled_ratio`, resampling round pairs.

    Round i of both sides is drawn together (the pair shares the host's
    load at that moment), ``resamples`` times with replacement; the
    interval holds the middle ``confidence`` of the resampled ratios. The
    draw is seeded, so the same timings always give the same interval.

    Args:
        base_rounds: The baseline's step times, one list per round.
        rounds: The other side's, round i paired with ``base_rounds[i]``.
        confidence: The interval's coverage, in (0, 1).
        resamples: Bootstrap draws, at least 1.
        seed: The draws' seed.

    Returns:
        ``(low, high)``.

    Raises:
        ValueError: For round lists of different lengths or none, an empty
            round, or a bad ``confidence`` or ``resamples``.
    """
    _check_pairs(base_rounds, rounds)
    pairs = list(zip(base_rounds, rounds))
    _check_draws(confidence, resamples, "ratio_interval")
    draw = random.Random(seed)
    ratios = sorted(
        _pooled(*zip(*(pairs[draw.randrange(len(pairs))] for _ in pairs)))  # checked above
        for _ in range(resamples))
    return _middle(ratios, confidence)


# --- the machine's load ---------------------------------------------------------------


def load_averages() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, or None where the OS has none."""
    try:
        return [float(v) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine_load() -> tuple[float | None, int]:
    """(1-minute load average or None where unknown, CPU count)."""
    loads = load_averages()
    return (loads[0] if loads else None), os.cpu_count() or 1


def busy(load: float | None, cpus: int) -> str:
    """"" or why a measurement at this load is not to be cached (`BUSY_LOAD_PER_CPU`)."""
    if load is not None and load > BUSY_LOAD_PER_CPU * cpus:
        return f"the machine was busy: load average {load:.1f} on {cpus} CPUs"
    return ""


# --- the per-host cache ------------------------------------------------------------------


def cache_dir() -> str:
    """The measurement cache's directory.

    Returns:
        `CACHE_DIR_ENV` if set, else ``$XDG_CACHE_HOME/tf_mixed``, else
        ``~/.cache/tf_mixed``.
    """
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tf_mixed")


def cache_path(key: Mapping, directory: str | None = None, *,
               prefix: str = "auto-policy") -> str:
    """The cache file for `key` in `directory` (default `cache_dir()`).

    Args:
        key: What the record is valid for (JSON-able).
        directory: The cache directory; default `cache_dir()`.
        prefix: The file name's start: "auto-policy" for `enable("auto")`,
            "plan" for `tf_mixed.plan`.
    """
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(directory or cache_dir(), f"{prefix}-{digest}.json")


def read_cache(path: str, key: Mapping,
               problem: Callable[[dict], str] | None = None) -> dict | None:
    """The cached record at `path` if it is whole, of `CACHE_FORMAT` and made for `key`.

    Never raises for a bad file: anything unusable is logged at debug level
    and gives None.

    Args:
        path: The cache file.
        key: The expected key.
        problem: ``problem(record) -> str``, what makes a record of the
            right format and key unusable ("" if nothing); None: no more checks.

    Returns:
        The record, or None.
    """
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError) as error:
        logging.debug("tf_mixed: ignoring the cache %s: %s", path, error)
        return None
    found = _record_problem(record, key, problem)
    if found:
        logging.debug("tf_mixed: ignoring the cache %s: %s", path, found)
        return None
    return record


def _record_problem(record: object, key: Mapping,
                    problem: Callable[[dict], str] | None) -> str:
    if not isinstance(record, dict) or record.get("format") != CACHE_FORMAT:
        return f"not a format-{CACHE_FORMAT} record"
    if record.get("key") != dict(key):
        return f"made for {record.get('key')!r}, not {dict(key)!r}"
    if problem is None:
        return ""
    try:
        return problem(record)
    except (KeyError, TypeError, ValueError) as error:
        return f"unreadable: {error!r}"


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
