"""Shared test set-up: two logical CPUs and a clean global policy per test.

TensorFlow fixes its device list the first time it initialises, so the CPU is
split into two logical devices here, at import time, before any test module
touches TensorFlow. Multi-replica tests then use
``tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])`` as if on two GPUs.
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
    """Save and restore Keras's global dtype policy and TF optimizer options."""
    from tf_mixed import policy as policy_module

    saved_policy = keras.config.dtype_policy()
    saved_options = tf.config.optimizer.get_experimental_options()
    yield
    policy_module._reset_for_tests()
    keras.config.set_dtype_policy(saved_policy)
    tf.config.optimizer.set_experimental_options(
        {k: saved_options.get(k, v) for k, v in
         _defaults_for(tf.config.optimizer.get_experimental_options()).items()}
    )
    keras.backend.clear_session()


def _defaults_for(current):
    """Options set during the test that were unset before it revert to TF's default."""
    return {key: _TF_DEFAULTS.get(key, value) for key, value in current.items()}


# Grappler options a test may flip; the value TF uses when none is set.
_TF_DEFAULTS = {"remapping": True}


@pytest.fixture
def mirrored():
    """A MirroredStrategy over the two logical CPUs."""
    return tf.distribute.MirroredStrategy(list(CPU_DEVICES))
