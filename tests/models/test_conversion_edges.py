"""Issue 17's edge cases of probe, convert and keep_float32 beyond the zoo sweep.

Nested overflow found and fixed at the innermost layer; non-finite data
reported as data; multi-output losses; the probe CLI's up-front checks.
"""

import math
import warnings

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed._internal import losses as _losses
from tf_mixed.cli import probe as bench_probe


@keras.saving.register_keras_serializable(package="tf_mixed_tests")
class SquareSum(keras.layers.Layer):
    """Sum of squares: 16 values of ~300 sum to ~1.5e6, beyond float16's 65504."""

    def call(self, x):
        return keras.ops.sum(keras.ops.square(x), axis=-1, keepdims=True) / 1e6


def _nested_overflow():
    inner_in = keras.Input((16,))
    h = keras.layers.Dense(16, kernel_initializer="identity", name="proj")(inner_in)
    encoder = keras.Model(inner_in, SquareSum(name="sqsum")(h), name="encoder")
    inputs = keras.Input((16,), name="x")
    out = keras.layers.Dense(1, kernel_initializer="ones", name="head", dtype="float32")(
        encoder(inputs))
    return keras.Model(inputs, out, name="outer")


def _overflow_batch(n=8):
    x = np.random.default_rng(0).uniform(250, 350, (n, 16)).astype("float32")
    return x, np.ones((n, 1), "float32")


def _finite(model, x):
    return bool(np.isfinite(np.asarray(model(x))).all())


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # planted
def test_nested_overflow_is_reported_and_fixed_at_the_innermost_layer():
    x, y = _overflow_batch()
    model = _nested_overflow()
    report = tf_mixed.probe(model, x, y, loss="mse")
    assert (report.first_nonfinite, report.first_nonfinite_in) == ("encoder/sqsum", "forward")
    rows = {row.name: row for row in report.layers}
    assert rows["encoder/proj"].nonfinite == 0 and rows["encoder/sqsum"].nonfinite == 1.0
    assert "keep_float32=['sqsum']" in report.advice
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_mixed.models.ConversionNote)
        assert not _finite(tf_mixed.convert(model, "mixed_float16"), x)
        # The advice works, and so does naming the nested model.
        assert _finite(tf_mixed.convert(model, "mixed_float16", keep_float32=["sqsum"]), x)
        whole = tf_mixed.convert(model, "mixed_float16", keep_float32=["encoder"])
    assert _finite(whole, x)
    assert {layer.compute_dtype for layer in whole.get_layer("encoder").layers[1:]} == {"float32"}


@pytest.mark.slow
@pytest.mark.parametrize("keep", [["sqsum"], ["encoder"]])
def test_enable_keep_float32_names_an_inner_layer_or_the_nested_model(keep):
    x, _ = _overflow_batch()
    tf_mixed.enable("mixed_float16", quiet=True)
    assert not _finite(_nested_overflow(), x)
    tf_mixed.enable("mixed_float16", quiet=True, keep_float32=keep)
    model = _nested_overflow()
    assert _finite(model, x)
    encoder = model.get_layer("encoder")
    assert encoder.get_layer("sqsum").compute_dtype == "float32"
    assert encoder.get_layer("proj").compute_dtype == (
        "float32" if keep == ["encoder"] else "float16")


def test_enable_keep_float32_nested_sequential_added_later():
    tf_mixed.enable("mixed_bfloat16", quiet=True, keep_float32=["encoder"])
    encoder = keras.Sequential(name="encoder")
    encoder.add(keras.layers.Dense(4, name="inner"))
    model = keras.Sequential([keras.Input((3,)), encoder, keras.layers.Dense(1, name="out")])
    assert encoder.get_layer("inner").compute_dtype == "float32"
    assert model.get_layer("out").compute_dtype == "bfloat16"
    assert model(np.ones((2, 3), "float32")).dtype == "bfloat16"


@pytest.mark.slow
@pytest.mark.parametrize("where, batch, example, column", [("x", 1, 2, 5), ("y", 0, 3, 0)])
def test_non_finite_data_is_a_data_problem_with_batch_and_column(where, batch, example, column):
    x, y = _overflow_batch(8)
    x, y = x / 300, y.copy()
    (x if where == "x" else y)[batch * 4 + example, column] = np.nan
    with pytest.raises(ValueError, match=(
            rf"{where} holds 1 inf/NaN value\(s\), the first \(nan\) in batch {batch}, "
            rf"example {example}, column {column}\. This is a data problem")):
        tf_mixed.probe(_nested_overflow(), x, y, loss="mse", batches=2)


def test_nan_made_in_float32_too_is_not_called_a_precision_problem():
    inputs = keras.Input((4,))
    out = keras.layers.Lambda(lambda t: keras.ops.log(t - 10.0), name="log")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(out))
    report = tf_mixed.probe(model, np.ones((4, 4), "float32"), np.ones((4, 1), "float32"),
                            loss="mse")
    assert report.first_nonfinite == "log"
    assert math.isinf({r.name: r for r in report.layers}["log"].float32_max_abs)
    assert "float32 run too: this is not a precision problem" in report.advice


def _two_heads():
    inputs = keras.Input((4,), name="x")
    a = keras.layers.Dense(1, kernel_initializer="ones", name="a")(inputs)
    b = keras.layers.Dense(1, kernel_initializer="zeros", name="b")(inputs)
    return keras.Model(inputs, [a, b])


def test_multi_output_loss_list_dict_and_compiled_sum_exactly():
    model = _two_heads()
    x = np.ones((2, 4), "float32")  # a = 4, b = 0
    y = [np.zeros((2, 1), "float32"), np.ones((2, 1), "float32")]
    preds = model(x)
    for loss in (["mse", "mae"], {"a": "mse", "b": "mae"}):
        assert float(_losses.resolve(loss, model)(y, preds)) == 16.0 + 1.0
    assert float(_losses.resolve({"b": "mae"}, model)(y, preds)) == 1.0
    model.compile(optimizer="sgd", loss=["mse", "mse"])
    report = tf_mixed.probe(model, x, y)  # compiled multi-output: no longer refused
    # d(mse)/d(a) = 2 * 4 / 2 = 4 per example overflows at 2**15; the kernel
    # gradient, 2 examples * 1 * 4 = 8, sets the scale: 2**floor(log2(65504 / 8)).
    assert (report.first_nonfinite, report.first_nonfinite_in) == ("a", "backward")
    assert report.recommended_scale == 2.0**12


@pytest.mark.slow
@pytest.mark.parametrize("loss, match", [
    (["mse"], r"1 losses for the 2 output\(s\) of model"),
    ({"c": "mse"}, r"names outputs model .* does not have: \['c'\]"),
    ("mse", r"one loss name for the 2 outputs .* loss=\['mse', 'mse'\]"),
    (["mse", 3], "loss must be"),
])
def test_multi_output_loss_mismatch_is_named(loss, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _losses.resolve(loss, _two_heads())


# ---------------------------------------------------------------- the probe CLI


def _saved_regression(tmp_path, compiled):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(inputs))
    if compiled:
        model.compile(optimizer="sgd", loss="mse")
    path = str(tmp_path / "m.keras")
    model.save(path)
    npz = str(tmp_path / "d.npz")
    np.savez(npz, x=np.ones((8, 4), "float32"), y=np.full((8, 1), 0.5, "float32"))
    return path, npz


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "under_file"])
def test_cli_bad_output_dir_fails_first_one_line(tmp_path, capsys, kind, monkeypatch):
    path, npz = _saved_regression(tmp_path, True)
    blocker = tmp_path / "taken"
    blocker.write_text("a file")
    out = blocker if kind == "file" else blocker / "sub" / "dir"
    loaded = []
    monkeypatch.setattr("tf_mixed.cli.model_file.load", lambda *a: loaded.append(a))
    code = bench_probe.main(["tf_mixed probe", path, f"--dataset=npz:{npz}",
                             f"--output_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert ("exists and is not a directory" if kind == "file" else "cannot be written") in err
    assert loaded == []  # refused before loading the model, let alone probing
    assert blocker.read_text() == "a file"


def test_cli_classifier_labels_that_do_not_fit_are_one_line(tmp_path, capsys):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(inputs))  # 3 classes
    path = str(tmp_path / "c.keras")
    model.save(path)
    npz = str(tmp_path / "d.npz")
    np.savez(npz, x=np.ones((8, 4), "float32"), y=np.ones((8, 2), "float32"))  # not labels
    out = tmp_path / "out"
    code = bench_probe.main(["tf_mixed probe", path, f"--dataset=npz:{npz}",
                             f"--output_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--dataset='npz:{npz}': y has shape (8, 2); model " in err, err
    assert "so y takes class indices (8,) or targets (8, 3)" in err and "Traceback" not in err
    assert not out.exists()


def test_cli_uncompiled_regression_without_loss_is_one_line_with_the_fix(tmp_path, capsys):
    path, npz = _saved_regression(tmp_path, False)
    out = tmp_path / "out"
    code = bench_probe.main(["tf_mixed probe", path, f"--dataset=npz:{npz}",
                             f"--output_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "is not compiled, so the loss must be given" in err and "pass --loss=NAME" in err
    assert not out.exists()
    assert bench_probe.main(["tf_mixed probe", path, f"--dataset=npz:{npz}", "--loss=mse",
                             f"--output_dir={out}"]) == 0
