"""tf_mixed.census over the model zoo (tests/support/zoo.py): every kind, built and reloaded."""

import keras
import pytest
from zoo import ZOO, reloaded_model

import tf_mixed
from tf_mixed._internal.facts import walk_layers


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_census_over_the_zoo(name):
    keras.config.set_dtype_policy("mixed_bfloat16")
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(16)
    report = tf_mixed.census(model, x, y, loss=spec.loss, batch_size=16)
    assert report.policy == "mixed_bfloat16"
    assert report.batch_size == 16
    assert 0.0 < report.half_flop_share <= 1.0
    assert report.casts_per_step > 0  # float32 weights cast to bfloat16 at least
    # Every cast and island belongs to a layer of the model or a named part of the step.
    layers = {n for n, _ in walk_layers(model)}
    for row in report.casts:
        assert row.layer in layers or row.layer.startswith("("), (name, row)
    assert str(report)
    report.to_dict()


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_census_of_the_reloaded_zoo(name):
    model = reloaded_model(name)  # float32, compiled with its loss
    x, y = ZOO[name].data(16)
    report = tf_mixed.census(model, x, y, batch_size=16)
    assert report.policy == "float32"
    assert report.half_flop_share == 0.0
    assert report.findings == ()

