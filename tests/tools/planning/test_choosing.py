"""tf_mixed.tools.planning.choosing: exact choices from injected timings."""

import pytest

from tf_mixed.tools.planning import LayerTiming, Measurement
from tf_mixed.tools.planning.choosing import choose

MS = 1e-3


def _layer(name, producers, f32, half, cast, float8=None, rounds=5):
    seconds = {"float32": tuple(v * MS for v in _rounds(f32, rounds)),
               "bfloat16": tuple(v * MS for v in _rounds(half, rounds))}
    if float8 is not None:
        seconds["float8"] = tuple(v * MS for v in _rounds(float8, rounds))
    return LayerTiming(name, "Dense", tuple(producers), seconds,
                       tuple(v * MS for v in _rounds(cast, rounds)), float8 is not None)


def _rounds(value, rounds):
    return list(value) if isinstance(value, (list, tuple)) else [value] * rounds


def _chain(*layers, precisions=("float32", "bfloat16")):
    return Measurement(precisions, tuple(layers))


def test_half_faster_everywhere_takes_the_whole_model_half():
    m = _chain(_layer("a", [""], 4, 2, 0.5), _layer("b", ["a"], 4, 2, 0.5),
               _layer("c", ["b"], 4, 2, 0.5))
    choice = choose(m)
    assert dict(choice.precisions) == {"a": "bfloat16", "b": "bfloat16", "c": "bfloat16"}
    assert choice.start == "bfloat16"
    # float32 12 ms; bfloat16 6 ms plus the model input's cast into a, 0.5 ms.
    assert choice.step_seconds["float32"] == pytest.approx(12 * MS)
    assert choice.step_seconds["bfloat16"] == pytest.approx(6.5 * MS)
    assert choice.step_seconds["plan"] == pytest.approx(6.5 * MS)
    assert choice.unsettled == ""


def test_a_layer_slower_in_half_beyond_the_spread_stays_float32():
    m = _chain(_layer("a", [""], 4, 2, 0.5), _layer("b", ["a"], 4, 2, 0.5),
               _layer("c", ["b"], 1, 3, 0.1))
    choice = choose(m)
    assert dict(choice.precisions) == {"a": "bfloat16", "b": "bfloat16", "c": "float32"}
    # c in float32: 1 ms instead of 3, plus its input cast 0.1 ms: 1.9 ms saved.
    assert choice.whys["c"].startswith("float32 saves 1.9 ms a step")
    assert choice.step_seconds["plan"] == pytest.approx((2 + 2 + 0.5 + 1 + 0.1) * MS)


def test_a_difference_inside_the_spread_keeps_the_whole_model_choice():
    # c's bfloat16 time is float32's +-0.2 ms round by round: no clear winner.
    m = _chain(_layer("a", [""], 4, 2, 0.0), _layer("b", ["a"], 4, 2, 0.0),
               _layer("c", ["b"], 1, [0.8, 1.2, 0.9, 1.1, 1.0], 0.0))
    choice = choose(m)
    assert choice.precisions["c"] == "bfloat16"
    assert "whole-model bfloat16" in choice.whys["c"]


def test_half_slower_overall_keeps_everything_float32():
    m = _chain(_layer("a", [""], 2, 4, 0.5), _layer("b", ["a"], 2, 4, 0.5))
    choice = choose(m)
    assert dict(choice.precisions) == {"a": "float32", "b": "float32"}
    assert choice.start == "float32"
    assert "not taken" in choice.whys["a"]


def test_casts_can_make_a_faster_half_layer_not_worth_it():
    # b alone is 0.5 ms faster in bfloat16, but the casts into it and out of
    # it (into c) cost 0.4 ms each.
    m = _chain(_layer("a", [""], 4, 6, 0.4), _layer("b", ["a"], 4, 3.5, 0.4),
               _layer("c", ["b"], 4, 6, 0.4))
    choice = choose(m)
    assert dict(choice.precisions) == {"a": "float32", "b": "float32", "c": "float32"}


def test_a_blocked_layer_is_float32_whatever_its_speed():
    m = _chain(_layer("a", [""], 4, 2, 0.5), _layer("b", ["a"], 4, 2, 0.5))
    choice = choose(m, blocked={"b": "error 0.3 above the tolerance 0.1 (probe): float32"})
    assert dict(choice.precisions) == {"a": "bfloat16", "b": "float32"}
    assert choice.whys["b"].startswith("error 0.3")


def test_float8_is_chosen_per_layer_where_it_is_faster():
    m = _chain(_layer("a", [""], 4, 2, 0.1), _layer("b", ["a"], 8, 4, 0.1, float8=1),
               _layer("c", ["b"], 8, 4, 0.1, float8=[4.1, 4.3, 4.2, 4.4, 4.5]),
               precisions=("float32", "bfloat16", "float8"))
    choice = choose(m)
    assert dict(choice.precisions) == {"a": "bfloat16", "b": "float8", "c": "bfloat16"}
    assert choice.whys["b"].startswith("float8 saves 3 ms")


def test_a_wide_spread_is_unsettled():
    m = _chain(_layer("a", [""], [4, 8, 4, 8, 4], 2, 0.0))
    assert "spread" in choose(m).unsettled
    assert choose(_chain(_layer("a", [""], 4, 2, 0.0, rounds=2))).unsettled.startswith("2 round")


def test_bad_measurements_are_refused_naming_the_layer():
    missing = Measurement(("float32", "bfloat16"), (LayerTiming(
        "dense", "Dense", ("",), {"float32": (1.0,)}, (0.0,)),))
    with pytest.raises(ValueError, match="no bfloat16 timing for layer 'dense'"):
        choose(missing)
    negative = _chain(_layer("dense", [""], 1, -1, 0))
    with pytest.raises(ValueError, match="layer 'dense' in bfloat16"):
        choose(negative)
    with pytest.raises(ValueError, match="exactly one half dtype"):
        choose(Measurement(("float32",), ()))


def test_milliseconds_are_never_shown_in_exponent_form():
    from tf_mixed.tools.planning.plan_table import ms

    assert (ms(0.00123), ms(0.0456), ms(2.1)) == ("1.23", "45.6", "2100")


def test_the_choice_carries_each_layers_medians_for_its_row():
    """`Choice.medians`: per timed layer, each precision's median over the
    rounds and its cast's (what the plan's table shows), float8 included."""
    m = _chain(_layer("a", [""], [4, 9, 5, 3, 6], [2, 1, 7, 3, 2], [0.5, 0.1, 0.2, 0.9, 0.3],
                      float8=[1, 1, 2, 8, 1]),
               _layer("b", ["a"], [1, 2, 6, 4, 5], [4, 3, 2, 1, 1], 0),
               precisions=("float32", "bfloat16", "float8"))
    medians = choose(m).medians
    assert set(medians) == {"a", "b"}
    seconds, cast = medians["a"]
    assert seconds == pytest.approx({"float32": 5 * MS, "bfloat16": 2 * MS, "float8": 1 * MS})
    assert cast == pytest.approx(0.3 * MS)
    seconds, cast = medians["b"]
    assert seconds == pytest.approx({"float32": 4 * MS, "bfloat16": 2 * MS}) and cast == 0.0
