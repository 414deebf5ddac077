"""Tests for the command line: subcommands, bad input, subprocess runs.

Bad input is checked in process through `main` (fast); a few tests run
``python -m tf_mixed`` itself to see real exit statuses and that no
traceback reaches the user.
"""

import json
import os
import subprocess
import sys

import pytest

from tf_mixed import hardware
from tf_mixed.__main__ import main

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
TINY = ["--image_size=16", "--train_size=64", "--val_size=32", "--batch_size=16",
        "--epochs=1", "--steps=3", "--warmup_steps=1", "--model=mlp"]


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


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--model=vgg16", "--model='vgg16': unknown model. Accepted: mlp, cnn, resnet18, resnet50."),
        ("--policies=float32,half", "--policies='half': unknown policy. Accepted: auto, mixed_float16, mixed_bfloat16, float32, fp16, bf16, fp32."),
        ("--dataset=imagenet", "--dataset='imagenet': unknown data set. Accepted: shapes, tfds:NAME[:SPLIT]"),
        ("--batch_size=0", "--batch_size=0: must be >= 1. Accepted: an integer >= 1."),
        ("--strategy=tpu", "--strategy='tpu': unknown strategy. Accepted: default, mirrored, multiworker."),
        ("--loop=keras", "--loop='keras': unknown loop. Accepted: fit, custom."),
        ("--suite=speed", "--suite='speed': unknown suite. Accepted: compare, overhead, comm."),
        ("--epochs=0", "--epochs=0: must be >= 1."),
        ("--batch_size=100000", "--batch_size=100000: larger than the 8000 training examples. Accepted: 1 to 8000."),
        ("--strategy=multiworker", "--loop='fit': Keras 3's model.fit fails under MultiWorkerMirroredStrategy"),
    ],
)
def test_bad_values_name_flag_value_and_choices(tmp_path, capsys, flag, expected):
    assert expected in _bad(tmp_path, capsys, flag)


def test_bad_folder(tmp_path, capsys):
    line = _bad(tmp_path, capsys, f"--dataset=folder:{tmp_path / 'nope'}")
    assert f"--dataset='folder:{tmp_path / 'nope'}': no such directory" in line
    assert "one subfolder per class" in line


def test_tfds_not_prepared(tmp_path, capsys):
    line = _bad(tmp_path, capsys, "--dataset=tfds:mnist", f"--data_dir={tmp_path}", "--nodownload")
    assert "--dataset='tfds:mnist': TFDS data set 'mnist' is not prepared" in line
    assert "tfds build mnist" in line


def test_unknown_tfds_name(tmp_path, capsys):
    assert "TFDS has no data set 'not_a_set'" in _bad(tmp_path, capsys, "--dataset=tfds:not_a_set")


def test_output_dir_that_cannot_be_written(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["tf_mixed", "bench", "--isolation=inprocess", f"--output_dir={blocker / 'sub'}", *TINY])
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


def test_info_prints_the_hardware_report(capsys):
    assert main(["tf_mixed", "info"]) == 0
    assert capsys.readouterr().out.strip() == hardware.report().strip()
    assert main(["tf_mixed", "info", "extra"]) == 2


def test_audit_needs_one_path(tmp_path, capsys):
    assert main(["tf_mixed", "audit"]) == 2
    assert "expected exactly one argument" in capsys.readouterr().err
    # The path is handed to tf_mixed.audit.main, which rejects a missing file.
    assert main(["tf_mixed", "audit", str(tmp_path / "missing.keras")]) == 2
    assert "missing.keras" in capsys.readouterr().err


# --- real processes -----------------------------------------------------------


def test_subprocess_bad_input_exit_2_without_traceback(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "--model=alexnet", f"--output_dir={out}"],
        capture_output=True, text=True, env=ENV, timeout=180,
    )
    assert proc.returncode == 2
    assert "--model='alexnet': unknown model" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_subprocess_isolation_run_writes_results(tmp_path):
    """The default isolation: each policy in its own ``python -m tf_mixed`` child."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "bench", *TINY, "--policies=fp32,bf16",
         f"--output_dir={out}"],
        capture_output=True, text=True, env=ENV, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["bench.png", "results.json", "results.md"]
    report = json.loads((out / "results.json").read_text())
    assert report["flags"]["isolation"] == "subprocess"
    assert [r["policy"] for r in report["results"]] == ["float32", "mixed_bfloat16"]
    assert "| float32 |" in proc.stdout and "| mixed_bfloat16 |" in proc.stdout
    assert "[mixed_bfloat16] epoch 1/1" in proc.stdout
    for r in report["results"]:
        assert r["peak_memory_mb"] > 100 and r["memory_kind"] == "process_peak_rss"
        assert r["samples_per_sec"] > 0 and r["timed_steps"] == 2


def test_multiworker_custom_loop(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "bench", *TINY, "--policies=fp32",
         "--strategy=multiworker", "--loop=custom", "--workers=2", f"--output_dir={out}"],
        capture_output=True, text=True, env=ENV, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())["results"][0]
    assert result["strategy"] == "multiworker" and result["replicas"] == 2 and result["workers"] == 2
    assert result["samples_per_sec"] > 0 and result["final_val_loss"] > 0
