"""tf_mixed.plan reads the layers' errors from the numerics catalog where it covers them all."""

import dataclasses
import json

import keras
import numpy as np
import pytest

from tf_mixed.policy import hardware, precision_map
from tf_mixed.tools import probing
from tf_mixed.tools.catalog import model_check, results
from tf_mixed.tools.planning import LayerTiming, Measurement, catalog_errors
from tf_mixed.tools.planning.plan_table import Plan
from tf_mixed.tools.planning.planner import plan

MS = 1e-3
FP16_CPU = hardware.HardwareInfo(cpu_model="Test Xeon", cpu_flags=frozenset({"avx512_fp16"}))


class OwnDense(keras.layers.Dense):
    """A class the catalog does not measure."""


def _model(last=keras.layers.Dense):
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    h = keras.layers.LayerNormalization(name="norm")(h)  # not timed: follows 'first'
    outputs = last(1, name="last")(h)
    return keras.Model(inputs, outputs, name="chain")


def _data(scale=1.0):
    x = np.random.default_rng(0).uniform(-1.0, 1.0, (8, 8)).astype("float32")
    x[0, 0] = 1.0  # max |x| of the batch: exactly 1 (a grid point)
    return x * scale, np.zeros((8, 1), "float32")


def _measurement():
    def timing(name, producers):
        return LayerTiming(name, "Dense", tuple(producers),
                           {"float32": (4 * MS,) * 5, "float16": (2 * MS,) * 5}, (0.5 * MS,) * 5,
                           False)

    return Measurement(("float32", "float16"),
                       (timing("first", [""]), timing("last", ["first"])), {"norm": "first"})


@pytest.fixture
def no_probe(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the probe ran although the catalog covers every layer")

    monkeypatch.setattr(probing, "probe_surveyed", refuse)  # what tf_mixed.plan runs


def _plan(model, x, y, **kwargs):
    return plan(model, x, y, loss="mse", policy="mixed_float16", measurement=_measurement(),
                info=FP16_CPU, step_check=False, cache=False, **kwargs)


def test_every_layer_covered_takes_the_catalogs_errors_and_skips_the_probe(no_probe):
    model = _model()
    x, y = _data()
    p = _plan(model, x, y)
    assert set(p.from_catalog) == {"first", "last"}
    # 'first' sees max |x| = 1, a grid point: its row's error there, exactly.
    row = model_check.match_for(results.stored(), model.get_layer("first"), "mixed_float16").row
    at_one = results.stored().magnitudes.index(1.0)
    assert p.from_catalog["first"] == f"{row.key} at max |x| 1"
    assert {r.name: r.error for r in p.layers}["first"] == row.forward[at_one]
    assert "errors of all 2 timed layers read from the numerics catalog (no probe)" in p.summary
    back = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == dataclasses.replace(p, measurement=None)


def test_a_layer_whose_inputs_overflow_its_row_stays_float32(no_probe):
    x, y = _data(scale=1e5)  # 'first' sees 1e5: Dense overflows float16 there
    p = _plan(_model(), x, y)
    assert p.choices["first"] == "float32"
    why = {r.name: r.why for r in p.layers}["first"]
    assert "not finite in half precision (catalog Dense[" in why and "max |x| 1e+05" in why


def test_one_layer_not_covered_runs_the_probe_for_all(monkeypatch):
    ran = []
    real = probing.probe_surveyed
    monkeypatch.setattr(probing, "probe_surveyed", lambda *a, **k: ran.append(1) or real(*a, **k))
    x, y = _data()
    p = _plan(_model(last=OwnDense), x, y)  # a class the catalog does not measure
    assert ran and p.from_catalog == {}
    assert "numerics catalog" not in p.summary


def test_use_catalog_false_always_probes(monkeypatch):
    ran = []
    real = probing.probe_surveyed
    monkeypatch.setattr(probing, "probe_surveyed", lambda *a, **k: ran.append(1) or real(*a, **k))
    x, y = _data()
    assert _plan(_model(), x, y, use_catalog=False).from_catalog == {} and ran
    with pytest.raises(TypeError, match="use_catalog"):
        _plan(_model(), x, y, use_catalog="yes")


def test_between_grid_points_the_worse_neighbour_counts():
    model = _model()
    grid = results.stored().magnitudes
    x, _ = _data(scale=2.0)  # 'first' sees 2: between 1 and 3.16
    surveyed = precision_map.survey(model)
    found = catalog_errors.read(surveyed, x, ["first"], "mixed_float16", 0.1)
    row = model_check.match_for(results.stored(), model.get_layer("first"), "mixed_float16").row
    i = grid.index(1.0)
    assert found.errors["first"] == max(row.forward[i], row.forward[i + 1])
    assert catalog_errors.read(surveyed, x * 1e7, ["first"], "mixed_float16", 0.1) is None  # off
