"""``--suite=memory`` and ``--suite=bf16``: the pieces, one tiny run each.

The suites' figures (BUILD_NOTES.md, issue 21) come from runs by hand; here a
child of the memory suite and a two-path quality run are run small.
"""

import json

import numpy as np
import pytest

from tf_mixed.bench import bf16_quality, memory_suite
from tf_mixed.bench.config import BenchConfig


def test_memory_suite_selects_its_paths_from_the_flags():
    # Its refusals (each before TensorFlow) are in tests/cli/test_main_before_tensorflow.py.
    assert memory_suite.selected_paths(("bf16",), 6) == ["mixed_bfloat16"]
    assert memory_suite.selected_paths(("fp32",), 8) == ["float32", "float32 accum4"]
    assert memory_suite.selected_paths((), 8, ["float32", "bfloat16 kahan, float32 state"]) == [
        "float32", "bfloat16 kahan, float32 state"]
    assert memory_suite.selected_paths(("float32",), 6, ["float32"]) == ["float32"]


def test_every_memory_path_is_available_with_accumulation():
    assert memory_suite.available_paths() == list(memory_suite.PATHS)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["bfloat16 stochastic, bfloat16 state, accum4", "float32"])
def test_memory_child_reports_bytes_and_peaks(tmp_path, path, monkeypatch):
    monkeypatch.setattr(memory_suite, "WIDTH", 64)
    out = tmp_path / "path.json"
    memory_suite._child(path, {"batch_size": 8, "steps": 2, "warmup_steps": 1,
                               "learning_rate": 1e-3, "seed": 0}, str(out))
    result = json.loads(out.read_text())
    per = result["bytes_per_parameter"]
    if path == "float32":
        assert (per["weights"], per["accumulation"]) == (4, 0)
    else:
        assert (per["weights"], per["gradients"], per["accumulation"]) == (2, 2, 4)
    assert result["peak_tensor_mb"] > 0 and result["peak_rss_mb"] > 0
    assert result["updates_per_sec"] > 0 and np.isfinite(result["final_loss"])


def test_drawn_digits_are_deterministic_and_balanced():
    first, second = bf16_quality.digits(3), bf16_quality.digits(3)
    for a, b in zip(first[:4], second[:4]):
        np.testing.assert_array_equal(a, b)
    x_train, y_train, x_val, _, source = first
    assert x_train.shape == (bf16_quality.TRAIN, 64) and x_val.shape[1] == 64
    assert x_train.min() >= 0 and x_train.max() <= 1
    assert set(np.unique(y_train)) == set(range(10))
    assert "digits" in source


@pytest.mark.slow
def test_quality_suite_writes_its_table(tmp_path, monkeypatch, capsys):
    paths = ("mixed_bfloat16 (reference)", "bfloat16, Keras Adam",
             "bfloat16 kahan, float32 state")
    monkeypatch.setattr(bf16_quality, "PATHS", {p: bf16_quality.PATHS[p] for p in paths})
    monkeypatch.setattr(bf16_quality, "HIDDEN", 16)
    config = BenchConfig(suite="bf16", epochs=1, batch_size=64, learning_rate=1e-4,
                         output_dir=str(tmp_path)).validate()
    report = bf16_quality.run_quality(config, "test")
    rows = {r["path"]: r for r in report["results"]}
    assert rows["bfloat16, Keras Adam"]["weights_moved"] == 0.0  # the stall
    assert rows["bfloat16 kahan, float32 state"]["weights_moved"] > 0.0
    assert json.loads((tmp_path / "results.json").read_text())["suite"] == "bf16"
    assert "| bfloat16, Keras Adam |" in capsys.readouterr().out
