"""The plan's whole-step check: the order its candidates are timed in, round by round.

No test times this host: the steps' timer is a fake.
"""

import keras
import numpy as np

from tf_mixed.models import conversion
from tf_mixed.policy import autotune, precision_map
from tf_mixed.tools.planning import step_check

CANDIDATES = {"float32": ("float32", ()), "bfloat16": ("mixed_bfloat16", ()),
              "plan": ("mixed_bfloat16", ("last",))}


def _maps(found):
    """Each candidate's map, decided on the survey (as the plan's `planned` does)."""
    return {name: precision_map.decide(found.model, policy, keep_float32=list(keep), found=found)
            for name, (policy, keep) in CANDIDATES.items()}


def _model():
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="last")(h), name="chain")


def test_each_candidate_leads_a_round_in_turn(monkeypatch):
    labels, calls = {}, []

    def first_call(step, inputs, remapping_off):  # traced in the order of the candidates
        labels[id(step)] = list(CANDIDATES)[len(labels)]

    def time_steps(step, inputs, count):
        assert count == 1
        calls.append(labels[id(step)])
        return float(len(calls))  # the call's place in the sequence

    monkeypatch.setattr(autotune, "first_call", first_call)
    monkeypatch.setattr(autotune, "time_steps", time_steps)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 8)).astype("float32"), rng.normal(size=(4, 1)).astype("float32")
    found = precision_map.survey(_model())
    copies = {name: conversion.apply_surveyed(found, m) for name, m in _maps(found).items()}
    rounds = step_check.time_steps(copies, x, y, keras.losses.mean_squared_error,
                                   half_policy="mixed_bfloat16", rounds=4)
    # measuring.rotated: each leads in turn, the second cycle backwards.
    assert calls == ["float32", "bfloat16", "plan",
                     "bfloat16", "plan", "float32",
                     "plan", "float32", "bfloat16",
                     "plan", "bfloat16", "float32"]
    assert rounds == {"float32": [1.0, 6.0, 8.0, 12.0], "bfloat16": [2.0, 4.0, 9.0, 11.0],
                      "plan": [3.0, 5.0, 7.0, 10.0]}
