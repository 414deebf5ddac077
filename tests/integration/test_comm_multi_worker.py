"""communication_dtype under MultiWorkerMirroredStrategy: two local workers.

The workers (tests/integration/_comm_worker.py) are fresh processes with TF_CONFIG on two
127.0.0.1 ports, started by tests/support/_workers.py (tf_mixed.distribute.workers);
every wait is bounded and no process outlives the test.
"""

import pathlib

import numpy as np
import pytest
from _workers import run_two_workers

# Every test here starts worker processes (module fixtures included).
pytestmark = pytest.mark.slow

WORKER = pathlib.Path(__file__).with_name("_comm_worker.py")
TIMEOUT_S = 240
VALUES = np.array([0.3, -1.7, 12.345, 1e-3], np.float32)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_two_workers(WORKER, tmp_path_factory.mktemp("comm"), timeout=TIMEOUT_S)


@pytest.mark.slow
def test_workers_agree_on_everything(results):
    assert results[0]["replicas"] == 2
    assert results[0] == results[1]


@pytest.mark.slow
def test_float16_update_matches_float32_within_rounding(results):
    f16, f32 = results[0]["finite_float16"], results[0]["finite_None"]
    assert f16["applied"] == f32["applied"] == [True]
    np.testing.assert_array_equal(f32["var"], -3 * VALUES * 2.0**-15)
    np.testing.assert_allclose(f16["var"], f32["var"], rtol=2 * 2.0**-10)


def test_half_sum_overflow_is_skipped_by_both_and_backs_off(results):
    half_sum = results[0]["half_sum"]
    assert half_sum["applied"] == [False, True]
    assert half_sum["scales"] == [2.0, 2.0]
    assert half_sum["var"] == [-0.5]
    assert half_sum["iterations"] == 1


def test_inf_on_worker_1_only_is_skipped_by_both(results):
    bad = results[0]["inf_worker1"]
    assert bad["applied"] == [False]
    assert bad["var"] == [1.0, 1.0]
    assert bad["scales"] == [2.0]
    assert bad["iterations"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("scenario,wire", [("finite_float16", "float16"),
                                           ("finite_None", "float32")])
def test_one_gradient_collective_and_no_flag(results, scenario, wire):
    # One replica per worker: one CollectiveReduceV2 per traced step.
    assert results[0][scenario]["collectives"] == [["CollectiveReduceV2", wire]]
