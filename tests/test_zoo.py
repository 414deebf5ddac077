"""Every model-taking API of tf_mixed over the model zoo (tests/zoo.py)."""

import keras
import numpy as np
import pytest
from zoo import KINDS, ZOO, reloaded_model


def test_zoo_covers_every_kind():
    assert {spec.kind for spec in ZOO.values()} == set(KINDS)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_trains_a_step_and_is_deterministic(name):
    spec = ZOO[name]
    x, y = spec.data(8)
    first, second = spec.compiled(), spec.compiled()
    for a, b in zip(first.get_weights(), second.get_weights()):
        np.testing.assert_array_equal(a, b)
    loss = first.train_on_batch(x, y)
    assert np.all(np.isfinite(loss))


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_reloaded_in_a_fresh_process_predicts_the_same(name):
    spec = ZOO[name]
    x = spec.data(4)[0]
    model = reloaded_model(name)
    assert model.compiled
    want = spec.ready().predict(x, verbose=0)
    got = model.predict(x, verbose=0)
    for w, g in zip(keras.tree.flatten(want), keras.tree.flatten(got)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
