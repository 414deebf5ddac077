"""tf_mixed.plan: choices from injected timings, the emulated host, float8 on a GPU, the cache."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed._internal import measuring
from tf_mixed.policy import hardware
from tf_mixed.tools.planning import LayerTiming, Measurement
from tf_mixed.tools.planning.plan_table import Plan
from tf_mixed.tools.planning.planner import plan

MS = 1e-3
AMX_CPU = hardware.HardwareInfo(cpu_model="Test Xeon", cpu_flags=frozenset({"avx512_bf16"}))
AVX2_CPU = hardware.HardwareInfo(cpu_model="Test EPYC", cpu_flags=frozenset({"avx2"}))


def _gpu(cc):
    return hardware.HardwareInfo(gpus=(hardware.GpuInfo("Test GPU", cc),), cpu_model="x")


def _model():
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, name="first")(inputs)
    h = keras.layers.ReLU(name="relu")(h)
    h = keras.layers.Dense(16, name="second")(h)
    outputs = keras.layers.Dense(1, name="last")(h)
    return keras.Model(inputs, outputs, name="chain")


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 8)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")


def _timing(name, producers, f32, half, cast, half_name="bfloat16", **extra):
    seconds = {"float32": (f32 * MS,) * 5, half_name: (half * MS,) * 5}
    seconds.update({k: (v * MS,) * 5 for k, v in extra.items()})
    return LayerTiming(name, "Dense", tuple(producers), seconds, (cast * MS,) * 5,
                       "float8" in extra)


def _measurement(half_name="bfloat16", precisions=None, **last_extra):
    return Measurement(
        precisions or ("float32", half_name),
        (_timing("first", [""], 4, 2, 0.5, half_name),
         _timing("second", ["first"], 4, 2, 0.5, half_name),
         _timing("last", ["second"], 1, 3, 0.1, half_name, **last_extra)),
        {"relu": "first"})


def _checked(half_name="bfloat16"):
    """Timings whose per-layer choice is neither whole model once built: 'second'
    (a middle layer) is faster in float32, the others in the half dtype ('last',
    the output, is float32 in every map: see `_measurement`)."""
    return Measurement(
        ("float32", half_name),
        (_timing("first", [""], 4, 2, 0.5, half_name),
         _timing("second", ["first"], 1, 3, 0.1, half_name),
         _timing("last", ["second"], 4, 2, 0.5, half_name)),
        {"relu": "first"})


def _no_timer(*args):
    raise AssertionError("plan timed although it should not have")


def test_injected_timings_give_exact_choices_that_convert_applies():
    model = _model()
    x, y = _data()
    p = plan(model, x, y, loss="mse", measurement=_measurement(), info=AMX_CPU, step_check=False,
             probe_report={"first": 0.001, "second": 0.002, "last": 0.003})
    assert p.choices == {"first": "bfloat16", "relu": "bfloat16", "second": "bfloat16",
                         "last": "float32"}
    assert p.policy == "mixed_bfloat16"
    assert p.keep_float32 == ("last",)
    assert p.step_seconds["plan"] == pytest.approx((2 + 2 + 0.5 + 1 + 0.1) * MS)
    table = str(p)
    assert "last" in table and "float32 saves 1.9 ms" in table
    assert "keep_float32=['last']" in table
    converted = p.apply(model)
    policies = {layer.name: layer.dtype_policy.name for layer in converted.layers[1:]}
    assert policies == {"first": "mixed_bfloat16", "relu": "mixed_bfloat16",
                        "second": "mixed_bfloat16", "last": "float32"}
    same = tf_mixed.convert(model, p.policy, keep_float32=p.keep_float32)
    assert [layer.dtype_policy.name for layer in same.layers] == [
        layer.dtype_policy.name for layer in converted.layers]
    assert json.loads(json.dumps(p.to_dict()))["keep_float32"] == ["last"]
    # The record reads back as the same plan (the timings' rounds are not kept).
    back = Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == dataclasses.replace(p, measurement=None)
    assert back.apply(model).layers[-1].dtype_policy.name == "float32"


def _steps(plan_s, f32_s, half_s):
    seen = []

    def timer(candidates):
        seen.append(dict(candidates))
        return {"float32": [f32_s] * 5, "bfloat16": [half_s] * 5, "plan": [plan_s] * 5}

    return timer, seen


def test_the_whole_step_check_keeps_a_plan_that_is_faster():
    x, y = _data()
    timer, seen = _steps(0.8, 1.2, 1.0)
    p = plan(_model(), x, y, loss="mse", measurement=_checked(), info=AMX_CPU,
             probe_report={}, step_timer=timer)
    assert p.choices["second"] == "float32" and p.choices["last"] == "float32"
    # The three candidates, each as the policy and keep_float32 that carry it.
    assert seen == [{"float32": ("float32", ()), "bfloat16": ("mixed_bfloat16", ()),
                     "plan": ("mixed_bfloat16", ("second",))}]
    assert "plan 800.0 ms, float32 1200.0 ms, bfloat16 1000.0 ms: the plan is 1.25x" in p.summary


def test_a_choice_that_builds_a_whole_models_map_is_not_step_checked():
    """The choice keeps 'last' float32, and so does every map ('last' is the
    model's regression output): the plan builds whole-model bfloat16's own
    model, so there is nothing to time against it."""
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU,
             probe_report={}, step_timer=lambda carriers: pytest.fail("timed the same model"))
    assert p.policy == "mixed_bfloat16" and p.keep_float32 == ("last",)
    assert "whole step" not in p.summary


@pytest.mark.parametrize("f32_s, half_s, winner", [(1.2, 1.0, "bfloat16"), (1.0, 1.2, "float32")])
def test_a_plan_not_faster_on_the_whole_step_gives_the_faster_whole_model(f32_s, half_s, winner):
    x, y = _data()
    timer, _ = _steps(1.1, f32_s, half_s)
    p = plan(_model(), x, y, loss="mse", measurement=_checked(), info=AMX_CPU,
             probe_report={}, step_timer=timer)
    # 'last' produces the model's regression output: convert keeps it float32
    # under any plan, and the plan's row says so (one precision value).
    assert p.choices == {"first": winner, "relu": winner, "second": winner, "last": "float32"}
    assert p.layers[-1].why.startswith("float32 head") or winner == "float32"
    assert p.policy == ("float32" if winner == "float32" else "mixed_bfloat16")
    assert f"not faster than whole-model {winner} beyond the rounds' spread" in str(p)
    # The plan's estimate is that of the model it builds, the whole model's (the
    # choice's 2 + 0.5 + 1 + 0.1 + 2 + 0.5 = 6.1 ms belonged to the plan the
    # check discarded).
    kept = {"float32": 9.0, "bfloat16": 7.5}[winner]
    assert p.step_seconds == pytest.approx({"float32": 9 * MS, "bfloat16": 7.5 * MS,
                                            "plan": kept * MS})
    assert f"timed layers' step {kept:g} ms (float32 9 ms, whole-model bfloat16 7.5 ms)" in (
        p.summary)


def test_the_whole_step_check_runs_for_real():
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_checked(), info=AMX_CPU,
             probe_report={})
    assert "whole step, median of 3 rounds: plan " in p.summary


def test_a_layer_above_the_tolerance_stays_float32_and_its_followers_with_it():
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU, step_check=False,
             probe_report={"first": 0.25, "second": 0.002, "last": 0.003})
    assert p.choices["first"] == "float32" and p.choices["relu"] == "float32"
    assert p.choices["second"] == "bfloat16"
    assert "error 0.25 above the tolerance 0.1" in str(p)
    assert p.keep_float32 == ("first", "relu", "last")


def test_the_real_probe_gives_the_errors():
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU, step_check=False,
             use_catalog=False)
    rows = {row.name: row for row in p.layers}
    assert 0 < rows["first"].error < 0.1 and rows["relu"].error is None


def test_an_emulated_half_dtype_gives_float32_everywhere_and_says_so():
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", info=AVX2_CPU, timer=_no_timer)
    assert p.policy == "float32"
    assert set(p.choices.values()) == {"float32"}
    assert "bfloat16 is emulated on this CPU (Test EPYC: no avx512_bf16 or amx_bf16)" in p.summary
    assert p.keep_float32 == ()
    fp16 = plan(_model(), x, y, loss="mse", info=AMX_CPU, policy="fp16", timer=_no_timer)
    assert "float16 is emulated" in fp16.summary


@pytest.mark.parametrize("cc, float8", [((8, 9), True), ((9, 0), True), ((8, 0), False)])
def test_float8_is_timed_on_gpus_of_compute_capability_8_9(cc, float8, tmp_path):
    seen = []

    def timer(model, batch, precisions, half_policy):
        seen.append((precisions, half_policy))
        return _measurement("float16", precisions, **({"float8": 0.5} if float8 else {}))

    x, y = _data()
    p = plan(_model(), x, y, loss="mse", info=_gpu(cc), timer=timer, cache_directory=str(tmp_path),
             probe_report={}, step_check=False)
    expected = ("float32", "float16", "float8") if float8 else ("float32", "float16")
    assert seen == [(expected, "mixed_float16")]
    assert p.choices["last"] == ("float8" if float8 else "float32")
    if float8:
        assert p.float8_layers == ("last",)
        assert p.float8_keep_float32 == ("first", "second")
        applied = p.apply(_model())  # convert, then tf_mixed.float8.quantize
        policies = {layer.name: layer.dtype_policy.name for layer in applied.layers[1:]}
        assert policies["last"].startswith("float8")
        assert policies["first"] == policies["second"] == "mixed_float16"


def test_the_cache_is_used_when_settled_and_quiet(tmp_path, monkeypatch):
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.5, 2))
    calls = []

    def timer(*args):
        calls.append(1)
        return _measurement()

    x, y = _data()
    model = _model()
    kwargs = dict(loss="mse", info=AMX_CPU, timer=timer, cache_directory=str(tmp_path),
                  probe_report={}, step_check=False)
    first = plan(model, x, y, **kwargs)
    assert not first.cached and first.cache_path and os.path.exists(first.cache_path)
    second = plan(model, x, y, **kwargs)
    assert second.cached and calls == [1] and second.choices == first.choices
    assert "read from" in second.summary
    with open(first.cache_path, "w") as f:
        f.write("{not json")
    third = plan(model, x, y, **kwargs)
    assert not third.cached and calls == [1, 1]
    other = keras.Model(model.inputs, model.outputs, name="other_shape")
    plan(other, x[:4], y[:4], **kwargs)  # another batch shape: another entry
    assert calls == [1, 1, 1]


def test_a_busy_machine_or_wide_spread_is_not_cached(tmp_path, monkeypatch):
    x, y = _data()
    kwargs = dict(loss="mse", info=AMX_CPU, cache_directory=str(tmp_path), probe_report={},
                  step_check=False)
    monkeypatch.setattr(measuring, "machine_load", lambda: (7.5, 2))
    busy = plan(_model(), x, y, timer=lambda *a: _measurement(), **kwargs)
    assert busy.cache_path == "" and "busy: load average 7.5 on 2 CPUs" in busy.summary
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.5, 2))
    wide = Measurement(("float32", "bfloat16"), tuple(LayerTiming(
        name, "Dense", (producer,), {"float32": (4e-3, 8e-3, 4e-3, 8e-3, 4e-3),
                                     "bfloat16": (2e-3,) * 5}, (0.0,) * 5)
        for name, producer in (("first", ""), ("second", "first"), ("last", "second"))))
    spread = plan(_model(), x, y, timer=lambda *a: wide, **kwargs)
    assert spread.cache_path == "" and "spread" in spread.summary
    # The rule a cached record is read by is the rule it is written by: a
    # timer's figures for other layers would never be read back, so are not kept.
    fewer = Measurement(wide.precisions, wide.layers[:1])
    other = plan(_model(), x, y, timer=lambda *a: fewer, **kwargs)
    assert other.cache_path == "" and "not cached (timings for other layers)" in other.summary
    assert os.listdir(tmp_path) == []


def test_timings_are_cached_only_once_the_choice_has_read_them(tmp_path, monkeypatch):
    """A plan that fails after timing (no loss for its probe) leaves no cache
    entry; the same plan with its loss writes one."""
    x, y = _data()
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.5, 2))
    kwargs = dict(info=AMX_CPU, cache_directory=str(tmp_path), use_catalog=False,
                  step_check=False, timer=lambda *a: _measurement())
    with pytest.raises(ValueError, match="needs a loss"):
        plan(_model(), x, y, **kwargs)
    assert os.listdir(tmp_path) == []
    done = plan(_model(), x, y, loss="mse", **kwargs)
    assert os.listdir(tmp_path) == [os.path.basename(done.cache_path)]


def test_a_plan_failing_in_its_step_check_keeps_its_timings(tmp_path, monkeypatch):
    """The step check comes after the choice has read the timings (here it
    fails: no loss to step with, the probe's errors given): they are cached,
    and the plan run again with its loss reads them instead of timing."""
    x, y = _data()
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.5, 2))
    kwargs = dict(info=AMX_CPU, cache_directory=str(tmp_path), use_catalog=False,
                  probe_report={"first": 0.001, "second": 0.002, "last": 0.003})
    model = _model()
    with pytest.raises(ValueError, match="needs a loss"):
        plan(model, x, y, timer=lambda *a: _checked(), **kwargs)
    assert len(os.listdir(tmp_path)) == 1
    again = plan(model, x, y, loss="mse", timer=_no_timer, **kwargs)
    assert again.cached and "read from" in again.summary


def test_a_model_without_a_layer_to_time_plans_float32_untimed(tmp_path):
    """No layer holds weights: nothing is timed or probed (no loss needed),
    every layer stays float32 and the summary says why; no error about a
    `measurement` the caller never passed."""
    inputs = keras.Input((8,))
    h = keras.layers.Rescaling(2.0, name="scale")(inputs)
    model = keras.Model(inputs, keras.layers.Activation("softmax", name="soft")(h))
    x, y = _data()
    p = plan(model, x, None, info=AMX_CPU, timer=_no_timer, cache_directory=str(tmp_path))
    assert p.policy == "float32" and p.measurement is None and p.keep_float32 == ()
    assert p.choices == {"scale": "float32", "soft": "float32"}
    assert p.summary == ("float32 for every layer: the model has no layer with weights to "
                         "time, so every layer stays float32 (nothing timed)")
    assert os.listdir(tmp_path) == []
    assert [layer.dtype_policy.name for layer in p.apply(model).layers[1:]] == ["float32"] * 2


def test_a_cache_that_cannot_be_written_is_named_in_the_summary(tmp_path, monkeypatch):
    """The cache directory is a file: the plan is made, and its summary says
    the timings were not cached and where it could not write (not silence)."""
    x, y = _data()
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.5, 2))
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("")
    p = plan(_model(), x, y, loss="mse", info=AMX_CPU, timer=lambda *a: _measurement(),
             cache_directory=str(blocker), step_check=False,
             probe_report={"first": 0.001, "second": 0.002, "last": 0.003})
    assert p.cache_path == "" and not p.cached
    assert f"; timed now, not cached (cannot write {blocker}{os.sep}plan-" in p.summary


def test_a_whole_model_candidate_puts_its_input_fed_untimed_layers_in_its_own_precision():
    """"scale" (no weights, fed by the model's input) follows no timed layer.
    The choice starts float32 ("first" alone moves to bfloat16), and the step
    check finds whole-model bfloat16 faster: that winner is bfloat16 throughout
    (not "scale" kept float32 because the per-layer choice started there)."""
    inputs = keras.Input((8,))
    h = keras.layers.Rescaling(0.5, name="scale")(inputs)
    h = keras.layers.Dense(16, name="first")(h)
    h = keras.layers.Dense(16, name="second")(h)
    model = keras.Model(inputs, keras.layers.Dense(1, name="last")(h), name="scaled")
    x, y = _data()
    measurement = Measurement(("float32", "bfloat16"), (
        _timing("first", [""], 4, 2, 0.1), _timing("second", ["first"], 1, 3, 0.1),
        _timing("last", ["second"], 1, 3, 0.1)))
    seen = {}

    def step_timer(carriers):
        seen.update(carriers)
        return {"float32": [3e-3] * 3, "bfloat16": [1e-3] * 3, "plan": [2e-3] * 3}

    p = plan(model, x, y, loss="mse", measurement=measurement, info=AMX_CPU, use_catalog=False,
             probe_report={"first": 0.001, "second": 0.001, "last": 0.001}, step_timer=step_timer)
    assert seen["bfloat16"] == ("mixed_bfloat16", ()) and seen["float32"] == ("float32", ())
    assert seen["plan"] == ("mixed_bfloat16", ("scale", "second", "last"))
    assert "so whole-model bfloat16" in p.summary
    # "last", the regression output, stays float32 by the map's rule alone.
    assert p.policy == "mixed_bfloat16" and p.keep_float32 == ("last",)
    assert p.choices == {"scale": "bfloat16", "first": "bfloat16", "second": "bfloat16",
                         "last": "float32"}
    why = {row.name: row.why for row in p.layers}["scale"]
    assert why == "no weights, fed by the model's inputs: the whole-model bfloat16"


def test_arguments_are_checked():
    x, y = _data()
    with pytest.raises(ValueError, match="policy='float32'"):
        plan(_model(), x, y, loss="mse", policy="float32", info=AMX_CPU)
    with pytest.raises(ValueError, match="tolerance"):
        plan(_model(), x, y, loss="mse", tolerance=0, info=AMX_CPU)
    with pytest.raises(TypeError, match="measurement"):
        plan(_model(), x, y, loss="mse", measurement={"float32": 1}, info=AMX_CPU)


@pytest.mark.parametrize("argument, value, match", [
    ("cache", "yes", "tf_mixed.plan() argument `cache` must be True or False. Received: "
                     "cache='yes'"),
    ("step_check", "no", "tf_mixed.plan() argument `step_check` must be True or False. Received: "
                         "step_check='no'"),
    ("cache_directory", 5, "tf_mixed.plan() argument `cache_directory` must be a directory "
                           "path, or None. Received: cache_directory=5 (of type int)"),
    ("timer", 5, "tf_mixed.plan() argument `timer` must be a function timer(model, x, precisions, "
                 "half_policy), or None. Received: timer=5"),
    ("step_timer", 5, "tf_mixed.plan() argument `step_timer` must be a function step_timer"),
    ("probe_report", [1], "tf_mixed.plan() argument `probe_report` must be a ProbeReport "
                          "(tf_mixed.probe) or a dict layer name -> relative error, or None. "
                          "Received: probe_report=[1] (of type list)"),
    ("probe_report", {"first": "high"}, "probe_report['first']='high' (of type str)"),
    ("info", "cpu", "tf_mixed.plan() argument `info` must be a "
                    "tf_mixed.policy.hardware.HardwareInfo, or None. Received: info='cpu'")])
def test_an_argument_of_the_wrong_type_is_named_before_anything_runs(argument, value, match):
    """Each was taken silently (a truthy "no" ran the step check) or failed
    deep inside (AttributeError, "'int' object is not callable")."""
    x, y = _data()
    kwargs = dict(loss="mse", info=AMX_CPU, timer=_no_timer, cache=False)
    kwargs[argument] = value
    with pytest.raises(TypeError) as raised:
        plan(_model(), x, y, **kwargs)
    assert match in str(raised.value)


def test_a_missing_batch_is_named_before_timing():
    _, y = _data()
    with pytest.raises(ValueError, match=r"needs `x`: one training batch .* Received: x=None"):
        plan(_model(), None, y, loss="mse", info=AMX_CPU, timer=_no_timer)


def test_the_public_face_hands_plan_on():
    assert tf_mixed.plan is plan
    assert "plan" in dir(tf_mixed)


CHEAP_ZOO = ("nested", "embedding")


@pytest.mark.parametrize("name", CHEAP_ZOO)
def test_zoo_plans_with_real_timing(name):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(16)
    p = plan(model, x, y, loss=spec.loss, rounds=1, cache=False, info=AMX_CPU)
    _check_zoo_plan(model, p, spec)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ZOO if n not in CHEAP_ZOO])
def test_zoo_plans_with_real_timing_slow(name):
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(16)
    p = plan(model, x, y, loss=spec.loss, rounds=2, cache=False, info=AMX_CPU)
    _check_zoo_plan(model, p, spec)


def _check_zoo_plan(model, p, spec):
    names = [layer.name for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    assert [row.name for row in p.layers] == names
    assert set(p.choices.values()) <= {"float32", "bfloat16"}
    timed = [row for row in p.layers if row.seconds]
    assert timed and all(row.seconds["float32"] > 0 and row.seconds["bfloat16"] > 0
                         for row in timed)
    if spec.nested:
        assert spec.nested in [row.name for row in timed]
    converted = p.apply(model)
    x, _ = spec.data(4)
    outputs = keras.tree.flatten(converted(x))
    assert all(np.isfinite(keras.ops.convert_to_numpy(o)).all() for o in outputs)


def test_enable_auto_with_a_plan_sets_its_policy_and_keeps_its_float32_layers():
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU, step_check=False,
             probe_report={})
    try:
        enabled = tf_mixed.enable("auto", plan=p, keep_float32=["relu"])
        assert enabled.policy == "mixed_bfloat16"
        assert "per-layer plan of model 'chain'" in enabled.reason
        rebuilt = _model()
    finally:
        tf_mixed.disable()
    policies = {layer.name: layer.dtype_policy.name for layer in rebuilt.layers[1:]}
    assert policies == {"first": "mixed_bfloat16", "relu": "float32",
                        "second": "mixed_bfloat16", "last": "float32"}


def test_enable_refuses_a_plan_with_an_explicit_policy_or_a_non_plan():
    x, y = _data()
    p = plan(_model(), x, y, loss="mse", measurement=_measurement(), info=AMX_CPU, step_check=False,
             probe_report={})
    with pytest.raises(ValueError, match=r"enable\('auto', plan=plan\)"):
        tf_mixed.enable("mixed_bfloat16", plan=p)
    with pytest.raises(TypeError, match="`plan` must be what tf_mixed.plan"):
        tf_mixed.enable("auto", plan="mixed_bfloat16")
    assert keras.config.dtype_policy().name == "float32"
