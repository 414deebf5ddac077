"""What a clone knows as it is built: each layer's outputs in its graph
(`Clone.outputs`, the probe's taps), and random layers that draw nothing
(``random_draws=False``, the probe's copies)."""

import keras
import numpy as np
import pytest
from zoo import ZOO

from tf_mixed._internal.facts import layer_outputs
from tf_mixed.models import cloning

BUILT = [name for name in ZOO if name != "sequential_no_input"]


@pytest.mark.parametrize("name", BUILT)
def test_an_inlined_clone_records_every_leaf_layers_outputs_as_keras_holds_them(name):
    flat = cloning.clone(ZOO[name].ready(), lambda layer: None, inline_nested=True)
    assert len(flat.outputs) == len(flat.layers)
    for (qualified, _, twin), made in zip(flat.layers, flat.outputs):
        assert [id(t) for t in made] == [id(t) for t in layer_outputs(twin)], qualified


def test_a_shared_layer_records_each_call():
    inputs = keras.Input((4,))
    shared = keras.layers.Dense(4, name="shared")
    model = keras.Model(inputs, shared(shared(inputs)))
    flat = cloning.clone(model, lambda layer: None, inline_nested=True)
    (name, _, _), = flat.layers
    assert name == "shared" and len(flat.outputs[0]) == 2


def test_a_functional_clone_records_its_layers_a_sequential_one_leaves_them_to_keras():
    functional = cloning.clone(ZOO["functional"].ready(), lambda layer: None)
    assert all(made for made in functional.outputs)
    sequential = cloning.clone(ZOO["sequential_input"].ready(), lambda layer: None)
    assert sequential.outputs == ((),) * len(sequential.layers)


def _random_model():
    inputs = keras.Input((4, 8))
    h = keras.layers.Dense(8, name="d1")(inputs)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    h = keras.layers.GaussianNoise(1.0, name="noise")(h)
    h = keras.layers.MultiHeadAttention(2, 4, dropout=0.5, name="mha")(h, h)
    return keras.Model(inputs, h)


def _trains_twice_alike(model, x) -> bool:
    a = keras.ops.convert_to_numpy(model(x, training=True))
    b = keras.ops.convert_to_numpy(model(x, training=True))
    return bool(np.array_equal(a, b))


def test_without_random_draws_every_random_layer_runs_as_in_inference():
    model = _random_model()
    x = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
    quiet = cloning.clone(model, lambda layer: None, inline_nested=True, random_draws=False)
    assert _trains_twice_alike(quiet.model, x)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(quiet.model(x, training=True)),
                               keras.ops.convert_to_numpy(model(x, training=False)),
                               rtol=1e-6, atol=1e-6)
    # By default a copy draws as the model does; the model itself is untouched.
    assert not _trains_twice_alike(cloning.clone(model, lambda layer: None).model, x)
    assert not _trains_twice_alike(model, x)
