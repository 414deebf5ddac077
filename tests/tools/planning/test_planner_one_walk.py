"""tf_mixed.plan walks its model once: the survey it makes is what the layer
graph, the catalog read, the probe, the step check, its rows and its map
read, and no stage asks tf_mixed's facts or the shims about the model again
(each entry point that takes the survey gives what its public twin gives)."""

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed._internal import facts, losses, shims
from tf_mixed.models import conversion
from tf_mixed.policy import hardware, keep_float32, precision_map
from tf_mixed.tools import probing
from tf_mixed.tools.catalog import matching, model_check
from tf_mixed.tools.planning import (
    LayerTiming,
    Measurement,
    catalog_errors,
    choosing,
    layer_timing,
    plan_rows,
    plan_table,
    planner,
)
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

    # 'second' is faster in float32: the plan differs from both whole models
    # ('last', the output, is float32 in every map).
    return Measurement(("float32", "bfloat16"),
                       (timing("first", [""], 4, 2), timing("second", ["first"], 1, 3),
                        timing("last", ["second"], 4, 2)), {"relu": "first"})


@pytest.fixture
def surveys(monkeypatch):
    """The models `precision_map.survey` walks while the test runs."""
    walked = []
    real = precision_map.survey

    def counting(model, *args, **kwargs):
        walked.append(model.name)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(precision_map, "survey", counting)
    return walked


def test_a_plan_with_its_probe_and_step_check_walks_the_model_once(surveys):
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU)
    assert "whole step, median of 3 rounds" in p.summary  # the step check ran
    assert p.layers[0].error is not None  # the probe ran
    assert surveys == ["chain"]


def test_a_plan_that_times_its_layers_walks_the_model_once(surveys, monkeypatch):
    # The default timer timed on a second survey of the model (its layer
    # graph walked again); it reads the plan's. The timings are fakes.
    from tf_mixed.policy import autotune

    monkeypatch.setattr(autotune, "first_call", lambda step, inputs, remapping_off: None)
    monkeypatch.setattr(autotune, "time_steps", lambda step, inputs, count: 1e-3)
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", info=AMX_CPU, rounds=3, cache=False,
             step_check=False, probe_report={"first": 0.0, "second": 0.0, "last": 0.0})
    assert [row.name for row in p.layers if row.seconds] == ["first", "second", "last"]
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


# ---------------------------------------------------------------- one survey, read by every stage

# What the survey asks about each layer (tf_mixed/_internal/facts.py and the
# shims), and the modules of the plan's stages that read the survey instead.
FACTS = ("activation_name", "is_input_layer", "keeps_float32_statistics", "rounded_ids",
         "walk_layers", "check_model_kind")
SHIMS = ("call_inputs", "keras_history")
READERS = (precision_map, keep_float32, layer_timing, catalog_errors, model_check, matching,
           choosing, plan_rows, plan_table, planner)


class _Recording:
    """A module's view of the shims that notes the calls made after the survey."""

    def __init__(self, module, late, state):
        self._module, self._late, self._state = module, late, state

    def __getattr__(self, name):
        real = getattr(shims, name)
        if name not in SHIMS:
            return real

        def recorded(*args, **kwargs):
            if self._state["surveyed"]:
                self._late.append(f"{self._module}: shims.{name}")
            return real(*args, **kwargs)

        return recorded


@pytest.fixture
def asked_late(monkeypatch):
    """The facts and shims the plan's stages ask about the model after its survey."""
    late: list[str] = []
    state = {"surveyed": False}
    real_survey = precision_map.survey

    def survey(model, *args, **kwargs):
        state["surveyed"] = False  # the survey itself asks
        found = real_survey(model, *args, **kwargs)
        state["surveyed"] = True
        return found

    for module in READERS:
        short = module.__name__.rsplit(".", 1)[-1]
        for name in FACTS:
            real = getattr(module, name, None)
            if real is None:
                continue

            def recorded(*args, _real=real, _where=f"{short}: facts.{name}", **kwargs):
                if state["surveyed"]:
                    late.append(_where)
                return _real(*args, **kwargs)

            monkeypatch.setattr(module, name, recorded)
        if hasattr(module, "_internals"):
            monkeypatch.setattr(module, "_internals", _Recording(short, late, state))
    monkeypatch.setattr(precision_map, "survey", survey)
    return late


def _timings_of(model, half="bfloat16"):
    """A measurement of every timed layer (the half dtype twice as fast)."""
    timed, producers, followers = layer_timing.layer_graph(model)
    return Measurement(("float32", half), tuple(
        LayerTiming(layer.name, type(layer).__name__, producers[layer.name],
                    {"float32": (2e-3,) * 3, half: (1e-3,) * 3}, (1e-4,) * 3)
        for layer in timed), followers)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_after_its_survey_a_plan_asks_no_fact_of_the_model_again(name, asked_late):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(8)
    measured = _timings_of(model)
    errors = {t.name: 0.0 for t in measured.layers}
    p = plan(model, x, y, loss=spec.loss, measurement=measured, probe_report=errors,
             info=AMX_CPU, step_check=False, cache=False)
    assert asked_late == []
    assert p.precision.layers  # the map was decided (from the survey)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_catalog_read_asks_no_fact_of_the_model_after_the_survey(name, asked_late):
    spec = ZOO[name]
    model = spec.ready()
    x, _ = spec.data(8)
    found = precision_map.survey(model)
    names = [layer.name for layer in layer_timing.surveyed_graph(found)[0]]
    read = catalog_errors.read(found, x, names, "mixed_bfloat16", 0.1)
    assert asked_late == []
    if read is not None:  # covered: the same errors as a read on a fresh survey
        assert read == catalog_errors.read(precision_map.survey(model), x, names,
                                           "mixed_bfloat16", 0.1)


def test_the_probe_and_step_check_stages_ask_no_fact_of_the_survey_side_again(asked_late):
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU)
    assert "whole step, median of 3 rounds" in p.summary and p.layers[0].error is not None
    assert asked_late == []


def test_an_emulated_plan_asks_no_fact_after_its_survey(asked_late):
    x, y = _data()
    cpu = hardware.HardwareInfo(cpu_model="Test EPYC", cpu_flags=frozenset({"avx2"}))
    p = plan(_model(), x, y, loss="mse", info=cpu)
    assert set(p.choices.values()) == {"float32"} and p.precision.target == "float32"
    assert asked_late == []


def test_a_plan_checks_the_model_kind_in_its_survey():
    class Sub(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(TypeError, match=r"tf_mixed.plan\(\) cannot use the subclassed model"):
        plan(Sub(), np.zeros((2, 3), "float32"))
    with pytest.raises(TypeError, match="tf_mixed.plan"):
        plan("not a model", np.zeros((2, 3), "float32"))


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_survey_holds_each_layers_facts(name):
    model = ZOO[name].ready()
    found = precision_map.survey(model)
    for _, layer in facts.walk_layers(model):
        fact = found.fact(layer)
        assert fact.input == facts.is_input_layer(layer)
        assert fact.statistics == facts.keeps_float32_statistics(layer)
        assert fact.activation == facts.activation_name(layer)
        tensors = shims.call_inputs(layer)
        assert found.calls[id(layer)] == tuple(tensors)
        for dtype in ("float16", "bfloat16"):
            rounds = not isinstance(layer, keras.Model) and any(
                facts.rounded_ids(layer, t, dtype) for t in tensors)
            assert (dtype in fact.rounds_ids) == rounds, (layer.name, dtype)


def test_the_survey_knows_which_half_dtype_rounds_token_ids():
    inputs = keras.Input((4,))  # float ids up to 999: bfloat16 rounds them, float16 does not
    ids = keras.layers.Embedding(1000, 8, name="emb")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(ids))
    assert precision_map.survey(model).fact(model.get_layer("emb")).rounds_ids == {"bfloat16"}
    assert precision_map.decide(model, "mixed_bfloat16").reasons["emb"] == "token ids"
    assert precision_map.decide(model, "mixed_float16").reasons["emb"] == "target"


@pytest.mark.parametrize("name", sorted(ZOO))
def test_keep_float32_matches_a_surveyed_layer_as_it_matches_the_layer(name):
    model = ZOO[name].ready()
    found = precision_map.survey(model)
    layers = [layer for _, layer in found.layers]
    rules = keep_float32.parse([layers[-1].name, keras.layers.Dense,
                                lambda layer: "norm" in layer.name])
    for layer in layers:
        assert rules.matches_surveyed(layer, is_input=found.fact(layer).input) == rules.matches(
            layer), layer.name


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_surveyed_tap_is_the_input_tap(name):
    spec = ZOO[name]
    model = spec.ready()
    x, _ = spec.data(4)
    assert model_check.surveyed_magnitudes(precision_map.survey(model), x) == (
        model_check.input_magnitudes(model, x))
