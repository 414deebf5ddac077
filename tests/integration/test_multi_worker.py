"""MultiWorkerMirroredStrategy: two local worker processes decide as one.

Each worker is a fresh Python process (tests/integration/_mw_worker.py) with TF_CONFIG
pointing at two 127.0.0.1 ports. Every subprocess has a timeout, so a hang
(workers entering different collectives) fails the test instead of stalling
the suite.
"""

import pathlib

import pytest
from _workers import run_two_workers

WORKER = pathlib.Path(__file__).with_name("_mw_worker.py")
TIMEOUT_S = 240


def _run_workers(tmp_path, bad_worker, bad_step, *extra):
    return run_two_workers(WORKER, tmp_path, bad_worker, bad_step, *extra,
                           timeout=TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize("bad_worker", [0, 1])
def test_overflow_on_one_worker_is_skipped_by_both(tmp_path, bad_worker):
    results = _run_workers(tmp_path, bad_worker=bad_worker, bad_step=2)
    assert results[0] == results[1]
    result = results[0]
    assert result["replicas"] == 2
    # Mean gradient 2, lr 0.5: each applied step lowers the kernel by 1.
    assert result["applied"] == [True, False, True, True]
    assert result["scales"] == [4.0, 2.0, 2.0, 4.0]
    assert result["kernel"] == [-2.0]
    assert result["iterations"] == 3
    assert result["skipped_steps"] == 1


@pytest.mark.slow
def test_batchnorm_poisoned_on_one_worker_is_rolled_back_on_both(tmp_path):
    results = _run_workers(tmp_path, 1, 2, "bn")
    assert results[0] == results[1]
    result = results[0]
    assert result["applied"] == [True, False, True, True]
    assert result["kernel"] == [-2.0]
    # Three applied steps of input 1 (batch of one: mean 1, variance 0),
    # momentum 0.99, from mean 0 / variance 1; the skipped step left nothing.
    mean, variance = result["bn"]
    assert mean == [pytest.approx(1 - 0.99**3, rel=1e-6)] * 1
    assert variance == [pytest.approx(0.99**3, rel=1e-6)] * 1
