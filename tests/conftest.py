"""Shared test set-up: two logical CPUs and a clean global policy per test.

TensorFlow fixes its device list the first time it initialises, so the CPU is
split into two logical devices here, at import time, before any test module
touches TensorFlow. Multi-replica tests then take the ``mirrored`` fixture, a
MirroredStrategy over "CPU:0" and "CPU:1", as if on two GPUs.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

CPU_DEVICES = ("CPU:0", "CPU:1")


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Saves and restores Keras's global dtype policy and TF's remapping option."""
    from tf_mixed import policy as policy_module

    saved_policy = keras.config.dtype_policy()
    saved_remapping = tf.config.optimizer.get_experimental_options().get("remapping")
    yield
    policy_module._reset_for_tests()
    keras.config.set_dtype_policy(saved_policy)
    # Unset before the test means TF's default, which is on.
    remapping = True if saved_remapping is None else saved_remapping
    tf.config.optimizer.set_experimental_options({"remapping": remapping})
    keras.backend.clear_session()


@pytest.fixture(scope="session")
def mirrored():
    """One MirroredStrategy over the two logical CPUs, shared by all tests.

    TF 2.21 gives two MirroredStrategy objects over the same devices the same
    collective keys; when their tensors differ in shape, TF aborts with
    "Shape mismatch in the collective instance". One strategy per process
    (the same one the bench uses in-process) avoids that.
    """
    from tf_mixed.training import shared_mirrored_strategy

    return shared_mirrored_strategy(list(CPU_DEVICES))
