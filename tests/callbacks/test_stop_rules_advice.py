"""Advice that fits the run: no float16 fix for a bfloat16 or float32 run (issue 44).

The monitor's stop messages and the probe's advice read one table,
`tf_mixed._internal.facts.POLICY_FIXES`, for the dtype the model computes in;
without a loss scale no loss-scale advice is given.
"""

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed._internal import facts
from tf_mixed.callbacks import stop_rules
from tf_mixed.callbacks.monitor import run_advice
from tf_mixed.callbacks.optimizer_views import view_of
from tf_mixed.callbacks.stop_rules import Progress, Reading, Snapshot, StopRules


def _model(policy):
    keras.config.set_dtype_policy(policy)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD()), loss="mse")
    return model


def _stops(advice):
    """The reason of each rule that can fire, with ``advice``."""
    stuck = Progress(Snapshot(scale=1.0, applied=0), Snapshot(
        scale=1.0, applied=0, skipped=30, min_scale_skips=30), streak=30)
    rules = StopRules(patience=20, max_skip_fraction=0.5)
    base = dict(kind="tf_mixed", threshold=1.0, advice=advice)
    return [
        stop_rules.decide(rules, Reading(progress=stuck, **base)),
        stop_rules.decide(rules, Reading(progress=Progress(Snapshot(1.0, 0), Snapshot(1.0, 0)),
                                         loss_problem="the loss is nan.", **base)),
        stop_rules.decide(rules, Reading(progress=Progress(Snapshot(1.0, 0), Snapshot(1.0, 0)),
                                         bad_weights=("dense/kernel",), **base)),
        stop_rules.decide(rules, Reading(progress=Progress(
            Snapshot(1.0, 0), Snapshot(1.0, 4, skipped=6), skipped_in_epoch=6,
            steps_in_epoch=10), epoch=0, **base)),
    ]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_a_run_without_float16_gets_no_float16_or_loss_scale_advice(policy):
    model = _model(policy)
    advice = run_advice(model, view_of(model.optimizer))
    assert not advice.scaled
    for reason in _stops(advice):
        assert reason is not None
        assert "float16" not in reason.replace("bfloat16", "")
        assert "mixed_bfloat16" not in reason
        assert "loss scal" not in reason.replace("no loss scale", "")
        assert "wrap_optimizer" not in reason


def test_a_float16_run_keeps_the_float16_advice():
    model = _model("mixed_float16")
    advice = run_advice(model, view_of(model.optimizer))
    assert advice.scaled
    stuck = _stops(advice)[0]
    assert "loss scale has sat at its minimum" in stuck
    assert facts.policy_fix("float16", "overflow") in stuck
    assert "train in mixed_bfloat16" in stuck


def test_the_narrowest_compute_dtype_decides():
    keras.config.set_dtype_policy("mixed_bfloat16")
    inputs = keras.Input((4,))
    h = keras.layers.Dense(4, dtype="mixed_float16")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(h))
    assert facts.narrowest_compute_dtype(model) == "float16"
    keras.config.set_dtype_policy("float32")
    assert facts.narrowest_compute_dtype(keras.Sequential([keras.Input((2,)),
                                                           keras.layers.Dense(1)])) == "float32"


def test_probe_of_a_bfloat16_policy_recommends_no_loss_scale():
    keras.config.set_dtype_policy("float32")
    inputs = keras.Input((8,))
    h = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, tf_mixed.Float32Output()(keras.layers.Dense(1)(h)))
    x = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
    report = tf_mixed.probe(model, x, x[:, :1], loss="mse", policy="mixed_bfloat16")
    assert report.recommended_scale == 1.0
    text = str(report)
    assert "recommended initial" not in text and "initial_scale" not in text
    assert "Loss scale: none needed" in text
