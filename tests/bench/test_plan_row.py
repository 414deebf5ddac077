"""tf_mixed.bench.plan_row: the main job's "per-layer plan" row and its notes."""

import pytest

from tf_mixed.bench import config, plan_row, report, serving
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
    assert plan_row.label({"policy": "plan", "same_as": "mixed_bfloat16"}) == (
        "per-layer plan: the plan is mixed_bfloat16")
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
def test_the_bench_trains_the_plan_beside_float32(tmp_path, capsys, monkeypatch):
    import json

    import plans

    from tf_mixed.cli.main import main

    # A plan that is neither whole-model policy (its first conv float32): trained.
    monkeypatch.setattr(plan_row, "make_plan", plans.injected(keep_first_float32=True))

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
    assert row["policy"] == "plan" and "same_as" not in row
    assert row["layer_plan"]["keep_float32"] == ["conv2d"] and row["compute_dtype"] == "bfloat16"
    assert report_data["round_order"].count("plan") == 1  # trained, one round
    assert "| per-layer plan |" in text and "per-layer plan: " in text
    assert "built before the policy was set" not in text  # trained under the plan's policy


def _whole(policy="mixed_bfloat16", keep=(), float8=()):
    layers = [{"seconds": {"float32": 1.0}, "choice": "bfloat16"}] * 3
    return {**_record(), "policy": policy, "keep_float32": list(keep),
            "float8_layers": list(float8), "summary": "chosen", "layers": layers}


def test_a_plan_equals_a_whole_model_policy_only_with_every_layer_in_its_precision():
    run = ("float32", "mixed_bfloat16", "plan")
    assert plan_row.same_as(_whole(), run) == "mixed_bfloat16"
    assert plan_row.same_as(_whole("float32"), run) == "float32"
    assert plan_row.same_as(_whole(keep=["conv2d"]), run) is None  # a layer kept float32
    assert plan_row.same_as(_whole(float8=["dense"]), run) is None
    assert plan_row.same_as(_whole(), ("float32", "plan")) is None  # no such row to reuse


def test_a_plan_equal_to_a_policy_takes_its_row_one_verdict_and_says_so():
    record = _whole()
    mixed = {"policy": "mixed_bfloat16", "samples_per_sec": 900.0, "step_time_ms": 40.0,
             "ratio_to_float32": {"samples_per_sec": 1.8, "trusted": False,
                                  "samples_per_sec_spread": {"median": 1.8, "n": 25, "min": 1.0,
                                                             "max": 2.6, "q1": 1.2, "q3": 2.4}},
             "verdict": "untrusted", "census": {}}
    row = plan_row.reused_row(record, mixed)
    assert row["policy"] == "plan" and row["same_as"] == "mixed_bfloat16"
    assert row["layer_plan"] is record and row["policy_reason"] == (
        "the plan is mixed_bfloat16 (chosen)")
    for key in ("samples_per_sec", "ratio_to_float32", "verdict"):
        assert row[key] == mixed[key]
    assert row["ratio_to_float32"] is not mixed["ratio_to_float32"]  # a copy
    assert "same_as" not in mixed
    data = {"results": [{"policy": "float32"}, mixed, row], "load_average": [9.0],
            "host": {"cpu_count": 2}}
    notes = report.notes(data)
    # One verdict line, mixed_bfloat16's; the plan's line says it is that row.
    assert [n for n in notes if "NO RATIO" in n or " = " in n] == [
        n for n in notes if n.startswith("mixed_bfloat16 / float32: NO RATIO")]
    mixed["serving"] = {"float32": {"bytes": 2048, "max_rel_error": 1e-3},
                        "float16_weights": {"bytes": 1024, "max_rel_error": 1e-3}}
    served = serving.markdown_table([mixed, plan_row.reused_row(record, mixed)])
    assert served.count("| mixed_bfloat16 |") == 1 and "| plan |" not in served
    assert ("per-layer plan: the plan is mixed_bfloat16 (3 bfloat16 timed layers); planned in "
            "12.5 s. It was not trained again: its row is mixed_bfloat16's, figures and "
            "verdict.") in notes



def test_a_plan_equal_to_a_policy_repeats_no_matmul_reference():
    """Issue 46: the main job printed the matmul reference twice, once per identical row."""
    record = _whole()
    pairs = {"median": 2.0, "n": 5, "min": 1.9, "max": 2.1, "q1": 2.0, "q3": 2.0}
    mixed = {"policy": "mixed_bfloat16", "samples_per_sec": 900.0, "step_time_ms": 40.0,
             "ratio_to_float32": {"samples_per_sec": 2.0, "trusted": True, "interval": [1.9, 2.1],
                                  "samples_per_sec_spread": pairs},
             "verdict": "2.00x float32", "census": {}}
    data = {"results": [{"policy": "float32"}, mixed, plan_row.reused_row(record, mixed)],
            "load_average": [1.0], "host": {"cpu_count": 2},
            "matmul": {"ratio": 4.0, "size": 1024, "dtype": "bfloat16"}}
    references = [n for n in report.notes(data) if n.startswith("Reference:")]
    assert references == [
        "Reference: a 1024x1024 matmul runs 4.00x faster in bfloat16 than in float32 on this "
        "host; mixed_bfloat16 gets 2.00x on this model (50% of it)."]
