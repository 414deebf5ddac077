"""Auto's check under MultiWorkerMirroredStrategy: one decision on every worker (issue 47).

Two local worker processes (tests/integration/_model_check_worker.py, started
by `tf_mixed.distribute.workers.run_local_workers`) fit the same model under
``enable("auto")``; each times its own steps with a faked clock, and the two
disagree: worker 0 sees bfloat16 at 2x float32, worker 1 at 1/6x. Both must
run the same rounds, average the figures, and keep the same policy at the
same step; worker 0's cache, holding the opposite verdict, is not read.
"""

import json
import pathlib
import sys

import pytest

from tf_mixed.distribute.workers import run_local_workers

pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("_model_check_worker.py")
LAUNCH_TIMEOUT_S = 240  # bounds a hang (a worker alone in a collective); a run takes 20-60 s


def test_both_workers_take_the_same_decision_from_the_mean_of_their_figures(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"out": str(tmp_path / "worker{i}.json"),
                                  "cache": str(tmp_path / "cache")}))
    results = run_local_workers(2, [sys.executable, str(WORKER), str(config)],
                                timeout=LAUNCH_TIMEOUT_S, check=False)
    for result in results:
        assert result.returncode == 0, result.output[-3000:]
    first, second = (json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(2))
    # Worker 1 alone measured 1/6x and would have moved; the mean, 1.08x, keeps bfloat16.
    for worker in (first, second):
        assert (worker["action"], worker["policy"], worker["cached"]) == (
            "kept", "mixed_bfloat16", False)
        assert worker["hidden"] == "bfloat16"
        assert worker["figures"][0] == pytest.approx((2.0 + 1 / 6) / 2, rel=1e-5)
        assert worker["figures"][5] == 5  # the fixed rounds, on both
        assert "1.08x float32" in worker["message"]
    assert first["figures"] == second["figures"]
    assert first["weights"] == second["weights"]  # the same training on both
