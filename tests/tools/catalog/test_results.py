"""tf_mixed.tools.catalog.results and comparing: the table, results.json, the stored catalog."""

import json
import math

import pytest

from tf_mixed.tools.catalog import comparing, results
from tf_mixed.tools.catalog.reading import SafeRange

GRID = (0.1, 1.0, 10.0)


SAFE = SafeRange(0.1, 1.0, "", "overflow")


def _row(layer="Dense", policy="mixed_float16", safe=SAFE,
         failure="", config="units=64"):
    return results.Row(layer, config, policy, "keras", forward=(0.001, 0.002, math.inf),
                       gradient=(0.001, None, math.nan), status=("ok", "ok", "overflow"),
                       safe=safe, failure=failure)


def _catalog(*rows, versions=None):
    return results.Catalog(rows=rows, magnitudes=GRID,
                           tolerance={"mixed_float16": 0.0078125},
                           versions=versions or {"keras": "3.15.1"},
                           left_out={"Layer": "the base class"})


def test_results_json_round_trips_inf_nan_and_none(tmp_path):
    catalog = _catalog(_row(), _row("Conv2D", failure="NotFoundError: no kernel"))
    path = tmp_path / "results.json"
    path.write_text(catalog.to_json())
    assert json.loads(path.read_text())["rows"][0]["forward"] == [0.001, 0.002, "inf"]
    loaded = results.load(path)
    assert loaded.rows[0].safe == catalog.rows[0].safe
    assert loaded.rows[0].forward[2] == math.inf and math.isnan(loaded.rows[0].gradient[2])
    assert loaded.rows[0].gradient[1] is None
    assert loaded.rows[1].failure == "NotFoundError: no kernel"
    assert loaded.magnitudes == GRID and loaded.left_out == catalog.left_out


def test_load_names_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="no catalog file"):
        results.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a tf_mixed catalog"):
        results.load(tmp_path / "x.json")


def test_the_table_gives_each_range_and_what_ends_it():
    text = str(_catalog(_row(), _row("Conv2D", failure="NotFoundError: no kernel")))
    assert "Dense[units=64]   <=0.1 .. 1 (|o)" in text
    assert "Conv2D[units=64]  does not run" in text
    assert "Note: Conv2D[units=64] under mixed_float16: NotFoundError: no kernel" in text
    assert "keras.layers: 2 of 3 float-computing classes measured (1 left out" in text


def test_reason_in_words():
    assert _row().reason() == "overflows above"
    assert _row(safe=SafeRange(None, None, "", "")).reason() == (
        "unsafe at every magnitude (overflow)")


def test_compare_lists_changed_missing_and_no_longer_running_rows():
    old = _catalog(_row(), _row("Add"), _row("Dot"), versions={"keras": "3.15.1"})
    new = _catalog(_row(safe=SafeRange(0.1, 10.0, "", "")), _row("Add", failure="E: x"),
                   _row("Softmax"), versions={"keras": "3.16.0"})
    found = comparing.compare(old, new)
    assert [str(c) for c in found.changes] == [
        "Dense[units=64] mixed_float16: <=0.1 .. 1 -> <=0.1 .. >=10",
        "Add[units=64] mixed_float16: <=0.1 .. 1 -> does not run",
        "Dot[units=64] mixed_float16: <=0.1 .. 1 -> not measured",
        "Softmax[units=64] mixed_float16: not measured -> <=0.1 .. 1",
    ]
    assert "keras 3.15.1 -> keras 3.16.0" in str(found)
    assert found and found.same_grid
    assert not comparing.compare(old, old)
    assert "no layer's safe range changed" in str(comparing.compare(old, old))


def test_the_stored_catalog_loads_and_matches_the_installed_keras():
    import keras

    stored = results.stored()
    assert stored.versions["keras"] == keras.__version__, (
        "Keras changed: re-measure the stored catalog: python -m tf_mixed catalog "
        "--output_dir=/tmp/c && cp /tmp/c/results.json " + results.STORED_FILE)
    measured, total = stored.coverage()
    assert measured / total >= 0.9


def test_compare_with_slack_lets_an_end_move_by_that_many_decades():
    old = _catalog(_row(safe=SafeRange(0.1, 10.0, "resolution", "overflow")))
    moved = _catalog(_row(safe=SafeRange(0.1, 31.6227766, "resolution", "overflow")))
    assert comparing.compare(old, moved)
    assert not comparing.compare(old, moved, slack=0.5)
    gone = _catalog(_row(safe=SafeRange(None, None, "", "")))
    assert comparing.compare(old, gone, slack=10)
