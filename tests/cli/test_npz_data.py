"""``--dataset=npz:PATH``: one reader, one sentence per wrong file (probe, doctor, export).

Each case names the file, the array, the shape received and what the model
expects; the last test checks that the three commands print the same line.
"""

import keras
import numpy as np
import pytest

from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.cli import npz_data
from tf_mixed.cli.main import main

XY = "Accepted: npz:PATH with arrays x and y (or x0, x1, ... and y0, y1, ...)."


@pytest.fixture(scope="module")
def model():
    inputs = keras.Input((8,), name="features")
    return keras.Model(inputs, keras.layers.Dense(3)(inputs), name="m")


def _file(tmp_path, name="d", **arrays):
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    return f"npz:{path}"


def _refused(spec, model, need_y=True):
    with pytest.raises(UsageError) as info:
        npz_data.load(spec, model, need_y=need_y, limit=4)
    return str(info.value)


X, Y = np.zeros((16, 8), "float32"), np.zeros(16, "int32")


def test_a_good_file_gives_its_first_examples(tmp_path, model):
    x, y = npz_data.load(_file(tmp_path, x=X, y=Y), model, need_y=True, limit=4)
    assert x.shape == (4, 8) and y.shape == (4,)
    x, y = npz_data.load(_file(tmp_path, x=X), model, need_y=False, limit=5)
    assert x.shape == (5, 8) and y is None
    # Targets of the output's shape, and class indices with a trailing 1, are taken too.
    for targets in (np.zeros((16, 3)), np.zeros((16, 1))):
        assert npz_data.load(_file(tmp_path, x=X, y=targets), model, need_y=True, limit=2)


def test_x_of_the_wrong_width_or_rank(tmp_path, model):
    spec = _file(tmp_path, x=np.zeros((16, 7)), y=Y)
    assert _refused(spec, model) == (
        f"--dataset={spec!r}: x has shape (16, 7); model 'm' input 'features' takes "
        f"(None, 8) (width 8 expected, got 7). {XY}")
    spec = _file(tmp_path, x=np.zeros((16, 8, 1)), y=Y)
    assert "x has shape (16, 8, 1); model 'm' input 'features' takes (None, 8) " \
           "(rank 2 expected, got 3)" in _refused(spec, model)


def test_arrays_of_different_lengths(tmp_path, model):
    spec = _file(tmp_path, x=X, y=np.zeros(10))
    assert _refused(spec, model) == (
        f"--dataset={spec!r}: the arrays hold different numbers of examples: x has 16 and "
        f"y has 10. {XY}")


def test_targets_that_fit_neither_indices_nor_the_output(tmp_path, model):
    spec = _file(tmp_path, x=X, y=np.zeros((16, 5)))
    assert _refused(spec, model) == (
        f"--dataset={spec!r}: y has shape (16, 5); model 'm' gives outputs of shape (None, 3), "
        f"so y takes class indices (16,) or targets (16, 3). {XY}")
    spec = _file(tmp_path, "flat", x=X, y=np.float32(1.0))
    assert "y has shape (); it needs one target per example" in _refused(spec, model)


def test_missing_arrays_name_what_the_file_has(tmp_path, model):
    assert "the file has no y array (it has x). " + XY in _refused(_file(tmp_path, x=X), model)
    spec = _file(tmp_path, y=Y)
    assert _refused(spec, model, need_y=False) == (
        f"--dataset={spec!r}: the file has no x array (it has y). Accepted: npz:PATH with an "
        "array x (or x0, x1, ...).")


def test_a_model_of_two_inputs_needs_x0_and_x1(tmp_path):
    a, b = keras.Input((8,), name="a"), keras.Input((2,), name="b")
    model = keras.Model([a, b], keras.layers.Dense(3)(keras.layers.Concatenate()([a, b])),
                        name="two")
    spec = _file(tmp_path, x=X, y=Y)
    assert "model 'two' takes 2 input(s); the data has 1 x array(s) (x)" in _refused(spec, model)
    spec = _file(tmp_path, "n", x0=X, x1=np.zeros((16, 3)), y=Y)
    assert "x1 has shape (16, 3); model 'two' input 'b' takes (None, 2)" in _refused(spec, model)
    x, y = npz_data.load(_file(tmp_path, "ok", x0=X, x1=np.zeros((16, 2)), y=Y), model,
                         need_y=True, limit=3)
    assert [a.shape for a in x] == [(3, 8), (3, 2)] and y.shape == (3,)


def test_no_file_and_not_an_archive(tmp_path, model):
    missing = f"npz:{tmp_path / 'none.npz'}"
    assert f"no such file {str(tmp_path / 'none.npz')!r}. " in _refused(missing, model)
    text = tmp_path / "text.npz"
    text.write_text("not numbers")
    assert f"{str(text)!r} is not an .npz archive (numpy.savez writes one)" in _refused(
        f"npz:{text}", model)


def test_probe_doctor_and_export_say_a_wrong_shape_in_the_same_words(tmp_path, model, capsys):
    # Under a second: three commands load a two-layer model and stop at its data.
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    path = str(tmp_path / "m.keras")
    model.save(path)
    spec = _file(tmp_path, x=np.zeros((16, 7)), y=Y)
    said = []
    for command in ("probe", "doctor", "export"):
        out = tmp_path / command
        assert main(["tf_mixed", command, path, f"--dataset={spec}",
                     f"--output_dir={out}"]) == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith(f"tf_mixed {command}: error: ") and not out.exists()
        said.append(line.split(": error: ")[1].split(" Accepted: ")[0])
    assert said == [f"--dataset={spec!r}: x has shape (16, 7); model 'm' input 'features' "
                    "takes (None, 8) (width 8 expected, got 7)."] * 3
