"""The plan's loss is resolved once, from its survey, at its first use: the
probe and the whole-step check run with that one function."""

import keras
import pytest
from zoo import ZOO

from tf_mixed._internal import losses
from tf_mixed.models import conversion
from tf_mixed.policy import hardware, precision_map
from tf_mixed.tools.planning import LayerTiming, Measurement, layer_timing, step_check
from tf_mixed.tools.planning.planner import plan

AMX_CPU = hardware.HardwareInfo(cpu_model="Test Xeon", cpu_flags=frozenset({"avx512_bf16"}))


def _planned(name="functional"):
    """A zoo model, a batch, and timings where its first timed layer is faster
    in float32 and the others in half precision: the plan builds neither whole
    model (the zoo's outputs are float32 in every map; its first layer is none)."""
    spec = ZOO[name]
    model = spec.ready()
    timed, producers, followers = layer_timing.layer_graph(model)

    def timing(i, layer):
        f32, half = (1, 3) if i == 0 else (4, 2)
        seconds = {"float32": (f32 * 1e-3,) * 5, "bfloat16": (half * 1e-3,) * 5}
        return LayerTiming(layer.name, type(layer).__name__, producers[layer.name], seconds,
                           (1e-4,) * 5)

    measurement = Measurement(("float32", "bfloat16"),
                              tuple(timing(i, layer) for i, layer in enumerate(timed)),
                              followers)
    return model, spec.data(8), measurement, spec.loss


@pytest.fixture
def resolved(monkeypatch):
    """The callers of every loss resolution while the test runs."""
    calls = []
    for name in ("resolve", "resolve_named"):
        real = getattr(losses, name, None)
        if real is not None:
            def counting(*args, real=real, **kwargs):
                calls.append(args[-1])
                return real(*args, **kwargs)
            monkeypatch.setattr(losses, name, counting)
    return calls


@pytest.mark.parametrize("name", ["functional", "multi_output"])
def test_a_plan_resolves_its_loss_once_for_the_probe_and_the_step_check(name, resolved):
    model, (x, y), measurement, loss = _planned(name)
    p = plan(model, x, y, loss=loss, measurement=measurement, info=AMX_CPU, use_catalog=False)
    assert "whole step, median of 3 rounds" in p.summary  # the step check ran
    assert all(row.error is not None for row in p.layers if row.seconds)  # the probe ran
    assert resolved == ["tf_mixed.plan()"]


def test_a_plan_needing_no_loss_resolves_none(resolved):
    model, (x, _), measurement, _ = _planned()
    errors = {timing.name: 0.0 for timing in measurement.layers}
    p = plan(model, x, measurement=measurement, info=AMX_CPU, probe_report=errors,
             step_check=False)
    assert p.layers and resolved == []


def test_a_plan_without_a_loss_says_so_naming_the_plan():
    model, (x, y), measurement, _ = _planned()
    with pytest.raises(ValueError, match=r"^tf_mixed\.plan\(\) needs a loss to differentiate"):
        plan(model, x, y, measurement=measurement, info=AMX_CPU, use_catalog=False)


def test_a_compiled_plan_takes_the_compiled_loss(resolved):
    model, (x, y), measurement, loss = _planned()
    model.compile(optimizer="sgd", loss=loss)
    p = plan(model, x, y, measurement=measurement, info=AMX_CPU, step_check=False,
             use_catalog=False)
    assert all(row.error is not None for row in p.layers if row.seconds)
    assert len(resolved) == 1


def test_the_step_check_steps_with_the_loss_it_is_handed():
    model, (x, y), measurement, _ = _planned()
    seen = []

    def loss_fn(y_true, y_pred):
        seen.append(tuple(y_pred.shape))
        return keras.ops.mean(keras.ops.square(y_true - y_pred))

    last = measurement.layers[-1].name
    found = precision_map.survey(model)
    copies = {"float32": precision_map.decide(model, "float32", found=found),
              "plan": precision_map.decide(model, "mixed_bfloat16", plan={last: "float32"},
                                           found=found)}
    rounds = step_check.time_steps(
        {name: conversion.apply_surveyed(found, m) for name, m in copies.items()}, x, y,
        loss_fn, half_policy="mixed_bfloat16", rounds=1)
    assert set(rounds) == {"float32", "plan"} and all(len(v) == 1 for v in rounds.values())
    assert seen and set(seen) == {tuple(y.shape)}  # each candidate's step traced with it


@pytest.mark.parametrize("name", ["functional", "multi_output"])
def test_the_step_check_times_the_copies_the_candidates_maps_build(name, monkeypatch):
    """Each candidate's map is decided once (`plan_table.planned`): the step
    check builds its copies from those maps, and the winner's is the plan's."""
    from tf_mixed.models import conversion

    model, (x, y), measurement, loss = _planned(name)
    built, real = [], conversion.apply_surveyed
    monkeypatch.setattr(conversion, "apply_surveyed",
                        lambda found, precision, *a: built.append(precision) or real(
                            found, precision, *a))
    decisions, real_decide = [], precision_map.decide
    monkeypatch.setattr(precision_map, "decide",
                        lambda *a, **k: decisions.append(k.get("plan")) or real_decide(*a, **k))
    wins = {"float32": [3e-3] * 3, "bfloat16": [2e-3] * 3, "plan": [1e-3] * 3}
    p = plan(model, x, y, loss=loss, measurement=measurement, info=AMX_CPU, use_catalog=False,
             step_timer=lambda carriers: {k: wins[k] for k in carriers})
    assert "the plan is 2.00x the faster whole model" in p.summary
    assert built == []  # the step timer replaced the copies: nothing built
    plan_map = decisions[-1]  # the candidates are decided in order, "plan" last
    assert p.precision_map.layers == real_decide(model, p.policy, plan=plan_map).layers
    # Timed for real, the three copies are built from exactly those three maps.
    monkeypatch.setattr(step_check, "_timed_rounds",
                        lambda steps, batch, rounds: {k: wins[k] for k in steps})
    decisions.clear()
    p = plan(model, x, y, loss=loss, measurement=measurement, info=AMX_CPU, use_catalog=False)
    assert [m.target for m in built] == ["float32", "mixed_bfloat16", "mixed_bfloat16"]
    assert built[-1].layers == p.precision_map.layers and built[-1] is p.precision_map
    assert len(decisions) == 4  # the probe's kept set, then one per candidate


@pytest.mark.parametrize("name", ["functional", "multi_output"])
def test_the_step_check_times_uncompiled_copies_and_raises_no_conversion_note(name, monkeypatch):
    """The user converted nothing: a trained, compiled model's plan raises no
    ConversionNote (the copies timed are convert's, not compiled), and the
    model keeps its optimizer."""
    import warnings

    model, (x, y), measurement, loss = _planned(name)
    model.compile(optimizer="adam", loss=loss)
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    optimizer = model.optimizer
    timed = []
    monkeypatch.setattr(step_check, "_step", lambda copy, loss_fn: timed.append(copy) or (
        lambda *batch: 0.0))
    monkeypatch.setattr(step_check.autotune, "first_call", lambda step, inputs, remapping_off: None)
    monkeypatch.setattr(step_check, "_timed_rounds", lambda steps, batch, rounds: {
        "float32": [3e-3] * 3, "bfloat16": [2e-3] * 3, "plan": [1e-3] * 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error", conversion.ConversionNote)
        p = plan(model, x, y, measurement=measurement, info=AMX_CPU, use_catalog=False)
    assert "the plan is 2.00x the faster whole model" in p.summary
    assert len(timed) == 3 and not any(copy.compiled for copy in timed)
    assert model.optimizer is optimizer and model.compiled


@pytest.mark.parametrize("half_policy, off", [
    ("mixed_float16", {"float32": False, "float16": True, "plan": True}),
    ("mixed_bfloat16", {"float32": False, "bfloat16": False, "plan": False})])
def test_the_step_check_turns_remapping_off_for_each_float16_candidate(half_policy, off,
                                                                       monkeypatch):
    """Under mixed_float16 every candidate but "float32" is traced with
    Grappler's remapping off (as `enable("mixed_float16")` runs on a CPU);
    under mixed_bfloat16 none is."""
    model, (x, y), _, _ = _planned()
    found = precision_map.survey(model)
    last = found.top[-1].name
    maps = {"float32": precision_map.decide(model, "float32", found=found),
            "plan": precision_map.decide(model, half_policy, plan={last: "float32"}, found=found)}
    maps[keras.DTypePolicy(half_policy).compute_dtype] = precision_map.decide(
        model, half_policy, found=found)
    copies = {name: conversion.apply_surveyed(found, m) for name, m in maps.items()}
    names = {id(copy): name for name, copy in copies.items()}
    traced = {}
    monkeypatch.setattr(step_check, "_step", lambda copy, loss_fn: names[id(copy)])
    monkeypatch.setattr(step_check.autotune, "first_call", lambda step, inputs, remapping_off:
                        traced.update({step: remapping_off}))
    monkeypatch.setattr(step_check, "_timed_rounds", lambda steps, batch, rounds: {})
    step_check.time_steps(copies, x, y, keras.losses.mean_squared_error,
                          half_policy=half_policy)
    assert traced == off


@pytest.mark.parametrize("inputs_only", ["data set", "y=None"])
def test_a_step_check_without_targets_names_them_and_the_fix(inputs_only):
    """A data set of inputs alone, or no `y`: the step check (after the
    timing) needs targets for its loss; it says so (was Keras's error from
    inside the traced step, or the batch's first two rows taken as (x, y))."""
    import tensorflow as tf

    model, (x, _), measurement, loss = _planned()
    data = tf.data.Dataset.from_tensor_slices(x).batch(4) if inputs_only == "data set" else x
    received = ("`x`, a tf.data dataset of " if inputs_only == "data set" else "y=None")
    with pytest.raises(ValueError, match="needs targets") as raised:
        plan(model, data, None, loss=loss, measurement=measurement, info=AMX_CPU,
             probe_report={})
    assert f"Received: {received}" in str(raised.value)
    assert "Pass `y` (or a data set of (x, y) batches), or step_check=False." in str(raised.value)
