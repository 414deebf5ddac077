"""What a measurement means: the tolerance, each point's status, the safe input range."""

# Pure functions of plain numbers (no Keras, no TensorFlow), so the rules read
# and test alone.
#
# The stated tolerance: a point is "ok" when the half copy's output and
# gradients are finite and each relative L2 error against float32 is at most
# `DEFAULT_TOLERANCE` times the compute dtype's machine epsilon (float16:
# 8 x 2**-10 = 0.0078; bfloat16: 8 x 2**-7 = 0.0625), that is about 16 of the
# dtype's unit roundoffs: what rounding the inputs, the weights and a few
# results costs, and far less than a defect does (a flushed or overflowing
# layer's error is of order 1). Otherwise the point is:
#
#     overflow            the half output or a gradient is inf/NaN, float32's is finite
#     underflow           error above tolerance, and at least `FLUSH_FRACTION` of the
#                         elements float32 computes as non-zero are exactly 0 in half
#     resolution          error above tolerance otherwise (subnormals, rounding, a
#                         saturated softmax's gradient)
#     float32_nonfinite   float32 itself is not finite there: no verdict on the policy
#
# The safe input range of a row is the longest run of consecutive "ok"
# magnitudes (the one nearest 1 among equals), with the status of the first
# point beyond each end ("" where the run reaches the end of the grid).

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from tf_mixed._internal.facts import COMPUTE_DTYPES, HALF_DTYPES, dtype_limits

__all__ = ["DEFAULT_MAGNITUDES", "DEFAULT_TOLERANCE", "FLUSH_FRACTION", "STATUSES",
           "SafeRange", "safe_range", "status", "tolerance"]

DEFAULT_TOLERANCE = 8.0
"""The tolerance in machine epsilons of the compute dtype."""

FLUSH_FRACTION = 0.25
"""The share of flushed elements from which a failed point is an underflow."""

# 10**-6 ... 10**6 in half decades: 25 points.
DEFAULT_MAGNITUDES: tuple[float, ...] = tuple(10.0 ** (k / 2) for k in range(-12, 13))

STATUSES = ("ok", "resolution", "underflow", "overflow", "float32_nonfinite")



def tolerance(policy: str, multiple: float = DEFAULT_TOLERANCE) -> float:
    """The largest relative error a point of ``policy`` may have and be "ok".

    Args:
        policy: a half policy ("mixed_float16", "mixed_bfloat16").
        multiple: the tolerance in machine epsilons of its compute dtype.

    Returns:
        ``multiple * eps`` (float16 eps 2**-10, bfloat16 2**-7).

    Raises:
        ValueError: ``policy`` computes in no half dtype.
    """
    half = [name for name in COMPUTE_DTYPES if COMPUTE_DTYPES[name] in HALF_DTYPES]
    if policy not in half:
        raise ValueError(
            f"policies must be half policies: {', '.join(repr(p) for p in half)}. "
            f"Received: {policy!r}")
    return multiple * dtype_limits(COMPUTE_DTYPES[policy]).eps


def status(forward: float, gradient: float | None, reference_finite: bool,
           half_finite: bool, flushed: float, limit: float) -> str:
    """The status of one point (see the module's comment)."""
    if not reference_finite:
        return "float32_nonfinite"
    if not half_finite:
        return "overflow"
    worst = forward if gradient is None else max(forward, gradient)
    if worst <= limit:
        return "ok"
    return "underflow" if flushed >= FLUSH_FRACTION else "resolution"


class SafeRange(NamedTuple):
    """The magnitudes over which a layer is safe under a policy.

    Attributes:
        low, high: the smallest and largest safe magnitude (None: safe nowhere).
        below, above: the status just beyond each end ("" at the grid's end).
    """

    low: float | None
    high: float | None
    below: str
    above: str

    def text(self) -> str:
        """``"3.2e-05 .. 3.2e+04"`` (``"<=1e-06"`` or ``">=1e+06"`` at the grid's ends)."""
        if self.low is None or self.high is None:
            return "none"
        low = f"<={self.low:.2g}" if not self.below else f"{self.low:.2g}"
        high = f">={self.high:.2g}" if not self.above else f"{self.high:.2g}"
        return f"{low} .. {high}"

    def contains(self, magnitude: float) -> bool:
        """Whether ``magnitude`` is inside (a grid end counts as open)."""
        if self.low is None or self.high is None:
            return False
        return ((not self.below or magnitude >= self.low * (1 - 1e-9))
                and (not self.above or magnitude <= self.high * (1 + 1e-9)))


def safe_range(magnitudes: Sequence[float], statuses: Sequence[str]) -> SafeRange:
    """The longest run of "ok" points (nearest magnitude 1 among equals)."""
    best: tuple[int, int] | None = None
    start = None
    runs = []
    for i, code in enumerate(list(statuses) + ["end"]):
        if code == "ok" and start is None:
            start = i
        elif code != "ok" and start is not None:
            runs.append((start, i - 1))
            start = None
    for run in runs:
        if best is None or _better(run, best, magnitudes):
            best = run
    if best is None:
        return SafeRange(None, None, "", "")
    lo, hi = best
    below = statuses[lo - 1] if lo > 0 else ""
    above = statuses[hi + 1] if hi + 1 < len(statuses) else ""
    return SafeRange(float(magnitudes[lo]), float(magnitudes[hi]), below, above)


def _better(run, best, magnitudes) -> bool:
    length, best_length = run[1] - run[0], best[1] - best[0]
    if length != best_length:
        return length > best_length
    return _distance_to_one(run, magnitudes) < _distance_to_one(best, magnitudes)


def _distance_to_one(run, magnitudes) -> float:
    lo, hi = math.log10(magnitudes[run[0]]), math.log10(magnitudes[run[1]])
    return 0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))
