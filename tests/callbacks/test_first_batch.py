"""The monitor's fit-start catalog check reads each layer's input magnitudes on the first batch."""

import warnings

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed._internal.warning import MixedPrecisionWarning
from tf_mixed.callbacks import first_batch, skip_contract
from tf_mixed.callbacks.monitor import LossScaleMonitor
from tf_mixed.tools.catalog import model_check, results


def _norm_model():
    """A LayerNormalization fed the raw inputs, then a Dense (float16) and a float32 head."""
    inputs = keras.Input((4,))
    x = keras.layers.LayerNormalization(name="norm")(inputs)
    x = keras.layers.Dense(4, name="hidden")(x)
    outputs = keras.layers.Dense(1, name="out", dtype="float32")(x)
    return keras.Model(inputs, outputs)


def _data(n, scale_rows=(), scale=1e5):
    x = np.random.default_rng(0).uniform(-1.0, 1.0, (n, 4)).astype("float32")
    x[:, 0] = 1.0  # max |x| of every example: exactly 1
    for i in scale_rows:
        x[i, 0] = scale
    return x, np.zeros((n, 1), "float32")


def _fit(model, x, y, batch_size, **monitor_kwargs):
    with model.distribute_strategy.scope():
        model.compile(optimizer=tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.0)),
                      loss="mse")
    monitor = LossScaleMonitor(check_policy=False, **monitor_kwargs)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0,
                  callbacks=[monitor])
    return [str(w.message) for w in record if issubclass(w.category, MixedPrecisionWarning)]


@pytest.fixture
def fp16():
    tf_mixed.enable("mixed_float16", quiet=True)


def test_a_layer_fed_beyond_its_safe_range_warns_at_fit_start(fp16):
    model = _norm_model()
    x, y = _data(8, scale_rows=[3])
    (message,) = _fit(model, x, y, batch_size=8)
    row = model_check.row_for(results.stored(), model.get_layer("norm"), "mixed_float16")
    assert "[warning] norm: Layer 'norm' (LayerNormalization)" in message
    assert "max |x| = 1e+05" in message and row.safe.text() in message
    assert row.key in message and "keep_float32=['norm']" in message
    assert "the first batch's inputs" in message


def test_inside_the_safe_range_nothing_is_said(fp16):
    x, y = _data(8)
    assert _fit(_norm_model(), x, y, batch_size=8) == []


def test_only_the_first_batch_is_read(fp16):
    # Example 12 is in the second batch: a check of the first batch only.
    x, y = _data(16, scale_rows=[12])
    model = _norm_model()
    assert _fit(model, x, y, batch_size=8) == []
    found = first_batch.install(model)  # armed again, as the next fit's monitor does
    assert found.read() is None  # no step has read a batch since


def test_check_setup_false_does_not_wrap_the_step(fp16):
    model = _norm_model()
    x, y = _data(8, scale_rows=[3])
    assert _fit(model, x, y, batch_size=8, check_setup=False) == []
    assert not first_batch.installed(model)


@pytest.mark.slow
def test_the_wrapper_keeps_the_skip_contract_and_a_second_fit_reads_again(fp16):
    model = _norm_model()
    x, y = _data(8, scale_rows=[3])
    assert len(_fit(model, x, y, batch_size=8)) == 1
    assert skip_contract.installed(model) and first_batch.installed(model)
    assert first_batch.install(model).read() is None  # armed
    model.fit(*_data(8), batch_size=8, verbose=0)  # no monitor: the armed step still reads
    assert first_batch.install(model) is not None
    x2, y2 = _data(8)
    assert _fit(model, x2, y2, batch_size=8) == []


def test_magnitudes_are_exact_per_layer(fp16):
    model = _norm_model()
    model.compile(optimizer="sgd", loss="mse")
    found = first_batch.install(model)
    model.make_train_function(force=True)
    x, y = _data(4, scale_rows=[2], scale=300.0)
    model.train_on_batch(x, y)
    read = found.read()
    assert set(read) == {"norm", "hidden"}  # "out" computes in float32: not judged
    assert read["norm"] == 300.0 and 0 < read["hidden"] < 10


@pytest.mark.slow
def test_under_a_strategy_every_replica_judges_the_global_magnitude(fp16, mirrored):
    # Batch 8 over two replicas: examples 4-7 are the second replica's.
    with mirrored.scope():
        model = _norm_model()
    (message,) = _fit(model, *_data(8, scale_rows=[6]), batch_size=8)
    assert "max |x| = 1e+05" in message
    found = first_batch.install(model)  # armed again
    model.fit(*_data(8, scale_rows=[7], scale=300.0), batch_size=8, verbose=0)
    # Each replica read its own half (which replica gets which half is the
    # input pipeline's choice); the check judges the largest of them.
    copies = first_batch._gathered(mirrored, found._seen)
    column = found.names.index("norm")
    assert sorted(copies[:, column].tolist()) == [1.0, 300.0]
    assert found.read()["norm"] == 300.0


@pytest.mark.parametrize("name", ZOO)
def test_the_zoo_under_float16_reaches_no_layers_unsafe_range(fp16, name):
    # What the fit-start check judges: the tap's magnitudes on a batch (the
    # fit itself over the zoo is the slow test below).
    spec = ZOO[name]
    model = spec.ready()
    names = model_check.bounded_layers(model)
    owners, tap = model_check.input_tap(model, names)
    magnitudes = model_check.input_magnitudes(model, spec.data(8)[0])
    assert set(owners) <= set(magnitudes)
    notes = model_check.check_model(model, magnitudes, has_gpu=True)
    assert not [n for n in notes if n.code in ("catalog_range", "catalog_unmatched")], notes


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_the_zoo_fits_under_float16_without_a_catalog_warning(fp16, name):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(8)
    model.compile(optimizer=tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.0)),
                  loss=spec.loss)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[LossScaleMonitor(check_policy=False)])
    messages = [str(w.message) for w in record if issubclass(w.category, MixedPrecisionWarning)]
    assert not [m for m in messages if "catalog_range" in m or "first batch" in m], messages
