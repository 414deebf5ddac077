"""The loss-scale monitor's rules as pure functions of typed values."""

# `tf_mixed.LossScaleMonitor` reads the optimizer into a `Snapshot`,
# folds it into its `Progress` with `advance` (what happened since the last
# read, per epoch), and asks `decide` whether to stop. Nothing here imports
# Keras or TensorFlow: the rules are tested with plain numbers.
#
# Three kinds of optimizer are read (`Kind`):
#
# * ``"tf_mixed"``: ``tf_mixed.LossScaleOptimizer`` keeps every counter.
# * ``"keras"``: ``keras.optimizers.LossScaleOptimizer`` keeps no skipped
#   counter, but its ``iterations`` advance only on applied steps, so skipped
#   = steps run - iterations advanced; it has no minimum scale and halves on
#   every skip, so "at its minimum" means at or below the monitor's threshold,
#   and the streak is derived from the halvings between two reads
#   (`keras_streak`).
# * ``"none"``: any other optimizer never skips; only the NaN rules apply.

from __future__ import annotations

import dataclasses
import math
from typing import Literal

__all__ = [
    "Advice", "Kind", "Progress", "Reading", "Snapshot", "StopRules", "advance",
    "agreed_loss_problem", "decide", "keras_streak", "loss_problem", "loss_signs",
    "search_skips", "start_epoch", "wire_cause",
]

Kind = Literal["tf_mixed", "keras", "none"]


@dataclasses.dataclass(frozen=True)
class Advice:
    """The fixes that fit the run, each a sentence starting " Fix: ".

    The monitor builds it from `tf_mixed._internal.facts.POLICY_FIXES` for
    the dtype the model computes in, so a bfloat16 or float32 run is never
    told a float16 fix.

    Attributes:
        overflow: What to do when steps keep being skipped.
        no_scale: What to do about a non-finite loss or weight when the
            optimizer does not scale the loss.
        scaled: Whether the optimizer scales the loss (a pass-through
            wrapper, scale 1, does not).
    """

    overflow: str
    no_scale: str
    scaled: bool = True


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One host read of the optimizer (same on every replica and worker).

    Attributes:
        scale: The loss scale (1.0 for an optimizer that does not scale).
        applied: The optimizer's ``iterations`` (applied steps).
        skipped: tf_mixed's cumulative skipped-step counter, else 0.
        min_scale_skips: tf_mixed's consecutive skips at its minimum, else 0.
        loss_sum: Sum of the losses of applied steps over this worker's
            replicas (`tf_mixed.scaling.loss_tally.LossTotals`), else 0.0.
        loss_steps: The applied steps that sum covers, else 0.
        calibration: tf_mixed's cumulative count of skipped steps that were
            the loss scale's calibration (`tf_mixed.scaling.calibration`),
            else None (not counted: `search_skips` falls back on epochs).
    """

    scale: float
    applied: int
    skipped: int = 0
    min_scale_skips: int = 0
    loss_sum: float = 0.0
    loss_steps: int = 0
    calibration: int | None = None


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the monitor knows between two reads.

    Attributes:
        epoch_start: The snapshot at the start of the epoch.
        last: The latest snapshot.
        skipped_in_epoch: Skipped steps of this epoch counted so far.
        steps_in_epoch: Steps (applied + skipped) of this epoch so far.
        total_skipped: Skipped steps since training began.
        streak: Consecutive skips at the minimum scale.
    """

    epoch_start: Snapshot
    last: Snapshot
    skipped_in_epoch: int = 0
    steps_in_epoch: int = 0
    total_skipped: int = 0
    streak: int = 0

    @property
    def epoch_loss_sum(self) -> float:
        """This worker's sum of applied steps' losses in this epoch."""
        return self.last.loss_sum - self.epoch_start.loss_sum

    @property
    def epoch_loss_steps(self) -> int:
        """The applied steps `epoch_loss_sum` covers."""
        return self.last.loss_steps - self.epoch_start.loss_steps


def start_epoch(progress: Progress) -> Progress:
    """`progress` at the start of a new epoch (counts of the epoch at zero)."""
    return dataclasses.replace(progress, epoch_start=progress.last,
                               skipped_in_epoch=0, steps_in_epoch=0)


def advance(progress: Progress, now: Snapshot, kind: Kind,
            steps_run: int | None, threshold: float) -> Progress:
    """Folds a new read into `progress`.

    Args:
        progress: The progress before this read.
        now: The new read.
        kind: Which optimizer was read.
        steps_run: Steps run in this epoch, for ``"keras"`` (which counts no
            skips): the batch count so far, or the epoch's step count at its
            end; None or 0 when unknown.
        threshold: For ``"keras"``: the scale counted as its minimum.

    Returns:
        The new progress.
    """
    applied_in_epoch = now.applied - progress.epoch_start.applied
    if kind == "tf_mixed":
        skipped = now.skipped - progress.epoch_start.skipped
    elif kind == "keras" and steps_run:
        skipped = max(0, steps_run - applied_in_epoch)
    else:
        skipped = 0
    new_skips = skipped - progress.skipped_in_epoch
    if kind == "tf_mixed":
        streak = now.min_scale_skips
    elif kind == "keras":
        new_applied = now.applied - progress.last.applied
        streak = keras_streak(progress.last.scale, new_applied + new_skips,
                              new_skips, threshold, progress.streak, now.scale)
    else:
        streak = 0
    return dataclasses.replace(
        progress, last=now, skipped_in_epoch=skipped,
        steps_in_epoch=applied_in_epoch + skipped,
        total_skipped=progress.total_skipped + new_skips, streak=streak)


def keras_streak(scale_before: float, n: int, k: int, threshold: float,
                 streak: int, scale_after: float) -> int:
    """Consecutive skips at or below ``threshold``, for Keras's wrapper.

    Keras's wrapper halves the scale on every skip and has no floor or
    counter. When all ``n`` steps since the last read were skipped, step
    ``i`` ran at ``scale_before / 2**i``: count those at the threshold (a
    walk over the halvings, exact for powers of two). Otherwise the order of
    applied and skipped steps is unknown; the streak restarts, at 1 if the
    last step was skipped at the threshold (no growth since, scale halved).

    Args:
        scale_before: The scale at the previous read.
        n: Steps run since the previous read.
        k: Of which skipped.
        threshold: The scale counted as the minimum.
        streak: The streak at the previous read.
        scale_after: The scale now.

    Returns:
        The streak now.
    """
    if n and k == n:
        used = scale_before
        for _ in range(k):
            if used <= threshold * (1 + 1e-6):
                streak += 1
            used /= 2
        return streak
    return 1 if k and scale_after * 2 <= threshold * (1 + 1e-6) else 0


@dataclasses.dataclass(frozen=True)
class StopRules:
    """When the monitor stops training.

    Attributes:
        patience: Consecutive skipped steps at the minimum scale tolerated.
        max_skip_fraction: Largest fraction of an epoch's steps that may be
            skipped (1.0 turns the rule off).
    """

    patience: int
    max_skip_fraction: float


@dataclasses.dataclass(frozen=True)
class Reading:
    """Everything `decide` judges, each value the same on every worker.

    Attributes:
        kind: Which optimizer was read.
        progress: The counts after the latest read.
        threshold: The minimum scale the streak counts at.
        loss_problem: A sentence about a non-finite loss reaching applied
            steps (`loss_problem`, agreed across workers), or None.
        bad_weights: Paths of weights holding NaN/inf in some replica's
            copy, on any worker.
        epoch: The epoch index at an epoch end; None at a batch check.
        cause: What overflows, when it is known not to be the forward pass
            (`wire_cause`), or None.
        advice: The fixes for the run's policy, or None (float16's).
    """

    kind: Kind
    progress: Progress
    threshold: float
    loss_problem: str | None = None
    bad_weights: tuple[str, ...] = ()
    epoch: int | None = None
    cause: str | None = None
    advice: Advice | None = None


def wire_cause(compute_dtype: str, communication_dtype: str | None) -> str | None:
    """The real cause of skipped steps when the forward pass cannot overflow.

    A model computing in float32 or bfloat16 never overflows float16 in its
    forward pass; if its gradients travel in float16, the wire does.

    Args:
        compute_dtype: The model's compute dtype.
        communication_dtype: The optimizer's gradient wire dtype, or None.

    Returns:
        A sentence with its fix, or None.
    """
    if communication_dtype != "float16" or compute_dtype == "float16":
        return None
    return (f" Cause: the model computes in {compute_dtype}, so its forward pass "
            "cannot overflow float16; its gradients travel between replicas in "
            "float16 (communication_dtype='float16'), which overflows above 65504. "
            "Fix: communication_dtype='bfloat16' (float32's range in half the "
            "bytes) or None, or lower the learning rate / clip the loss.")


def loss_problem(kind: Kind, progress: Progress,
                 logged_loss: float | None) -> str | None:
    """This worker's sign that a non-finite loss reached the weights.

    With tf_mixed's optimizer the applied steps' loss sum (a loss tally) or
    Keras's logged loss must be finite (the skip contract keeps skipped
    steps out of it); otherwise Keras's logged loss must be finite unless a
    step was skipped.

    Args:
        kind: Which optimizer was read.
        progress: The counts after the latest read.
        logged_loss: Keras's ``logs["loss"]``, or None.

    Returns:
        A sentence for the stop reason, or None.
    """
    if kind == "tf_mixed":
        if not math.isfinite(progress.epoch_loss_sum) or (
                logged_loss is not None and not math.isfinite(logged_loss)):
            return ("the loss was NaN/inf on steps that were applied (not "
                    "skipped) in this epoch: non-finite values are reaching "
                    "the weights.")
        return None
    if (logged_loss is not None and not math.isfinite(logged_loss)
            and progress.skipped_in_epoch == 0):
        return (f"the loss became {logged_loss} and no step was skipped: "
                "non-finite values are reaching the weights.")
    return None


# The non-finite values a loss problem can rest on, in `loss_signs`' order.
NON_FINITE = (math.nan, math.inf, -math.inf)


def loss_signs(kind: Kind, progress: Progress,
               logged_loss: float | None) -> list[float]:
    """This worker's `loss_problem` as counts to sum across workers.

    A worker's loss problem rests on its own values (its loss tally covers
    its replicas only); summed, the signs give every worker the same
    `agreed_loss_problem`.

    Args:
        kind: Which optimizer was read.
        progress: The counts after the latest read.
        logged_loss: Keras's ``logs["loss"]``, or None.

    Returns:
        ``[nan, inf, -inf]`` (`NON_FINITE`'s order): 1.0 at the value the
        problem rests on (the logged loss when non-finite, else the loss
        tally's sum), zeros when this worker sees no problem.
    """
    signs = [0.0, 0.0, 0.0]
    if loss_problem(kind, progress, logged_loss) is None:
        return signs
    value = (logged_loss if logged_loss is not None and not math.isfinite(logged_loss)
             else progress.epoch_loss_sum)
    signs[0 if math.isnan(value) else 1 if value > 0 else 2] = 1.0
    return signs


def agreed_loss_problem(kind: Kind, progress: Progress,
                        signs: list[float]) -> str | None:
    """The `loss_problem` every worker states, from the sum of their `loss_signs`.

    Args:
        kind: Which optimizer was read.
        progress: The counts after the latest read (its skip counts follow
            the global verdict: the same on every worker).
        signs: Every worker's `loss_signs`, summed.

    Returns:
        The sentence for the first value some worker saw, in `NON_FINITE`'s
        order (NaN before inf), or None when no worker saw a problem.
    """
    for value, count in zip(NON_FINITE, signs):
        if count:
            return loss_problem(kind, progress, value)
    return None


def search_skips(progress: Progress) -> int:
    """The epoch's skips that were the loss scale finding its first level.

    Until a run applies its first step, each skip halves the scale from its
    initial value (2**15 by default) toward a level the gradients fit:
    dynamic loss scaling's calibration, not trouble (keras.applications'
    MobileNetV3Small, weights=None, skips its first 7 steps, so with epochs
    of 4 steps the first is all calibration and the second holds 3
    calibration skips before its first applied step).

    * tf_mixed's optimizer counts them in the step itself
      (`Snapshot.calibration`, `tf_mixed.scaling.calibration`: skipped for
      non-finite gradients, above the minimum scale, before the first
      applied step), so the epoch's share is exact in every epoch, the one
      holding the first applied step included, however rarely it is read.
    * Without that count (Keras's wrapper): an epoch that applied no step,
      in a run that had applied none before, and whose scale came down, is
      calibration throughout; in the epoch of the first applied step the
      reads cannot tell calibration from later skips: they all count.

    A run that never finds a level is stopped by the ``patience`` rule at the
    minimum scale (those skips are not calibration).

    Returns:
        How many of the epoch's skipped steps the epoch rule leaves out.
    """
    start, last = progress.epoch_start, progress.last
    if last.calibration is not None and start.calibration is not None:
        return last.calibration - start.calibration
    if start.applied or last.applied or not 0 < last.scale < start.scale:
        return 0
    return progress.skipped_in_epoch


def decide(rules: StopRules, reading: Reading) -> str | None:
    """Why training must stop now, or None.

    The rules, in order: ``patience`` consecutive skips at the minimum
    scale; a non-finite loss on applied steps; NaN/inf in the weights; at an
    epoch end, more than ``max_skip_fraction`` of its steps skipped (the
    loss scale's calibration skips left out of both counts, `search_skips`).

    Args:
        rules: The thresholds.
        reading: The values judged.

    Returns:
        The reason, with its fix, or None to go on.
    """
    progress = reading.progress
    streak = progress.streak
    advice = reading.advice
    if reading.kind != "none" and streak >= rules.patience:
        if advice is not None and not advice.scaled:
            return (f"{streak} consecutive steps were skipped (patience="
                    f"{rules.patience}): each would have written a non-finite "
                    "value into the weights, the optimizer's slots or the "
                    "forward state." + (reading.cause or advice.overflow))
        return (
            f"the loss scale has sat at its minimum ({reading.threshold:g}) "
            f"for {streak} consecutive skipped steps (patience="
            f"{rules.patience}): the gradients are non-finite even without "
            "scaling, so no amount of loss scaling helps."
            + (reading.cause or _advice(reading.kind, advice=advice)))
    if reading.loss_problem:
        return reading.loss_problem + _advice(reading.kind, nan=True, advice=advice)
    if reading.bad_weights:
        return (
            f"weights {list(reading.bad_weights[:3])} hold NaN/inf (in at "
            "least one replica's copy): an earlier update corrupted them and "
            "no later step can repair them. Restore a checkpoint."
            + _advice(reading.kind, nan=True, advice=advice))
    search = search_skips(progress)  # the scale's calibration: not a failure
    steps, skipped = progress.steps_in_epoch - search, progress.skipped_in_epoch - search
    if (reading.epoch is not None and steps
            and skipped / steps > rules.max_skip_fraction):
        left_out = (f", not counting its {search} calibration skip"
                    f"{'s' if search > 1 else ''} of the loss scale" if search else "")
        return (
            f"{skipped} of {steps} steps in epoch {reading.epoch + 1} were "
            f"skipped{left_out} ({skipped / steps:.0%} > max_skip_fraction="
            f"{rules.max_skip_fraction:g}): "
            + ("the loss scale keeps finding non-finite gradients"
               if advice is None or advice.scaled else
               "most steps would write non-finite values")
            + ", so most updates are thrown away."
            + (reading.cause or _advice(reading.kind, advice=advice)))
    return None


def _advice(kind: Kind, nan: bool = False, advice: Advice | None = None) -> str:
    """The fix sentence; float16's when the run's `Advice` is not known."""
    if advice is not None:
        return advice.no_scale if nan and not advice.scaled else advice.overflow
    if nan and kind == "none":
        return (" Fix: scale the loss with tf_mixed.wrap_optimizer(...) "
                "(float16), lower the learning rate, and make the model's "
                "outputs float32 (tf_mixed.audit(model) lists risky layers).")
    return (" Fix: look for float16 overflow in the forward pass "
            "(tf_mixed.audit(model) lists risky layers), keep "
            "softmax/normalisation in float32, lower the learning rate, or "
            "train in mixed_bfloat16.")
