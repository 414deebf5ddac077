"""The healing rule as a pure function, and moving a layer (tf_mixed.scaling.healing)."""

import keras
import pytest

import tf_mixed
from tf_mixed.scaling.attribution import FORWARD, GRADIENT, GRADIENT_AT_MIN_SCALE
from tf_mixed.scaling.attribution import AttributedSkip as S
from tf_mixed.scaling.healing import Decision, HealRule, decide, move_to_float32

NAMES = ["a", "b", "c", "d", "e", "f", "g", "h"]


def test_three_forward_culprits_in_the_window_move_the_layer():
    skips = [S(10, "c", FORWARD), S(11, "c", FORWARD), S(12, "c", FORWARD)]
    decision = decide(HealRule(skips=3, window=200), skips, (), NAMES, now=12)
    assert decision == Decision(move=("c",), evidence={"c": tuple(skips)}, step=12)


def test_what_does_not_count():
    rule = HealRule(skips=2, window=10)
    # A gradient overflow above the minimum scale is the scale's business.
    assert decide(rule, [S(1, "a", GRADIENT), S(2, "a", GRADIENT)], (), NAMES, 2).move == ()
    # At the minimum scale it counts.
    assert decide(rule, [S(1, "a", GRADIENT_AT_MIN_SCALE), S(2, "a", GRADIENT_AT_MIN_SCALE)],
                  (), NAMES, 2).move == ("a",)
    # Outside the window (steps 1 and 2 are 10 or more steps before 12).
    assert decide(rule, [S(1, "a", FORWARD), S(2, "a", FORWARD)], (), NAMES, 12).move == ()
    # Two different layers, one each.
    assert decide(rule, [S(1, "a", FORWARD), S(2, "b", FORWARD)], (), NAMES, 2).move == ()
    # Already healed.
    assert decide(rule, [S(1, "a", FORWARD), S(2, "a", FORWARD)], ("a",), NAMES, 2).move == ()


def test_past_the_limit_it_stops_with_the_evidence():
    rule = HealRule(skips=1, max_fraction=0.25)      # 2 of 8 layers may move
    assert rule.limit(8) == 2 and rule.limit(3) == 1
    decision = decide(rule, [S(7, "b", FORWARD)], ("a", "c"), NAMES, 7)
    assert decision.move == ()
    assert decision.stop == (
        "at step 7 healing would move 3 of 8 layers to float32, past the limit of 2 "
        "(max_fraction=0.25); already moved: ['a', 'c']; culprits now: 'b': 1 skipped "
        "steps (steps 7; forward output)")


@pytest.mark.slow
@pytest.mark.parametrize("knobs, match", [
    ({"skips": 0}, "skips"), ({"window": 2, "skips": 3}, "window >= skips"),
    ({"max_fraction": 0.0}, "max_fraction"), ({"skips": True}, "skips"),
    ({"max_fraction": 1.5}, r"max_fraction=1\.5")])
def test_rule_knobs_are_checked(knobs, match):
    with pytest.raises(ValueError, match=match):
        HealRule(**knobs)


def test_move_to_float32_moves_a_block_and_its_sublayers():
    tf_mixed.enable("mixed_float16")
    mha = keras.layers.MultiHeadAttention(2, 4, name="mha")
    x = keras.ops.ones((1, 3, 4))
    mha(x, x)
    changed = move_to_float32(mha)
    assert mha in changed and len(changed) > 4      # query/key/value/output projections...
    assert all(layer.compute_dtype == "float32" for layer in changed)
    assert mha(x, x).dtype == "float32"
    assert move_to_float32(mha) == []               # idempotent


def test_move_to_float32_refuses_half_variables():
    layer = keras.layers.Dense(2, dtype="float16")
    layer.build((None, 2))
    with pytest.raises(ValueError, match="keeps its variables in float16"):
        move_to_float32(layer)
