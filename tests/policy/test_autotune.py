"""Measured "auto": the pure decision, the cache, and enable("auto") on top.

Every timing here is injected: no test depends on this machine's speed.
"""

import json
import logging
import os

import keras
import pytest

import tf_mixed
from tf_mixed._internal import measuring
from tf_mixed.policy import autotune, hardware

CPU = hardware.HardwareInfo(
    cpu_model="Test EPYC 9999", cpu_flags=frozenset({"avx2", "avx512_bf16"})
)
FP16_CPU = hardware.HardwareInfo(
    cpu_model="Test Xeon", cpu_flags=frozenset({"avx512_bf16", "avx512_fp16"})
)
GPU = hardware.HardwareInfo(gpus=(hardware.GpuInfo("Test A100", (8, 0)),))


class FakeTimer:
    """Returns fixed seconds per step and counts its calls: a number is the
    same figure in each of `autotune.ROUNDS` rounds, a list is the rounds."""

    def __init__(self, **timings):
        self.timings = {name: list(value) if isinstance(value, list)
                        else [value] * autotune.ROUNDS for name, value in timings.items()}
        self.calls = []

    def __call__(self, policies):
        self.calls.append(tuple(policies))
        return {name: self.timings[name] for name in policies}


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch):
    """The machine's real load never decides whether a result is cached here."""
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.5, 2))


def no_timing(policies):
    raise AssertionError(f"timed {policies} although a valid cache exists")


# --- the pure decision ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "timings, expected, speedup",
    [
        ({"float32": 2.0, "mixed_bfloat16": 1.0}, "mixed_bfloat16", 2.0),    # faster
        ({"float32": 1.0, "mixed_bfloat16": 2.0}, "float32", 0.5),           # slower
        ({"float32": 1.1, "mixed_bfloat16": 1.0}, "float32", 1.1),           # within margin
        ({"float32": 1.25, "mixed_bfloat16": 1.0}, "mixed_bfloat16", 1.25),  # past it
        ({"float32": 4.0, "mixed_bfloat16": 2.0, "mixed_float16": 1.0},
         "mixed_float16", 4.0),                                              # fastest half
        ({"float32": 1.0}, "float32", 1.0),                                  # nothing else
    ],
)
def test_choose_from_timings(timings, expected, speedup):
    decision = autotune.choose_from_timings(timings)
    assert decision.policy == expected
    assert decision.speedups["float32"] == 1.0
    if expected != "float32":
        assert decision.speedups[expected] == speedup
    assert decision.margin == 1.15


def test_margin_is_inclusive_and_configurable():
    # 1.5 / 1.0 is exact in binary floating point.
    timings = {"float32": 1.5, "mixed_bfloat16": 1.0}
    assert autotune.choose_from_timings(timings, margin=1.5).policy == "mixed_bfloat16"
    assert autotune.choose_from_timings(timings, margin=1.75).policy == "float32"


@pytest.mark.slow
@pytest.mark.parametrize(
    "timings, margin, message",
    [
        ({"mixed_bfloat16": 1.0}, 1.15, "must include 'float32'"),
        ({"float32": 1.0, "bfloat16": 1.0}, 1.15, "unknown policy 'bfloat16'"),
        ({"float32": 0.0}, 1.15, "positive number"),
        ({"float32": float("nan")}, 1.15, "positive number"),
        ({"float32": 1.0, "mixed_bfloat16": -1.0}, 1.15, "positive number"),
        ({"float32": 1.0, "mixed_bfloat16": "fast"}, 1.15, "positive number"),
        ({"float32": 1.0}, 0.9, "`margin` must be a number >= 1.0"),
        ({"float32": 1.0}, True, "`margin` must be a number >= 1.0"),
    ],
)
def test_choose_from_timings_rejects_bad_input(timings, margin, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        autotune.choose_from_timings(timings, margin)


def test_candidates_include_float16_only_with_native_float16():
    assert autotune.candidates(CPU) == ("float32", "mixed_bfloat16")
    assert autotune.candidates(FP16_CPU) == ("float32", "mixed_bfloat16", "mixed_float16")
    amx_fp16 = hardware.HardwareInfo(cpu_flags=frozenset({"amx_fp16"}))
    assert "mixed_float16" in autotune.candidates(amx_fp16)


# --- the cache ------------------------------------------------------------------


def test_measures_once_then_reads_the_cache(tmp_path):
    timer = FakeTimer(float32=1.9, mixed_bfloat16=1.0)
    first = autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert timer.calls == [("float32", "mixed_bfloat16")]
    assert first.policy == "mixed_bfloat16"
    assert not first.cached
    assert "mixed_bfloat16 measured 1.90x float32 on this CPU (Test EPYC 9999)" in first.reason
    assert f"measured now, cached in {first.cache_path}" in first.reason
    record = json.loads(open(first.cache_path).read())
    assert record["rounds_s"] == {"float32": [1.9] * 7, "mixed_bfloat16": [1.0] * 7}
    assert record["key"] == autotune.cache_key(CPU)
    assert os.listdir(tmp_path) == [os.path.basename(first.cache_path)]  # no temp file

    second = autotune.measured_choice(CPU, timer=no_timing, directory=str(tmp_path))
    assert second.cached and second.policy == "mixed_bfloat16"
    assert second.timings == first.timings
    assert "1.90x float32" in second.reason
    assert f"cached result measured {record['measured_at']}, read from" in second.reason


def test_a_measurement_on_a_busy_machine_is_used_but_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(measuring, "machine_load", lambda: (7.5, 2))
    timer = FakeTimer(float32=1.9, mixed_bfloat16=1.0)
    first = autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert first.policy == "mixed_bfloat16" and first.cache_path == ""
    assert ("not cached (the machine was busy: load average 7.5 on 2 CPUs): "
            "the next call measures again") in first.reason
    assert os.listdir(tmp_path) == []
    autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert len(timer.calls) == 2  # measured again


def test_float32_reason_quotes_every_half_policy(tmp_path):
    timer = FakeTimer(float32=1.0, mixed_bfloat16=1.1, mixed_float16=4.0)
    choice = autotune.measured_choice(FP16_CPU, timer=timer, directory=str(tmp_path))
    assert choice.policy == "float32"
    assert "no half policy reached 1.15x float32" in choice.reason
    assert ("(median of per-round ratios: mixed_bfloat16 0.91x (90% interval "
            "0.91-0.91x over 7 interleaved rounds), mixed_float16 0.25x") in choice.reason
    assert "tf_mixed.enable('mixed_bfloat16')" in choice.reason


def test_another_machine_has_its_own_cache_entry(tmp_path):
    autotune.measured_choice(CPU, timer=FakeTimer(float32=2.0, mixed_bfloat16=1.0),
                             directory=str(tmp_path))
    other = hardware.HardwareInfo(cpu_model="Other CPU", cpu_flags=CPU.cpu_flags)
    timer = FakeTimer(float32=1.0, mixed_bfloat16=2.0)
    assert autotune.measured_choice(other, timer=timer, directory=str(tmp_path)).policy == "float32"
    assert len(timer.calls) == 1


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _valid_record(**key_changes):
    key = dict(autotune.cache_key(CPU), **key_changes)
    return {"format": 2, "key": key, "measured_at": "then",
            "rounds_s": {"float32": [1.0] * 7, "mixed_bfloat16": [4.0] * 7}}


@pytest.mark.slow
@pytest.mark.parametrize(
    "content",
    [
        pytest.param('{"format": 1, "key": {"probe"', id="truncated"),
        pytest.param("not json at all", id="not-json"),
        pytest.param(b"\xff\xfe\x00garbage", id="binary"),
        pytest.param("null", id="null"),
        pytest.param("OTHER_TF", id="other-tf-version"),
        pytest.param("BAD_TIMINGS", id="bad-timings"),
    ],
)
def test_unusable_cache_is_ignored_and_replaced(tmp_path, caplog, content):
    path = measuring.cache_path(autotune.cache_key(CPU), str(tmp_path))
    if content == "OTHER_TF":
        content = json.dumps(_valid_record(tensorflow="2.0.0"))
    elif content == "BAD_TIMINGS":
        record = _valid_record()
        record["rounds_s"]["mixed_bfloat16"] = [-1] * 7
        content = json.dumps(record)
    if isinstance(content, bytes):
        open(path, "wb").write(content)
    else:
        _write(path, content)
    timer = FakeTimer(float32=2.0, mixed_bfloat16=1.0)
    with caplog.at_level(logging.DEBUG, logger="absl"):
        choice = autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert len(timer.calls) == 1 and choice.policy == "mixed_bfloat16"
    assert any("ignoring the cache" in r.getMessage() for r in caplog.records)
    # Replaced by a whole, valid record.
    assert autotune.read_cache(path, autotune.cache_key(CPU))["rounds_s"]["float32"] == [2.0] * 7


def test_a_valid_record_is_used_as_is(tmp_path):
    path = measuring.cache_path(autotune.cache_key(CPU), str(tmp_path))
    _write(path, json.dumps(_valid_record()))
    choice = autotune.measured_choice(CPU, timer=no_timing, directory=str(tmp_path))
    assert choice.cached and choice.policy == "float32"  # bfloat16 0.25x in the record


def test_unreadable_cache_is_ignored(tmp_path, caplog):
    path = measuring.cache_path(autotune.cache_key(CPU), str(tmp_path))
    os.mkdir(path)  # a directory where the file should be: open() fails
    timer = FakeTimer(float32=2.0, mixed_bfloat16=1.0)
    with caplog.at_level(logging.DEBUG, logger="absl"):
        choice = autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert choice.policy == "mixed_bfloat16" and not choice.cached
    assert "not cached (cache directory not writable)" in choice.reason
    assert any("cannot write the auto-policy cache" in r.getMessage() for r in caplog.records)
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # no temp file


def test_cache_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    timer = FakeTimer(float32=2.0, mixed_bfloat16=1.0)
    choice = autotune.measured_choice(CPU, timer=timer, directory=str(blocker / "sub"))
    assert choice.policy == "mixed_bfloat16" and choice.cache_path == ""


def test_read_only_directory_leaves_no_partial_file(tmp_path, monkeypatch, caplog):
    # The tests run as root, which ignores chmod; refuse the final rename the
    # way a read-only directory would.
    def refuse(src, dst):
        raise PermissionError(13, "Read-only file system", dst)

    monkeypatch.setattr(autotune.os, "replace", refuse)
    timer = FakeTimer(float32=2.0, mixed_bfloat16=1.0)
    with caplog.at_level(logging.DEBUG, logger="absl"):
        choice = autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert choice.policy == "mixed_bfloat16"
    assert os.listdir(tmp_path) == []
    assert any("Read-only file system" in r.getMessage() for r in caplog.records)


def test_the_suite_uses_a_private_cache_and_no_timing():
    """conftest.py's promise: no test times this machine or writes ~/.cache."""
    assert os.environ["TF_MIXED_AUTO_MEASURE"] == "0"
    assert "tf_mixed_test_cache_" in measuring.cache_dir()
    assert not autotune.measure_by_default()


@pytest.mark.slow
@pytest.mark.parametrize(
    "value, expected",
    [("", True), ("1", True), ("true", True), ("ON", True),
     ("0", False), ("false", False), (" No ", False), ("off", False)],
)
def test_measure_environment_variable(monkeypatch, value, expected):
    monkeypatch.setenv("TF_MIXED_AUTO_MEASURE", value)
    assert autotune.measure_by_default() is expected


# --- enable("auto") on top ------------------------------------------------------


@pytest.fixture
def cpu_host(monkeypatch, tmp_path):
    monkeypatch.setattr(hardware, "detect", lambda: CPU)
    monkeypatch.setenv("TF_MIXED_CACHE_DIR", str(tmp_path))
    timer = FakeTimer(float32=1.9, mixed_bfloat16=1.0)
    monkeypatch.setattr(autotune, "time_rounds", timer)
    return timer


def test_enable_auto_measures_then_reads_the_cache(cpu_host):
    enabled = tf_mixed.enable("auto", measure=True)
    assert enabled.policy == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert "mixed_bfloat16 measured 1.90x float32 on this CPU (Test EPYC 9999)" in enabled.reason
    assert "measured now, cached in" in enabled.reason
    again = tf_mixed.enable("auto", measure=True)
    assert len(cpu_host.calls) == 1
    assert "cached result measured" in again.reason and "1.90x" in again.reason


def test_environment_variable_turns_measuring_on_and_off(cpu_host, monkeypatch):
    monkeypatch.setenv("TF_MIXED_AUTO_MEASURE", "0")
    assert tf_mixed.enable("auto").policy == "float32"  # the rule: no AMX
    assert cpu_host.calls == []
    monkeypatch.setenv("TF_MIXED_AUTO_MEASURE", "1")
    assert tf_mixed.enable("auto").policy == "mixed_bfloat16"
    assert len(cpu_host.calls) == 1
    # An explicit argument wins over the variable.
    monkeypatch.setenv("TF_MIXED_AUTO_MEASURE", "0")
    assert "cached result" in tf_mixed.enable("auto", measure=True).reason


def test_bad_environment_variable_is_a_clear_error(cpu_host, monkeypatch):
    keras.config.set_dtype_policy("float32")
    monkeypatch.setenv("TF_MIXED_AUTO_MEASURE", "sometimes")
    with pytest.raises(ValueError, match="TF_MIXED_AUTO_MEASURE.*'sometimes'"):
        tf_mixed.enable("auto")
    assert keras.config.dtype_policy().name == "float32"


def test_measure_false_keeps_the_rule(cpu_host):
    enabled = tf_mixed.enable("auto", measure=False)
    assert enabled.policy == "float32"
    assert "CPU rule (not measured)" in enabled.reason
    assert cpu_host.calls == []


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["yes", 1, 0.0])
def test_measure_must_be_a_bool(cpu_host, bad):
    keras.config.set_dtype_policy("float32")
    with pytest.raises(TypeError, match=r"`measure` must be a bool.*Received: measure="):
        tf_mixed.enable("auto", measure=bad)
    with pytest.raises(TypeError, match="`measure` must be a bool"):
        with tf_mixed.policy_scope("auto", measure=bad):
            pass  # pragma: no cover
    assert keras.config.dtype_policy().name == "float32"


def test_gpu_keeps_the_rule_and_names_it(monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: GPU)
    monkeypatch.setattr(autotune, "time_rounds", no_timing)
    enabled = tf_mixed.enable("auto", measure=True)
    assert enabled.policy == "mixed_float16"
    assert "GPU rule: compute capability >= 7.0" in enabled.reason


def test_tpu_keeps_the_rule(monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(tpu=True))
    monkeypatch.setattr(autotune, "time_rounds", no_timing)
    enabled = tf_mixed.enable("auto", measure=True)
    assert enabled.policy == "mixed_bfloat16" and "TPU rule" in enabled.reason


# --- issue 16, case 7: a load-robust statistic, settled before it is cached ------


def test_median_of_paired_round_ratios_ignores_load_that_hits_both():
    # Load slows both policies of rounds 2 and 4 alike: every ratio is 2.0.
    rounds = {"float32": [2.0, 4.0, 2.0, 6.0, 2.0, 2.0, 2.0],
              "mixed_bfloat16": [1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 1.0]}
    decision = autotune.choose_from_rounds(rounds)
    assert decision.policy == "mixed_bfloat16"
    assert decision.speedups == {"float32": 1.0, "mixed_bfloat16": 2.0}
    assert decision.spreads["mixed_bfloat16"] == (2.0, 2.0)
    assert decision.rounds["mixed_bfloat16"] == 7 and decision.unsettled == ""


def test_one_preempted_round_does_not_move_the_median():
    # Round 5's float32 step was preempted (8.0): the median ratio stays 2.0;
    # a mean of ratios would read 2.86x, a ratio of means 2.86x too.
    rounds = {"float32": [2.0, 2.0, 2.0, 2.0, 8.0, 2.0, 2.0],
              "mixed_bfloat16": [1.0] * 7}
    decision = autotune.choose_from_rounds(rounds)
    assert decision.speedups["mixed_bfloat16"] == 2.0
    assert decision.spreads["mixed_bfloat16"] == (2.0, 2.0)
    assert decision.unsettled == ""


def test_quartiles_are_exact_on_a_known_spread():
    # Ratios 1.0, 1.25, 1.5, 1.75, 2.0 (float32 seconds over 1.0 each round).
    rounds = {"float32": [1.5, 1.0, 2.0, 1.25, 1.75], "mixed_bfloat16": [1.0] * 5}
    decision = autotune.choose_from_rounds(rounds, margin=1.15)
    assert decision.speedups["mixed_bfloat16"] == 1.5
    assert decision.spreads["mixed_bfloat16"] == (1.25, 1.75)
    # The median's 90% interval (measuring.estimate) is what settles it, not the spread.
    assert decision.intervals["mixed_bfloat16"] == (1.0, 2.0)
    assert decision.unsettled == "the 90% interval 1.00-2.00x reaches across the 1.15x margin"


def test_a_wide_spread_clear_of_the_margin_is_settled():
    # Ratios 1.0 to 2.2 spread 43% of their median (the old rule refused to cache
    # them), but the median's interval, 1.20-2.00x, lies above the 1.15x margin.
    rounds = {"float32": [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2], "mixed_bfloat16": [1.0] * 7}
    decision = autotune.choose_from_rounds(rounds)
    assert decision.intervals["mixed_bfloat16"] == (1.2, 2.0)
    assert decision.policy == "mixed_bfloat16" and decision.unsettled == ""


@pytest.mark.slow
@pytest.mark.parametrize(
    "float32, expected_policy, unsettled",
    [
        # Near the 1.15x margin: ratios 1.10..1.22, 90% interval 1.12-1.20.
        ([1.10, 1.12, 1.14, 1.16, 1.18, 1.20, 1.22], "mixed_bfloat16",
         "the 90% interval 1.12-1.20x reaches across the 1.15x margin"),
        # Clearly above: interquartile 1.53-1.59x.
        ([1.50, 1.52, 1.54, 1.56, 1.58, 1.60, 1.62], "mixed_bfloat16", ""),
        # Clearly below.
        ([0.90, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96], "float32", ""),
        # Too few rounds to trust.
        ([2.0, 2.0, 2.0], "mixed_bfloat16", "3 round(s), fewer than 5"),
    ],
    ids=["near-threshold", "clearly-above", "clearly-below", "few-rounds"],
)
def test_settled_only_when_clear_of_the_margin(float32, expected_policy, unsettled):
    rounds = {"float32": float32, "mixed_bfloat16": [1.0] * len(float32)}
    decision = autotune.choose_from_rounds(rounds)
    assert decision.policy == expected_policy
    assert decision.unsettled == unsettled


@pytest.mark.slow
@pytest.mark.parametrize(
    "float32, why",
    [([1.10, 1.12, 1.14, 1.16, 1.18, 1.20, 1.22],
      "the 90% interval 1.12-1.20x reaches across the 1.15x margin"),
     ([1.5, 1.0, 2.0, 1.25, 1.75, 1.1, 1.6], "the 90% interval 1.10-1.75x reaches across")],
    ids=["near-threshold", "noisy"],
)
def test_an_unsettled_measurement_is_used_but_not_cached(tmp_path, float32, why):
    timer = FakeTimer(float32=float32, mixed_bfloat16=[1.0] * 7)
    first = autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert first.policy == "mixed_bfloat16" and first.cache_path == ""
    assert os.listdir(tmp_path) == []
    assert f"measured now, not cached ({why}" in first.reason
    assert "the next call measures again" in first.reason
    autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert len(timer.calls) == 2  # measured again


def test_the_reason_quotes_measurement_and_spread(tmp_path):
    timer = FakeTimer(float32=[1.50, 1.52, 1.54, 1.56, 1.58, 1.60, 1.62],
                      mixed_bfloat16=[1.0] * 7)
    choice = autotune.measured_choice(CPU, timer=timer, directory=str(tmp_path))
    assert (
        "mixed_bfloat16 measured 1.56x float32 on this CPU (Test EPYC 9999) on the "
        "Dense+Conv2D training probe (median of per-round ratios, 90% interval "
        "1.52-1.60x over 7 interleaved rounds; needs >= 1.15x)") in choice.reason
    assert f"measured now, cached in {choice.cache_path}" in choice.reason
    cached = autotune.measured_choice(CPU, timer=no_timing, directory=str(tmp_path))
    assert "90% interval 1.52-1.60x over 7 interleaved rounds" in cached.reason


def test_a_cached_unsettled_record_is_not_trusted(tmp_path, caplog):
    path = measuring.cache_path(autotune.cache_key(CPU), str(tmp_path))
    record = _valid_record()
    record["rounds_s"] = {"float32": [1.10, 1.12, 1.14, 1.16, 1.18, 1.20, 1.22],
                          "mixed_bfloat16": [1.0] * 7}
    _write(path, json.dumps(record))
    with caplog.at_level(logging.DEBUG, logger="absl"):
        assert autotune.read_cache(path, autotune.cache_key(CPU)) is None
    assert any("an unsettled measurement" in r.getMessage() for r in caplog.records)


def test_a_version_1_cache_from_the_small_probe_is_not_read(tmp_path):
    """The 1.01x cached by the old ~2 ms probe must not decide any more."""
    key = dict(autotune.cache_key(CPU), probe=1)
    path = measuring.cache_path(autotune.cache_key(CPU), str(tmp_path))
    _write(path, json.dumps({"format": 1, "key": key, "measured_at": "then",
                             "timings_s": {"float32": 1.01, "mixed_bfloat16": 1.0}}))
    assert autotune.read_cache(path, autotune.cache_key(CPU)) is None
    assert autotune.PROBE_VERSION == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "rounds, message",
    [({"float32": [], "mixed_bfloat16": [1.0]}, "non-empty list"),
     ({"float32": 1.0}, "non-empty list"),
     ({"float32": "1.0"}, "non-empty list"),
     ({"float32": [1.0, 0.0]}, "positive number of seconds"),
     ({"mixed_bfloat16": [1.0]}, "must include 'float32'")],
)
def test_choose_from_rounds_rejects_bad_input(rounds, message):
    with pytest.raises(ValueError, match=message):
        autotune.choose_from_rounds(rounds)


class FakeProbe:
    """Stands in for TF in `time_rounds`: each (size, dtype) step takes fixed
    seconds; the order of timed steps is recorded."""

    SECONDS = {("screen", "float32"): 2.0**-8, ("screen", "bfloat16"): 2.0**-9,
               ("screen", "float16"): 40 * 2.0**-8,
               ("probe", "float32"): 2.0**-4, ("probe", "bfloat16"): 2.0**-5}

    def __init__(self, monkeypatch):
        self.timed = []
        monkeypatch.setattr(autotune, "_probe_inputs", lambda tf, dense, conv: (
            "screen" if dense == autotune._SCREEN_DENSE else "probe"))
        monkeypatch.setattr(autotune, "_probe_step", lambda tf, dtype: dtype)
        monkeypatch.setattr(autotune, "first_call", lambda step, inputs, remapping_off: None)
        monkeypatch.setattr(autotune, "time_steps", self.time_steps)

    def time_steps(self, step, inputs, count):
        self.timed.append((inputs, step))
        return self.SECONDS[(inputs, step)]


def test_time_rounds_screens_then_interleaves_on_the_probe(monkeypatch):
    probe = FakeProbe(monkeypatch)
    rounds = autotune.time_rounds(["float32", "mixed_bfloat16", "mixed_float16"], rounds=3)
    # float16 is 40x float32 on the screen: never run on the probe; its one
    # figure is scaled by float32's probe/screen ratio (16x).
    assert rounds == {"float32": [2.0**-4] * 3, "mixed_bfloat16": [2.0**-5] * 3,
                      "mixed_float16": [2.5]}
    assert probe.timed == [("screen", "float32"), ("screen", "bfloat16"),
                           ("screen", "float16")] + [
        # measuring.interleaved_rounds: the order rotates (each policy leads in turn).
        ("probe", "float32"), ("probe", "bfloat16"), ("probe", "bfloat16"), ("probe", "float32"),
        ("probe", "bfloat16"), ("probe", "float32")]
    decision = autotune.choose_from_rounds(rounds)
    assert decision.policy == "mixed_bfloat16" and decision.speedups["mixed_bfloat16"] == 2.0
    assert decision.speedups["mixed_float16"] == pytest.approx(0.025)


def test_time_policies_summarises_rounds_by_median(monkeypatch):
    FakeProbe(monkeypatch)
    assert autotune.time_policies(["float32", "mixed_bfloat16"], rounds=3) == {
        "float32": 2.0**-4, "mixed_bfloat16": 2.0**-5}
