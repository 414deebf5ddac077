"""Auto's check tries a per-layer plan when the half policy loses (issue 47).

Timings are faked (a clock that advances by the step cost of the precisions
the model's layers are in when read), so no test depends on this host.
"""

import contextlib
import logging as std_logging

import keras
import numpy as np
import pytest
from model_checks import HALF, check_on, checked_model  # noqa: F401 (check_on: a fixture)

import tf_mixed
from tf_mixed.policy import model_check
from tf_mixed.policy.model_check import Figures, PlanTrial
from tf_mixed.tools.planning import step_candidate

SLOW = Figures(0.5, 0.45, 0.55, 0.1, 0.2, 3)

# Every test runs with the check on, its cache fresh, auto's host choice faked.
pytestmark = pytest.mark.usefixtures("check_on")


class MixClock:
    """Advances by the seconds of a step with the layers' current precisions:
    {(hidden's dtype, logits' dtype): seconds}; ``trace`` more at each
    precision mix's first step."""

    def __init__(self, model, seconds, trace=0.0):
        self.model, self.seconds, self.trace = model, seconds, trace
        self.now, self.reads, self.seen = 0.0, 0, set()

    def __call__(self):
        self.reads += 1
        mix = (self.model.get_layer("hidden").compute_dtype,
               self.model.get_layer("logits").compute_dtype)
        self.now += self.seconds[mix] / 2
        if self.reads % 2 == 0 and mix not in self.seen:
            self.seen.add(mix)
            self.now += self.trace
        return self.now, self.now


def _model(name="planned"):
    return checked_model(name)


B, F = "bfloat16", "float32"
# Whole bfloat16 is slower than float32; hidden in bfloat16 with logits in
# float32 (the plan) is faster than both.
PLAN_WINS = {(B, B): 0.02, (F, F): 0.01, (B, F): 0.005}
PLAN_LOSES = {(B, B): 0.02, (F, F): 0.01, (B, F): 0.015}


def _fit(model, clock, monkeypatch, plans, *, n=2048, batch=16):
    """fit with LossScaleMonitor; the plan source answers the logits layer in float32."""
    monkeypatch.setattr(model_check, "clock", clock)

    def source(seen):
        def plan(model, budget):
            plans.append((budget, seen[0] if seen else None))
            return step_candidate.float32_paths(model, ["logits"]), "faked plan"
        return plan

    monkeypatch.setattr(step_candidate, "plan_source", source)
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)),
                  loss="sparse_categorical_crossentropy")
    monitor = tf_mixed.LossScaleMonitor()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    model.fit(x, np.arange(n) % 3, batch_size=batch, verbose=0, callbacks=[monitor])
    return monitor


# ---------------------------------------------------------------- the rule


def test_a_plan_faster_than_float32_is_kept_with_the_figures():
    moved = model_check.decide(SLOW, HALF, "auto", model_name="m", where="w", cost_s=2.0)
    trial = PlanTrial(("logits",), "faked plan", Figures(1.6, 1.3, 1.9, 0.1, 0.0625, 3), 4.0)
    verdict = model_check.with_plan(moved, trial)
    assert (verdict.action, verdict.policy, verdict.cost_s) == ("planned", HALF, 6.0)
    assert verdict.plan is trial and trial.kept
    assert "a per-layer plan (1 layers in float32, the rest in mixed_bfloat16; faked plan) " \
           "measured 1.60x float32" in verdict.message
    assert "interval 1.30-1.90x" in verdict.message
    assert "now trains with that plan" in verdict.message
    assert "0.50x float32 on model 'm'" in verdict.message  # the half policy's figures too


def test_a_plan_not_faster_than_float32_leaves_float32_and_says_so():
    moved = model_check.decide(SLOW, HALF, "auto", model_name="m", where="w")
    trial = PlanTrial(("logits",), "faked plan", Figures(0.9, 0.8, 1.1, 0.1, 0.11, 3), 4.0)
    verdict = model_check.with_plan(moved, trial)
    assert (verdict.action, verdict.policy) == ("moved", "float32")
    assert verdict.message.endswith("measured 0.90x float32 on the model's own step (plan "
                                    "110.0 ms, float32 100.0 ms; median of 3 interleaved "
                                    "rounds, 90% interval 0.80-1.10x; it cost 4.0 s of CPU "
                                    "more): float32 kept.")


def test_a_plan_not_timed_says_why():
    moved = model_check.decide(SLOW, HALF, "auto", model_name="m", where="w")
    verdict = model_check.with_plan(moved, PlanTrial((), "over the budget"))
    assert verdict.action == "moved"
    assert verdict.message.endswith("A per-layer plan was not timed: over the budget.")


# ---------------------------------------------------------------- in fit


def test_fit_under_auto_moves_a_losing_half_policy_to_a_faster_plan(
        monkeypatch, caplog):
    tf_mixed.enable("auto")
    model = _model()
    plans = []
    with caplog.at_level(std_logging.WARNING):
        monitor = _fit(model, MixClock(model, PLAN_WINS), monkeypatch, plans)
    verdict = monitor.model_check.verdict
    assert (verdict.action, verdict.policy) == ("planned", HALF)
    assert verdict.figures.ratio == pytest.approx(0.5)
    assert verdict.plan.figures.ratio == pytest.approx(2.0)
    assert verdict.plan.float32_layers == ("logits",)
    assert model.get_layer("hidden").compute_dtype == B
    assert model.get_layer("logits").compute_dtype == F
    assert model.get_layer("head").compute_dtype == F
    assert "now trains with that plan" in caplog.text
    # The plan was asked for once, within what was left of the budget, with
    # fit's element spec (the batch's shapes) noted at the first step.
    (budget, spec), = plans
    assert budget > 0 and spec[0].shape.as_list() == [16, 8]  # 2048 / 16: a static batch
    # A new model of the same config and batch shapes: the cache decides at once.
    keras.backend.clear_session()  # layer names as in a new process
    tf_mixed.enable("auto")
    again = _model()
    clock = MixClock(again, PLAN_WINS)
    second = _fit(again, clock, monkeypatch, plans)
    assert second.model_check.verdict.cached and second.model_check.verdict.action == "planned"
    assert again.get_layer("logits").compute_dtype == F and len(plans) == 1
    assert clock.reads == 0


def test_fit_keeps_float32_when_the_plan_is_not_faster(monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    monitor = _fit(model, MixClock(model, PLAN_LOSES), monkeypatch, [])
    verdict = monitor.model_check.verdict
    assert (verdict.action, verdict.policy) == ("moved", "float32")
    assert verdict.plan.figures.ratio == pytest.approx(0.01 / 0.015)
    assert model.get_layer("hidden").compute_dtype == F
    assert "float32 kept." in verdict.message


def test_the_plan_is_not_timed_when_its_predicted_cost_is_over_the_budget_left(
        monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    plans = []
    # Each trace 1 s: the plan is predicted at 1.5 s; 5% of 128 steps of 10 ms
    # is 0.064 s, and the float32 trace alone spent it.
    monkeypatch.setenv(model_check.SECONDS_ENV, "")
    monitor = _fit(model, MixClock(model, PLAN_WINS, trace=1.0), monkeypatch, plans)
    # The half trace (1 s) is over that budget: float32 is not even traced.
    assert monitor.model_check.verdict is None and plans == []
    monkeypatch.setenv(model_check.SECONDS_ENV, "2.5")  # room for float32, not the plan
    model = _model("second")
    monitor = _fit(model, MixClock(model, PLAN_WINS, trace=1.0), monkeypatch, plans)
    verdict = monitor.model_check.verdict
    assert verdict.action == "moved" and plans == []
    assert "it would cost about 1.5 s of CPU" in verdict.plan.summary
    assert "A per-layer plan was not timed" in verdict.message


def test_an_explicit_policy_or_a_winning_half_policy_tries_no_plan(monkeypatch):
    tf_mixed.enable(HALF)
    model = _model()
    plans = []
    assert _fit(model, MixClock(model, PLAN_WINS), monkeypatch, plans
                ).model_check.verdict.action == "warned"
    tf_mixed.enable("auto")
    model = _model("fast")
    faster = {(B, B): 0.005, (F, F): 0.01, (B, F): 0.004}
    assert _fit(model, MixClock(model, faster), monkeypatch, plans
                ).model_check.verdict.action == "kept"
    assert plans == []


def test_under_several_workers_no_plan_is_tried():
    tf_mixed.enable("auto")
    model = _model()
    asked = []

    class Worker:
        num_replicas_in_sync = 2

        class extended:  # noqa: N801
            worker_devices = ("/job:worker/task:0/device:CPU:0",)

    check = model_check.Check(model, "w", lambda name: None, strategy=Worker(),
                              reduce=lambda s, v: [2 * a for a in v],
                              plan_source=lambda m, b: asked.append(b) or "never")
    while (name := check.next_policy()) is not None:
        check.record({"float32": 0.01, HALF: 0.02, "plan": 0.001}[name])
    assert check.verdict.action == "moved" and asked == []
    assert "under several workers only whole-model policies" in check.verdict.message


# ---------------------------------------------------------------- the plan source


def test_the_plan_source_plans_on_a_batch_shaped_as_fits():
    import tensorflow as tf

    model = _model()
    spec = (tf.TensorSpec([None, 8], tf.float32), tf.TensorSpec([None], tf.int32))
    x = step_candidate.batch_like(spec)
    assert x.shape == (step_candidate.BATCH, 8) and x.dtype == np.float32
    assert step_candidate.batch_like(tf.TensorSpec([4, 2], tf.int32)).tolist() == [[0, 0]] * 4
    assert step_candidate.plan_source([])(model, 1.0) == (
        "fit showed no batch shapes to time the layers on")
    found = step_candidate.plan_source([spec])(model, 1.0)
    paths, summary = found
    assert set(paths) <= set(model_check.policies_of(model))
    assert summary.startswith("tf_mixed.plan: ") and "on a batch of 32 of fit's shapes" in summary


def test_the_plan_source_says_why_it_cannot_plan_a_subclassed_model():
    import tensorflow as tf

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Sub()
    model(np.zeros((1, 8), "float32"))
    why = step_candidate.plan_source([(tf.TensorSpec([None, 8], tf.float32),)])(model, 1.0)
    assert isinstance(why, str) and why.startswith("tf_mixed.plan cannot plan this model")


def test_the_plan_source_of_make_train_step_takes_its_first_calls_shapes():
    model = _model()
    spec = step_candidate.spec_of((np.zeros((4, 8), "float32"), np.zeros(4, "int64")))
    assert [(s.shape.as_list(), s.dtype.name) for s in spec] == [([4, 8], "float32"),
                                                                  ([4], "int64")]
    assert step_candidate.batch_like(spec).shape == (4, 8)
    assert step_candidate.plan_source([], who="make_train_step")(model, 1.0) == (
        "make_train_step showed no batch shapes to time the layers on")


def test_float32_paths_cover_a_nested_models_layers():
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="a")], name="inner")
    inputs = keras.Input((4,))
    outer = keras.Model(inputs, keras.layers.Dense(2, name="b")(inner(inputs)))
    paths = step_candidate.float32_paths(outer, ["inner"])
    assert set(paths) == set(model_check.policies_of(inner))
    assert "inner/a" in paths and not {"b", "outer"} & set(paths)


# ---------------------------------------------------------------- in make_train_step


def _fake_source(plans):
    """A plan source factory answering the logits layer in float32, noting what it was given."""

    def source(seen, who="fit"):
        def plan(model, budget):
            plans.append((budget, seen[0] if seen else None, who))
            return step_candidate.float32_paths(model, ["logits"]), "faked plan"
        return plan

    return source


def _step_until_decided(model, clock, monkeypatch, plans, *, strategy=None, batches=None):
    """make_train_step's step called until its check decides; (step, calls)."""
    from tf_mixed import training

    monkeypatch.setattr(model_check, "clock", clock)
    monkeypatch.setattr(step_candidate, "plan_source", _fake_source(plans))
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01))
        optimizer.build(model.trainable_variables)
    step = training.make_train_step(model, "sparse_categorical_crossentropy", optimizer,
                                    strategy=strategy)
    if batches is None:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(16, 8)).astype("float32")
        batches = iter(lambda: (x, np.arange(16) % 3), None)
    calls = 0
    while calls < 60 and not (step.model_check and not step.model_check[0].active):
        out = step(*next(batches))
        calls += 1
    assert np.isfinite(float(out["loss"]))
    return step, calls


@pytest.mark.slow
def test_make_train_step_under_auto_moves_a_losing_half_policy_to_a_faster_plan(
        monkeypatch, caplog):
    tf_mixed.enable("auto")
    model = _model()
    plans = []
    with caplog.at_level(std_logging.WARNING):
        step, _ = _step_until_decided(model, MixClock(model, PLAN_WINS), monkeypatch, plans)
    verdict = step.model_check[0].verdict
    assert (verdict.action, verdict.policy) == ("planned", HALF)
    assert verdict.figures.ratio == pytest.approx(0.5)
    assert verdict.plan.figures.ratio == pytest.approx(2.0)
    assert verdict.plan.float32_layers == ("logits",)
    assert [model.get_layer(n).compute_dtype for n in ("hidden", "logits", "head")] == [B, F, F]
    assert "make_train_step's first calls" in verdict.message
    assert "now trains with that plan" in caplog.text
    # Asked once, within the budget left, with the first call's (x, y) shapes.
    (budget, spec, who), = plans
    assert 0 < budget <= model_check.CHECK_SECONDS and who == "make_train_step"
    assert [s.shape.as_list() for s in spec] == [[16, 8], [16]]
    assert step_candidate.batch_like(spec).shape == (16, 8)
    # The step keeps training with the plan: no more switches, no more timing.
    reads = step.model_check[0].steps
    step(np.zeros((16, 8), "float32"), np.zeros(16, "int64"))
    assert step.model_check[0].steps == reads
    # A new model of the same config and batch: the cache decides at its first call.
    keras.backend.clear_session()
    tf_mixed.enable("auto")
    again = _model()
    clock = MixClock(again, PLAN_WINS)
    second, calls = _step_until_decided(again, clock, monkeypatch, plans)
    assert second.model_check[0].verdict.cached and calls == 1
    assert second.model_check[0].verdict.action == "planned"
    assert again.get_layer("logits").compute_dtype == F and len(plans) == 1
    assert clock.reads == 0


@pytest.mark.slow
def test_make_train_step_keeps_float32_when_the_plan_is_not_faster(monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    step, _ = _step_until_decided(model, MixClock(model, PLAN_LOSES), monkeypatch, [])
    verdict = step.model_check[0].verdict
    assert (verdict.action, verdict.policy) == ("moved", "float32")
    assert verdict.plan.figures.ratio == pytest.approx(0.01 / 0.015)
    assert model.get_layer("hidden").compute_dtype == F and "float32 kept." in verdict.message


@pytest.mark.slow
def test_make_train_step_tries_no_plan_its_budget_forbids(monkeypatch):
    tf_mixed.enable("auto")
    model = _model()
    plans = []
    monkeypatch.setenv(model_check.SECONDS_ENV, "2.5")  # room for float32, not the plan
    step, _ = _step_until_decided(model, MixClock(model, PLAN_WINS, trace=1.0),
                                  monkeypatch, plans)
    verdict = step.model_check[0].verdict
    assert (verdict.action, verdict.policy) == ("moved", "float32") and plans == []
    assert "it would cost about 1.5 s of CPU" in verdict.plan.summary
    assert "A per-layer plan was not timed" in verdict.message
    assert model.get_layer("hidden").compute_dtype == F


@pytest.mark.slow
def test_make_train_step_on_two_replicas_takes_one_plan_every_replica_runs(
        monkeypatch, mirrored):
    import tensorflow as tf

    tf_mixed.enable("auto")
    with mirrored.scope():
        model = _model()
    plans = []
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(64, 8)).astype("float32"), np.arange(64) % 3)).batch(16).repeat()
    batches = iter(mirrored.experimental_distribute_dataset(data))
    step, _ = _step_until_decided(model, MixClock(model, PLAN_WINS), monkeypatch, plans,
                                  strategy=mirrored, batches=batches)
    verdict = step.model_check[0].verdict
    assert (verdict.action, verdict.policy) == ("planned", HALF)
    # One plan, timed on one replica's share of the batch (16 over 2 replicas).
    (_, spec, _), = plans
    assert [s.shape.as_list() for s in spec] == [[8, 8], [8]]
    # Every replica computes with it: hidden in bfloat16, logits in float32.

    def replica(x):
        hidden = model.get_layer("hidden")(x)
        return hidden, model.get_layer("logits")(hidden)

    hidden, logits = mirrored.run(replica, args=(next(batches)[0],))
    assert [v.dtype for v in mirrored.experimental_local_results(hidden)] == [tf.bfloat16] * 2
    assert [v.dtype for v in mirrored.experimental_local_results(logits)] == [tf.float32] * 2
