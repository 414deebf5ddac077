"""The split of the suite into a fast and a slow tier is checked (issue 29)."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_fast_tier_is_the_default_and_slow_and_gpu_are_marked():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m 'not slow and not gpu'" in options["addopts"]
    assert {m.split(":")[0] for m in options["markers"]} == {"slow", "gpu"}
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest -m slow" in readme


@pytest.mark.slow
def test_a_fast_test_over_the_cpu_limit_fails_the_check(tmp_path):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_spin.py").write_text(
        "import time, pytest\n"
        "def _spin():\n"
        "    end = time.process_time() + 0.5\n"
        "    while time.process_time() < end:\n"
        "        pass\n"
        "def test_spins():\n"
        "    _spin()\n"
        "@pytest.mark.slow\n"
        "def test_spins_but_is_slow():\n"
        "    _spin()\n")
    env = dict(os.environ, TF_MIXED_FAST_TEST_LIMIT_S="0.3", TF_MIXED_TIER_CHECK="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "tier check FAILED: 1 fast-tier test(s) over 0.3 s of CPU time" in run.stdout
    assert "test_spin.py::test_spins:" in run.stdout
    assert "test_spins_but_is_slow" not in run.stdout.split("tier check")[1]
    env["TF_MIXED_TIER_CHECK"] = "0"  # without the check: a note, and the run passes
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "tier check note" in run.stdout, run.stdout
