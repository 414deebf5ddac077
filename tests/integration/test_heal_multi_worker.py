"""Healing under MultiWorkerMirroredStrategy: both workers move the same layer at the same step."""

import json
import pathlib
import sys

import pytest

from tf_mixed.distribute.workers import run_local_workers

pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("_heal_worker.py")


def test_two_workers_heal_the_same_layer_at_the_same_step(tmp_path):
    config = tmp_path / "heal.json"
    config.write_text(json.dumps({"out": str(tmp_path / "out{i}.json")}))
    results = run_local_workers(2, [sys.executable, str(WORKER), str(config)],
                                timeout=240, check=False)
    for result in results:
        assert result.returncode == 0, result.output[-3000:]
    w0, w1 = (json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2))
    # Worker 0 never saw a non-finite value; it heals from the shared flags.
    assert w0["healings"] == w1["healings"] and len(w0["healings"]) == 1
    assert "at step 5" in w0["healings"][0] and "'gate'" in w0["healings"][0]
    for w in (w0, w1):
        assert w["healed_layers"] == ["gate"] and w["gate_dtype"] == "float32"
        assert w["skipped_steps"] == 5 and w["healed_logged"] == [1.0]
    assert w0["weights"] == w1["weights"]
