"""The main job's timing plan: interleaved rounds and a time budget.

The primitives (quartiles, pair ratios, intervals, round order) are
`tf_mixed._internal.measuring`'s.
"""

# Every policy trains in rounds of steps, and the rounds alternate between the
# policies (float32 round 1, mixed round 1, float32 round 2, ...), so a change
# in the host's load lands on both sides of a ratio. Each round's figure is the
# batch size over its median step time; a policy's figure is the median of its
# rounds, shown with its spread; the ratio to float32 is taken per round pair
# (round i of a policy over round i of float32), then its median.
#
# The plan: after one warm-up segment and `PLAN_ROUNDS` measured rounds of
# every policy (never one: a single round taken while a neighbour's job runs
# would decide alone), `plan_run` decides, from the median of those rounds,
# which policies train in full (epochs, accuracy compared) and which are only
# timed (`TIMING_ROUNDS` rounds, accuracy not compared), so that the job keeps
# to its time budget wherever float32 alone fits in it. A timed policy whose
# round-pair ratios do not yet answer "faster here, and by about how much"
# (`trusted`: the median's bootstrap interval, `tf_mixed._internal.measuring`,
# holds 1 and is not narrow) gets more rounds, paired with float32's, until it
# does, until `MAX_ROUNDS`, or until the job reaches its budget plus
# `EXTRA_TIME_FRACTION` of it; a ratio still unanswered then is printed as no
# ratio, with its interval (`tf_mixed.bench.report`). The load average is
# read at the end of every round (`Lane.loads`), for the note on what widened
# an interval.
# `Scheduler` holds the rounds and answers each policy's next command; it does
# no I/O and reads time only from the clock it is given, so tests drive it with
# injected timings.

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Sequence

from tf_mixed._internal import measuring
from tf_mixed._internal.measuring import pair_ratios

BASE = "float32"
# Validation and the per-round hand-over cost a little beyond the training
# steps themselves; estimates of a run's remaining time include this margin.
OVERHEAD_FACTOR = 1.2
PLAN_ROUNDS = 3  # measured rounds of every policy before the plan is made
TIMING_ROUNDS = 5  # rounds a policy that does not fit whole is timed on, at least
MAX_ROUNDS = 15  # a timed policy's rounds, extra rounds included, at most
# A timed policy's extra rounds (its pairs too wide to trust) run until the job
# has used its budget plus this fraction of it.
EXTRA_TIME_FRACTION = 0.5
MIN_TRUSTED_PAIRS = measuring.MIN_PAIRS  # fewer round pairs than this are never a verdict
MIN_ROUND_STEPS = 5


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one policy does after its measured round.

    Attributes:
        policy: The policy name.
        full: True: it trains all its epochs (accuracy compared); False: it is
            only timed on ``rounds`` rounds (accuracy not compared).
        rounds: Timed rounds in all, the measured one included (full runs:
            as many as the training takes, 0 here).
        round_steps: Steps per timed round.
        estimate_s: Estimated seconds the policy still needs.
        reason: One sentence a user reads: what was cut and why.
    """

    policy: str
    full: bool
    rounds: int
    round_steps: int
    estimate_s: float
    reason: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan_run(
    step_s: dict[str, float],
    steps_done: dict[str, int],
    *,
    total_steps: int,
    round_steps: int,
    budget_s: float,
    elapsed_s: float,
    emulated: Sequence[str] = (),
    measured_rounds: int = 1,
) -> dict[str, Plan]:
    """Decides which policies train in full and which are only timed.

    float32 (the baseline) always trains in full. Every other policy, in the
    order given, trains in full when the job's estimated end (``elapsed_s``
    plus the remaining steps of every full policy, times `OVERHEAD_FACTOR`)
    stays within ``budget_s``, or when float32 alone already overruns the
    budget (a slow or busy host: no budget can be kept) and the policy is no
    slower than float32. Otherwise it is timed on `TIMING_ROUNDS` rounds in
    all (its measured rounds included), with rounds shortened (to no fewer
    than `MIN_ROUND_STEPS` steps) to fit what the budget leaves.

    Args:
        step_s: Median step seconds per policy, from its measured rounds.
        steps_done: Training steps each policy has taken so far.
        total_steps: Steps of a full run (epochs x steps per epoch).
        round_steps: Steps per round.
        budget_s: The job's time budget in seconds.
        elapsed_s: Seconds the job has run so far.
        emulated: Policies whose half-precision type this host emulates
            (said in the reason).
        measured_rounds: Rounds each policy has already been timed on (they
            count towards `TIMING_ROUNDS`).

    Returns:
        A `Plan` per policy of ``step_s``.
    """
    def remaining(policy: str) -> float:
        return max(0, total_steps - steps_done.get(policy, 0)) * step_s[policy] * OVERHEAD_FACTOR

    plans: dict[str, Plan] = {}
    committed = elapsed_s
    if BASE in step_s:
        committed += remaining(BASE)
        plans[BASE] = Plan(BASE, True, 0, round_steps, remaining(BASE),
                           "the baseline: always run in full")
    base_over = BASE in step_s and committed > budget_s
    for policy in step_s:
        if policy == BASE:
            continue
        need = remaining(policy)
        if committed + need <= budget_s:
            committed += need
            plans[policy] = Plan(policy, True, 0, round_steps, need,
                                 "fits the time budget: run in full")
            continue
        if base_over and step_s[policy] <= step_s[BASE]:
            committed += need
            plans[policy] = Plan(
                policy, True, 0, round_steps, need,
                f"float32 alone overruns the {budget_s:.0f} s budget on this host (its run ends "
                f"in about {elapsed_s + remaining(BASE):.0f} s); {policy} is no slower, so it "
                "runs in full too")
            continue
        left = max(0.0, budget_s - committed)
        extra_rounds = max(0, TIMING_ROUNDS - measured_rounds)  # the measured rounds count
        fit = (int(left / (extra_rounds * step_s[policy] * OVERHEAD_FACTOR)) if extra_rounds
               else round_steps)
        steps = max(min(MIN_ROUND_STEPS, round_steps), min(round_steps, fit))
        estimate = extra_rounds * steps * step_s[policy] * OVERHEAD_FACTOR
        committed += estimate
        base = step_s.get(BASE)
        speed = (f"it runs at {base / step_s[policy]:.2f}x float32's speed here" if base
                 else f"its step takes {1000 * step_s[policy]:.0f} ms")
        why = (f"{_half_name(policy)} is emulated on this CPU: " if policy in emulated else "")
        plans[policy] = Plan(
            policy, False, max(TIMING_ROUNDS, measured_rounds), steps, estimate,
            f"{why}{policy}: {speed}, so its remaining "
            f"{max(0, total_steps - steps_done.get(policy, 0))} steps would take about "
            f"{need:.0f} s, past the {budget_s:.0f} s budget; "
            f"timed on {max(TIMING_ROUNDS, measured_rounds)} "
            f"rounds of up to {steps} steps, accuracy not compared "
            f"(--time_budget=0 runs it in full)",
        )
    return plans


def _half_name(policy: str) -> str:
    return "float16" if "float16" in policy and "bfloat16" not in policy else "bfloat16"


# --- statistics -------------------------------------------------------------------


def trusted(ratios: Sequence[float]) -> bool:
    """Whether paired-round ratios make a verdict: their median's interval
    answers "faster here, and by about how much" (`measuring.Estimate.answers`)."""
    return bool(ratios) and measuring.estimate(ratios).answers()


# --- the scheduler ------------------------------------------------------------------


@dataclasses.dataclass
class Lane:
    """One policy's progress: its warm-up, its rounds, whether it finished."""

    policy: str
    steps_done: int = 0
    warmed_up: bool = False
    rounds: list[list[float]] = dataclasses.field(default_factory=list)  # step seconds per round
    loads: list[float | None] = dataclasses.field(default_factory=list)  # load average per round
    finished: bool = False


class Scheduler:
    """Interleaves the policies' rounds and keeps the plan; no I/O.

    Each policy's first command is its warm-up (``warmup_steps`` untimed
    steps), the next `PLAN_ROUNDS` its measured rounds; once every policy has
    them, the first command that needs it makes the plan (`plan_run`), and a
    timed policy whose ratio is still too wide gets extra rounds (`_extend`). A
    command is the number of steps to run next, or 0 for "stop training now".

    Args:
        policies: Policy names, in the order their rounds alternate.
        total_steps: Steps of a full run.
        round_steps: Steps per round.
        warmup_steps: Untimed steps before the first round.
        budget_s: The job's time budget; 0 or less for none (every policy in full).
        clock: Seconds since the job began.
        reserve_s: Seconds of the budget kept for the work after training (the
            census, result files); at least the time the policies took to start
            (a busy host is as slow after training as before it).
        emulated: Policies whose half type the host emulates.
        load: The machine's 1-minute load average (None where unknown), read
            as each round is recorded.
    """

    def __init__(self, policies: Sequence[str], *, total_steps: int, round_steps: int,
                 warmup_steps: int, budget_s: float, clock: Callable[[], float],
                 emulated: Sequence[str] = (), reserve_s: float = 0.0,
                 load: Callable[[], float | None] = lambda: None):
        self.lanes = {p: Lane(p) for p in policies}
        self.total_steps = total_steps
        self.round_steps = max(1, round_steps)
        self.warmup_steps = warmup_steps
        self.budget_s = budget_s
        self.clock = clock
        self.emulated = tuple(emulated)
        self.reserve_s = reserve_s
        self.load = load
        self.started_s: float | None = None  # the clock at the first command
        self.plans: dict[str, Plan] | None = None
        self.order: list[str] = []  # the policy of each timed round, in the order run
        self.extra_rounds: dict[str, int] = {}  # rounds granted past a plan, per policy

    def command(self, policy: str) -> int:
        """Steps ``policy`` runs next; 0: stop training (its plan is met)."""
        lane = self.lanes[policy]
        left = self.total_steps - lane.steps_done
        if self.started_s is None:
            self.started_s = self.clock()
        if not lane.warmed_up:
            return (max(1, min(self.warmup_steps, left)) if self.warmup_steps
                    else self._round(lane, left))
        if len(lane.rounds) < PLAN_ROUNDS:
            return max(1, min(self.round_steps, left))
        plan = self._plan_for(policy)
        if plan is None or plan.full:
            # Never 0 for a full run: its training ends by itself.
            return max(1, min(self.round_steps, left))
        if len(lane.rounds) < plan.rounds or self._extend(policy):
            return max(1, min(plan.round_steps, left))
        return 0

    def _round(self, lane: Lane, left: int) -> int:
        lane.warmed_up = True  # no warm-up asked for
        return max(1, min(self.round_steps, left))

    def record(self, policy: str, step_seconds: Sequence[float], *, finished: bool) -> None:
        """Takes one segment's step times (the warm-up's, then each round's)."""
        lane = self.lanes[policy]
        lane.steps_done += len(step_seconds)
        if not lane.warmed_up:
            lane.warmed_up = True
        elif step_seconds:
            lane.rounds.append(list(step_seconds))
            lane.loads.append(self.load())
            self.order.append(policy)
        lane.finished = lane.finished or finished

    def _plan_for(self, policy: str) -> Plan | None:
        if self.plans is None or policy not in self.plans:
            if self.budget_s <= 0:
                return None
            if not all(_measured(lane) for lane in self.lanes.values()):
                # Sequential runs (--isolation=inprocess): a later policy has not
                # run yet; plan once the policy asking has its measured rounds.
                if policy == BASE or not _measured(self.lanes[policy]):
                    return None
                known = {p: lane for p, lane in self.lanes.items() if _measured(lane)}
            else:
                known = self.lanes
            new = plan_run(
                {p: _median_step(lane) for p, lane in known.items()},
                {p: lane.steps_done for p, lane in known.items()},
                total_steps=self.total_steps, round_steps=self.round_steps,
                budget_s=self.budget_s - self._reserve(), elapsed_s=self.clock(),
                emulated=self.emulated, measured_rounds=PLAN_ROUNDS,
            )
            self.plans = {**new, **(self.plans or {})}  # a plan once made stands
        return self.plans.get(policy)

    def _reserve(self) -> float:
        return max(self.reserve_s, self.started_s or 0.0)

    def pair_ratios(self, policy: str) -> list[float]:
        """``policy``'s speed over float32's, round i against round i (their median steps)."""
        base = self.lanes.get(BASE)
        if base is None:
            return []
        return pair_ratios([1 / statistics.median(r) for r in base.rounds],
                           [1 / statistics.median(r) for r in self.lanes[policy].rounds])

    def _extend(self, policy: str) -> bool:
        """One more round for a timed policy whose ratio is not yet a verdict.

        Granted while its round pairs are no verdict (`trusted`), float32 has a
        round to pair the new one with (or is still training), the policy has
        fewer than `MAX_ROUNDS` rounds, and the job is within its budget plus
        `EXTRA_TIME_FRACTION` of it (minus the reserve for what follows).
        """
        lane, base = self.lanes[policy], self.lanes.get(BASE)
        if base is None or policy == BASE or len(lane.rounds) >= MAX_ROUNDS:
            return False
        if base.finished and len(base.rounds) <= len(lane.rounds):
            return False  # no float32 round left to pair with
        if trusted(self.pair_ratios(policy)):
            return False
        if self.clock() > self.budget_s * (1 + EXTRA_TIME_FRACTION) - self._reserve():
            return False
        self.extra_rounds[policy] = self.extra_rounds.get(policy, 0) + 1
        return True

    def round_rates(self, policy: str, batch_size: int) -> list[float]:
        """Samples/s of each round: the batch size over the round's median step."""
        return [batch_size / statistics.median(r) for r in self.lanes[policy].rounds]

    def plan(self, policy: str) -> Plan:
        """The policy's plan (a full run where no plan was needed)."""
        if self.plans and policy in self.plans:
            return self.plans[policy]
        reason = ("no time budget (--time_budget=0)" if self.budget_s <= 0
                  else "the baseline: always run in full")
        return Plan(policy, True, 0, self.round_steps, 0.0,
                    reason if policy == BASE or self.budget_s <= 0 else "run in full")


def _measured(lane: Lane) -> bool:
    """Whether a lane has the rounds a plan may rest on (or has no more to give)."""
    return len(lane.rounds) >= PLAN_ROUNDS or (lane.finished and bool(lane.rounds))


def _median_step(lane: Lane) -> float:
    """A lane's step seconds: the median of its rounds' medians (one slow round moves it little)."""
    return statistics.median(statistics.median(r) for r in lane.rounds)
