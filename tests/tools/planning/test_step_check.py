"""The plan's loss is resolved once, from its survey, at its first use: the
probe and the whole-step check run with that one function."""

import keras
import numpy as np
import pytest

from tf_mixed._internal import losses
from tf_mixed.policy import hardware, precision_map
from tf_mixed.tools.planning import LayerTiming, Measurement, step_check
from tf_mixed.tools.planning.planner import plan

AMX_CPU = hardware.HardwareInfo(cpu_model="Test Xeon", cpu_flags=frozenset({"avx512_bf16"}))


def _model():
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="last")(h), name="pair")


def _data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(8, 8)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")


def _measurement():
    """'first' faster in half, 'last' in float32: the plan is neither whole model."""
    def timing(name, producer, f32, half):
        seconds = {"float32": (f32 * 1e-3,) * 5, "bfloat16": (half * 1e-3,) * 5}
        return LayerTiming(name, "Dense", (producer,), seconds, (1e-4,) * 5)

    return Measurement(("float32", "bfloat16"),
                       (timing("first", "", 4, 2), timing("last", "first", 1, 3)), {})


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


def test_a_plan_resolves_its_loss_once_for_the_probe_and_the_step_check(resolved):
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU,
             use_catalog=False)
    assert "whole step, median of 3 rounds" in p.summary  # the step check ran
    assert all(row.error is not None for row in p.layers)  # the probe ran
    assert resolved == ["tf_mixed.plan()"]


def test_a_plan_needing_no_loss_resolves_none(resolved):
    x, _ = _data()
    p = plan(_model(), x, measurement=_measurement(), info=AMX_CPU,
             probe_report={"first": 0.0, "last": 0.0}, step_check=False)
    assert p.layers and resolved == []


def test_a_plan_without_a_loss_says_so_naming_the_plan():
    x, y = _data()
    with pytest.raises(ValueError, match=r"^tf_mixed\.plan\(\) needs a loss to differentiate"):
        plan(_model(), x, y, measurement=_measurement(), info=AMX_CPU, use_catalog=False)


def test_a_compiled_plan_takes_the_compiled_loss(resolved):
    model = _model()
    model.compile(optimizer="sgd", loss="mse")
    x, y = _data()
    p = plan(model, x, y, measurement=_measurement(), info=AMX_CPU, step_check=False,
             use_catalog=False)
    assert all(row.error is not None for row in p.layers) and len(resolved) == 1


def test_the_step_check_steps_with_the_loss_it_is_handed():
    x, y = _data()
    seen = []

    def loss_fn(y_true, y_pred):
        seen.append(tuple(y_pred.shape))
        return keras.ops.mean(keras.ops.square(y_true - y_pred))

    found = precision_map.survey(_model())
    rounds = step_check.time_steps(found, x, y, loss_fn,
                                   {"float32": ("float32", ()),
                                    "plan": ("mixed_bfloat16", ("last",))}, rounds=1)
    assert set(rounds) == {"float32", "plan"} and all(len(v) == 1 for v in rounds.values())
    assert seen and set(seen) == {(8, 1)}  # traced with it, once per candidate step
