"""A `.keras` file saved mid-training under mixed_float16, loaded in a fresh process
that only imports tf_mixed (no `enable`), continues bit for bit (issue 27).

The cause it failed on an Intel Xeon with AVX512-FP16/AMX and passed on AMD hosts
(tf_mixed/policy/half_kernels.py): `enable` holds Grappler's remapping pass off
on a host without a GPU, the fresh process did not, and where oneDNN computes
float16 on the CPU the remapper fuses a float16 Dense's MatMul + BiasAdd into one
kernel that rounds once instead of twice. The test checks that construction on
every host (the remapping option in both processes) and the bits.
"""

import json
import os
import pathlib
import subprocess
import sys

import keras
import pytest
import tensorflow as tf

import tf_mixed  # noqa: F401  arms tf_mixed.policy.half_kernels
from tf_mixed.policy import half_kernels
from tf_mixed.policy import state as policy_state

WORKER = pathlib.Path(__file__).with_name("_resume_worker.py")


def _run(mode, directory):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, str(WORKER), mode, str(directory)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((directory / f"{mode}.json").read_text())


@pytest.mark.slow
def test_a_keras_file_resumed_in_a_fresh_process_continues_bit_for_bit(tmp_path):
    whole = _run("whole", tmp_path)
    resumed = _run("resume", tmp_path)
    # What the fresh process differs in, and what must not matter:
    assert whole["global_policy"] == "mixed_float16" and resumed["global_policy"] == "float32"
    assert resumed["layer_policies"] == whole["layer_policies"]
    # The kernels: remapping held off in both (it was on after loading).
    assert whole["remapping"] is False and resumed["remapping"] is False
    # Skipped steps on both sides of the reload: the overflowing batch of each
    # epoch, and the first steps while the scale backs off from 2**15.
    assert whole["skipped_steps"] == resumed["skipped_steps"] == 5
    assert resumed["weights"] == whole["weights"]  # moving statistics included
    assert resumed["loss_scale"] == whole["loss_scale"]
    assert resumed["optimizer"] == whole["optimizer"]  # loss scale, counters, slots


def test_a_float16_layer_made_without_enable_holds_remapping_off(monkeypatch):
    monkeypatch.setattr(half_kernels, "_has_gpu", lambda: False)
    assert policy_state.remapping_holders() == 0 and not policy_state.half_layers_hold()
    keras.layers.Dense(2, dtype="float32")
    assert not policy_state.half_layers_hold()
    keras.layers.Dense(2, dtype="mixed_float16")
    assert policy_state.half_layers_hold() and policy_state.remapping_holders() == 1
    assert tf.config.optimizer.get_experimental_options()["remapping"] is False
    keras.layers.Dense(2, dtype="float16")  # one hold for the process, not one per layer
    assert policy_state.remapping_holders() == 1
    policy_state.reset()  # what tests/conftest.py does after each test
    assert not policy_state.half_layers_hold()


def test_no_hold_with_a_gpu_or_under_enable(monkeypatch):
    monkeypatch.setattr(half_kernels, "_has_gpu", lambda: True)
    keras.layers.Dense(2, dtype="mixed_float16")
    assert not policy_state.half_layers_hold() and policy_state.remapping_holders() == 0
    monkeypatch.setattr(half_kernels, "_has_gpu", lambda: False)
    policy_state.hold_remapping()  # as `enable("mixed_float16")` does on a CPU
    keras.layers.Dense(2, dtype="mixed_float16")
    assert not policy_state.half_layers_hold() and policy_state.remapping_holders() == 1


def test_mixed_bfloat16_layers_take_no_hold(monkeypatch):
    monkeypatch.setattr(half_kernels, "_has_gpu", lambda: False)
    keras.layers.Dense(2, dtype="mixed_bfloat16")
    assert not policy_state.half_layers_hold()


@pytest.mark.slow
@pytest.mark.parametrize("order", ["import tf_mixed, keras", "import keras, tf_mixed"])
def test_import_tf_mixed_is_enough_to_arm_the_hook(order):
    code = (f"{order}\n"
            "from tf_mixed._internal import shims\n"
            "from tf_mixed.policy import half_kernels\n"
            "from tf_mixed.distribute import keras_fix_20585\n"
            "print(half_kernels.on_layer_init in shims._layer_init_hooks,"
            " keras_fix_20585.is_watching())\n")
    # The check imports the modules itself, so first look at what `import` did.
    probe = (f"{order}\nimport sys\n"
             "print('tf_mixed.policy.half_kernels' in sys.modules,"
             " 'tf_mixed.distribute.keras_fix_20585' in sys.modules)\n")
    for source in (probe, code):
        done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["True", "True"], done.stdout
