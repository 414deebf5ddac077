"""Decisions taken from one worker's data are taken by every worker (2 local worker processes).

tests/integration/_decisions_worker.py runs each scenario on two workers of one
cluster (`tf_mixed.distribute.workers.run_local_workers`, one CPU replica
each); only worker 1's shard holds the values that matter. The monitor's
first-batch catalog check must warn on both workers with the same message,
and each stop rule must stop both workers after the same batch with the same
reason, and both processes must exit 0 (a worker alone in a collective would
time out instead: the strategy's collectives are bounded at 60 s, the whole
launch at ``LAUNCH_TIMEOUT_S``).
"""

import json
import math
import pathlib
import sys

import pytest

from tf_mixed.distribute.workers import run_local_workers

pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("_decisions_worker.py")
LAUNCH_TIMEOUT_S = 300  # bounds a hang; the run takes 30-60 s on a busy 2-core host
SCENARIOS = ["first_batch", "patience", "plain_nan", "forward_state", "epoch_fraction", "raise"]
STOPPED = "LossScaleMonitor stopped training: "


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both workers' results, per scenario: ``{scenario: (worker 0's, worker 1's)}``."""
    tmp = tmp_path_factory.mktemp("decisions")
    config = tmp / "config.json"
    config.write_text(json.dumps({"out": str(tmp / "worker{i}.json"), "scenarios": SCENARIOS,
                                  "collective_timeout": 60}))
    results = run_local_workers(2, [sys.executable, str(WORKER), str(config)],
                                timeout=LAUNCH_TIMEOUT_S, start_timeout=180, check=False)
    for result in results:  # a clean exit: nobody hung, nobody crashed
        assert result.returncode == 0, result.output[-3000:]
    first, second = (json.loads((tmp / f"worker{i}.json").read_text()) for i in range(2))
    assert first["replicas"] == second["replicas"] == 2
    return {name: (first[name], second[name]) for name in SCENARIOS}


def _same_on_both(runs, scenario, *keys):
    first, second = runs[scenario]
    for key in keys:
        assert first[key] == second[key], (scenario, key, first[key], second[key])
    return first


def test_the_first_batch_check_warns_on_every_worker_from_worker_1s_batch(runs):
    found = _same_on_both(runs, "first_batch", "magnitudes", "second_magnitudes", "warnings",
                          "errors")
    # Worker 1's first batch (1e5), not worker 0's own (1) nor its second batch (7e5).
    assert found["magnitudes"]["norm"] == 1e5
    (message,) = found["warnings"]  # the second fit's clean first batches: nothing
    assert message.startswith("Model 'functional': [warning] norm: Layer 'norm' "
                              "(LayerNormalization) computes in float16 and its inputs "
                              "reach max |x| = 1e+05")
    assert "the first batch's inputs" in message
    assert found["second_magnitudes"]["norm"] == 1.0


def _stopped(runs, scenario, batches, start):
    found = _same_on_both(runs, scenario, "batches", "stop_reason", "errors", "iterations",
                          "skipped")
    assert found["batches"] == batches  # no batch after the stop, on either worker
    assert found["stop_reason"].startswith(start), found["stop_reason"]
    assert found["errors"] == [STOPPED + found["stop_reason"]]
    return found


def test_patience_stops_both_workers_after_the_same_batch(runs):
    # Steps 1-2 applied; from step 3 worker 1's NaN skips every step on both:
    # 4 -> 2 -> 1 (steps 3, 4), then 2 skips at the minimum (5, 6): patience=2.
    found = _stopped(runs, "patience", [[0, 6]],
                     "the loss scale has sat at its minimum (1) for 2 consecutive skipped "
                     "steps (patience=2)")
    assert (found["iterations"], found["skipped"], found["loss_scale"]) == (2, 4, 1.0)
    assert found["weights_finite"]


def test_raise_on_failure_raises_on_both_workers_at_the_same_batch(runs):
    found = _same_on_both(runs, "raise", "raised", "batches", "iterations", "skipped")
    # The failure is raised in batch 6's end: the callback after the monitor never sees it.
    assert found["batches"] == [[0, 5]]
    assert found["raised"] == STOPPED + runs["patience"][0]["stop_reason"]
    assert (found["iterations"], found["skipped"]) == (2, 4)


def test_a_nan_loss_on_one_worker_stops_both_with_the_loss_rule(runs):
    found = _stopped(runs, "plain_nan", [[0, 3]],
                     "the loss became nan and no step was skipped: non-finite values are "
                     "reaching the weights.")
    assert found["iterations"] == 3 and not found["weights_finite"]


def test_forward_state_broken_on_one_worker_is_named_on_both(runs):
    # Only worker 1's copies of the moving statistics hold NaN (the step was
    # skipped on both; rollback_forward_state=False keeps what it wrote).
    first, second = runs["forward_state"]
    assert all(math.isfinite(v) for stats in first["norm_stats"] for v in stats)
    assert not all(math.isfinite(v) for stats in second["norm_stats"] for v in stats)
    found = _stopped(runs, "forward_state", [[0, 3]],
                     "weights ['sequential/norm/moving_mean', 'sequential/norm/moving_variance']"
                     " hold NaN/inf")
    assert (found["iterations"], found["skipped"]) == (2, 1)


def test_the_epoch_rule_stops_both_workers_at_the_same_epoch_end(runs):
    found = _stopped(runs, "epoch_fraction", [[0, 8]],
                     "5 of 8 steps in epoch 1 were skipped (62% > max_skip_fraction=0.5)")
    assert (found["iterations"], found["skipped"]) == (3, 5)
