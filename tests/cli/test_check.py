"""``python -m tf_mixed check`` on a pass prints its report and nothing else (issue 37).

Neither tf_mixed's warnings nor TensorFlow's retracing log of the scenarios show then.
"""

import logging
import warnings

import pytest

import tf_mixed
from tf_mixed.cli import check as check_command
from tf_mixed.tools.check import scenarios


class _Result:
    devices = ("CPU:0",)

    def __init__(self, passed):
        self.passed = passed

    def to_json(self):
        return {}


@pytest.mark.parametrize("passed", [True, False])
def test_the_scenarios_own_warnings_show_only_when_the_check_fails(passed, monkeypatch, capsys):
    def run_check(**kwargs):  # a scenario that skips a step on purpose: tf_mixed warns
        warnings.warn("a step was skipped on purpose", tf_mixed.callbacks.MixedPrecisionWarning,
                      stacklevel=2)
        warnings.warn("something else", UserWarning, stacklevel=2)
        logging.getLogger("tensorflow").warning("5 out of the last 8 calls triggered retracing")
        return _Result(passed)

    tf_log: list[str] = []  # what TensorFlow's logger hands its own handlers
    seen = logging.Handler()
    seen.emit = lambda record: tf_log.append(record.getMessage())
    monkeypatch.setattr(logging.getLogger("tensorflow"), "handlers",
                        [*logging.getLogger("tensorflow").handlers, seen])

    monkeypatch.setattr(scenarios, "run_check", run_check)
    monkeypatch.setattr(scenarios, "prepare_devices", lambda: None)
    monkeypatch.setattr(check_command, "render", lambda result, info: "THE REPORT")
    with warnings.catch_warnings(record=True) as shown:  # what reaches the user
        warnings.simplefilter("always")
        code = check_command.main(["--parts=tf_mixed"])
    assert code == (0 if passed else 1)
    assert capsys.readouterr().out == "THE REPORT\n"
    messages = [str(w.message) for w in shown]
    assert "something else" in messages  # not tf_mixed's: shown as usual
    assert ("a step was skipped on purpose" in messages) is (not passed)
    assert tf_log == ([] if passed else ["5 out of the last 8 calls triggered retracing"])


def test_help_is_absl_style_like_every_other_command(capsys):
    assert check_command.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m tf_mixed check [--output=FILE]")
    assert "  --budget: Seconds for the throughput timing rounds, in (0, 60]." in out
    assert "(default: '2.0')" in out and "options:" not in out  # argparse's heading


def _throughput(float32, bfloat16):
    from tf_mixed.policy import hardware

    cpu = hardware.HardwareInfo(cpu_model="Test CPU")
    return scenarios.measure_throughput(
        cpu, timer=lambda names: {"float32": float32, "mixed_bfloat16": bfloat16})


def test_throughput_is_a_median_with_its_interval():
    part = _throughput([2.0, 3.0, 2.0, 6.0, 2.0], [1.0, 1.0, 1.0, 2.0, 1.0])
    estimate = part.estimates["mixed_bfloat16"]
    assert estimate.median == part.speedups["mixed_bfloat16"] == 2.0
    assert estimate.answers() and estimate.low > 1.0
    assert check_command._ratio_cells(part, "mixed_bfloat16") == [
        "2.00x", f"{estimate.low:.2f}-{estimate.high:.2f}x over 5 round(s)"]
    assert f"(2.00x (90% interval {estimate.low:.2f}-" in part.auto_reason
    # Rounds on both sides of 1: no ratio, the interval shown.
    part = _throughput([1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 2.0, 0.6, 1.6, 1.0])
    cells = check_command._ratio_cells(part, "mixed_bfloat16")
    assert cells[0] == "no ratio" and cells[1].endswith("over 5 round(s) (holds 1)")
    # Too few rounds to say.
    part = _throughput([2.0], [1.0])
    assert check_command._ratio_cells(part, "mixed_bfloat16") == [
        "no ratio", "2.00-2.00x over 1 round(s) (too few rounds: raise --budget)"]


def test_the_throughput_part_says_auto_measured_the_probe_not_a_model():
    from tf_mixed.policy import hardware

    throughput = scenarios.measure_throughput(
        hardware.HardwareInfo(cpu_model="Test CPU"),
        timer=lambda names: {name: 0.01 for name in names})

    class Result:
        devices, tf_mixed, keras, defects, passed = ("CPU:0",), [], [], [], True

    Result.throughput = throughput
    text = check_command.render(Result(), hardware.HardwareInfo(cpu_model="Test CPU"))
    assert "=> enable('auto') picks float32" in text
    assert ("   measured on: the probe above (one Dense, one Conv2D), not a model of yours; "
            "each model's own training step is checked against float32 when it trains, "
            "where the check costs under 5% of the planned training and 60 s of CPU") in text
