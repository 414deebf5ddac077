"""Two local MultiWorkerMirroredStrategy workers hold the same float8 state.

Worker 1's shard is 10x larger (tests/_float8_worker.py). With
``tf_mixed.wrap_optimizer`` both workers hold identical scales and
histories, equal to one device fed the global batch; with plain Keras they
differ (the defect, so the test can fail).
"""

import pathlib

import keras
import numpy as np
import pytest
from _float8_common import float8_values, one_device_run
from _workers import run_two_workers

import tf_mixed

WORKER = pathlib.Path(__file__).with_name("_float8_worker.py")


@pytest.mark.slow
def test_workers_agree_and_equal_one_device(tmp_path):
    first, second = run_two_workers(WORKER, tmp_path, "tf_mixed", timeout=300)
    assert first["replicas"] == 2
    assert first["values"] == second["values"]
    reference = float8_values(one_device_run(
        3, lambda: tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)))[0])
    for name, copies in first["values"].items():
        if name.startswith("a/inputs"):  # the data itself: bit for bit
            np.testing.assert_array_equal(copies[0], reference[name][0], err_msg=name)
        else:
            np.testing.assert_allclose(copies[0], reference[name][0], rtol=1e-5,
                                       err_msg=name)


@pytest.mark.slow
def test_plain_keras_workers_disagree(tmp_path):
    first, second = run_two_workers(WORKER, tmp_path, "keras", timeout=300)
    assert first["values"]["a/inputs_scale"] != second["values"]["a/inputs_scale"]
