"""The skipped-step contract in processes of their own (docs/skipped-step.md).

Keras's MirroredStrategy column runs in a process of its own
(tests/integration/_keras_mirrored_column.py): Keras's wrapper and tf_mixed's
under one process's MirroredStrategy collide on collective keys.
Under MultiWorkerMirroredStrategy two local workers
(tests/integration/_skip_worker.py) train the skip matrix's run
with one bad batch, its inf in worker 1's share, and the same
run without that batch; every row must match on both workers, both workers
must log the same flags and History and hold the same weights.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import skip_matrix as sm

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


@pytest.mark.parametrize("kind", ["forward", "update"])
def test_tf_mixed_bfloat16_finite_gradient_overflows_on_both_workers(tmp_path, kind):
    # Finite gradients on both workers; worker 1's share overflows BatchNorm's
    # variance ("forward", each worker's own statistics) or Adam's update
    # ("update"): one verdict, ridden on the gradient all-reduce.
    results, paths = _launch(tmp_path, wrapper="tf_mixed", bad_worker=1,
                             policy="mixed_bfloat16", kind=kind)
    for result in results:
        assert result.returncode == 0, result.output[-3000:]
    w0, w1 = (json.loads(p.read_text()) for p in paths)
    for worker in (w0, w1):
        assert all(worker["rows"].values()), worker["rows"]
        assert worker["skipped"] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
        assert worker["skip_reason"][sm.BAD_STEP] == sm.REASON[kind, "mixed_bfloat16"]
        assert worker["weights_finite"]
    assert w0["weights_digest"] == w1["weights_digest"]


KERAS_MIRRORED = pathlib.Path(__file__).with_name("_keras_mirrored_column.py")


def test_keras_column_under_mirrored_strategy(tmp_path):
    # In a process of its own: Keras's wrapper and tf_mixed's under one
    # process's MirroredStrategy collide on collective keys.
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(pathlib.Path(__file__).parents[2]), str(SUPPORT)])}
    done = subprocess.run([sys.executable, str(KERAS_MIRRORED), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert rows["0"] == sm.KERAS_ONE_DEVICE
    # Replica 1's overflow is applied (fact 2): the weights hold inf/NaN.
    assert rows["1"] == {**sm.KERAS_ONE_DEVICE, "weights": False, "optimizer": False}
    assert rows["1_weights_finite"] is False


def test_keras_column_under_multi_worker_strategy(tmp_path):
    # Keras's wrapper decides from each worker's own gradients: worker 1
    # skips while worker 0 applies and waits in the gradient all-reduce
    # alone, until the collective timeout (60 s) ends the run.
    results, paths = _launch(tmp_path, wrapper="keras", bad_worker=1)
    assert any(result.returncode != 0 for result in results)
    assert not all(p.exists() for p in paths)
