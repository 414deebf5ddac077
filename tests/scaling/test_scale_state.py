"""tf_mixed.scaling.scale_state: the frozen config, the state record, next_state.

No optimizer is built here except in the last tests, which check that the
optimizer's TensorFlow transition is the pure one.
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_mixed.scaling.optimizer import LossScaleOptimizer
from tf_mixed.scaling.scale_state import (
    KNOBS,
    RULE_FIELDS,
    LossScaleConfig,
    LossScaleState,
    initial_state,
    next_state,
)

INF, NAN = float("inf"), float("nan")

# 100 steps: finite (True) or not, fixed so the expected lists below stay
# valid; runs of overflows long enough to reach the minimum scale.
PATTERN = ([True] * 6 + [False] + [True] * 3 + [False] * 8 + [True] * 20
           + [False, False, True] * 5 + [True] * 10 + [False] * 6
           + [True] * 25 + [False] * 3 + [True] * 3)
assert len(PATTERN) == 100


def _by_hand(pattern, *, initial_scale, growth_interval, growth_factor,
             backoff_factor, min_scale, max_scale, hysteresis):
    """The documented rule spelled out step by step (written independently
    of next_state: counters as plain ints, one if/else per case)."""
    scale, good, streak, skipped, at_min_run = initial_scale, 0, 0, 0, 0
    rows = []
    for finite in pattern:
        used = scale
        if finite:
            good += 1
            streak = 0
            at_min_run = 0
            if good == growth_interval:
                scale = min(scale * growth_factor, max_scale)
                good = 0
        else:
            skipped += 1
            good = 0
            streak += 1
            at_min_run = at_min_run + 1 if used <= min_scale else 0
            if streak == hysteresis:
                scale = max(scale * backoff_factor, min_scale)
                streak = 0
        rows.append((scale, good, streak, skipped, not finite, at_min_run))
    return rows


KNOB_SETS = {
    "keras-like": dict(initial_scale=32.0, growth_interval=3,
                       growth_factor=2.0, backoff_factor=0.5, min_scale=1.0,
                       max_scale=2.0**24, hysteresis=1),
    "hysteresis": dict(initial_scale=64.0, growth_interval=2,
                       growth_factor=4.0, backoff_factor=0.25, min_scale=1.0,
                       max_scale=1024.0, hysteresis=3),
    "clamped": dict(initial_scale=16.0, growth_interval=1, growth_factor=2.0,
                    backoff_factor=0.5, min_scale=8.0, max_scale=64.0,
                    hysteresis=2),
}


def _run_python(config, pattern):
    state, rows = initial_state(config), []
    for finite in pattern:
        state = next_state(config, state, finite)
        rows.append(tuple(state)[:RULE_FIELDS])  # the rule's fields, not skip_reasons
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KNOB_SETS))
def test_100_steps_equal_the_hand_computed_sequence(name):
    knobs = KNOB_SETS[name]
    rows = _run_python(LossScaleConfig(**knobs), PATTERN)
    assert rows == _by_hand(PATTERN, **knobs)


def test_first_steps_written_out():
    config = LossScaleConfig(initial_scale=4.0, growth_interval=2,
                             min_scale=1.0)
    scales = [s.scale for s in _states(config, [True, True, False, False,
                                                False, False, True])]
    assert scales == [4.0, 8.0, 4.0, 2.0, 1.0, 1.0, 1.0]
    last = _states(config, [True, True, False, False, False, False, False])[-1]
    # Steps 3-5 ran at 8, 4, 2; steps 6 and 7 at 1 = min_scale: two skips
    # at the minimum.
    assert last == LossScaleState(1.0, 0, 0, 5, True, 2)


def _states(config, pattern):
    state, out = initial_state(config), []
    for finite in pattern:
        state = next_state(config, state, finite)
        out.append(state)
    return out


def test_fixed_scale_never_moves_and_counts_every_skip_as_at_minimum():
    config = LossScaleConfig(initial_scale=128.0, dynamic=False)
    states = _states(config, [True] * 5000 + [False] * 3)
    assert {s.scale for s in states} == {128.0}
    assert states[-1].min_scale_skips == 3
    assert states[-1].skipped_steps == 3


def test_pass_through_is_scale_one_fixed():
    config = LossScaleConfig.pass_through()
    assert (config.initial_scale, config.dynamic) == (1.0, False)


def test_next_state_depends_on_its_arguments_only():
    """No hidden counter: the same (config, state, verdict) gives the same state."""
    config = LossScaleConfig(initial_scale=8.0, growth_interval=2)
    state = initial_state(config)._replace(good_steps=1)
    first = next_state(config, state, True)
    other = LossScaleConfig(hysteresis=2)
    walk = initial_state(other)
    for finite in (False, False, True, False):  # unrelated transitions between
        walk = next_state(other, walk, finite)
    assert next_state(config, state, True) == first
    assert (first.scale, first.good_steps) == (16.0, 0)
    assert next_state(config, first, False).scale == 8.0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KNOB_SETS))
def test_tensor_transition_equals_python_transition(name):
    config = LossScaleConfig(**KNOB_SETS[name])
    state = LossScaleState(
        tf.constant(config.initial_scale, tf.float32),
        tf.constant(0, tf.int64), tf.constant(0, tf.int64),
        tf.constant(0, tf.int64), tf.constant(False), tf.constant(0, tf.int64))
    step = tf.function(lambda s, f: next_state(config, s, f))
    expected = _run_python(config, PATTERN)
    for finite, want in zip(PATTERN, expected):
        state = step(state, tf.constant(finite))
        got = (float(state.scale), int(state.good_steps),
               int(state.overflow_streak), int(state.skipped_steps),
               bool(state.last_step_skipped), int(state.min_scale_skips))
        assert got == want


def test_a_python_verdict_on_tensors_builds_only_its_own_operations():
    # What the optimizer's two state branches run (pipeline.advance_state).
    config = LossScaleConfig(**KNOB_SETS["hysteresis"])
    python = initial_state(config)._replace(good_steps=1, overflow_streak=2,
                                            skipped_steps=5, min_scale_skips=0)
    graph = tf.Graph()
    with graph.as_default():
        tensors = LossScaleState(*(tf.constant(v) for v in python[:RULE_FIELDS]))
        built = {}
        for finite in (True, False):
            start = len(graph.get_operations())
            after = next_state(config, tensors, finite)
            built[finite] = sorted(op.type for op in graph.get_operations()[start:]
                                   if op.type != "Const")
            # A field this verdict leaves alone comes back as given: not written.
            assert (after.skipped_steps is tensors.skipped_steps) is finite
            with tf.compat.v1.Session() as session:
                values = session.run([v for v in after if tf.is_tensor(v)])
            got = iter(values)
            expected = next_state(config, python, finite)
            assert tuple(next(got) if tf.is_tensor(v) else v for v in after) == expected
    # Applied: count a good step and maybe grow; nothing of the skipped path.
    assert built[True] == ["AddV2", "GreaterEqual", "Minimum", "Mul", "SelectV2", "SelectV2"]
    assert "Minimum" not in built[False] and "Maximum" in built[False]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KNOB_SETS))
def test_optimizer_follows_the_pure_transition(name):
    """Finite and non-finite steps through the optimizer's TF update."""
    knobs = KNOB_SETS[name]
    var = keras.Variable([0.0])
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), **knobs)
    step = tf.function(lambda g: opt.apply([g], [var]))
    expected = _run_python(LossScaleConfig(**knobs), PATTERN[:40])
    for finite, want in zip(PATTERN[:40], expected):
        step(tf.constant([1.0 if finite else NAN]))
        assert tuple(opt.loss_scale_state())[:RULE_FIELDS] == want


# ------------------------------------------------------------ bad input


def test_numpy_scalars_are_accepted():
    config = LossScaleConfig(initial_scale=np.float32(1024),
                             growth_interval=np.int64(100),
                             hysteresis=np.float64(2.0))
    assert config.initial_scale == 1024.0 and type(config.initial_scale) is float
    assert config.growth_interval == 100 and type(config.growth_interval) is int
    assert config.hysteresis == 2


@pytest.mark.slow
@pytest.mark.parametrize("name,value", [
    ("initial_scale", True), ("initial_scale", "1024"), ("initial_scale", NAN),
    ("initial_scale", INF), ("initial_scale", None), ("growth_interval", True),
    ("growth_interval", np.bool_(True)), ("growth_interval", INF),
    ("growth_interval", NAN), ("backoff_factor", None),
    ("max_scale", np.float32("inf")), ("hysteresis", "2"),
])
def test_bad_knobs_name_argument_value_and_rule(name, value):
    with pytest.raises(ValueError) as info:
        LossScaleConfig(**{name: value})
    message = str(info.value)
    assert f"`{name}`" in message and f"{name}={value!r}" in message
    assert "must be" in message


@pytest.mark.slow
@pytest.mark.parametrize("name", [row[0] for row in KNOBS] + ["dynamic"])
def test_config_is_frozen_and_a_replaced_knob_is_validated(name):
    config = LossScaleConfig()
    before = getattr(config, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, name, before)
    assert getattr(config, name) == before
    # dataclasses.replace goes through the same checks as the constructor.
    with pytest.raises(ValueError, match=f"`{name}`"):
        dataclasses.replace(config, **{name: "1"})
