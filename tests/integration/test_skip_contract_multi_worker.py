"""The skipped-step contract under MultiWorkerMirroredStrategy (docs/skipped-step.md).

Two local workers (tests/integration/_skip_worker.py) train the skip
matrix's run with one bad batch, its inf in worker 1's share, and the same
run without that batch; every row must match on both workers, both workers
must log the same flags and History and hold the same weights.
"""

import json
import os
import pathlib
import sys

import pytest

from tf_mixed.distribute.launch import run_local_workers

pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("_skip_worker.py")
SUPPORT = pathlib.Path(__file__).parents[1] / "support"
LAUNCH_TIMEOUT_S = 300


def _launch(tmp_path, **config):
    config["out"] = str(tmp_path / "worker{i}.json")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    env = {"PYTHONPATH": os.pathsep.join(
        [str(SUPPORT), str(pathlib.Path(__file__).parents[2]),
         os.environ.get("PYTHONPATH", "")])}
    results = run_local_workers(2, [sys.executable, str(WORKER), str(path)],
                                timeout=LAUNCH_TIMEOUT_S, check=False, env=env,
                                grace_seconds=5.0)
    return results, [tmp_path / f"worker{i}.json" for i in range(2)]


def test_tf_mixed_every_row_on_both_workers(tmp_path):
    results, paths = _launch(tmp_path, wrapper="tf_mixed", bad_worker=1)
    for result in results:
        assert result.returncode == 0, result.output[-3000:]
    w0, w1 = (json.loads(p.read_text()) for p in paths)
    assert w0["replicas"] == 2
    for worker in (w0, w1):
        assert all(worker["rows"].values()), worker["rows"]
        assert worker["skipped"] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert w0["history"] == w1["history"]
    assert w0["weights_digest"] == w1["weights_digest"]
