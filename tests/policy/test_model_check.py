"""Auto's choice checked on the model's own training step (tf_mixed.policy.model_check).

Timings are faked: a clock that advances, at each reading, by the seconds a
step costs in the policy the model's layers are in at that moment (so no test
depends on this host); the rule, schedule and statistics are pure and checked
with exact values.
"""

import logging as std_logging
import warnings

import keras
import numpy as np
import pytest
from model_checks import HALF, check_on, checked_model  # noqa: F401 (check_on: a fixture)
from zoo import ZOO

import tf_mixed
from tf_mixed import training
from tf_mixed._internal import measuring
from tf_mixed.policy import model_check
from tf_mixed.policy.model_check import Figures, StepRounds
from tf_mixed.tools.planning import step_candidate

# Every test runs with the check on, its cache fresh, auto's host choice faked.
pytestmark = pytest.mark.usefixtures("check_on")


class FakeClock:
    """Advances by the step cost of the policy the watched layer is in when read."""

    def __init__(self, seconds):
        self.seconds, self.now, self.layer, self.reads = dict(seconds), 0.0, None, 0

    def watch(self, layer):
        self.layer = layer
        return self

    def __call__(self):
        self.reads += 1
        self.now += self.seconds[self.layer.compute_dtype] / 2  # two reads a step
        return self.now, self.now  # (wall, CPU): alike here


_model = checked_model


def _data(n=256):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 8)).astype("float32"), (np.arange(n) % 3).astype("int32")


def _fit(model, clock, monkeypatch, *, epochs=1, batch=16, n=256):
    monkeypatch.setattr(model_check, "clock", clock.watch(model.get_layer("hidden")))
    with model.distribute_strategy.scope():
        optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    monitor = tf_mixed.LossScaleMonitor()
    x, y = _data(n)
    model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, callbacks=[monitor])
    return monitor


# ---------------------------------------------------------------- pure parts


def test_figures_are_the_median_of_per_round_ratios_with_its_interval():
    rounds = {"float32": [2.0, 2.0, 2.0, 2.0, 2.0], HALF: [4.0, 2.0, 8.0, 4.0, 1.0]}
    fig = model_check.figures(rounds, HALF)
    # ratios float32 / half: 0.5, 1.0, 0.25, 0.5, 2.0; the interval is measuring's.
    found = measuring.estimate([0.5, 1.0, 0.25, 0.5, 2.0])
    assert (fig.ratio, fig.low, fig.high) == (0.5, found.low, found.high)
    assert fig.low <= 0.5 <= fig.high
    assert (fig.float32_s, fig.half_s, fig.rounds) == (2.0, 4.0, 5)
    assert Figures.from_list(fig.as_list()) == fig


def test_figures_refuse_no_round_and_non_positive_seconds():
    with pytest.raises(ValueError, match="at least one round of positive seconds"):
        model_check.figures({"float32": [], HALF: []}, HALF)
    with pytest.raises(ValueError, match="Received: rounds="):
        model_check.figures({"float32": [1.0], HALF: [0.0]}, HALF)


SLOW = Figures(0.5, 0.45, 0.55, 0.1, 0.2, 5)
FAST = Figures(1.5, 1.4, 1.6, 0.3, 0.2, 5)


def test_auto_moves_a_slower_half_policy_to_float32_with_the_figures():
    verdict = model_check.decide(SLOW, HALF, "auto", model_name="m", where="fit's first steps",
                                 cost_s=1.25)
    assert (verdict.policy, verdict.action) == ("float32", "moved")
    for text in ("0.50x float32", "mixed_bfloat16 200.0 ms", "float32 100.0 ms",
                 "median of 5 interleaved rounds", "90% interval 0.45-0.55x",
                 "check cost 1.2 s of CPU", "now trains in float32, the faster for it",
                 "tf_mixed.plan"):
        assert text in verdict.message


def test_an_explicit_slower_policy_is_kept_and_told_with_the_fix():
    verdict = model_check.decide(SLOW, HALF, "explicit", model_name="m", where="w")
    assert (verdict.policy, verdict.action) == (HALF, "warned")
    assert "2.00x slower than in float32" in verdict.message
    assert "tf_mixed.enable('auto')" in verdict.message
    assert "tf_mixed.enable('float32')" in verdict.message


@pytest.mark.parametrize("requested", ["auto", "explicit"])
def test_a_half_policy_not_slower_is_kept(requested):
    verdict = model_check.decide(FAST, HALF, requested, model_name="m", where="w", cached=True)
    assert (verdict.policy, verdict.action) == (HALF, "kept")
    assert "1.50x float32" in verdict.message and "read from the cache" in verdict.message


def test_a_ratio_the_rounds_do_not_resolve_from_one_says_so():
    fig = Figures(0.97, 0.9, 1.05, 0.1, 0.103, 5)
    verdict = model_check.decide(fig, HALF, "auto", model_name="m", where="w")
    assert verdict.action == "moved"
    assert "the interval holds 1.00x" in verdict.message
    assert "now trains in float32, as fast for it within the interval" in verdict.message


def _drive(rounds: StepRounds, seconds, cpu=None):
    """Runs the schedule; a policy's seconds are a number or a list used in turn."""
    order = []
    while (name := rounds.next_policy()) is not None:
        order.append(name)
        given = seconds[name]
        wall = given[order.count(name) - 1] if isinstance(given, list) else given
        rounds.record(name, wall, None if cpu is None else cpu[name])
    return order


# float32 steady, the half policy alternately faster and slower: an interval
# across 1.00x whatever the number of rounds.
UNRESOLVED = {"float32": 1.0, HALF: [2.0, 1.0] + [0.8, 1.25] * 10}


def test_the_schedule_warms_each_policy_then_alternates_the_order_of_rounds():
    rounds = StepRounds(HALF, budget_s=0.0)  # a spent budget: the minimum rounds
    order = _drive(rounds, {HALF: 2.0, "float32": 1.0})
    f, h = "float32", HALF
    # Two half steps (its trace, then its step), float32's trace, then
    # rounds in measuring.rotated's order.
    assert order == [h, h, f] + [f, h, h, f, h, f]
    assert len(rounds.rounds()["float32"]) == model_check.MIN_ROUNDS == 3


def test_the_schedule_runs_up_to_the_most_rounds_within_its_budget():
    rounds = StepRounds(HALF, budget_s=1e9)
    _drive(rounds, UNRESOLVED)
    assert len(rounds.rounds()[HALF]) == model_check.MAX_ROUNDS == 7
    assert not rounds.answered()


def test_the_schedule_stops_once_the_interval_answers():
    rounds = StepRounds(HALF, budget_s=1e9)
    _drive(rounds, {HALF: 2.0, "float32": 1.0})  # every round 0.50x: answered at once
    assert len(rounds.rounds()[HALF]) == model_check.MIN_ROUNDS
    assert rounds.answered()
    faster = StepRounds(HALF, budget_s=1e9)
    _drive(faster, {HALF: [3.0, 1.0, 1.0, 1.0, 1.0], "float32": [9.0, 1.2, 1.5, 1.1]})
    assert len(faster.rounds()[HALF]) == 3 and faster.answered()  # all above 1.00x


def test_a_short_run_gets_the_rounds_that_end_before_it():
    assert model_check.rounds_within(None) == model_check.MAX_ROUNDS
    assert model_check.rounds_within(19) == 7    # 3 + 14 steps, 2 to spare
    assert model_check.rounds_within(15) == 5
    assert model_check.rounds_within(model_check.MIN_STEPS) == model_check.MIN_ROUNDS
    assert model_check.rounds_within(10**6) == model_check.MAX_ROUNDS
    rounds = StepRounds(HALF, budget_s=1e9, max_rounds=5)
    _drive(rounds, UNRESOLVED)
    assert len(rounds.rounds()[HALF]) == 5


def test_fixed_rounds_are_the_same_number_whatever_the_budget_or_the_answer():
    for budget, seconds in ((1e9, UNRESOLVED), (0.0, {HALF: 2.0, "float32": 1.0})):
        rounds = StepRounds(HALF, fixed=True, budget_s=budget)
        _drive(rounds, seconds)
        assert len(rounds.rounds()[HALF]) == model_check.FIXED_ROUNDS == 5


def test_the_cost_is_the_second_trace_and_the_slower_policy_excess_in_cpu_seconds():
    rounds = StepRounds(HALF, budget_s=0.0)
    walls = {HALF: [9.0, 2.0, 2.0, 3.0, 2.0], "float32": [5.0, 1.0, 1.0, 1.0]}
    for name, wall in [(HALF, 9.0), (HALF, 2.0), ("float32", 5.0), ("float32", 1.0),
                       (HALF, 2.0), (HALF, 3.0), ("float32", 1.0), (HALF, 2.0),
                       ("float32", 1.0)]:
        rounds.record(name, wall, cpu=2 * wall)  # CPU: twice the wall (two threads)
    assert rounds.rounds() == {"float32": walls["float32"][1:], HALF: walls[HALF][2:]}
    # CPU: float32's warm-up step beyond its median step (10 - 2), then 2 + 4 + 2.
    assert rounds.cost() == 16.0
    assert rounds.trace() == 14.0  # the half policy's first step beyond its second, CPU


def test_a_float32_trace_predicted_over_the_budget_is_not_run():
    rounds = StepRounds(HALF, budget_s=5.0)
    rounds.record(HALF, 8.0)   # trace + step
    rounds.record(HALF, 1.0)   # a step: the trace took 7 s
    assert rounds.trace() == 7.0 and rounds.trace_too_costly()
    assert rounds.next_policy() is None
    fixed = StepRounds(HALF, fixed=True, budget_s=5.0, warm={HALF: 8.0}, first=1.0)
    assert fixed.next_policy() == "float32"  # every worker runs the same rounds


def test_the_budget_environment_variable_replaces_both_bounds(monkeypatch):
    monkeypatch.setenv(model_check.SECONDS_ENV, "90")
    assert model_check.budget_s(10, 0.1) == 90.0
    monkeypatch.setenv(model_check.SECONDS_ENV, "soon")
    with pytest.raises(ValueError, match="TF_MIXED_MODEL_CHECK_SECONDS=.soon."):
        model_check.budget_s(10, 0.1)


def test_the_budget_is_the_smaller_of_its_seconds_and_its_share_of_an_epoch():
    assert model_check.budget_s(None, 1.0) == model_check.CHECK_SECONDS
    assert model_check.budget_s(100, 0.5) == pytest.approx(2.5)
    assert model_check.budget_s(10**6, 1.0) == model_check.CHECK_SECONDS


# ---------------------------------------------------------------- moving a model


@pytest.mark.parametrize("name", ZOO)
def test_policies_move_to_float32_and_back_over_the_zoo(name):
    with tf_mixed.policy_scope(HALF):
        model = ZOO[name].ready()
    before = model_check.policies_of(model)
    weights = [w.numpy() for w in model.weights]
    model_check.set_policies(model, model_check.float32_of(before))
    assert {layer.compute_dtype for layer in _sublayers(model)} == {"float32"}
    model_check.set_policies(model, before)
    assert model_check.policies_of(model) == before
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(weights, model.weights))
    assert model_check.half_of(before) == (HALF, "")


@pytest.mark.slow  # a fit of 16 steps and two traces per zoo model
@pytest.mark.parametrize("name", ZOO)
def test_fit_moves_every_zoo_model_auto_chose_when_float32_is_faster(
        name, monkeypatch):
    spec = ZOO[name]
    tf_mixed.enable("auto")
    model = spec.ready()
    record = model_check.Check.record
    fake = {"float32": 0.01, HALF: 0.02}
    monkeypatch.setattr(model_check.Check, "record",
                        lambda self, seconds: record(self, fake[self._current]))
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)),
                  loss=spec.loss)
    monitor = tf_mixed.LossScaleMonitor()
    x, y = spec.data(256)
    history = model.fit(x, y, batch_size=16, verbose=0, callbacks=[monitor])
    assert monitor.model_check.verdict.action == "moved"
    assert {layer.compute_dtype for layer in _sublayers(model)} == {"float32"}
    assert all(np.isfinite(v) for v in history.history["loss"])


def _sublayers(model):
    from tf_mixed._internal import shims

    return shims.sublayers(model)


def test_a_float32_or_pure_half_model_is_not_checked_and_says_why():
    assert model_check.half_of({"a": "float32"}) == (None, "it computes in float32")
    half, why = model_check.half_of({"a": "bfloat16"})
    assert half is None and "variables in bfloat16" in why
    # A float8-quantized model (tf_mixed.float8.quantize) is not moved to float32.
    half, why = model_check.half_of({"a": "mixed_bfloat16", "b": "float8_from_mixed_bfloat16"})
    assert half is None and why == ("its layers are quantized (policy "
                                    "'float8_from_mixed_bfloat16'): float32 compute would undo "
                                    "the quantization")


# ---------------------------------------------------------------- fit


def test_fit_under_auto_moves_a_slower_model_to_float32_before_training_on(
        monkeypatch, caplog):
    tf_mixed.enable("auto")
    model = _model()
    clock = FakeClock({"bfloat16": 0.02, "float32": 0.01})
    with caplog.at_level(std_logging.WARNING):
        monitor = _fit(model, clock, monkeypatch)
    verdict = monitor.model_check.verdict
    assert (verdict.requested, verdict.action, verdict.policy) == ("auto", "moved", "float32")
    assert verdict.figures.ratio == pytest.approx(0.5)
    # 5% of a 16-step run is spent within the first rounds: the minimum ran.
    assert verdict.figures.rounds == model_check.MIN_ROUNDS
    assert model.get_layer("hidden").compute_dtype == "float32"
    assert model.compute_dtype == "float32"
    assert "now trains in float32" in caplog.text
    # The steps after the check are not timed: the clock was read in the rounds only.
    assert clock.reads == 2 * (3 + 2 * model_check.MIN_ROUNDS)
    assert model.predict(_data(4)[0], verbose=0).dtype == np.float32


def test_fit_under_auto_keeps_a_faster_half_policy(monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    monitor = _fit(model, FakeClock({"bfloat16": 0.01, "float32": 0.02}), monkeypatch)
    assert monitor.model_check.verdict.action == "kept"
    assert model.get_layer("hidden").compute_dtype == "bfloat16"
    assert model.get_layer("head").compute_dtype == "float32"


def test_fit_under_an_explicit_policy_warns_once_and_keeps_it(monkeypatch, caplog):
    tf_mixed.enable(HALF)
    model = _model()
    clock = FakeClock({"bfloat16": 0.03, "float32": 0.01})
    with caplog.at_level(std_logging.WARNING):
        first = _fit(model, clock, monkeypatch)
        second = _fit(model, clock, monkeypatch)
    assert first.model_check.verdict.action == "warned"
    assert model.get_layer("hidden").compute_dtype == "bfloat16"
    assert caplog.text.count("requested explicitly, and") == 1
    assert "3.00x slower than in float32" in caplog.text
    # The second fit decided from the cache, before its first step.
    assert second.model_check.verdict.cached and second.model_check.verdict.cost_s == 0.0
    assert second.model_check.verdict.action == "warned"


def test_a_policy_kept_from_the_cache_switches_no_step():
    tf_mixed.enable(HALF)
    model = _model()
    model_check.write_cached(model_check.cache_key(model_check.model_digest(model, None), HALF),
                             FAST, 1.0)
    switched = []
    check = model_check.Check(model, "w", switched.append)
    assert check.verdict.cached and check.verdict.action == "kept"
    assert switched == []  # the loop's half step, traced or not, stays


def test_the_cache_decides_before_the_first_step_of_a_second_run(monkeypatch):
    tf_mixed.enable("auto")
    first_model = _model()
    _fit(first_model, FakeClock({"bfloat16": 0.02, "float32": 0.01}), monkeypatch)
    keras.backend.clear_session()  # layer names as in a new process
    tf_mixed.enable("auto")
    again = _model()  # the same config: the same cache entry
    clock = FakeClock({"bfloat16": 0.02, "float32": 0.01})
    with warnings.catch_warnings():
        warnings.simplefilter("error", tf_mixed.callbacks.MixedPrecisionWarning)
        monitor = _fit(again, clock, monkeypatch)  # float32 on purpose: not "built before"
    assert monitor.model_check.verdict.cached
    assert clock.reads == 0
    assert again.get_layer("hidden").compute_dtype == "float32"


def test_a_busy_machine_decides_but_does_not_cache(monkeypatch):
    monkeypatch.setattr(measuring, "machine_load", lambda: (9.0, 2))
    tf_mixed.enable("auto")
    model = _model()
    monitor = _fit(model, FakeClock({"bfloat16": 0.02, "float32": 0.01}), monkeypatch)
    assert monitor.model_check.verdict.action == "moved"
    assert model_check.read_cached(monitor.model_check.key) is None


def test_a_model_whose_trace_is_over_the_budget_is_told_not_checked(
        monkeypatch, caplog):
    tf_mixed.enable("auto")
    model = _model()
    clock = FakeClock({"bfloat16": 0.02, "float32": 0.01})
    calls = []
    real = clock.__call__

    def slow_first_step():  # the first step's two readings: a 30 s trace
        calls.append(1)
        wall, cpu = real()
        late = 30.0 if len(calls) >= 2 else 0.0
        return wall + late, cpu + late

    monkeypatch.setattr(model_check, "clock", slow_first_step)
    clock.watch(model.get_layer("hidden"))
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)),
                  loss="sparse_categorical_crossentropy")
    monitor = tf_mixed.LossScaleMonitor()
    with caplog.at_level(std_logging.INFO, logger="absl"):
        model.fit(*_data(), batch_size=16, verbose=0, callbacks=[monitor])
    # It read "reaches 60 s of CPU and 5% of the planned training": the smaller one stops it.
    assert "reaches its budget, the smaller of 60 s of CPU and 5% of the planned" in caplog.text
    assert monitor.model_check.verdict is None
    assert "NOT checked against float32" in monitor.model_check.skipped
    assert "its trace took 30.0 s of CPU" in caplog.text
    # 5% of 16 steps of 0.01 s; it read "budget of 0.0 s" (README's own fit example)
    assert "over the check's budget of 0.008 s" in caplog.text
    assert model.get_layer("hidden").compute_dtype == "bfloat16"


def test_a_run_too_short_for_the_check_is_not_checked_and_says_why(monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    monitor = _fit(model, FakeClock({"bfloat16": 0.02, "float32": 0.01}), monkeypatch, n=64)
    assert monitor.model_check is None
    assert model.get_layer("hidden").compute_dtype == "bfloat16"


def test_a_fit_that_stops_inside_the_rounds_leaves_the_model_in_its_policy(
        monkeypatch, caplog):
    tf_mixed.enable("auto")
    model = _model()

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                self.model.stop_training = True

    monkeypatch.setattr(model_check, "clock",
                        FakeClock({"bfloat16": 0.02, "float32": 0.01}).watch(
                            model.get_layer("hidden")))
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)),
                  loss="sparse_categorical_crossentropy")
    monitor = tf_mixed.LossScaleMonitor()
    with caplog.at_level(std_logging.WARNING):
        model.fit(*_data(), batch_size=16, verbose=0, callbacks=[monitor, Stop()])
    assert monitor.model_check.verdict is None
    assert model.get_layer("hidden").compute_dtype == "bfloat16"
    assert "did not finish" in caplog.text


def test_check_policy_false_trains_as_built(monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    monitor = tf_mixed.LossScaleMonitor(check_policy=False)
    model.fit(*_data(), batch_size=16, verbose=0, callbacks=[monitor])
    assert monitor.model_check is None and monitor.get_config()["check_policy"] is False
    with pytest.raises(TypeError, match="check_policy"):
        tf_mixed.LossScaleMonitor(check_policy=1)


def test_the_monitors_first_line_says_what_auto_measured_and_on_what(caplog):
    tf_mixed.enable("auto")
    model = _model()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    monitor = tf_mixed.LossScaleMonitor(check_policy=False)
    with caplog.at_level(std_logging.INFO, logger="absl"):  # whatever absl's verbosity
        model.fit(*_data(32), batch_size=16, verbose=0, callbacks=[monitor])
    first = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("tf_mixed.LossScaleMonitor")][0]
    assert "host's Dense+Conv2D probe" in first and "not measured on this model" in first


def test_under_mirrored_strategy_the_one_decision_moves_every_replica(
        monkeypatch, mirrored):
    tf_mixed.enable("auto")
    with mirrored.scope():
        model = _model()
    monitor = _fit(model, FakeClock({"bfloat16": 0.02, "float32": 0.01}), monkeypatch,
                   batch=32, n=512)
    assert monitor.model_check.verdict.action == "moved"
    assert model.get_layer("hidden").compute_dtype == "float32"


# ---------------------------------------------------------------- other entry points


@pytest.mark.slow
def test_make_train_step_under_auto_moves_a_slower_model(monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    clock = FakeClock({"bfloat16": 0.02, "float32": 0.01}).watch(model.get_layer("hidden"))
    monkeypatch.setattr(model_check, "clock", clock)
    # The whole-model move: no per-layer plan (tests/policy/test_model_check_plan.py's).
    monkeypatch.setattr(step_candidate, "plan_source",
                        lambda seen, who="fit": lambda model, budget: "no plan (faked)")
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))
    optimizer.build(model.trainable_variables)
    step = training.make_train_step(model, "sparse_categorical_crossentropy", optimizer)
    x, y = _data(16)
    for _ in range(3 + 2 * model_check.MAX_ROUNDS + 2):
        out = step(x, y)
    assert np.isfinite(float(out["loss"]))
    verdict = step.model_check[0].verdict
    assert (verdict.action, verdict.policy) == ("moved", "float32")
    assert "make_train_step's first calls" in verdict.message
    assert verdict.message.endswith("A per-layer plan was not timed: no plan (faked).")
    assert model.get_layer("hidden").compute_dtype == "float32"


@pytest.mark.slow
def test_make_train_step_under_an_explicit_policy_keeps_it(monkeypatch):
    tf_mixed.enable(HALF)
    model = _model()
    monkeypatch.setattr(model_check, "clock", FakeClock(
        {"bfloat16": 0.02, "float32": 0.01}).watch(model.get_layer("hidden")))
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))
    optimizer.build(model.trainable_variables)
    step = training.make_train_step(model, "sparse_categorical_crossentropy", optimizer)
    x, y = _data(16)
    for _ in range(3 + 2 * model_check.MAX_ROUNDS):
        step(x, y)
    assert step.model_check[0].verdict.action == "warned"
    assert model.get_layer("hidden").compute_dtype == "bfloat16"


def test_enable_auto_with_a_model_moves_it_and_marks_it_auto():
    model = _model()  # built in float32
    enabled = tf_mixed.enable("auto", model=model, keep_float32=["logits"])
    assert enabled.policy == HALF
    assert "moved to mixed_bfloat16 now" in enabled.reason
    assert model.get_layer("hidden").compute_dtype == "bfloat16"
    assert model.get_layer("logits").compute_dtype == "float32"
    assert model.get_layer("head").compute_dtype == "float32"
    tf_mixed.disable()
    assert model_check.provenance(model) == "auto"


def test_enable_refuses_a_model_that_is_not_built():
    with pytest.raises(TypeError, match="`model` must be a built Keras model"):
        tf_mixed.enable("mixed_bfloat16", model=keras.Sequential([keras.layers.Dense(2)]))
    with pytest.raises(TypeError, match="Received: model='m'"):
        tf_mixed.enable("mixed_bfloat16", model="m")


def test_convert_auto_marks_its_copy_as_auto_chosen():
    model = _model()
    converted = tf_mixed.convert(model, "auto")
    assert model_check.provenance(converted) == "auto"
    assert model_check.provenance(tf_mixed.convert(model, HALF)) == "explicit"


# ---------------------------------------------------------------- several workers


class _FakeExtended:
    worker_devices = ("/job:worker/task:0/device:CPU:0",)


class _FakeMultiWorker:
    num_replicas_in_sync = 2
    extended = _FakeExtended()


def test_several_workers_decide_from_the_mean_of_every_workers_figures():
    strategy = _FakeMultiWorker()
    assert model_check.multi_worker(strategy)
    other_worker = [2.0, 1.8, 2.2, 0.1, 0.05, 5.0, 1.0]
    mine = [0.5, 0.4, 0.6, 0.1, 0.2, 5.0, 3.0]
    shared = model_check.shared_means(
        strategy, mine, reduce=lambda s, v: [a + b for a, b in zip(v, other_worker)])
    assert shared == pytest.approx([1.25, 1.1, 1.4, 0.1, 0.125, 5.0, 2.0])
    verdict = model_check.decide(Figures.from_list(shared[:-1]), HALF, "auto",
                                 model_name="m", where="w", cost_s=shared[-1])
    assert verdict.action == "kept"  # this worker alone would have moved


def test_one_worker_keeps_its_own_figures(mirrored):
    assert not model_check.multi_worker(mirrored)
    assert model_check.shared_means(mirrored, [1.0, 2.0]) == [1.0, 2.0]


def test_under_several_workers_the_rounds_are_fixed_and_the_cache_unread(
        monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    key = model_check.cache_key(model_check.model_digest(model, None), HALF)
    model_check.write_cached(key, FAST, 1.0)
    switched = []
    check = model_check.Check(model, "w", switched.append, strategy=_FakeMultiWorker(),
                              reduce=lambda s, v: [2 * a for a in v])
    assert check.active and check.rounds.fixed  # the cached verdict was not read
    assert check.next_policy() == HALF and switched == []  # already in its own policy
    while (name := check.next_policy()) is not None:
        check.record({"float32": 0.01, HALF: 0.02}[name])
    assert check.verdict.action == "moved" and switched[-1] == "float32"


def test_the_monitors_first_line_says_the_check_runs_within_its_budget():
    # It said "is checked against float32 in the first steps", then a warning
    # said "NOT checked" for every short fit (README's own example).
    tf_mixed.enable("mixed_bfloat16")
    text = model_check.describe(checked_model())
    assert text == (
        "model 'checked' computes in mixed_bfloat16, requested explicitly (tf_mixed measured "
        "nothing for it); its own training step is checked against float32 in the first "
        "steps where the check fits its budget (the smaller of 60 s of CPU and 5% of the "
        "planned training)")
