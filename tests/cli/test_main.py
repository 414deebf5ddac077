"""Tests for the command line: subcommands, bad input, subprocess runs.

Bad input is checked in process through `main` (fast); a few tests run
``python -m tf_mixed`` itself to see real exit statuses, that no traceback
reaches the user and that TensorFlow's C++ log stays off stderr.
"""

import json
import os
import subprocess
import sys

import pytest

from tf_mixed._internal import quiet
from tf_mixed.bench import child, compare
from tf_mixed.cli.main import main
from tf_mixed.policy import hardware

# The CLI's own default log level is what is under test: none set here.
ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
TINY = ["--image_size=16", "--train_size=64", "--val_size=32", "--batch_size=16",
        "--epochs=1", "--steps=3", "--warmup_steps=1", "--model=mlp",
        "--time_budget=0"]  # every policy in full, whatever this host's speed


def _bad(tmp_path, capsys, *flags):
    out = tmp_path / "out"
    code = main(["tf_mixed", "bench", "--isolation=inprocess", f"--output_dir={out}", *flags])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tf_mixed bench: error: ")
    assert "Traceback" not in captured.err
    assert not out.exists()  # nothing created, nothing that looks like a result
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--model=vgg16", "--model='vgg16': unknown model. Accepted: mlp, cnn, resnet18, "
                          "resnet50, mobilenetv2, efficientnetb0, transformer."),
        ("--policies=float32,half", "--policies='half': unknown policy. Accepted: auto, "
                                    "mixed_float16, mixed_bfloat16, float32, bfloat16, fp16, "
                                    "bf16, fp32, float8, plan, auto-checked."),
        ("--dataset=imagenet",
         "--dataset='imagenet': unknown data set. Accepted: shapes, tfds:NAME[:SPLIT]"),
        ("--batch_size=0", "--batch_size=0: must be at least 1."),
        ("--strategy=tpu",
         "--strategy='tpu': unknown strategy. Accepted: default, mirrored, multiworker."),
        ("--loop=keras", "--loop='keras': unknown loop. Accepted: fit, custom."),
        ("--suite=speed", "--suite='speed': unknown suite. Accepted: compare, overhead, comm, "
                          "memory, bf16, gpu, heal, heal_cost."),
        ("--epochs=0", "--epochs=0: must be at least 1."),
        ("--batch_size=100000", "--batch_size=100000: larger than the 8000 training examples "
                                "of shapes. Accepted: 1 to 8000."),
        ("--image_size=8", "--image_size=8: too small for the shapes data set. "
                           "Accepted: 16 or more (0 picks 32)."),
    ],
)
def test_bad_values_name_flag_value_and_choices(tmp_path, capsys, flag, expected):
    assert expected in _bad(tmp_path, capsys, flag)


def test_bad_folder(tmp_path, capsys):
    line = _bad(tmp_path, capsys, f"--dataset=folder:{tmp_path / 'nope'}")
    assert f"--dataset='folder:{tmp_path / 'nope'}': no such directory" in line
    assert "one subfolder per class" in line


def _text_jpgs(root):
    for name in ("cats", "dogs"):
        os.makedirs(root / name)
        for i in range(3):
            (root / name / f"{i}.jpg").write_text("this is text, not a JPEG\n")
    return root


@pytest.mark.parametrize("isolation", ["inprocess", "subprocess"])
def test_folder_of_text_files_named_jpg(tmp_path, capsys, isolation):
    root = _text_jpgs(tmp_path / "imgs")
    line = _bad(tmp_path, capsys, f"--dataset=folder:{root}", f"--isolation={isolation}")
    assert (f"--dataset='folder:{root}': {root / 'cats' / '0.jpg'} "
            "is not a JPEG, PNG, GIF or BMP image") in line


@pytest.mark.slow
def test_image_that_does_not_decode_in_training(tmp_path, capsys):
    """A file with a JPEG header and a broken body gets past the pre-check;
    training names the set."""
    import numpy as np
    from PIL import Image

    root = tmp_path / "imgs"
    for name in ("cats", "dogs"):
        os.makedirs(root / name)
        for i in range(8):
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / name / f"{i}.png")
    (root / "cats" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 64)
    line = _bad(tmp_path, capsys, f"--dataset=folder:{root}", *TINY, "--policies=fp32",
                "--train_size=0", "--val_size=0", "--batch_size=2")
    assert f"--dataset='folder:{root}': an image could not be decoded" in line


def test_child_bad_input_is_one_line_through_the_parent(tmp_path):
    """The child writes its error to --error_file and exits 2; the parent raises it as is."""
    from tf_mixed.bench.config import BenchConfig

    config_path, error_file = tmp_path / "config.json", tmp_path / "err"
    config_path.write_text(json.dumps(BenchConfig(image_size=8, model="mlp").to_json()))
    code = child.main([str(config_path), "float32", f"--error_file={error_file}"])
    assert code == 2
    message = error_file.read_text()
    assert message.startswith("--image_size=8: too small for the shapes data set.")
    with pytest.raises(compare.ChildFailed) as info:
        compare._check("float32", code, [str(error_file)])
    assert info.value.usage and str(info.value) == message
    with pytest.raises(compare.ChildFailed, match="exit status 1") as info:
        compare._check("float32", 1, [str(tmp_path / "none")])
    assert not info.value.usage


def test_tfds_not_prepared(tmp_path, capsys):
    line = _bad(tmp_path, capsys, "--dataset=tfds:mnist", f"--data_dir={tmp_path}", "--nodownload")
    assert "--dataset='tfds:mnist': TFDS data set 'mnist' is not prepared" in line
    assert "tfds.builder('mnist', data_dir=" in line and ".download_and_prepare()" in line


def test_unknown_tfds_name(tmp_path, capsys):
    assert "TFDS has no data set 'not_a_set'" in _bad(tmp_path, capsys, "--dataset=tfds:not_a_set")


def test_output_dir_that_cannot_be_written(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["tf_mixed", "bench", "--isolation=inprocess", f"--output_dir={blocker / 'sub'}",
                 *TINY])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"--output_dir='{blocker / 'sub'}': cannot be written" in err
    code = main(["tf_mixed", "bench", "--isolation=inprocess", f"--output_dir={blocker}", *TINY])
    assert code == 2 and "exists and is not a directory" in capsys.readouterr().err


def test_malformed_flag_and_positional(capsys):
    assert main(["tf_mixed", "bench", "--batch_size=many"]) == 2
    err = capsys.readouterr().err
    assert "batch_size" in err and "many" in err and "Traceback" not in err
    assert main(["tf_mixed", "bench", "extra"]) == 2
    assert "unexpected argument 'extra'" in capsys.readouterr().err
    assert main(["tf_mixed", "bench", "--no_such_flag=1"]) == 2
    assert "no_such_flag" in capsys.readouterr().err


def test_unknown_subcommand_and_help(capsys):
    assert main(["tf_mixed", "train"]) == 2
    assert "unknown command 'train'; accepted: bench, info, audit" in capsys.readouterr().err
    assert main(["tf_mixed", "bench", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--policies", "--model", "--dataset", "--batch_size", "--epochs", "--steps",
                 "--strategy", "--loop", "--output_dir", "--seed", "--suite", "--data_dir"):
        assert flag in out
    assert main(["tf_mixed", "--help"]) == 0
    assert "python -m tf_mixed info" in capsys.readouterr().out


def test_info_reports_faked_hardware(monkeypatch, capsys):
    import platform

    import keras
    import tensorflow as tf

    gpu = hardware.HardwareInfo(
        gpus=(hardware.GpuInfo("A100", (8, 0)),),
        cpu_model="Test CPU", cpu_flags=frozenset({"avx2", "amx_bf16", "sse4_2"}),
    )
    monkeypatch.setattr(hardware, "detect", lambda: gpu)
    assert main(["tf_mixed", "info"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[:5] == [
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"Python {platform.python_version()}",
        "CPU: Test CPU",
        "  half-precision flags: avx2, amx_bf16; AMX-BF16 usable: no",
        "GPU 0: A100, compute capability 8.0",
        "TPU: none",
    ]
    assert lines[5] == 'tf_mixed.enable("auto") picks: mixed_float16'
    assert lines[6].startswith("  because: ") and len(lines) == 8
    assert lines[7].startswith("  measured on: nothing: GPUs and TPUs follow a rule; each "
                               "model's own training step is checked against float32")
    rocm = hardware.HardwareInfo(gpus=(hardware.GpuInfo("MI250", None),), tpu=True)
    monkeypatch.setattr(hardware, "detect", lambda: rocm)
    assert main(["tf_mixed", "info"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0: MI250, compute capability unknown\nTPU: yes\n" in out
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo())
    assert main(["tf_mixed", "info", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "half-precision flags: none" in out and "GPU: none" in out
    assert 'picks: float32' in out
    # conftest turns measuring off: auto took the CPU rule and says so.
    assert "measured on: nothing: the CPU rule (TF_MIXED_AUTO_MEASURE is off)" in out
    monkeypatch.setenv("TF_MIXED_AUTO_MEASURE", "1")
    from tf_mixed.cli import info

    assert info.measured_on(hardware.HardwareInfo()).startswith(
        "this host's Dense+Conv2D probe (one 1024-wide Dense, one 64-channel Conv2D), not "
        "your model; each model's own training step is checked")
    assert main(["tf_mixed", "info", "extra"]) == 2
    assert "unexpected argument 'extra'" in capsys.readouterr().err


def test_audit_needs_one_path(tmp_path, capsys):
    assert main(["tf_mixed", "audit"]) == 2
    assert "expected exactly one MODEL argument" in capsys.readouterr().err
    assert main(["tf_mixed", "audit", str(tmp_path / "missing.keras")]) == 2
    err = capsys.readouterr().err
    # The wording of every model command (probe, doctor, export): what to pass.
    assert err == (f"tf_mixed audit: error: MODEL={str(tmp_path / 'missing.keras')!r}: no such "
                   "file. Pass the path of a saved .keras model.\n")


def _saved_mlp(path):
    import keras

    import tf_mixed

    inputs = keras.Input((16,))
    x = keras.layers.Dense(100, activation="relu", name="hidden")(inputs)
    x = keras.layers.Dense(8, name="logits")(x)
    outputs = tf_mixed.layers.OutputActivation("softmax", name="probs")(x)
    keras.Model(inputs, outputs, name="mlp").save(path)
    return str(path)


def test_audit_prints_the_saved_models_report(tmp_path, capsys):
    import keras

    import tf_mixed

    tf_mixed.enable("mixed_bfloat16", quiet=True)
    path = _saved_mlp(tmp_path / "m.keras")
    keras.config.set_dtype_policy("float32")  # as in a fresh CLI process
    assert main(["tf_mixed", "audit", path]) == 0
    out = capsys.readouterr().out
    # The float32 head loads as what it saves as: Keras's Activation, float32.
    assert "probs        Activation  float32" in out and "units=100" in out
    assert "explicit_float32" not in out and "float32 policy in a mixed" not in out
    assert "policy mixed_bfloat16" in out
    assert "global policy" not in out  # a loaded model is not compared with the global policy


def test_audit_unloadable_file(tmp_path, capsys):
    path = tmp_path / "junk.keras"
    path.write_text("not a model")
    assert main(["tf_mixed", "audit", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"tf_mixed audit: error: MODEL='{path}' cannot be loaded")


# --- real processes -----------------------------------------------------------


@pytest.mark.slow
def test_subprocess_info_prints_nothing_on_stderr():
    proc = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "info"], capture_output=True, text=True, env=ENV,
        timeout=180,
    )
    assert proc.returncode == 0
    assert proc.stderr == ""  # no oneDNN / cudart / cuInit lines
    assert 'tf_mixed.enable("auto") picks: ' in proc.stdout


@pytest.mark.slow
def test_subprocess_bad_input_one_line_exit_2(tmp_path):
    """Bad input found in the parent (--model) and in the data (a child would have read it)."""
    out = tmp_path / "out"
    root = _text_jpgs(tmp_path / "imgs")
    for flag, expected in (
        ("--model=alexnet", "tf_mixed bench: error: --model='alexnet': unknown model."),
        (f"--dataset=folder:{root}",
         f"tf_mixed bench: error: --dataset='folder:{root}': {root / 'cats' / '0.jpg'} is not"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "tf_mixed", flag,
             "--model=mlp" if "dataset" in flag else "--epochs=1", f"--output_dir={out}"],
            capture_output=True, text=True, env=ENV, timeout=180,
        )
        assert proc.returncode == 2
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), proc.stderr
        assert proc.stdout == ""
        assert not out.exists()


@pytest.mark.slow
def test_subprocess_isolation_run_writes_results(tmp_path):
    """The default isolation: each policy in its own ``python -m tf_mixed`` child."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "bench", *TINY, "--policies=fp32,bf16",
         f"--output_dir={out}"],
        capture_output=True, text=True, env=ENV, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines()
                if quiet.is_tf_log_line(line)], proc.stderr
    assert sorted(os.listdir(out)) == ["bench.png", "results.json", "results.md"]
    report = json.loads((out / "results.json").read_text())
    assert report["flags"]["isolation"] == "subprocess"
    assert [r["policy"] for r in report["results"]] == ["float32", "mixed_bfloat16"]
    assert "| float32 |" in proc.stdout and "| mixed_bfloat16 |" in proc.stdout
    assert "[mixed_bfloat16] epoch 1/1" in proc.stdout
    for r in report["results"]:
        assert r["peak_memory_mb"] > 100 and r["memory_kind"] == "process_peak_rss"
        assert r["samples_per_sec"] > 0 and r["timed_steps"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_multiworker(tmp_path, loop):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "bench", *TINY, "--policies=fp32",
         "--strategy=multiworker", f"--loop={loop}", "--workers=2", f"--output_dir={out}"],
        capture_output=True, text=True, env=ENV, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())["results"][0]
    assert (result["strategy"] == "multiworker" and result["replicas"] == 2
            and result["workers"] == 2)
    assert result["loop"] == loop
    assert result["samples_per_sec"] > 0 and result["final_val_loss"] > 0


# --- quiet --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("line, is_log", [
    ("I0000 00:00:1795330598.903093    8612 port.cc:153] oneDNN custom operations are on.", True),
    ("E0000 00:00:1795330602.934204    8612 cuda_platform.cc:52] "
     "failed call to cuInit: INTERNAL", True),
    ("W1122 07:01:17.123456  123 gpu/gpu_device.cc:2344] Cannot dlopen some GPU libraries.", True),
    ("WARNING: All log messages before absl::InitializeLog() is called "
     "are written to STDERR", True),
    ("To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild", True),
    ("tf_mixed bench: error: --model='x': unknown model.", False),
    ("WARNING:absl:tf_mixed: mixed_float16 was requested on a host with no GPU.", False),
    ("Traceback (most recent call last):", False),
])
def test_tf_log_lines_are_told_apart(line, is_log):
    assert quiet.is_tf_log_line(line) is is_log


def test_tf_warnings_summarised_in_one_line_others_pass(capsys):
    import logging
    import warnings

    keras_file = os.path.join("site-packages", "keras", "src", "trainers", "trainer.py")
    shown = []
    # TensorFlow's own stream handler on its logger (tf.get_logger adds one): a
    # warning held back must not reach it, or the summary repeats what was shown (issue 46).
    tf_handler = logging.Handler()
    tf_handler.emit = lambda record: shown.append("TF's handler: " + record.getMessage())
    logging.getLogger("tensorflow").addHandler(tf_handler)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        with quiet.summarised_tf_warnings(False, "bench") as caught:
            warnings.warn_explicit("a Keras warning", UserWarning, keras_file, 1)
            warnings.warn_explicit("another", UserWarning, keras_file, 2)
            logging.getLogger("tensorflow").warning("a TF log warning")
            warnings.warn_explicit("ours", UserWarning, "tf_mixed/callbacks/monitor.py", 3)
    logging.getLogger("tensorflow").removeHandler(tf_handler)
    assert len(caught) == 3
    assert shown == ["ours"]  # passed on to the usual display; TF's handler saw nothing
    err = capsys.readouterr().err
    summary = [line for line in err.splitlines() if line.startswith("tf_mixed bench:")]
    assert summary == [
        "tf_mixed bench: 3 TensorFlow/Keras warning(s) hidden "
        "(first: UserWarning: a Keras warning); --verbose shows them."
    ]


def test_log_level_default_keeps_the_users_and_verbose_overrides():
    env = {}
    quiet.set_log_level(env, verbose=False)
    assert env == {"TF_CPP_MIN_LOG_LEVEL": "3"}
    env = {"TF_CPP_MIN_LOG_LEVEL": "1"}
    quiet.set_log_level(env, verbose=False)
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "1"
    quiet.set_log_level(env, verbose=True)
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert compare._child_env(False, {"TF_CONFIG": "{}"})["TF_CONFIG"] == "{}"
