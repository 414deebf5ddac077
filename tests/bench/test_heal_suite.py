"""`--suite=heal`'s demo: float32, mixed without healing (stopped), mixed healed."""

import pytest

from tf_mixed.bench import heal_suite


def _check(rows):
    float32, unhealed, healed = rows
    assert float32["stopped_at"] is None and float32["skipped_steps"] == 0
    # Without healing the monitor stops the run.
    assert unhealed["stopped_at"] is not None and unhealed["healed_layers"] == []
    # With healing the smooth-ReLU layer moves once and the run goes to its end,
    # within 0.5 point of float32's test accuracy, which has reached its plateau
    # (the task has a margin: a model that learns the rule scores 1.0).
    assert healed["stopped_at"] is None
    assert healed["healed_layers"] == ["hidden"]
    assert len(healed["healings"]) == 1 and "forward output" in healed["healings"][0]
    assert float32["accuracy"] >= 0.995, rows
    assert abs(healed["accuracy"] - float32["accuracy"]) <= 0.005, rows
    assert unhealed["accuracy"] < float32["accuracy"] - 0.005, rows


@pytest.mark.slow
def test_heal_demo_on_one_device():
    data = heal_suite.demo_data()
    _check([heal_suite.run_demo("float32", False, data=data),
            heal_suite.run_demo("mixed_float16", False, data=data),
            heal_suite.run_demo("mixed_float16", True, data=data)])


@pytest.mark.slow
def test_heal_demo_under_two_replicas(mirrored):
    data = heal_suite.demo_data()
    _check([heal_suite.run_demo("float32", False, data=data, strategy=mirrored),
            heal_suite.run_demo("mixed_float16", False, data=data, strategy=mirrored),
            heal_suite.run_demo("mixed_float16", True, data=data, strategy=mirrored)])


def test_the_suites_are_known_to_the_config():
    from tf_mixed.bench.config import BenchConfig

    assert BenchConfig(suite="heal").validate().model_name == "mlp"
    assert BenchConfig(suite="heal_cost").validate().model_name == "cnn"


@pytest.mark.slow
def test_heal_cost_reports_both_paths(capsys, tmp_path):
    from tf_mixed.bench.config import BenchConfig

    config = BenchConfig(suite="heal_cost", model="mlp", policies=("mixed_bfloat16",),
                         image_size=8, batch_size=8, round_steps=2, rounds=1,
                         output_dir=str(tmp_path)).validate()
    rows = heal_suite.run_heal_cost(config, "cmd")
    assert [r["policy"] for r in rows] == ["mixed_bfloat16"]
    assert rows[0]["plain_ms"] > 0 and rows[0]["attributed_ms"] > 0 and rows[0]["record_us"] > 0
    assert "| mixed_bfloat16 | mlp |" in capsys.readouterr().out


_HEAL_ROW = {"run": "float32", "stopped_at": None, "healed_layers": [], "healings": [],
             "skipped_steps": 0, "accuracy": 1.0, "seconds": 2.5}
_COST_ROW = {"policy": "mixed_bfloat16", "model": "mlp", "record_us": 40.0, "plain_ms": 2.0,
             "attributed_ms": 2.1, "wall_ratio": 1.05, "wall_interval": [1.01, 1.09],
             "cpu_ratio": 1.04, "pairs": [[[0.002, 0.002], [0.0021, 0.0021]]]}


@pytest.mark.parametrize("suite, patch, row, line", [
    ("heal", ("run_demo", lambda *a, **k: dict(_HEAL_ROW)), _HEAL_ROW,
     "| float32 | - | - | 0 | 1.0000 | 2.5 |"),
    ("heal_cost", ("_heal_cost_rows", lambda config: [dict(_COST_ROW)]), _COST_ROW,
     "| mixed_bfloat16 | mlp | 2.00 | 2.10 | 1.050 (1.010-1.090) | 1.040 | 40 | 2.00% |"),
])
def test_each_heal_suite_honours_output_dir_and_writes_its_files(
        suite, patch, row, line, tmp_path, monkeypatch, capsys):
    """Issue 46: --suite=heal and heal_cost ignored --output_dir and wrote no results.json."""
    import json

    from tf_mixed.bench.config import BenchConfig

    monkeypatch.setattr(heal_suite, *patch)
    monkeypatch.setattr(heal_suite, "demo_data", lambda seed=0: None)
    out = tmp_path / "out"
    config = BenchConfig(suite=suite, output_dir=str(out)).validate()
    run = heal_suite.run_heal if suite == "heal" else heal_suite.run_heal_cost
    rows = run(config, f"python -m tf_mixed bench --suite={suite}")
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]
    report = json.loads((out / "results.json").read_text())
    assert report["suite"] == suite and report["results"][0] == rows[0]
    assert report["load_average"] and report["command"].endswith(f"--suite={suite}")
    assert line in (out / "results.md").read_text()
    assert line in capsys.readouterr().out
