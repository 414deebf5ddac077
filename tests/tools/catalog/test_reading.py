"""tf_mixed.tools.catalog.reading: the tolerance, point statuses and the safe range, exactly."""

import math

import pytest

from tf_mixed.tools.catalog import reading

GRID = (1e-2, 1e-1, 1.0, 10.0, 100.0)


def test_the_tolerance_is_eight_machine_epsilons_of_the_compute_dtype():
    assert reading.tolerance("mixed_float16") == 8 * 2.0 ** -10
    assert reading.tolerance("mixed_bfloat16") == 8 * 2.0 ** -7
    assert reading.tolerance("mixed_float16", 2) == 2 * 2.0 ** -10


def test_a_policy_without_a_half_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="'mixed_bfloat16', 'mixed_float16'. Received: 'float32'"):
        reading.tolerance("float32")


@pytest.mark.parametrize("args, expected", [
    ((0.001, 0.002, True, True, 0.0), "ok"),
    ((0.001, None, True, True, 0.0), "ok"),
    ((0.001, 0.5, True, True, 0.0), "resolution"),
    ((0.9, 0.001, True, True, 0.25), "underflow"),
    ((0.9, 0.001, True, True, 0.24), "resolution"),
    ((math.inf, None, True, False, 0.0), "overflow"),
    ((math.nan, None, False, False, 0.0), "float32_nonfinite"),
])
def test_status(args, expected):
    assert reading.status(*args, limit=0.01) == expected


def test_the_safe_range_is_the_longest_ok_run_with_what_ends_it():
    safe = reading.safe_range(GRID, ["underflow", "ok", "ok", "ok", "overflow"])
    assert safe == reading.SafeRange(0.1, 10.0, "underflow", "overflow")
    assert safe.text() == "0.1 .. 10"
    assert safe.contains(1.0) and safe.contains(10.0) and not safe.contains(11.0)


def test_a_run_reaching_the_grid_end_is_open_there():
    safe = reading.safe_range(GRID, ["ok", "ok", "ok", "resolution", "ok"])
    assert safe == reading.SafeRange(0.01, 1.0, "", "resolution")
    assert safe.text() == "<=0.01 .. 1"
    assert safe.contains(1e-9)


def test_equal_runs_prefer_the_one_nearest_one():
    safe = reading.safe_range(GRID, ["ok", "resolution", "ok", "resolution", "ok"])
    assert (safe.low, safe.high) == (1.0, 1.0)


def test_no_ok_point_is_no_range():
    safe = reading.safe_range(GRID, ["overflow"] * 5)
    assert safe.low is None and safe.text() == "none" and not safe.contains(1.0)


def test_the_default_grid_spans_1e_minus_6_to_1e6_in_half_decades():
    grid = reading.DEFAULT_MAGNITUDES
    assert len(grid) == 25 and grid[0] == pytest.approx(1e-6) and grid[-1] == pytest.approx(1e6)
    assert grid[12] == 1.0
