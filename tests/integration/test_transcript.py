"""The first commands a newcomer runs, each in a fresh process, read as a newcomer reads them.

Issue 46: the main job, ``info``, ``check``, ``audit``, ``probe``, ``doctor`` and
``export``, on a small Sequential, a keras.applications model and a KerasHub model
built from config, saved under float32, mixed_bfloat16 and mixed_float16. Each
output is checked for the defect classes the issue found: a TensorFlow traceback
where a sentence belongs, a line printed twice, a default that does not fit the
model (TensorFlow's "label value outside the valid range"), and, under a
bfloat16 model, advice that names float16's loss scale.

Within the CI budget (slow tier, one fresh process per test, parallel under
xdist): the five model commands run on every model and every policy, but not on
all nine pairs each (36 processes, ~8 s of CPU each): command k runs on the pairs
(model i, policy j) with (i + j + k) % 3 == 0, a Latin square, so every command
meets every model and every policy once (12 processes). ``info`` takes no model;
``check`` proves the step on the host (its probe timing is check's own); the main
job trains its own models: each runs once.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ("sequential", "applications", "kerashub")
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
COMMANDS = ("audit", "probe", "doctor", "export")

pytestmark = pytest.mark.slow


def _build(kind):
    import keras

    keras.utils.set_random_seed(3)
    if kind == "sequential":  # 5 classes: the bench's generated data has 10 (issue 46)
        return keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3),
                                 keras.layers.Flatten(),
                                 keras.layers.Dense(5, activation="softmax")], name="small")
    if kind == "applications":
        model = keras.applications.MobileNetV3Small(
            weights=None, input_shape=(32, 32, 3), classes=5, include_preprocessing=False)
        model.compile("adam", "sparse_categorical_crossentropy")
        return model
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
        max_sequence_length=16)
    return keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2,
                                               preprocessor=None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(model, policy) -> a .keras file built under that policy, made on first use."""
    import keras

    import tf_mixed

    files = {}

    def get(kind, policy):
        if (kind, policy) not in files:
            path = tmp_path_factory.mktemp(f"{kind}_{policy}") / "model.keras"
            tf_mixed.enable(policy, quiet=True) if policy != "float32" else tf_mixed.disable()
            try:
                model = _build(kind)
                if not model.compiled:
                    model.compile("adam", "sparse_categorical_crossentropy")
                model.save(path)
            finally:
                tf_mixed.disable()
                keras.config.set_dtype_policy("float32")
            if kind == "kerashub":  # its inputs: a dict, which no generated set gives
                ids = np.random.default_rng(0).integers(1, 64, (16, 6)).astype("int32")
                arrays = {f"x{n}": ids if "token" in t.name else
                          (np.ones_like(ids) if "mask" in t.name else np.zeros_like(ids))
                          for n, t in enumerate(model.inputs)}
                np.savez(path.parent / "data.npz", y=np.zeros(16, "int32"), **arrays)
            files[kind, policy] = path
        return files[kind, policy]

    return get


def _run(args, cwd, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_MIXED_PROGRESS="1")
    env.pop("TF_MIXED_AUTO_MEASURE", None)
    env["TF_MIXED_AUTO_MEASURE"] = "0"  # no host timing in tests: auto follows its rules
    proc = subprocess.run([sys.executable, "-m", "tf_mixed", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


# Progress lines carry the seconds (they differ); table rows and rules may repeat.
_IGNORED = re.compile(r"^\s*$|^\||^-+$|^=+$|.* \(\d+ s\)$")


def repeated_lines(text):
    """Lines of 30 characters or more printed more than once (not table rows)."""
    seen, twice = set(), []
    for line in text.splitlines():
        if len(line) < 30 or _IGNORED.match(line):
            continue
        if line in seen and line not in twice:
            twice.append(line)
        seen.add(line)
    return twice


def defects(code, out, err, policy=None):
    """What a newcomer would trip over in one command's output."""
    found = []
    text = out + "\n" + err
    if "Traceback (most recent call last)" in text:
        found.append("a traceback: " + err[-600:])
    if code not in (0, 1, 2):
        found.append(f"exit status {code}")
    if code == 2 and len([line for line in err.splitlines() if ": error: " in line]) != 1:
        found.append("refused without exactly one error line: " + err[-600:])
    found += [f"printed twice: {line!r}" for line in repeated_lines(out)]
    found += [f"printed twice: {line!r}" for line in repeated_lines(err)]
    for wrong in ("outside the valid range", "Incompatible shapes", "InvalidArgumentError"):
        if wrong in text:
            found.append(f"a default that does not fit the model: {wrong}")
    if policy == "mixed_bfloat16":
        for line in text.splitlines():
            # Advice to a bfloat16 model about float16's loss scale or Tensor Cores' float16
            # (probe's own loss-scale lines are issue 46's numerics part, owned elsewhere).
            if "Loss scale:" in line or "loss scale" in line.lower() and "probe" in line:
                continue
            if "use mixed_float16" in line or "switch to mixed_float16" in line:
                found.append(f"advice for another policy: {line!r}")
    return found


def _cases():
    for k, command in enumerate(COMMANDS):
        for i, model in enumerate(MODELS):
            for j, policy in enumerate(POLICIES):
                if (i + j + k) % 3 == 0:
                    yield command, model, policy


def _args(command, path, out_dir):
    data = (["--dataset=npz:" + str(path.parent / "data.npz")]
            if (path.parent / "data.npz").exists() else [])
    return {
        "audit": ["audit", str(path)],
        "probe": ["probe", str(path), "--batch_size=8", f"--output_dir={out_dir}"],
        "doctor": ["doctor", str(path), "--batch_size=8", f"--output_dir={out_dir}", *data],
        "export": ["export", str(path), "--batch_size=4", f"--output_dir={out_dir}", *data],
    }[command]


@pytest.mark.parametrize("command, model, policy", list(_cases()),
                         ids=lambda v: str(v))
def test_a_model_command_reads_right(command, model, policy, saved, tmp_path):
    path = saved(model, policy)
    code, out, err = _run(_args(command, path, tmp_path / "out"), tmp_path)
    assert not defects(code, out, err, policy), (code, out[-3000:], err[-3000:])
    if command == "probe" and model == "sequential":
        # The generated data has 10 classes, the model 5: fitted, and said once.
        assert code == 0, err[-2000:]
        assert err.count("labels folded into 5 classes") == 1
    if command == "probe" and model == "kerashub":
        # Two dict inputs: one sentence naming the flag to pass.
        assert code == 2 and "--dataset" in err and "npz:PATH" in err, err[-2000:]


def test_info_check_and_the_main_job_read_right(tmp_path):
    code, out, err = _run(["info"], tmp_path)
    assert code == 0 and not defects(code, out, err), (out, err)
    code, out, err = _run(["check", "--parts=tf_mixed"], tmp_path)
    assert code == 0 and not defects(code, out, err), (out, err)
    assert err.count("[check] part 1:") == 1  # one progress line per event
    code, out, err = _run(["check", "--help"], tmp_path)
    assert code == 0 and "--budget: Seconds for the throughput timing rounds" in out
    code, out, err = _run(["--model=mlp", "--epochs=1", "--train_size=512", "--val_size=128",
                           "--batch_size=64", "--round_steps=2", "--warmup_steps=1",
                           "--isolation=inprocess", f"--output_dir={tmp_path / 'bench'}",
                           "--policies=float32,mixed_bfloat16"], tmp_path)
    assert code == 0 and not defects(code, out, err), (out[-3000:], err[-3000:])
    assert "mixed_bfloat16 / float32" in out and "interval" in out
