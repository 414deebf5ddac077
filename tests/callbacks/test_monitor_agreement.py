"""LossScaleMonitor states the same reason on every worker: a peer's signs and weight flags
are summed into its own (the all-reduce faked here; tests/integration/test_cross_worker_decisions.py
runs it on two worker processes)."""

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.callbacks import monitor as monitor_module
from tf_mixed.callbacks import stop_rules


@pytest.fixture
def monitor():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="out")], name="m")
    model.compile(optimizer=tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    monitor = tf_mixed.LossScaleMonitor(check_policy=False, check_setup=False)
    monitor.set_model(model)
    monitor.on_train_begin()
    return monitor


def _peer(monkeypatch, peer):
    """The all-reduce: this worker's values plus a peer's."""
    sent = []

    def sums(strategy, values):
        sent.append(list(values))
        return [a + b for a, b in zip(values, peer)]

    monkeypatch.setattr(monitor_module, "_global_sums", sums)
    return sent


def test_a_peers_bad_weight_and_loss_are_named_here(monitor, monkeypatch):
    # The peer: a NaN loss tally and NaN in its copy of the bias (kernel, bias).
    sent = _peer(monkeypatch, [1.0, 0.0, 0.0, 0.0, 1.0])
    problem, bad = monitor_module._agreed_problems(monitor, 0.5, scan=True)
    assert sent == [[0.0] * 5]  # one all-reduce: 3 signs, 1 flag per float weight
    assert problem == stop_rules.loss_problem("tf_mixed", monitor._progress, float("nan"))
    assert bad == ("m/out/bias",)


def test_own_bad_weights_join_the_peers(monitor, monkeypatch):
    kernel, bias = monitor.model.weights
    kernel.assign(np.full((2, 1), np.nan, "float32"))
    sent = _peer(monkeypatch, [0.0, 0.0, 0.0, 0.0, 1.0])
    assert monitor_module._agreed_problems(monitor, 0.5, scan=True) == (
        None, ("m/out/kernel", "m/out/bias"))
    # Not scanned here (nothing suspicious on this worker): the peer's flag alone.
    assert monitor_module._agreed_problems(monitor, 0.5, scan=False) == (None, ("m/out/bias",))
    assert sent[0][3:] == [1.0, 0.0] and sent[1][3:] == [0.0, 0.0]


def test_with_one_worker_nothing_is_reduced(monitor):
    assert monitor_module._agreed_problems(monitor, 0.5, scan=True) == (None, ())
    assert monitor_module._agreed_problems(monitor, float("inf"), scan=True)[0] == (
        stop_rules.loss_problem("tf_mixed", monitor._progress, float("inf")))


class _TwoWorkers:
    """A strategy seen from one worker of two (one local replica): `run` is counted."""

    num_replicas_in_sync = 2

    def __init__(self):
        self.extended = type("Extended", (), {"worker_devices": ("/cpu:0",)})()
        self.runs = 0

    def run(self, fn):
        self.runs += 1  # once per trace of the summing function
        return fn()

    def reduce(self, op, value, axis):
        return value * 2.0  # the peer sent the same values


def test_the_workers_sums_trace_one_function_per_length_of_values():
    strategy = _TwoWorkers()
    for values in ([1.0, 2.0], [3.0, 4.0], [5.0, 6.0]):
        assert monitor_module._global_sums(strategy, values) == [2 * v for v in values]
    assert monitor_module._global_sums(strategy, [7.0]) == [14.0]
    assert strategy.runs == 2  # one trace per length; every check traced anew before
