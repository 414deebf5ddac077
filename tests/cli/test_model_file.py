"""Loading the MODEL argument of the model commands (`tf_mixed.cli.model_file`)."""

import warnings

import keras

from tf_mixed.cli import model_file


def test_a_compiled_untrained_model_loads_without_keras_optimizer_warning(tmp_path):
    # Compiled, saved before any training: its optimizer was never built, and Keras
    # warns on load that it skips that state, which no command uses.
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    model.save(tmp_path / "m.keras")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        loaded = model_file.load(str(tmp_path / "m.keras"))
    assert [str(w.message) for w in shown] == []
    assert loaded.output_shape == (None, 2)
