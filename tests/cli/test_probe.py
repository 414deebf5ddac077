"""``python -m tf_mixed probe``'s data defaults fit the model given, or one sentence says
which flag to pass (issue 46: a 5-class model failed with TensorFlow's "label value of 9
outside the valid range [0, 5)")."""

import types

import keras
import numpy as np
import pytest

from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.cli import probe


def _flags(dataset="shapes"):
    return types.SimpleNamespace(batch_size=8, batches=2, dataset=dataset, seed=0, data_dir="")


def _classifier(classes, shape=(16, 16, 3)):
    inputs = keras.Input(shape)
    x = keras.layers.Conv2D(4, 3)(inputs) if len(shape) == 3 else inputs
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(classes, activation="softmax")(x), name="m")


def test_labels_fit_a_model_with_fewer_classes_and_it_is_said_once(capsys):
    x, y = probe._batches(_flags(), _classifier(5))
    assert y is None
    labels = np.concatenate([b[1].numpy() for b in x])
    assert labels.size == 16 and labels.min() >= 0 and labels.max() < 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "tf_mixed: note: the shapes data has 10 classes and model 'm' outputs 5: labels folded")
    assert "--dataset=npz:PATH" in err


def test_a_model_as_wide_as_the_data_keeps_its_labels(capsys):
    x, _ = probe._batches(_flags(), _classifier(10))
    assert next(iter(x))[0].shape == (8, 16, 16, 3)  # the model's own image side
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("model, problem", [
    (lambda: _classifier(3, shape=(8,)), "model 'm' takes inputs of shape (8,); the shapes set "
                                         "gives RGB images (height, width, 3)"),
    (lambda: _classifier(1), "model 'm' has 1 output unit; the shapes set has 10 classes"),
])
def test_data_that_cannot_fit_is_one_sentence_naming_the_flag(model, problem):
    with pytest.raises(UsageError) as raised:
        probe._batches(_flags(), model())
    assert str(raised.value) == (
        f"--dataset='shapes': {problem}. Pass your own data: --dataset=npz:PATH with arrays x "
        "and y (numpy.savez(PATH, x=..., y=...)).")
