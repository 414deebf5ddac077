"""The plan's per-layer timing: the order each layer's candidates are timed in, round by round.

No test times this host: the steps' timer and the clock are fakes.
"""

import warnings

import keras
import numpy as np
import pytest

from tf_mixed.policy import autotune
from tf_mixed.tools.planning.layer_timing import time_layers

# The steps as `time_layers` traces them: layer by layer in the model's order,
# each layer's precisions in the order given, then its cast (none for the
# embedding, whose inputs are token ids).
TRACED = ["embed/float32", "embed/bfloat16", "first/float32", "first/bfloat16", "first/cast",
          "last/float32", "last/bfloat16", "last/cast"]

# measuring.grouped_rounds: the layers in rotated order, and within each its
# candidates in rotated order (a second cycle runs backwards).
ROUNDS = [
    ["embed/float32", "embed/bfloat16", "first/float32", "first/bfloat16", "first/cast",
     "last/float32", "last/bfloat16", "last/cast"],
    ["first/bfloat16", "first/cast", "first/float32", "last/bfloat16", "last/cast",
     "last/float32", "embed/bfloat16", "embed/float32"],
    ["last/cast", "last/float32", "last/bfloat16", "embed/bfloat16", "embed/float32",
     "first/cast", "first/float32", "first/bfloat16"],
    ["last/cast", "last/bfloat16", "last/float32", "first/cast", "first/bfloat16",
     "first/float32", "embed/float32", "embed/bfloat16"],
]


def _model():
    tokens = keras.Input((4,), dtype="int32")
    h = keras.layers.Embedding(20, 8, name="embed")(tokens)
    h = keras.layers.Flatten(name="flat")(h)
    h = keras.layers.Dense(16, name="first")(h)
    return keras.Model(tokens, keras.layers.Dense(1, name="last")(h), name="tokens")


@pytest.fixture
def timed(monkeypatch):
    """Every timed step's label, in the order timed; a step's figure is its place in that order."""
    labels, calls = {}, []

    def first_call(step, inputs, remapping_off):
        labels[id(step)] = TRACED[len(labels)]

    def time_steps(step, inputs, count):
        assert count == 2  # steps_per_round
        calls.append(labels[id(step)])
        return float(len(calls))

    monkeypatch.setattr(autotune, "first_call", first_call)
    monkeypatch.setattr(autotune, "time_steps", time_steps)
    return calls


def _run(**kwargs):
    x = np.arange(8, dtype="int32").reshape(2, 4)
    return time_layers(_model(), x, ("float32", "bfloat16"), "mixed_bfloat16", **kwargs)


def test_each_round_times_the_layers_and_their_candidates_in_rotated_order(timed):
    measurement = _run(rounds=4, min_rounds=3, budget_s=None)
    assert timed == [label for order in ROUNDS for label in order]
    assert measurement.rounds == 4
    # Each figure lands on its layer and candidate: its place in the sequence.
    for t in measurement.layers:
        for r, order in enumerate(ROUNDS):
            for precision in ("float32", "bfloat16"):
                assert t.seconds[precision][r] == 8 * r + order.index(f"{t.name}/{precision}") + 1
            cast = f"{t.name}/cast"
            assert t.cast_seconds[r] == (8 * r + order.index(cast) + 1 if cast in order else 0.0)
    assert [t.name for t in measurement.layers] == ["embed", "first", "last"]
    assert measurement.layers[0].cast_seconds == (0.0,) * 4


def test_the_budget_stops_after_min_rounds(timed):
    ticks = iter(range(100))  # one second a reading
    measurement = _run(rounds=5, min_rounds=3, budget_s=0.5, clock=lambda: float(next(ticks)))
    assert measurement.rounds == 3
    assert timed == [label for order in ROUNDS[:3] for label in order]
    assert next(ticks) == 2  # read at the start and after the third round only


@pytest.mark.parametrize("inputs", ["one", "list", "dict", "sequential"])
def test_capturing_the_timed_layers_inputs_raises_no_keras_structure_warning(inputs):
    # The capture model took `model.inputs` (a list) for a one-input model,
    # and Keras warned that the batch's structure does not match.
    from tf_mixed.tools.planning.layer_timing import capture_inputs

    if inputs == "sequential":  # no `.input` of its own: built by its Input
        dense = keras.layers.Dense(4, name="dense")
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="first"), dense])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            captured = capture_inputs(model, [dense], np.ones((3, 8), "float32"))
        assert [tuple(v.shape) for v in captured.values()] == [(3, 8)]
        return
    a, b = keras.Input((8,), name="a"), keras.Input((8,), name="b")
    given = {"one": a, "list": [a, b], "dict": {"a": a, "b": b}}[inputs]
    joined = a if inputs == "one" else keras.layers.Add(name="add")([a, b])
    dense = keras.layers.Dense(4, name="dense")
    model = keras.Model(given, dense(joined))
    batch = keras.tree.map_structure(lambda t: np.ones((3, 8), "float32"), given)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        captured = capture_inputs(model, [dense], batch)
    assert [tuple(v.shape) for v in captured.values()] == [(3, 8)]
