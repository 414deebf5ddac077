"""tf_mixed.plan walks its model once: the survey it makes is what the layer
graph, the probe, the step check and its rows read (each entry point that
takes the survey gives what its public twin gives)."""

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed._internal import losses
from tf_mixed.models import conversion
from tf_mixed.policy import hardware, precision_map
from tf_mixed.tools import probing
from tf_mixed.tools.planning import LayerTiming, Measurement, layer_timing
from tf_mixed.tools.planning.planner import plan

AMX_CPU = hardware.HardwareInfo(cpu_model="Test Xeon", cpu_flags=frozenset({"avx512_bf16"}))


def _model():
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    h = keras.layers.ReLU(name="relu")(h)
    h = keras.layers.Dense(16, name="second")(h)
    return keras.Model(inputs, keras.layers.Dense(1, name="last")(h), name="chain")


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 8)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")


def _measurement():
    def timing(name, producers, f32, half):
        seconds = {"float32": (f32 * 1e-3,) * 5, "bfloat16": (half * 1e-3,) * 5}
        return LayerTiming(name, "Dense", tuple(producers), seconds, (1e-4,) * 5)

    # 'last' is faster in float32: the plan differs from both whole models.
    return Measurement(("float32", "bfloat16"),
                       (timing("first", [""], 4, 2), timing("second", ["first"], 4, 2),
                        timing("last", ["second"], 1, 3)), {"relu": "first"})


@pytest.fixture
def surveys(monkeypatch):
    """The models `precision_map.survey` walks while the test runs."""
    walked = []
    real = precision_map.survey

    def counting(model):
        walked.append(model.name)
        return real(model)

    monkeypatch.setattr(precision_map, "survey", counting)
    return walked


def test_a_plan_with_its_probe_and_step_check_walks_the_model_once(surveys):
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU)
    assert "whole step, median of 3 rounds" in p.summary  # the step check ran
    assert p.layers[0].error is not None  # the probe ran
    assert surveys == ["chain"]


def test_an_emulated_plan_walks_the_model_once(surveys):
    x, y = _data()
    cpu = hardware.HardwareInfo(cpu_model="Test EPYC", cpu_flags=frozenset({"avx2"}))
    p = plan(_model(), x, y, loss="mse", info=cpu)
    assert set(p.choices.values()) == {"float32"}
    assert surveys == ["chain"]


@pytest.mark.parametrize("name", ZOO)
def test_the_survey_holds_the_top_layers_and_the_inputs(name):
    model = ZOO[name].ready()
    found = precision_map.survey(model)
    inputs = [layer for layer in model.layers if isinstance(layer, keras.layers.InputLayer)]
    assert list(found.top) == [layer for layer in model.layers if layer not in inputs]
    assert {id(layer) for layer in inputs} <= found.inputs
    for tensor in keras.tree.flatten(model.inputs):
        assert id(tensor._keras_history.operation) in found.inputs
    assert not any(id(layer) in found.inputs for layer in found.top)


@pytest.mark.parametrize("name", ZOO)
def test_the_surveyed_graph_is_the_layer_graph(name):
    model = ZOO[name].ready()
    timed, producers, followers = layer_timing.layer_graph(model)
    s_timed, s_producers, s_followers = layer_timing.surveyed_graph(precision_map.survey(model))
    assert [layer.name for layer in s_timed] == [layer.name for layer in timed]
    assert (s_producers, s_followers) == (producers, followers)


@pytest.mark.parametrize("name", ["functional", "nested", "embedding", "multi_output"])
def test_probe_surveyed_gives_probes_report(name):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(8)
    report = tf_mixed.probe(model, x, y, loss=spec.loss, policy="mixed_bfloat16")
    found = precision_map.survey(model)
    loss_fn = losses.resolve_named(spec.loss, found.output_names, model, "probe()")
    again = probing.probe_surveyed(found, x, y, loss_fn, policy="mixed_bfloat16")
    assert [(s.name, s.compute_dtype) for s in again.layers] == [
        (s.name, s.compute_dtype) for s in report.layers]
    np.testing.assert_allclose([s.rel_error for s in again.layers],
                               [s.rel_error for s in report.layers])
    assert again.advice == report.advice


@pytest.mark.parametrize("name", ["functional", "nested", "multi_output"])
def test_apply_surveyed_builds_what_convert_builds(name):
    model = ZOO[name].ready()
    found = precision_map.survey(model)
    precision = precision_map.decide(model, "mixed_bfloat16", keep_float32=["d1"]
                                     if name == "functional" else (), found=found)
    copy = conversion.apply_surveyed(found, precision)
    same = tf_mixed.convert(model, "mixed_bfloat16",
                            keep_float32=["d1"] if name == "functional" else ())
    assert [(layer.name, layer.dtype_policy.name) for layer in copy.layers] == [
        (layer.name, layer.dtype_policy.name) for layer in same.layers]
    for a, b in zip(copy.weights, same.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
