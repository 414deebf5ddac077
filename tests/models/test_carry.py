"""tf_mixed.models.carry: what Keras's saving carries from a layer to its copy."""

import keras
import numpy as np

from tf_mixed.models import carry, cloning


def _copy(layer, dtype=None):
    twin = cloning.recreate(layer, dtype)
    return twin


def test_an_adapted_normalization_copy_computes_with_its_statistics():
    norm = keras.layers.Normalization()
    data = np.array([[1.0, 100.0], [3.0, 300.0]], "float32")
    norm.adapt(data)
    twin = _copy(norm)
    twin.build((None, 2))
    cloning.copy_weights(norm, twin)
    np.testing.assert_array_equal(np.asarray(twin.mean), [[0.0, 0.0]])  # not carried yet
    carry.carry_state(norm, twin)
    np.testing.assert_array_equal(np.asarray(twin.mean), [[2.0, 200.0]])
    np.testing.assert_array_equal(np.asarray(twin(data)), np.asarray(norm(data)))


def test_a_lookup_copy_gets_its_vocabulary():
    lookup = keras.layers.StringLookup()
    lookup.adapt(np.array([["b"], ["a"], ["b"]]))
    twin = _copy(lookup)
    carry.carry_state(lookup, twin)
    assert twin.get_vocabulary() == lookup.get_vocabulary() == ["[UNK]", "b", "a"]
    words = np.array([["a"], ["b"], ["z"]])
    np.testing.assert_array_equal(np.asarray(twin(words)), [[2], [1], [0]])


def test_a_text_vectorization_copy_inside_a_model_gets_its_vocabulary():
    vectorize = keras.layers.TextVectorization(max_tokens=8, output_sequence_length=3,
                                               name="vectorize")
    vectorize.adapt(np.array(["red green", "green blue", "green"]))
    inputs = keras.Input((), dtype="string")
    model = keras.Model(inputs, vectorize(inputs))
    copy = cloning.clone(model, lambda layer: None).model
    text = np.array(["green red", "blue cyan"])
    np.testing.assert_array_equal(np.asarray(copy(text)), np.asarray(model(text)))


def test_a_discretization_after_adapt_is_copied_with_its_boundaries():
    bins = keras.layers.Discretization(num_bins=2)
    bins.adapt(np.array([[0.0], [1.0], [2.0], [3.0]], "float32"))
    twin = _copy(bins, "mixed_bfloat16")
    assert twin.bin_boundaries == bins.bin_boundaries
    x = np.array([[0.5], [2.5]], "float32")
    np.testing.assert_array_equal(np.asarray(twin(x)), np.asarray(bins(x)))
