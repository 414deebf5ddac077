"""The overhead suite: tf_mixed's optimizer and monitor against Keras's own scaling.

No test here times this host: the timings a run makes are only checked for
their shape and for the arithmetic the report does with them.
"""

import json
import math
import os
import statistics

import keras
import pytest

from tf_mixed._internal import measuring
from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.bench import config, overhead, train
from tf_mixed.cli.main import main
from tf_mixed.policy import global_policy as policy


def _ratio(value, low, high):
    return {"ratio": value, "low": low, "high": high}


def test_the_verdict_is_at_most_one_percent_slower_only_when_the_widened_interval_is():
    control = _ratio(0.998, 0.99, 1.01)  # the control 0.2% from 1: widens by 0.002
    sentence = overhead.verdict(_ratio(1.002, 0.995, 1.007), control, rounds=18)
    assert sentence.startswith("tf_mixed's step is at most 1% slower than Keras's: ")
    assert "widened by the control's 0.2%, is 0.993-1.009x" in sentence
    # Faster is "at most 1% slower" too: the goal bounds one side only.
    faster = overhead.verdict(_ratio(0.95, 0.94, 0.96), control, rounds=18)
    assert faster.startswith("tf_mixed's step is at most 1% slower than Keras's: ")


def test_the_verdict_is_slower_only_when_the_widened_interval_starts_above():
    sentence = overhead.verdict(_ratio(1.05, 1.03, 1.07), _ratio(1.01, 1.0, 1.02), rounds=18)
    assert sentence.startswith("tf_mixed's step is more than 1% slower than Keras's: ")
    assert "1.020-1.080x" in sentence


def test_a_control_far_from_one_makes_a_tight_interval_unresolved():
    # Two identical Keras set-ups 2.6% apart: a 1.017-1.057x reading is no verdict.
    sentence = overhead.verdict(_ratio(1.04, 1.017, 1.057), _ratio(1.026, 1.006, 1.049),
                                rounds=18)
    assert sentence.startswith("Not resolved to 1% on this host: ")
    assert "0.991-1.083x, across 1.01x" in sentence and "--rounds" in sentence


@pytest.mark.parametrize("rounds", [1, 4])
def test_too_few_rounds_make_no_verdict(rounds):
    # However tight: a bootstrap over 1-4 rounds covers far less than 90%.
    sentence = overhead.verdict(_ratio(1.0, 1.0, 1.0), _ratio(1.0, 1.0, 1.0), rounds=rounds)
    assert sentence == (f"No verdict from {rounds} round{'s' if rounds > 1 else ''}: at least 5 "
                        "are needed (--rounds=5 or more).")


def test_the_paths_share_one_set_of_weights_with_their_own_optimizers():
    bench_config = config.BenchConfig(suite="overhead", image_size=16, train_size=32,
                                      val_size=8, batch_size=8).validate()
    data = config.load_data(bench_config)
    train_set = train.batched(data.train, 8, train=True, seed=0, size=data.train_size)
    keras.backend.clear_session()
    with policy.policy_scope("mixed_float16"):
        paths = overhead._build_paths(bench_config, "mixed_float16", data, train_set)
    assert list(paths) == ["keras", "tf_mixed", "keras_control"]
    weights = [[id(w) for w in p.model.weights] for p in paths.values()]
    assert weights[0] == weights[1] == weights[2] and weights[0]
    optimizers = [p.optimizer for p in paths.values()]
    assert len({id(o) for o in optimizers}) == 3
    assert [type(o).__module__.split(".")[0] for o in optimizers] == ["keras", "tf_mixed",
                                                                      "keras"]


@pytest.mark.slow  # 5.2 s CPU (over the fast tier's 5 s): a whole suite run
def test_overhead_suite(tmp_path, capsys):
    out = tmp_path / "over"
    code = main([
        "tf_mixed", "bench", "--suite=overhead", "--image_size=16", "--train_size=64",
        "--batch_size=16", "--steps=3", "--rounds=4", "--warmup_steps=1", f"--output_dir={out}",
    ])
    text = capsys.readouterr().out
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    assert report["suite"] == "overhead" and report["policy"] == "mixed_float16"
    assert report["model"]["name"] == "mlp"
    keras_row, ours, control = report["results"]
    assert [r["path"] for r in report["results"]] == ["keras", "tf_mixed", "keras_control"]
    assert keras_row["optimizer"] == control["optimizer"] == "keras.LossScaleOptimizer"
    assert ours["optimizer"] == "tf_mixed.LossScaleOptimizer"
    assert ours["callbacks"] == ["LossScaleMonitor"]
    # 4 rounds x 3 timed steps (each round ran 4: its first is left out), the order rotated.
    assert report["rounds"] == 4
    assert report["round_order"] == [n for r in range(4) for n in measuring.rotated(
        ["keras", "tf_mixed", "keras_control"], r)]
    times = report["step_times_ms"]
    for r in report["results"]:
        assert [len(x) for x in times[r["path"]]] == [3] * 4 and r["timed_steps"] == 12
        assert r["step_time_ms"] == pytest.approx(
            statistics.median(v for x in times[r["path"]] for v in x))
    # The ratio: tf_mixed's steps over both Keras set-ups' steps, pooled round by round.
    base = [k + c for k, c in zip(times["keras"], times["keras_control"])]
    assert report["overhead_ratio"] == pytest.approx(
        measuring.pooled_ratio(base, times["tf_mixed"]))
    low, high = report["overhead_interval"]
    assert (low, high) == pytest.approx(measuring.ratio_interval(base, times["tf_mixed"]))
    assert low <= report["overhead_ratio"] <= high
    assert report["control_ratio"] == pytest.approx(
        measuring.pooled_ratio(times["keras"], times["keras_control"]))
    assert report["confidence"] == 0.9
    assert report["verdict"] == overhead.verdict(
        _ratio(report["overhead_ratio"], low, high),
        _ratio(report["control_ratio"], *report["control_interval"]), rounds=4)
    assert report["verdict"].startswith("No verdict from 4 rounds")
    assert f"**{report['overhead_ratio']:.3f}x** (90% interval {low:.3f}-{high:.3f}x)" in text
    assert f"Verdict: {report['verdict']}" in text
    # CPU time per step too: a busy machine stretches wall time, not work.
    assert math.isfinite(report["cpu_overhead_ratio"]) and report["cpu_overhead_ratio"] > 0
    assert "CPU time per step (this process" in text
    assert sorted(os.listdir(out)) == ["bench.png", "results.json", "results.md"]


def test_the_overhead_suite_runs_a_balanced_rotation_of_rounds_unless_told():
    rounds = config.BenchConfig(suite="overhead").timing_rounds
    assert rounds == config.DEFAULT_ROUNDS["overhead"] == 18
    # Every path leads, and follows every other, equally often (schedule.rotated).
    assert rounds % (2 * len(overhead.PATHS)) == 0 and rounds >= overhead.MIN_VERDICT_ROUNDS
    assert config.BenchConfig(suite="comm").timing_rounds == config.OTHER_ROUNDS == 3
    assert config.BenchConfig(suite="overhead", rounds=5).timing_rounds == 5


def test_a_negative_rounds_is_refused_and_zero_means_the_default():
    with pytest.raises(UsageError, match="--rounds=-1"):
        config.BenchConfig(suite="overhead", rounds=-1).validate()
    assert config.BenchConfig(suite="overhead", rounds=0).validate().timing_rounds == 18
