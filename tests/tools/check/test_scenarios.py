"""`python -m tf_mixed check` and the `selfcheck` scenarios behind it.

In process, on the two logical CPUs of conftest.py (the same shared
MirroredStrategy as the other tests); one test runs the command in a fresh
process, where the check splits the CPU itself.
"""

import json
import os
import subprocess
import sys

import keras
import pytest
import repo_paths

from tf_mixed import __main__ as cli
from tf_mixed.cli import check as bench_check
from tf_mixed.policy import hardware
from tf_mixed.tools.check import scenarios as selfcheck

ROOT = str(repo_paths.ROOT)


@pytest.fixture(autouse=True)
def two_logical_cpus(monkeypatch):
    """In process, the check runs on conftest's two logical CPUs, even on a
    host with GPUs (one MirroredStrategy per device set, shared with the
    other tests)."""
    monkeypatch.setattr(
        selfcheck, "_logical_devices", lambda: ([], ["/device:CPU:0", "/device:CPU:1"])
    )


@pytest.mark.slow
def test_check_runs_every_part_and_writes_json(tmp_path, capsys):
    out = tmp_path / "check.json"
    assert bench_check.main([f"--output={out}", "--budget=0.05"]) == 0
    stdout = capsys.readouterr().out
    for heading in ("1. tf_mixed.LossScaleOptimizer", "2. keras.optimizers.LossScaleOptimizer",
                    "3. Throughput", "enable('auto') picks", "4. Known mixed-precision defects",
                    "Result: PASS"):
        assert heading in stdout
    result = json.loads(out.read_text())
    assert os.listdir(tmp_path) == ["check.json"]  # no temporary file left
    assert result["passed"] is True and result["replicas"] == 2
    ours = result["tf_mixed_optimizer"]
    assert ours["passed"] is True
    assert [s["bad_replica"] for s in ours["scenarios"]] == [0, 1]
    for scenario in ours["scenarios"]:
        assert scenario["checks"] == {key: True for key, _ in selfcheck.CHECKS}
    keras_part = result["keras_optimizer"]
    # Keras notices an overflow on replica 0 (its check reads replica 0's gradients).
    assert all(keras_part["scenarios"][0]["checks"].values())
    corrupted = [s for s in keras_part["scenarios"]
                 if not (s["checks"]["weights_finite"] and s["checks"]["weights_unchanged"])]
    assert keras_part["corrupts_weights"] is bool(corrupted)
    throughput = result["throughput"]
    timed = throughput["seconds_per_step"]
    assert {"float32", "mixed_bfloat16"} <= set(timed)
    assert all(seconds > 0 for seconds in timed.values())
    assert throughput["speedup_vs_float32"]["float32"] == 1.0
    assert throughput["auto"]["policy"] in timed
    assert result["versions"]["keras"] == keras.__version__


@pytest.mark.slow
def test_an_optimizer_that_applies_nonfinite_steps_fails_the_check(
    tmp_path, capsys, monkeypatch
):
    # Plain Adam: no loss scaling, no skip; inf goes straight into the weights.
    monkeypatch.setattr(selfcheck, "make_tf_mixed_optimizer",
                        lambda: keras.optimizers.Adam(0.01))
    out = tmp_path / "check.json"
    assert bench_check.main([f"--output={out}", "--parts=tf_mixed"]) == 1
    stdout = capsys.readouterr().out
    assert "=> FAIL" in stdout and "Result: FAIL" in stdout
    result = json.loads(out.read_text())
    assert result["passed"] is False
    for scenario in result["tf_mixed_optimizer"]["scenarios"]:
        assert scenario["checks"]["weights_finite"] is False
        assert scenario["checks"]["scale_backed_off"] is False
    assert result["keras_optimizer"]["scenarios"] == [] and result["throughput"] is None


def test_no_mirrored_strategy_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(selfcheck, "_logical_devices", lambda: ([], ["/device:CPU:0"]))
    out = tmp_path / "check.json"
    assert bench_check.main([f"--output={out}"]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if not line.startswith("[check]")]
    assert len(lines) == 1
    assert lines[0].startswith("tf_mixed check: error: a MirroredStrategy needs at least 2")
    assert "fresh process" in lines[0]
    assert not out.exists() and captured.out == ""


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--parts=tf_mixed,speed"], "--parts='tf_mixed,speed': unknown part 'speed'. "
                                     "Accepted: tf_mixed, keras, throughput, defects."),
        (["--output=/tmp"],
         "--output='/tmp': is a directory. Pass a file path such as check.json."),
        (["--budget=0"], "--budget=0.0: must be a number of seconds in (0, 60]."),
        (["--budget=fast"], "--budget='fast': not a number. Accepted: a number, "
                            "such as --budget=2.0 (the default)."),
        (["--output=/no/such/dir/check.json"],
         "--output='/no/such/dir/check.json': directory '/no/such/dir' does not exist."),
        (["--verbose"], "Unknown command line flag 'verbose'"),
        (["extra"], "unexpected argument 'extra'; flags look like --parts=tf_mixed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    assert bench_check.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"tf_mixed check: error: {message}"


def test_dispatched_from_python_m_tf_mixed(capsys):
    assert cli.main(["tf_mixed", "check", "--parts=nope"]) == 2
    assert "unknown part 'nope'" in capsys.readouterr().err


def test_throughput_auto_decision_from_injected_timings():
    cpu = hardware.HardwareInfo(cpu_model="Test CPU")
    timings = {"float32": 2.0, "mixed_bfloat16": 1.0}
    part = selfcheck.measure_throughput(cpu, timer=lambda names: timings)
    assert part.auto_policy == "mixed_bfloat16" and part.speedups["mixed_bfloat16"] == 2.0
    assert "measured 2.00x float32" in part.auto_reason
    gpu = hardware.HardwareInfo(gpus=(hardware.GpuInfo("Test A100", (8, 0)),))
    seen = []
    part = selfcheck.measure_throughput(
        gpu, timer=lambda names: seen.append(names) or {n: 1.0 for n in names})
    assert seen == [("float32", "mixed_bfloat16", "mixed_float16")]  # all timed on a GPU
    assert part.auto_policy == "mixed_float16" and "GPU rule" in part.auto_reason


@pytest.mark.slow
def test_fresh_process_splits_the_cpu_itself(tmp_path):
    """The real command: TF not yet initialised, so check makes 2 logical CPUs."""
    out = tmp_path / "check.json"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "check", "--parts=tf_mixed", f"--output={out}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["passed"] is True
    # Two logical CPUs on a host with fewer than two GPUs, else every GPU.
    assert result["replicas"] >= 2
