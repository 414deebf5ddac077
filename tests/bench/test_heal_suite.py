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
def test_heal_cost_reports_both_paths(capsys):
    from tf_mixed.bench.config import BenchConfig

    config = BenchConfig(suite="heal_cost", model="mlp", policies=("mixed_bfloat16",),
                         image_size=8, batch_size=8, round_steps=2, rounds=1).validate()
    rows = heal_suite.run_heal_cost(config, "cmd")
    assert [r["policy"] for r in rows] == ["mixed_bfloat16"]
    assert rows[0]["plain_ms"] > 0 and rows[0]["attributed_ms"] > 0 and rows[0]["record_us"] > 0
    assert "| mixed_bfloat16 | mlp |" in capsys.readouterr().out
