"""Shared test set-up: two logical CPUs and a clean global policy per test.

TensorFlow fixes its device list the first time it initialises, so the CPU is
split into two logical devices here, at import time, before any test module
touches TensorFlow. Multi-replica tests then take the ``mirrored`` fixture, a
MirroredStrategy over "CPU:0" and "CPU:1", as if on two GPUs.
"""

import atexit
import itertools
import os
import shutil
import sys
import tempfile

# Helpers shared by tests at every depth (zoo, workers, paths): `from zoo import ZOO`.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tests never time this machine for enable("auto") nor touch the user's cache:
# "auto" uses the rules (tests of the measured path pass measure=True with an
# injected timer) and the cache lives in a per-session directory. Set in the
# environment, so test subprocesses inherit both.
os.environ["TF_MIXED_AUTO_MEASURE"] = "0"
# Nor time a model's first steps against float32 (tf_mixed.policy.model_check):
# its tests turn it on with a fake clock.
os.environ["TF_MIXED_MODEL_CHECK"] = "0"
# No progress lines (tf_mixed._internal.progress) unless a test turns them on: a
# slow step on a busy host must not add a line to output a test reads.
os.environ["TF_MIXED_PROGRESS"] = "0"
_CACHE_DIR = tempfile.mkdtemp(prefix="tf_mixed_test_cache_")
os.environ["TF_MIXED_CACHE_DIR"] = _CACHE_DIR
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

CPU_DEVICES = ("CPU:0", "CPU:1")

# TF_MIXED_FAKE_HARDWARE=gpu runs the suite as if on a host with one Tensor
# Core GPU (hardware.detect faked; tests that fake it themselves still win),
# to show no test depends on the host having no GPU. .ci/run runs the
# hardware-dependent test files this way.
_FAKE_HARDWARE = os.environ.get("TF_MIXED_FAKE_HARDWARE", "").strip().lower()
if _FAKE_HARDWARE not in ("", "gpu"):
    raise pytest.UsageError(
        f"TF_MIXED_FAKE_HARDWARE must be 'gpu' or unset. Received: {_FAKE_HARDWARE!r}."
    )


@pytest.fixture(autouse=True)
def _fake_hardware(monkeypatch):
    if _FAKE_HARDWARE == "gpu":
        from tf_mixed.policy import hardware

        real = hardware.detect()
        fake = hardware.HardwareInfo(
            gpus=(hardware.GpuInfo("Fake GPU (TF_MIXED_FAKE_HARDWARE)", (8, 0)),),
            cpu_model=real.cpu_model, cpu_flags=real.cpu_flags,
            amx_bf16_usable=real.amx_bf16_usable,
        )
        monkeypatch.setattr(hardware, "detect", lambda: fake)
    yield


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Saves and restores Keras's global dtype policy and TF's remapping option."""
    from tf_mixed.policy import state as policy_state

    saved_policy = keras.config.dtype_policy()
    yield
    policy_state.reset()
    keras.config.set_dtype_policy(saved_policy)
    # TF's default (on) after every test, whatever a test or a module fixture
    # set before this fixture ran: a float16 layer made without `enable` holds
    # the option off for the process (tf_mixed.policy.half_kernels) until the
    # reset above, so a value saved at the test's start could be a leak.
    tf.config.optimizer.set_experimental_options({"remapping": True})
    # Keras's own clear_session runs a full gc.collect(): 0.3-3 s a test over the
    # ~330k objects TF and Keras keep alive, most of the slow tier's time in
    # small tests. A full collection every GC_EVERY tests keeps cyclic garbage
    # (and the native buffers it holds) bounded at a twentieth of the cost.
    keras.backend.clear_session(free_memory=next(_TESTS_RUN) % GC_EVERY == 0)


GC_EVERY = 20
_TESTS_RUN = itertools.count(1)


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


# ------------------------------------------------------------------ the tiers
#
# `python -m pytest` runs the fast tier (pyproject's addopts: -m "not slow and
# not gpu"); `python -m pytest -m slow` the slow tier (multi-process,
# multi-worker, subprocess CLI runs, long trainings); `-m gpu` the tests that
# need a GPU (they skip with one line elsewhere). Every test is in one tier.
#
# The split is checked: with TF_MIXED_TIER_CHECK=1 (.ci/run sets it) a fast-tier
# test that takes more than FAST_TEST_LIMIT_S of CPU time (this process and the
# children it waited for; CPU time, not wall time, so a busy host does not move
# it) fails the session, naming the test and saying to mark it slow.
FAST_TEST_LIMIT_S = float(os.environ.get("TF_MIXED_FAST_TEST_LIMIT_S", "5.0"))
_TIER_CHECK = os.environ.get("TF_MIXED_TIER_CHECK", "").strip() == "1"
_over_limit: list[str] = []


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item._tier_cpu_start = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "teardown":
        return
    spent = _cpu_seconds() - item._tier_cpu_start
    outcome.get_result().user_properties.append(("cpu_seconds", round(spent, 3)))  # --junitxml
    if item.get_closest_marker("slow") is None and item.get_closest_marker("gpu") is None:
        if spent > FAST_TEST_LIMIT_S:
            _over_limit.append(f"{item.nodeid}: {spent:.1f} s CPU")


def pytest_sessionfinish(session, exitstatus):
    if _TIER_CHECK and _over_limit:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _over_limit:
        verdict = "FAILED" if _TIER_CHECK else "note"
        terminalreporter.write_line(
            f"tier check {verdict}: {len(_over_limit)} fast-tier test(s) over "
            f"{FAST_TEST_LIMIT_S:g} s of CPU time; mark them @pytest.mark.slow:")
        for line in _over_limit:
            terminalreporter.write_line(f"  {line}")
