"""The monitor's stop rules as pure functions: plain numbers in, a decision out.

No model, no optimizer, no Keras: each test builds `Snapshot` values by hand
and checks the exact counts and the exact decision.
"""

import os
import subprocess
import sys

import pytest
from repo_paths import ROOT

from tf_mixed.callbacks import stop_rules
from tf_mixed.callbacks.stop_rules import Progress, Reading, Snapshot, StopRules

RULES = StopRules(patience=3, max_skip_fraction=0.5)


_START = Snapshot(scale=8.0, applied=0)


def _start(snapshot=_START):
    return Progress(epoch_start=snapshot, last=snapshot)


@pytest.mark.slow
def test_the_rules_load_without_keras_or_tensorflow():
    # The module file itself, not through tf_mixed.callbacks (whose __init__
    # hands on the Keras callbacks too): the rules are pure Python.
    code = ("import sys, importlib.util as u; "
            "spec = u.spec_from_file_location('stop_rules', "
            f"{str(ROOT / 'tf_mixed' / 'callbacks' / 'stop_rules.py')!r}); "
            "m = sys.modules['stop_rules'] = u.module_from_spec(spec); "
            "spec.loader.exec_module(m); "
            "print(sorted(m for m in ('keras', 'tensorflow') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_tf_mixed_counts_come_from_the_optimizer_counters():
    progress = _start(Snapshot(scale=8.0, applied=10, skipped=2))
    progress = stop_rules.advance(
        progress, Snapshot(scale=4.0, applied=13, skipped=5, min_scale_skips=1),
        "tf_mixed", steps_run=None, threshold=1.0)
    assert (progress.steps_in_epoch, progress.skipped_in_epoch) == (6, 3)
    assert (progress.total_skipped, progress.streak) == (3, 1)
    progress = stop_rules.advance(
        progress, Snapshot(scale=4.0, applied=14, skipped=5),
        "tf_mixed", steps_run=None, threshold=1.0)
    assert (progress.steps_in_epoch, progress.total_skipped) == (7, 3)
    restarted = stop_rules.start_epoch(progress)
    assert (restarted.steps_in_epoch, restarted.skipped_in_epoch) == (0, 0)
    assert restarted.total_skipped == 3 and restarted.epoch_start.applied == 14


def test_keras_skips_are_steps_run_minus_applied():
    progress = stop_rules.advance(
        _start(), Snapshot(scale=2.0, applied=6), "keras", steps_run=8,
        threshold=1.0)
    assert (progress.steps_in_epoch, progress.skipped_in_epoch) == (8, 2)
    # Steps unknown: nothing can be said about skips.
    unknown = stop_rules.advance(
        _start(), Snapshot(scale=2.0, applied=6), "keras", steps_run=None,
        threshold=1.0)
    assert unknown.skipped_in_epoch == 0


def test_keras_streak_walks_the_halvings():
    # Four skips in a row from scale 4: steps ran at 4, 2, 1, 0.5; two at or
    # below the threshold 1.
    assert stop_rules.keras_streak(4.0, 4, 4, 1.0, 0, 0.25) == 2
    # Mixed applied and skipped steps: the order is unknown; the last step
    # was skipped at the threshold only if the scale halved below it.
    assert stop_rules.keras_streak(4.0, 3, 1, 1.0, 5, 0.5) == 1
    assert stop_rules.keras_streak(4.0, 3, 1, 1.0, 5, 4.0) == 0
    assert stop_rules.keras_streak(4.0, 3, 0, 1.0, 5, 4.0) == 0


def test_other_optimizers_never_skip():
    progress = stop_rules.advance(
        _start(Snapshot(scale=1.0, applied=0)), Snapshot(scale=1.0, applied=5),
        "none", steps_run=9, threshold=1.0)
    assert (progress.steps_in_epoch, progress.skipped_in_epoch) == (5, 0)
    many = Progress(epoch_start=progress.epoch_start, last=progress.last,
                    streak=99)
    assert stop_rules.decide(RULES, Reading("none", many, 1.0)) is None


def test_patience_counts_consecutive_skips_at_the_minimum():
    progress = Progress(_start().last, _start().last, streak=2)
    assert stop_rules.decide(RULES, Reading("tf_mixed", progress, 1.0)) is None
    progress = Progress(_start().last, _start().last, streak=3)
    reason = stop_rules.decide(RULES, Reading("tf_mixed", progress, 0.5))
    assert reason.startswith(
        "the loss scale has sat at its minimum (0.5) for 3 consecutive "
        "skipped steps (patience=3)")


def test_skip_fraction_is_judged_at_epoch_ends_only():
    progress = Progress(_start().last, _start().last, steps_in_epoch=10,
                        skipped_in_epoch=6)
    assert stop_rules.decide(RULES, Reading("tf_mixed", progress, 1.0)) is None
    reason = stop_rules.decide(RULES, Reading("tf_mixed", progress, 1.0, epoch=0))
    assert reason.startswith("6 of 10 steps in epoch 1 were skipped (60% > "
                             "max_skip_fraction=0.5)")
    exactly_half = Progress(_start().last, _start().last, steps_in_epoch=10,
                            skipped_in_epoch=5)
    assert stop_rules.decide(
        RULES, Reading("tf_mixed", exactly_half, 1.0, epoch=0)) is None


def test_loss_problems():
    start = Snapshot(scale=1.0, applied=0, loss_sum=1.5)
    nan_sum = Progress(start, Snapshot(scale=1.0, applied=2,
                                       loss_sum=float("nan")))
    fine = Progress(start, Snapshot(scale=1.0, applied=2, loss_sum=2.0))
    assert "applied (not skipped)" in stop_rules.loss_problem(
        "tf_mixed", nan_sum, None)
    # tf_mixed's logged loss leaves skipped steps out (the skip contract).
    assert "applied (not skipped)" in stop_rules.loss_problem("tf_mixed", fine, float("nan"))
    assert stop_rules.loss_problem("tf_mixed", fine, 0.25) is None
    assert fine.epoch_loss_sum == 0.5
    assert stop_rules.loss_problem("none", fine, float("inf")) == (
        "the loss became inf and no step was skipped: non-finite values are "
        "reaching the weights.")
    skipped = Progress(start, start, skipped_in_epoch=1)
    assert stop_rules.loss_problem("keras", skipped, float("nan")) is None
    assert stop_rules.loss_problem("keras", fine, 0.25) is None


@pytest.mark.parametrize("kind, fix", [
    ("none", "scale the loss with tf_mixed.wrap_optimizer"),
    ("keras", "look for float16 overflow"),
])
def test_nan_rules_stop_with_the_advice_for_the_optimizer(kind, fix):
    progress = _start()
    reason = stop_rules.decide(RULES, Reading(
        kind, progress, 1.0, loss_problem="the loss became nan."))
    assert reason.startswith("the loss became nan. Fix: " + fix)
    reason = stop_rules.decide(RULES, Reading(
        kind, progress, 1.0, bad_weights=("a", "b", "c", "d")))
    assert reason.startswith("weights ['a', 'b', 'c'] hold NaN/inf")


def test_the_streak_rule_comes_first():
    progress = Progress(_start().last, _start().last, streak=3,
                        steps_in_epoch=4, skipped_in_epoch=4)
    reason = stop_rules.decide(RULES, Reading(
        "keras", progress, 1.0, loss_problem="x", bad_weights=("w",), epoch=0))
    assert "consecutive skipped steps" in reason


def _epoch(start, last, steps, skipped):
    return Progress(start, last, steps_in_epoch=steps, skipped_in_epoch=skipped)


def test_an_epoch_of_the_scales_first_search_is_not_a_stop():
    # MobileNetV3Small (weights=None) under mixed_float16: 32768 -> 2048 in
    # epoch 1's 4 steps, all skipped, none applied before or during.
    first = _epoch(Snapshot(32768.0, 0), Snapshot(2048.0, 0), steps=4, skipped=4)
    assert stop_rules.search_skips(first) == 4
    assert stop_rules.decide(RULES, Reading("tf_mixed", first, 1.0, epoch=0)) is None
    assert stop_rules.decide(RULES, Reading("keras", first, 1.0, epoch=0)) is None


@pytest.mark.parametrize("start, last", [
    (Snapshot(32768.0, 5), Snapshot(2048.0, 5)),   # a step was applied before the epoch
    (Snapshot(2048.0, 0), Snapshot(256.0, 1)),     # the first step applied in the epoch
    (Snapshot(1.0, 0), Snapshot(1.0, 0)),          # the pass-through: no scale to search
    (Snapshot(8.0, 0), Snapshot(16.0, 0)),         # the scale grew
])
def test_every_other_epoch_counts_all_its_skips(start, last):
    progress = _epoch(start, last, steps=4, skipped=4)
    assert stop_rules.search_skips(progress) == 0
    assert stop_rules.decide(RULES, Reading("tf_mixed", progress, 1.0, epoch=0)).startswith(
        "4 of 4 steps in epoch 1 were skipped (100% > max_skip_fraction=0.5)")


def test_the_optimizers_calibration_count_is_left_out_exactly():
    # tf_mixed's count (Snapshot.calibration) in the epoch of the first applied
    # step: 3 calibration skips, then 1 applied step; then one real skip too.
    healthy = _epoch(Snapshot(2048.0, 0, skipped=4, calibration=4),
                     Snapshot(256.0, 1, skipped=7, calibration=7), steps=4, skipped=3)
    assert stop_rules.search_skips(healthy) == 3
    assert stop_rules.decide(RULES, Reading("tf_mixed", healthy, 1.0, epoch=1)) is None
    failing = _epoch(Snapshot(2048.0, 0, skipped=4, calibration=4),
                     Snapshot(128.0, 2, skipped=9, calibration=5), steps=7, skipped=5)
    assert stop_rules.search_skips(failing) == 1
    assert stop_rules.decide(RULES, Reading("tf_mixed", failing, 1.0, epoch=1)).startswith(
        "4 of 6 steps in epoch 2 were skipped, not counting its 1 calibration skip of the "
        "loss scale (67% > max_skip_fraction=0.5)")
    # Without the count (Keras's wrapper) that epoch counts all its skips.
    blind = _epoch(Snapshot(2048.0, 0), Snapshot(256.0, 1), steps=4, skipped=3)
    assert stop_rules.search_skips(blind) == 0
    assert stop_rules.decide(RULES, Reading("keras", blind, 1.0, epoch=1)).startswith(
        "3 of 4 steps in epoch 2 were skipped (75%")
