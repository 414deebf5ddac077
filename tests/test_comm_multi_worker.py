"""communication_dtype under MultiWorkerMirroredStrategy: two local workers.

The workers (tests/_comm_worker.py) are fresh processes with TF_CONFIG on two
127.0.0.1 ports, started the way tests/test_multi_worker.py starts its own;
every wait is bounded and no process outlives the test.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = pathlib.Path(__file__).with_name("_comm_worker.py")
TIMEOUT_S = 240
VALUES = np.array([0.3, -1.7, 12.345, 1e-3], np.float32)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("comm")
    ports = ",".join(str(p) for p in _free_ports(2))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(i), ports,
                          str(outs[i])],
                         env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
        for i in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=TIMEOUT_S)
            logs.append(output.decode(errors="replace")[-3000:])
    except subprocess.TimeoutExpired:
        pytest.fail(f"multi-worker run did not finish in {TIMEOUT_S} s "
                    "(workers disagreeing would hang in a collective)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log
    return [json.loads(out.read_text()) for out in outs]


def test_workers_agree_on_everything(results):
    assert results[0]["replicas"] == 2
    assert results[0] == results[1]


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


@pytest.mark.parametrize("scenario,wire", [("finite_float16", "float16"),
                                           ("finite_None", "float32")])
def test_one_gradient_collective_and_no_flag(results, scenario, wire):
    # One replica per worker: one CollectiveReduceV2 per traced step.
    assert results[0][scenario]["collectives"] == [["CollectiveReduceV2", wire]]
