"""tf_mixed.bench.plan_row: the main job's "per-layer plan" row and its notes."""

import pytest

from tf_mixed.bench import config, plan_row, report
from tf_mixed.policy import hardware


def _record(cached=False):
    return {
        "policy": "mixed_bfloat16", "cached": cached, "plan_seconds": 12.5,
        "keep_float32": ["logits"], "step_seconds": {"plan": 0.030, "float32": 0.05},
        "layers": [{"seconds": {"float32": 1.0}, "choice": "bfloat16"},
                   {"seconds": {"float32": 1.0}, "choice": "bfloat16"},
                   {"seconds": {"float32": 1.0}, "choice": "float32"},
                   {"seconds": {}, "choice": "bfloat16"}],
    }


def _report(ratio):
    return {"matmul": {"ratio": 2.5, "size": 1024, "dtype": "bfloat16"}, "results": [
        {"policy": "float32"},
        {"policy": "plan", "layer_plan": _record(), "step_time_ms": 40.0,
         "ratio_to_float32": {"samples_per_sec": ratio},
         "census": {"half_flop_share": 0.75, "casts_per_step": 12,
                    "cast_bytes_per_step": 3 * 2**20}}]}


def test_the_row_is_labelled_per_layer_plan():
    assert plan_row.label({"policy": "plan"}) == "per-layer plan"
    assert plan_row.label({"policy": "mixed_bfloat16"}) == "mixed_bfloat16"


def test_notes_say_what_was_chosen_and_where_the_rest_goes_in_numbers():
    lines = plan_row.notes(_report(2.0))
    assert lines[0] == ("per-layer plan: mixed_bfloat16 with 2 bfloat16, 1 float32 timed layers "
                        "(kept float32: logits); planned in 12.5 s.")
    assert lines[1] == (
        "per-layer plan gets 2.00x of the host's 2.50x matmul ratio (80%). Where the rest goes: "
        "25% of the step's matmul/conv FLOPs stay in float32 (census); 12 casts a step moving "
        "3.0 MB (census); the timed layers' forward+backward is 30.0 ms of the 40.0 ms step, the "
        "other 10.0 ms (25%) are layers without weights, the loss, the optimizer update and "
        "dispatch, which half precision does not speed up.")


def test_per_layer_times_above_the_step_are_not_used_to_split_it():
    data = _report(2.0)
    data["results"][1]["step_time_ms"] = 20.0
    assert plan_row.notes(data)[1].endswith(
        "the timed layers, each timed alone, sum to 30.0 ms, more than the 20.0 ms step (each "
        "carries its own dispatch), so they do not split this step further.")


def test_no_where_the_rest_goes_when_the_row_reaches_the_matmul_ratio():
    assert len(plan_row.notes(_report(2.6))) == 1


def test_the_compare_report_carries_the_plan_notes():
    data = _report(2.0)
    del data["results"][1]["ratio_to_float32"]  # the ratio's own notes need the rounds
    assert plan_row.notes(data)[0] in report.notes(data)


@pytest.mark.parametrize("auto_host", [True, False])
def test_the_compare_default_adds_the_plan_as_a_third_row(monkeypatch, auto_host):
    info = hardware.HardwareInfo(amx_bf16_usable=auto_host)
    monkeypatch.setattr(hardware, "detect", lambda: info)
    names, note = config.resolve_policies((), with_plan=True)
    assert names == ("float32", "mixed_bfloat16", "plan")
    assert note.endswith("; and the per-layer plan (tf_mixed.plan) as a third row.")
    assert config.resolve_policies(())[0] == ("float32", "mixed_bfloat16")
    assert config.resolve_policies(("fp32", "plan"))[0] == ("float32", "plan")


@pytest.mark.slow
def test_the_bench_trains_the_plan_beside_float32(tmp_path, capsys):
    import json

    from tf_mixed.cli.main import main

    out = tmp_path / "out"
    code = main(["tf_mixed", "bench", "--isolation=inprocess", "--image_size=16",
                 "--train_size=96", "--val_size=40", "--batch_size=16", "--epochs=1",
                 "--steps=3", "--warmup_steps=1", "--round_steps=3", "--time_budget=0",
                 "--matmul_size=128", "--model=cnn", "--policies=float32,plan",
                 f"--output_dir={out}"])
    text = capsys.readouterr().out
    assert code == 0
    report_data = json.loads((out / "results.json").read_text())
    row = report_data["results"][1]
    assert row["policy"] == "plan" and row["layer_plan"]["layers"]
    assert row["compute_dtype"] == ("float32" if row["layer_plan"]["policy"] == "float32"
                                    else "bfloat16")
    assert "| per-layer plan |" in text and "per-layer plan: " in text
    assert "built before the policy was set" not in text  # trained under the plan's policy
