"""``python -m tf_mixed doctor``: census, findings, doctor.json, --measure, bad input.

Timing figures are never asserted (the machine decides them); the tests
check what was applied and that the figures are real measurements.
"""

import json
import math

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.cli import doctor
from tf_mixed.cli.main import main


def _planted(tmp_path):
    """A mixed_bfloat16 MLP with a width-1001 Dense and a float32 Dense after it."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    inp = keras.Input((32,))
    h = keras.layers.Dense(1001, activation="relu", name="wide")(inp)
    h = keras.layers.Dense(64, name="island", dtype="float32")(h)
    out = keras.layers.Dense(4, name="out", dtype="float32")(h)
    model = keras.Model(inp, out, name="planted")
    path = tmp_path / "planted.keras"
    model.save(path)
    keras.config.set_dtype_policy("float32")
    rng = np.random.default_rng(0)
    npz = tmp_path / "data.npz"
    np.savez(npz, x=rng.normal(size=(64, 32)).astype("float32"), y=rng.integers(0, 4, 64))
    return str(path), str(npz)


def _small(tmp_path, model, name):
    """``model`` saved as ``name``.keras beside 32 samples of 16 ones (d.npz):
    (its path, the output folder `_doctor` gives)."""
    path = tmp_path / f"{name}.keras"
    model.save(path)
    np.savez(tmp_path / "d.npz", x=np.ones((32, 16), "float32"), y=np.zeros(32, "int32"))
    return path, tmp_path / "out"


def _doctor(path, tmp_path, *flags) -> int:
    """``python -m tf_mixed doctor`` on a `_small` model and its data."""
    return main(["tf_mixed", "doctor", str(path), f"--dataset=npz:{tmp_path / 'd.npz'}",
                 "--batch_size=16", *flags, f"--output_dir={tmp_path / 'out'}"])


def test_doctor_writes_the_census_and_names_each_cause(tmp_path, capsys):
    path, npz = _planted(tmp_path)
    out = tmp_path / "out"
    code = main(["tf_mixed", "doctor", path, f"--dataset=npz:{npz}", "--batch_size=16",
                 f"--output_dir={out}"])
    printed = capsys.readouterr().out
    assert code == 0
    record = json.loads((out / "doctor.json").read_text())
    findings = {(f["code"], f["layer"]) for f in record["census"]["findings"]}
    assert findings == {("float32_island", "island"), ("tile_misfit", "wide")}
    assert record["census"]["policy"] == "mixed_bfloat16"
    assert record["measured"] is None
    assert "use units=1008" in printed and "Float32 islands" in printed
    assert not (out / "doctor.json.partial").exists()


def test_fixed_model_applies_only_the_automatic_fixes(tmp_path):
    path, npz = _planted(tmp_path)
    model = keras.saving.load_model(path)
    x = np.ones((16, 32), "float32")
    report = tf_mixed.census(model, x, np.zeros(16, "int32"),
                             loss="sparse_categorical_crossentropy", batch_size=16)
    fixed, applied = doctor.fixed_model(model, report)
    assert applied == ["'island' converted to mixed_bfloat16",
                       "'wide' padded to a multiple of 16"]
    assert fixed.get_layer("wide").units == 1008
    assert fixed.get_layer("island").dtype_policy.name == "mixed_bfloat16"
    assert fixed.get_layer("out").dtype_policy.name == "float32"  # no finding: kept
    assert model.get_layer("wide").units == 1001  # the original is untouched


@pytest.mark.slow
def test_measure_times_both_models(tmp_path, capsys):
    path, npz = _planted(tmp_path)
    out = tmp_path / "out"
    code = main(["tf_mixed", "doctor", path, f"--dataset=npz:{npz}", "--batch_size=16",
                 "--measure", "--steps=2", "--rounds=2", "--warmup_steps=1",
                 f"--output_dir={out}"])
    assert code == 0, capsys.readouterr().err
    measured = json.loads((out / "doctor.json").read_text())["measured"]
    assert measured["timed_steps"] == {"before": 4, "after": 4}
    assert len(measured["applied"]) == 2
    for key in ("before_step_ms", "after_step_ms", "speedup", "round_speedup_median"):
        assert math.isfinite(measured[key]) and measured[key] > 0
    low, high = measured["round_speedup_interval"]  # measuring.estimate of the round pairs
    assert low <= measured["round_speedup_median"] <= high
    text = capsys.readouterr().out
    assert "Measured (median fit step" in text and f"90% interval {low:.2f}-{high:.2f}x" in text


def test_measure_with_nothing_to_apply(tmp_path, capsys):
    keras.config.set_dtype_policy("mixed_bfloat16")
    path, out = _small(tmp_path, keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32), keras.layers.Dense(4)]), "clean")
    code = _doctor(path, tmp_path, "--measure")
    assert code == 0
    assert "nothing to measure" in capsys.readouterr().out
    assert json.loads((out / "doctor.json").read_text())["measured"]["applied"] == []


def _bad(tmp_path, capsys, *args):
    out = tmp_path / "out"
    code = main(["tf_mixed", "doctor", *args, f"--output_dir={out}"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tf_mixed doctor: error: ")
    assert not out.exists()  # nothing left behind
    return lines[0]


def test_missing_file(tmp_path, capsys):
    line = _bad(tmp_path, capsys, str(tmp_path / "nope.keras"))
    assert "no such file" in line


def test_dataset_shape_mismatch(tmp_path, capsys):
    path, _ = _planted(tmp_path)
    npz = tmp_path / "narrow.npz"
    np.savez(npz, x=np.ones((32, 7), "float32"), y=np.zeros(32, "int32"))
    line = _bad(tmp_path, capsys, path, f"--dataset=npz:{npz}", "--batch_size=16")
    assert line.endswith(
        f"--dataset='npz:{npz}': x has shape (32, 7); model 'planted' input 'input_layer' "
        "takes (None, 32) (width 32 expected, got 7). Accepted: npz:PATH with arrays x and y "
        "(or x0, x1, ... and y0, y1, ...).")
    # Images where the model takes vectors: the rank, in the same words.
    line = _bad(tmp_path, capsys, path, "--dataset=shapes", "--batch_size=16")
    assert ("x has shape (None, 32, 32, 3); model 'planted' input 'input_layer' takes "
            "(None, 32) (rank 2 expected, got 4)") in line


def test_targets_that_do_not_fit_name_both_shapes(tmp_path, capsys):
    path, _ = _planted(tmp_path)
    npz = tmp_path / "wide_y.npz"
    np.savez(npz, x=np.ones((32, 32), "float32"), y=np.zeros((32, 3), "int32"))
    line = _bad(tmp_path, capsys, path, f"--dataset=npz:{npz}", "--batch_size=16")
    assert line.endswith(
        f"--dataset='npz:{npz}': y has shape (32, 3); model 'planted' gives outputs of shape "
        "(None, 4), so y takes class indices (32,) or targets (32, 4). Accepted: npz:PATH "
        "with arrays x and y (or x0, x1, ... and y0, y1, ...).")


@pytest.mark.parametrize("kind", ["file", "under_a_file"])
def test_output_dir_is_checked_before_the_work(tmp_path, capsys, monkeypatch, kind):
    path, npz = _planted(tmp_path)
    (tmp_path / "afile").write_text("mine")
    out = tmp_path / "afile" if kind == "file" else tmp_path / "afile" / "out"
    traced = []
    monkeypatch.setattr(tf_mixed, "census", lambda *a, **k: traced.append(1))
    code = main(["tf_mixed", "doctor", path, f"--dataset=npz:{npz}", f"--output_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"tf_mixed doctor: error: --output_dir='{out}': ")
    assert ("exists and is not a directory" if kind == "file" else "cannot be written") in err[0]
    assert traced == []  # refused before the census
    assert (tmp_path / "afile").read_text() == "mine"


def test_unknown_policy(tmp_path, capsys):
    path, npz = _planted(tmp_path)
    line = _bad(tmp_path, capsys, path, f"--dataset=npz:{npz}", "--policy=fp12")
    assert "--policy='fp12': unknown policy" in line
    assert "mixed_bfloat16" in line  # the accepted names


@pytest.mark.slow
@pytest.mark.parametrize("args, expected", [
    ((), "expected exactly one MODEL"),
    (("a.keras", "--steps=0"), "--steps=0"),
    (("a.keras", "--jit_compile=maybe"), "jit_compile"),
])
def test_bad_flags(tmp_path, capsys, args, expected):
    assert expected in _bad(tmp_path, capsys, *args)


def test_a_float32_model_starts_with_turning_mixed_precision_on(tmp_path, capsys):
    path, out = _small(tmp_path, keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(32, name="hidden"),
         keras.layers.Dense(4, name="head")], name="plain"), "plain")
    code = _doctor(path, tmp_path)
    printed = capsys.readouterr().out
    assert code == 0
    first = printed.split("\n\n")[0]
    assert first.startswith("Start here: model 'plain' computes in float32")
    assert "tf_mixed.enable()" in first
    # The policy this host should try (no GPU here unless faked: mixed_bfloat16).
    policy = doctor.host_policy()
    assert f"tf_mixed.convert(model, '{policy}') on this host" in first
    assert f"python -m tf_mixed doctor {path} --policy={policy}" in first
    assert json.loads((out / "doctor.json").read_text())["first_change"] == first
    # Run as it says: converted, the model starts with its census instead.
    code = _doctor(path, tmp_path, f"--policy={policy}")
    assert code == 0 and capsys.readouterr().out.startswith("Census of model 'plain'")
    assert json.loads((out / "doctor.json").read_text())["first_change"] is None


@pytest.mark.slow
def test_doctor_plan_proposes_a_precision_per_layer(tmp_path, capsys):
    path, npz = _planted(tmp_path)
    out = tmp_path / "out"
    code = main(["tf_mixed", "doctor", path, f"--dataset=npz:{npz}", "--batch_size=16",
                 "--plan", f"--output_dir={out}"])
    printed = capsys.readouterr().out
    assert code == 0
    plan = json.loads((out / "doctor.json").read_text())["plan"]
    assert [row["name"] for row in plan["layers"]] == ["wide", "island", "out"]
    assert all(row["choice"] in ("float32", "bfloat16", "float16") for row in plan["layers"])
    assert "Plan for model 'planted'" in printed and "Apply: " in printed


def test_the_next_policy_suggested_is_this_hosts():
    # Issue 37: a bfloat16 host was told to try --policy=mixed_float16 next.
    assert doctor.host_policy(has_gpu=True) == "mixed_float16"
    assert doctor.host_policy(has_gpu=False) == "mixed_bfloat16"

    class Report:
        policy, model_name = "float32", "plain"

    text = doctor.first_change(Report(), "m.keras", "mixed_bfloat16")
    assert "python -m tf_mixed doctor m.keras --policy=mixed_bfloat16; or let" in text
    assert "tf_mixed.convert(model, 'mixed_bfloat16') on this host" in text


@pytest.mark.slow
def test_doctor_plan_on_the_default_generated_dataset(tmp_path, capsys):
    # `--plan` with the default --dataset=shapes failed: the generated set is
    # a tf.data dataset of batches, which the plan takes as it is.
    inp = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(8, 3, activation="relu", name="conv")(inp)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    out = keras.layers.Dense(10, name="logits")(h)
    path = tmp_path / "cnn.keras"
    keras.Model(inp, out, name="cnn").save(path)
    out_dir = tmp_path / "out"
    code = main(["tf_mixed", "doctor", str(path), "--batch_size=8", "--batches=1",
                 "--plan", f"--output_dir={out_dir}"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    plan = json.loads((out_dir / "doctor.json").read_text())["plan"]
    assert [row["name"] for row in plan["layers"]] == ["conv", "pool", "logits"]
    assert "Plan for model 'cnn'" in printed.out
