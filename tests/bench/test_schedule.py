"""The main job's plan and round statistics, as pure functions of injected timings.

No test here times this host: every step time and clock reading is given.
"""

import pytest

from tf_mixed._internal import measuring
from tf_mixed.bench import schedule
from tf_mixed.bench.schedule import Scheduler, plan_run


def test_a_policy_that_fits_runs_in_full():
    # 400 steps left each: float32 400 * 0.1 * 1.2 = 48 s, bf16 400 * 0.05 * 1.2 = 24 s.
    plans = plan_run({"float32": 0.1, "mixed_bfloat16": 0.05},
                     {"float32": 100, "mixed_bfloat16": 100},
                     total_steps=500, round_steps=20, budget_s=105.0, elapsed_s=20.0)
    assert plans["float32"].full and plans["mixed_bfloat16"].full
    assert plans["float32"].estimate_s == pytest.approx(48.0)
    assert plans["mixed_bfloat16"].estimate_s == pytest.approx(24.0)


def test_an_emulated_policy_is_timed_on_five_rounds_and_says_why():
    # bf16 at 0.16x: 0.3125 s a step; its 480 steps left need 480 * 0.3125 * 1.2 = 180 s.
    plans = plan_run({"float32": 0.05, "mixed_bfloat16": 0.3125},
                     {"float32": 20, "mixed_bfloat16": 20},
                     total_steps=500, round_steps=20, budget_s=105.0, elapsed_s=20.0,
                     emulated=("mixed_bfloat16",))
    bf16 = plans["mixed_bfloat16"]
    assert plans["float32"].full and not bf16.full
    assert bf16.rounds == 5
    # Left after float32: 105 - 20 - 480 * 0.05 * 1.2 = 56.2 s; four more rounds of
    # n steps cost 4 * n * 0.3125 * 1.2 = 1.5 n s: n = 37, capped at round_steps.
    assert bf16.round_steps == 20
    assert bf16.estimate_s == pytest.approx(30.0)
    assert bf16.reason == (
        "bfloat16 is emulated on this CPU: mixed_bfloat16: it runs at 0.16x float32's speed "
        "here, so its remaining 480 steps would take about 180 s, past the 105 s budget; "
        "timed on 5 rounds of up to 20 steps, accuracy not compared (--time_budget=0 runs it "
        "in full)")


def test_rounds_shrink_to_what_the_budget_leaves_but_not_below_the_minimum():
    # Left after float32: 130 - 10 - 0.5 * 160 * 1.2 = 24 s; 3 rounds measured, 2 to
    # go, of n steps at 1 s * 1.2: n = int(24 / 2.4) = 10.
    plans = plan_run({"float32": 0.5, "mixed_float16": 1.0}, {"float32": 0, "mixed_float16": 0},
                     total_steps=160, round_steps=20, budget_s=130.0, elapsed_s=10.0,
                     measured_rounds=3)
    assert plans["mixed_float16"].round_steps == 10 and plans["mixed_float16"].rounds == 5
    # Nothing left at all: still the minimum, 5 steps (or the round size if smaller).
    plans = plan_run({"float32": 1.0, "mixed_float16": 2.0}, {}, total_steps=500,
                     round_steps=20, budget_s=10.0, elapsed_s=10.0)
    assert plans["mixed_float16"].round_steps == 5 and plans["float32"].full
    plans = plan_run({"float32": 1.0, "mixed_float16": 2.0}, {}, total_steps=500,
                     round_steps=3, budget_s=10.0, elapsed_s=10.0)
    assert plans["mixed_float16"].round_steps == 3


def test_where_float32_alone_overruns_a_policy_no_slower_still_runs_in_full():
    # float32's 400 steps left take 400 * 0.5 * 1.2 = 240 s: past 105 s whatever follows.
    step_s = {"float32": 0.5, "mixed_bfloat16": 0.2, "mixed_float16": 0.6}
    plans = plan_run(step_s, {p: 100 for p in step_s}, total_steps=500, round_steps=20,
                     budget_s=105.0, elapsed_s=60.0)
    assert plans["mixed_bfloat16"].full and not plans["mixed_float16"].full
    assert plans["mixed_bfloat16"].reason == (
        "float32 alone overruns the 105 s budget on this host (its run ends in about 300 s); "
        "mixed_bfloat16 is no slower, so it runs in full too")


def test_trust_is_the_interval_answering_faster_or_slower():
    assert measuring.pair_ratios([100.0, 200.0, 50.0], [250.0, 400.0]) == [2.5, 2.0]
    assert schedule.trusted([2.0, 2.1, 1.9, 2.0])
    # Wide pairs that all say "faster" are a verdict (issue 46: 34% spread, every pair > 1).
    assert schedule.trusted([3.06, 1.56, 3.4, 2.9, 3.1, 2.2, 3.3])
    # Pairs on both sides of 1, far apart: no verdict.
    assert not schedule.trusted([0.5, 1.5, 0.5, 1.5, 0.5])
    # Fewer than 3 pairs are never a verdict, however close.
    assert not schedule.trusted([2.0, 2.0])
    assert schedule.trusted([2.0, 2.0, 2.0])
    assert not schedule.trusted([])


def _drive(scheduler, step_s, finish_at):
    """Runs the lanes in turn as compare does, each step taking ``step_s[policy]``."""
    commands = []
    active = list(scheduler.lanes)
    while active:
        for policy in list(active):
            steps = scheduler.command(policy)
            commands.append((policy, steps))
            done = scheduler.lanes[policy].steps_done
            if steps == 0:
                scheduler.record(policy, [], finished=True)
                active.remove(policy)
                continue
            steps = min(steps, finish_at - done)
            finished = done + steps >= finish_at
            scheduler.record(policy, [step_s[policy]] * steps, finished=finished)
            if finished:
                active.remove(policy)
    return commands


def test_scheduler_interleaves_rounds_and_stops_a_policy_that_does_not_fit():
    # Read at the first command (the policies took 10 s to start, so 10 s are kept
    # for after training), when the plan is made (30 s), then at each extension check.
    clock = iter([10.0, 30.0] + [200.0] * 20).__next__
    scheduler = Scheduler(("float32", "mixed_bfloat16"), total_steps=200, round_steps=20,
                          warmup_steps=5, budget_s=70.0, clock=clock, reserve_s=5.0)
    commands = _drive(scheduler, {"float32": 0.1, "mixed_bfloat16": 1.0}, finish_at=200)
    # Warm-up, then three measured rounds each before any plan.
    assert commands[:8] == [("float32", 5), ("mixed_bfloat16", 5)] + [
        ("float32", 20), ("mixed_bfloat16", 20)] * 3
    # The plan at 30 s, 70 - 10 = 60 s to train in: float32 has 135 steps left,
    # 16.2 s, done by 46.2 s; bf16 needs 156 s more: timed on 5 rounds, the 2 left
    # of int(13.8 / 2.4) = 5 steps each.
    plan = scheduler.plan("mixed_bfloat16")
    assert not plan.full and plan.rounds == 5 and plan.round_steps == 5
    assert [c for c in commands if c[0] == "mixed_bfloat16"] == [
        ("mixed_bfloat16", 5)] + [("mixed_bfloat16", 20)] * 3 + [
        ("mixed_bfloat16", 5), ("mixed_bfloat16", 5), ("mixed_bfloat16", 0)]
    assert scheduler.order[:10] == ["float32", "mixed_bfloat16"] * 5
    assert scheduler.lanes["float32"].steps_done == 200
    assert scheduler.round_rates("mixed_bfloat16", 64) == [64.0] * 5
    assert scheduler.pair_ratios("mixed_bfloat16") == [pytest.approx(0.1)] * 5
    assert scheduler.extra_rounds == {}  # steady pairs: no extra round
    assert scheduler.plan("float32").full


def _run_loaded(step_s, load, **schedule) -> Scheduler:
    """A scheduler of ``step_s``'s policies on a fake clock, driven to the end.

    Like `_drive`, each round of a lane timed as step_s * load(policy, round
    index); the clock advances by each segment's seconds. ``schedule``: the
    other `Scheduler` arguments.
    """
    clock = [0.0]
    scheduler = Scheduler(tuple(step_s), clock=lambda: clock[0], **schedule)
    active = list(scheduler.lanes)
    while active:
        for policy in list(active):
            steps = scheduler.command(policy)
            lane = scheduler.lanes[policy]
            if steps == 0:
                scheduler.record(policy, [], finished=True)
                active.remove(policy)
                continue
            steps = min(steps, scheduler.total_steps - lane.steps_done)
            factor = load(policy, len(lane.rounds)) if lane.warmed_up else 1.0
            times = [step_s[policy] * factor] * steps
            clock[0] += sum(times)
            finished = lane.steps_done + steps >= scheduler.total_steps
            scheduler.record(policy, times, finished=finished)
            if finished:
                active.remove(policy)
    return scheduler


def _alternating(policy, i):
    """float32's rounds alternate fast and slow (a neighbour's job on and off): with
    bf16 at 0.02 s a step against float32's 0.01 s, the pairs alternate 0.5x and 1.5x."""
    return 3.0 if policy == "float32" and i % 2 else 1.0


def test_one_round_under_load_does_not_cut_a_policy():
    # bf16 runs at 2x float32 (0.05 s against 0.1 s a step); its first round is
    # taken while a neighbour's job runs (10x slower). Planned from that round
    # alone it would look 5x slower than float32 and be cut; the median of three
    # rounds says 2x: float32 and bf16 together fit, so both run in full.
    scheduler = _run_loaded({"float32": 0.1, "mixed_bfloat16": 0.05},
                            lambda policy, i: 10.0 if (policy, i) == ("mixed_bfloat16", 0)
                            else 1.0,
                            total_steps=400, round_steps=20, warmup_steps=5, budget_s=100.0)
    assert scheduler.plan("mixed_bfloat16").full
    assert scheduler.lanes["mixed_bfloat16"].steps_done == 400
    # The same timings planned from the first round alone cut it (what this guards).
    one_round = plan_run({"float32": 0.1, "mixed_bfloat16": 0.5},
                         {"float32": 25, "mixed_bfloat16": 25}, total_steps=400,
                         round_steps=20, budget_s=100.0, elapsed_s=8.0)
    assert not one_round["mixed_bfloat16"].full


def test_a_timed_policy_with_pairs_too_wide_gets_extra_rounds_within_the_bound():
    # bf16 cannot fit (2x slower than float32 in the planning rounds); float32
    # runs 1000 steps. Its pairs alternate 0.5x and 1.5x, so their interval
    # always holds 1: extra rounds are granted until MAX_ROUNDS.
    scheduler = _run_loaded({"float32": 0.01, "mixed_bfloat16": 0.02}, _alternating,
                            total_steps=1000, round_steps=10, warmup_steps=0, budget_s=20.0)
    plan = scheduler.plan("mixed_bfloat16")
    assert not plan.full and plan.rounds == schedule.TIMING_ROUNDS
    assert len(scheduler.lanes["mixed_bfloat16"].rounds) == schedule.MAX_ROUNDS
    assert scheduler.extra_rounds == {
        "mixed_bfloat16": schedule.MAX_ROUNDS - schedule.TIMING_ROUNDS}
    assert not schedule.trusted(scheduler.pair_ratios("mixed_bfloat16"))


def test_extra_rounds_stop_once_the_interval_answers():
    # The first five pairs alternate 0.5x and 1.5x (no verdict), then float32's
    # rounds slow to 4x and every new pair says 2.0x: extra rounds stop at the
    # first count of pairs whose interval answers.
    def load(policy, i):
        if policy != "float32":
            return 1.0
        return 4.0 if i >= schedule.TIMING_ROUNDS else _alternating(policy, i)

    scheduler = _run_loaded({"float32": 0.01, "mixed_bfloat16": 0.02}, load,
                            total_steps=1000, round_steps=10, warmup_steps=0, budget_s=20.0)
    assert not scheduler.plan("mixed_bfloat16").full
    ratios = scheduler.pair_ratios("mixed_bfloat16")
    first = next(n for n in range(schedule.TIMING_ROUNDS, len(ratios) + 1)
                 if schedule.trusted(ratios[:n]))
    assert first == len(ratios) > schedule.TIMING_ROUNDS
    assert scheduler.extra_rounds == {"mixed_bfloat16": len(ratios) - schedule.TIMING_ROUNDS}


def test_the_load_is_read_as_each_round_is_recorded():
    readings = iter([1.0, 2.0, 3.0, 4.0])
    scheduler = Scheduler(("float32",), total_steps=20, round_steps=5, warmup_steps=5,
                          budget_s=0.0, clock=lambda: 0.0, load=lambda: next(readings))
    scheduler.record("float32", [0.1] * 5, finished=False)  # the warm-up: no round
    scheduler.record("float32", [0.1] * 5, finished=False)
    scheduler.record("float32", [0.1] * 5, finished=True)
    assert scheduler.lanes["float32"].loads == [1.0, 2.0]


def test_extra_rounds_stop_at_the_time_bound():
    # The clock already past budget * (1 + EXTRA_TIME_FRACTION): no extra round.
    scheduler = _run_loaded({"float32": 0.01, "mixed_bfloat16": 1.0}, _alternating,
                            total_steps=1000, round_steps=10, warmup_steps=0, budget_s=20.0)
    assert len(scheduler.lanes["mixed_bfloat16"].rounds) == schedule.TIMING_ROUNDS
    assert scheduler.extra_rounds == {}


def test_scheduler_without_budget_runs_every_policy_in_full():
    scheduler = Scheduler(("float32", "mixed_float16"), total_steps=30, round_steps=10,
                          warmup_steps=0, budget_s=0.0, clock=lambda: 1e9)
    commands = _drive(scheduler, {"float32": 0.1, "mixed_float16": 100.0}, finish_at=30)
    assert commands == [("float32", 10), ("mixed_float16", 10)] * 3
    assert scheduler.plan("mixed_float16").reason == "no time budget (--time_budget=0)"


def test_sequential_lanes_plan_when_the_later_policy_is_measured():
    # --isolation=inprocess: float32 runs whole first, then the other policy.
    scheduler = Scheduler(("float32", "mixed_float16"), total_steps=90, round_steps=10,
                          warmup_steps=2, budget_s=20.0, clock=lambda: 19.0)
    for steps in (2, 10, 10, 10, 10, 10, 10, 10, 10, 8):
        assert scheduler.command("float32") == steps
        scheduler.record("float32", [0.1] * steps, finished=steps == 8)
    assert scheduler.command("mixed_float16") == 2
    scheduler.record("mixed_float16", [1.0, 1.0], finished=False)
    for _ in range(3):  # its measured rounds
        assert scheduler.command("mixed_float16") == 10
        scheduler.record("mixed_float16", [1.0] * 10, finished=False)
    # 19 s gone, 1 s left: two more rounds of the minimum 5 steps.
    assert scheduler.command("mixed_float16") == 5
    assert not scheduler.plan("mixed_float16").full


# --- the overhead suite's round order and ratio interval ---------------------------


def test_rotated_lets_each_name_lead_and_runs_every_other_cycle_backwards():
    names = ["keras", "tf_mixed", "control"]
    orders = [measuring.rotated(names, r) for r in range(6)]
    assert orders == [
        ["keras", "tf_mixed", "control"], ["tf_mixed", "control", "keras"],
        ["control", "keras", "tf_mixed"],
        ["control", "tf_mixed", "keras"], ["keras", "control", "tf_mixed"],
        ["tf_mixed", "keras", "control"],
    ]
    # Over two cycles every name runs right after every other name equally often.
    follows = {}
    for order in orders:
        for before, after in zip(order, order[1:]):
            follows[(before, after)] = follows.get((before, after), 0) + 1
    assert set(follows.values()) == {2} and len(follows) == 6


@pytest.mark.parametrize("names, index", [([], 0), (["a"], -1)])
def test_rotated_refuses_no_names_or_a_negative_round(names, index):
    with pytest.raises(ValueError, match="rotated\\(\\) needs names"):
        measuring.rotated(names, index)


def test_pooled_ratio_is_the_median_of_all_steps_over_the_baselines():
    base = [[1.0, 2.0, 3.0], [4.0, 5.0]]  # median of all five: 3.0
    other = [[3.0, 6.0], [9.0, 12.0, 15.0]]  # median of all five: 9.0
    assert measuring.pooled_ratio(base, other) == 3.0


def test_ratio_interval_of_steady_rounds_is_the_ratio_itself():
    base = [[0.020, 0.020], [0.020, 0.020], [0.020, 0.020]]
    other = [[0.021, 0.021], [0.021, 0.021], [0.021, 0.021]]
    low, high = measuring.ratio_interval(base, other)
    assert low == high == pytest.approx(1.05)


def test_ratio_interval_is_seeded_and_holds_the_middle_of_the_round_pairs():
    base = [[1.0]] * 8
    other = [[r] for r in (0.90, 0.95, 1.00, 1.00, 1.05, 1.10, 1.20, 1.30)]
    first = measuring.ratio_interval(base, other, resamples=500)
    assert first == measuring.ratio_interval(base, other, resamples=500)  # the same draws
    low, high = first
    assert 0.90 <= low < measuring.pooled_ratio(base, other) < high <= 1.30
    # A narrower confidence gives a narrower interval from the same draws.
    narrow = measuring.ratio_interval(base, other, resamples=500, confidence=0.5)
    assert low <= narrow[0] <= narrow[1] <= high


@pytest.mark.parametrize("kwargs, match", [
    ({"base_rounds": [], "rounds": []}, "Received: 0 and 0 rounds"),
    ({"base_rounds": [[1.0]], "rounds": [[1.0], [2.0]]}, "Received: 1 and 2 rounds"),
    ({"base_rounds": [[1.0], []], "rounds": [[1.0], [1.0]]}, r"base_rounds\[1\] is an empty"),
    ({"base_rounds": [[1.0]], "rounds": [[1.0]], "confidence": 1.0}, "confidence=1.0"),
    ({"base_rounds": [[1.0]], "rounds": [[1.0]], "resamples": 0}, "resamples=0"),
])
def test_ratio_interval_refuses_what_it_cannot_bootstrap(kwargs, match):
    with pytest.raises(ValueError, match=match):
        measuring.ratio_interval(**kwargs)


def test_pooled_ratio_refuses_unpaired_rounds():
    with pytest.raises(ValueError, match="Received: 2 and 1 rounds"):
        measuring.pooled_ratio([[1.0], [1.0]], [[1.0]])
