"""``python -m tf_mixed export``: the artifact, export.json, and bad input."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.cli.main import main


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A mixed_float16 image model saved as .keras, and an npz of inputs."""
    root = tmp_path_factory.mktemp("saved")
    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10), tf_mixed.layers.OutputActivation("softmax"),
        ])
    finally:
        keras.config.set_dtype_policy("float32")
    path = root / "m.keras"
    model.save(path)
    x = np.random.RandomState(0).uniform(0, 255, (6, 16, 16, 3)).astype("float32")
    np.savez(root / "x.npz", x=x)
    np.savez(root / "no_x.npz", y=x)
    (root / "broken.keras").write_bytes(b"not a zip")
    return root


def _ok(capsys, *args):
    code = main(["tf_mixed", "export", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@pytest.mark.slow
def test_litert_with_dataset_writes_artifact_and_report(saved, tmp_path, capsys):
    out = tmp_path / "out"
    text = _ok(capsys, str(saved / "m.keras"), "--format=litert", "--precision=float16_weights",
               "--dataset=shapes", "--batch_size=4", f"--output_dir={out}")
    assert sorted(os.listdir(out)) == ["export.json", "model.tflite"]
    record = json.loads((out / "export.json").read_text())
    report = record["report"]
    assert report["precision"] == "float16_weights" and report["trained_dtype"] == "float16"
    assert report["select_ops"] == [] and report["runtime"] == "ai_edge_litert"
    assert report["max_rel_error"] <= report["tolerance"]
    assert report["bytes"] == os.path.getsize(out / "model.tflite")
    assert record["batch_size"] == 4 and record["command"].startswith("python -m tf_mixed export")
    assert "float16_weights (trained in float16)" in text and "wrote" in text


def test_saved_model_from_npz(saved, tmp_path, capsys):
    out = tmp_path / "out"
    _ok(capsys, str(saved / "m.keras"), "--format=saved_model", "--precision=bfloat16",
        f"--dataset=npz:{saved / 'x.npz'}", f"--output_dir={out}")
    assert sorted(os.listdir(out)) == ["export.json", "saved_model"]
    report = json.loads((out / "export.json").read_text())["report"]
    assert report["precision"] == "bfloat16" and report["max_rel_error"] <= report["tolerance"]


@pytest.mark.slow
@pytest.mark.parametrize("args,match", [
    (["{root}/missing.keras"], r"MODEL='.*missing.keras': no such file"),
    (["{root}/broken.keras"], r"cannot be loaded as a Keras model"),
    (["{root}/m.keras", "--format=onnx"],
     r"--format='onnx': unknown format. Accepted: saved_model, litert"),
    (["{root}/m.keras", "--precision=half"], r"--precision='half': unknown precision"),
    (["{root}/m.keras", "--format=litert", "--precision=float16"],
     r"\(it is a saved_model precision\)"),
    (["{root}/m.keras", "--dataset=npz:{root}/x.npz", "--tolerance=-1"], r"--tolerance=-1.0"),
    (["{root}/m.keras", "--dataset=imagenet"], r"--dataset='imagenet': unknown data set"),
    (["{root}/m.keras", "--dataset=npz:{root}/no_x.npz"], r"the file has no x array \(it has y\)"),
    (["{root}/m.keras", "--dataset=npz:{root}/nope.npz"], r"no such file '.*nope.npz'"),
    (["{root}/m.keras", "--dataset=shapes", "--batch_size=0"], r"--batch_size=0"),
    (["{root}/x.npz"], r"MODEL='.*x.npz': not a saved Keras model"),
    ([], r"expected exactly one MODEL argument"),
    (["{root}/m.keras", "--colour=red"], r"Unknown command line flag 'colour'"),
])
def test_bad_input_one_line_exit_2_nothing_left(saved, tmp_path, capsys, args, match):
    out = tmp_path / "out"
    args = [a.format(root=saved) for a in args]
    code = main(["tf_mixed", "export", *args, f"--output_dir={out}"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(lines) == 1 and lines[0].startswith("tf_mixed export: error: "), captured.err
    assert pytest.importorskip("re").search(match, lines[0]), lines[0]
    assert not out.exists()


def test_data_that_does_not_fit_the_model(saved, tmp_path, capsys):
    # shapes at the model's 16x16 but an npz of 8x8 images: refused, nothing left.
    np.savez(tmp_path / "small.npz", x=np.zeros((2, 8, 8, 3), "float32"))
    out = tmp_path / "out"
    code = main(["tf_mixed", "export", str(saved / "m.keras"),
                 f"--dataset=npz:{tmp_path / 'small.npz'}", f"--output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "x has shape (2, 8, 8, 3); model " in err[0] and "takes (None, 16, 16, 3)" in err[0]
    assert not out.exists()


def test_unwritable_output_dir(saved, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["tf_mixed", "export", str(saved / "m.keras"), f"--output_dir={blocker}/out"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--output_dir=" in err[0] and "cannot be written" in err[0]
    assert os.listdir(tmp_path) == ["file"]


def test_existing_output_dir_is_kept_on_bad_input(saved, tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    code = main(["tf_mixed", "export", str(saved / "m.keras"), "--dataset=npz:nope.npz",
                 f"--output_dir={tmp_path}"])
    assert code == 2
    assert os.listdir(tmp_path) == ["keep.txt"]
    capsys.readouterr()


@pytest.mark.slow
def test_subprocess_exit_status_and_no_traceback(saved, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "export", str(saved / "missing.keras"),
         f"--output_dir={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=300, env={**os.environ}, check=False,
    )
    assert result.returncode == 2
    expected = (f"tf_mixed export: error: MODEL={str(saved / 'missing.keras')!r}: "
                "no such file. Pass the path of a saved .keras model.")
    assert result.stderr.strip().splitlines() == [expected]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_artifact_failing_its_check_exits_1_and_leaves_nothing(saved, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["tf_mixed", "export", str(saved / "m.keras"), "--format=saved_model",
                 "--precision=bfloat16", f"--dataset=npz:{saved / 'x.npz'}",
                 "--tolerance=1e-12", f"--output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "above tolerance=1e-12" in err[0]
    assert not out.exists()


def test_without_a_sample_export_never_says_it_checks():
    # Issue 37: the progress said "checking it on the sample", then the report
    # "not checked (no sample)".
    from tf_mixed.cli import export as export_command
    from tf_mixed.serving.export_report import ExportReport

    lines = [export_command.stage(step, "m.keras", "litert", "float32", False) for step in (1, 2)]
    assert lines == ["step 1/2: loading m.keras",
                     "step 2/2: exporting litert (float32) (no sample: no parity check)"]
    assert export_command.stage(2, "m.keras", "litert", "float32", True) == (
        "step 2/2: exporting litert (float32) and checking it on the sample")
    fields = dict(path="m.tflite", format="litert", precision="float32", trained_dtype="float32",
                  input_names=("x",), input_dtypes=("float32",), input_shapes=((None, 4),),
                  output_names=("y",), output_dtypes=("float32",), output_shapes=((None, 2),),
                  bytes=10, select_ops=(), runtime="ai_edge_litert", tolerance=1e-5)
    unchecked = str(ExportReport(**fields))
    assert "parity         not checked: no sample was given\n" in unchecked + "\n"
    assert "run by" not in unchecked
    checked = str(ExportReport(**fields, max_abs_error=0.5, max_rel_error=0.25, worst_output="y"))
    assert "max rel 0.25 (worst: y; tolerance 1e-05), run by ai_edge_litert" in checked
