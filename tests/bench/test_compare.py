"""Tests for the bench: models, policy choice, tiny in-process runs, result files.

Runs go through `tf_mixed.cli.main.main` in this process (TF start-up is
shared) with tiny images and a few steps; one test per distinct path.
"""

import json
import math
import os
import re

import keras
import numpy as np
import plans
import pytest

from tf_mixed._internal import measuring
from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.bench import compare, config, models, plan_row, plot, run, schedule, serving
from tf_mixed.bench import report as bench_report
from tf_mixed.cli.main import main
from tf_mixed.policy import global_policy as policy_module
from tf_mixed.policy import hardware

TINY = [
    "--isolation=inprocess",
    "--image_size=16",
    "--train_size=96",
    "--val_size=40",
    "--batch_size=16",
    "--epochs=2",
    "--steps=3",
    "--warmup_steps=1",
    "--round_steps=3",
    "--time_budget=0",  # no plan: these runs must not depend on this host's speed
    "--matmul_size=128",
]


@pytest.fixture
def real_serving():
    """Asked for by a test that reads a run's serving figures: the LiteRT export runs."""


@pytest.fixture(autouse=True)
def _serving_only_where_read(request, monkeypatch):
    # The serving check (two LiteRT exports per mixed run, a third of a tiny
    # run's time) reports a failure as figures, never as an error: a test that
    # does not read them loses nothing when it is left out.
    if "real_serving" not in request.fixturenames:
        monkeypatch.setattr(serving, "measure", lambda model, sample: None)


def _run(tmp_path, capsys, *flags):
    out = tmp_path / "out"
    code = main(["tf_mixed", "bench", *TINY, f"--output_dir={out}", *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    with open(out / "results.json") as f:
        report = json.load(f)
    return report, captured.out, out


def _positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


# --- models -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_models_compute_in_policy_and_return_float32(name):
    size = 32  # ResNet-50's minimum
    shape = (size,) if name in models.SEQUENCE_MODELS else (size, size, 3)
    with policy_module.policy_scope("mixed_bfloat16"):
        model = models.build(name, shape, 5)
    out = model(np.zeros((2, *shape), np.float32))
    assert out.shape == (2, 5)
    assert out.dtype == "float32"
    np.testing.assert_allclose(np.sum(np.asarray(out), -1), 1.0, rtol=1e-5)
    dense_or_conv = [
        layer for layer in _all_layers(model)
        if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D))
    ]
    assert dense_or_conv and all(l.compute_dtype == "bfloat16" for l in dense_or_conv)
    assert all(v.dtype == "float32" for v in model.trainable_variables)


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _all_layers(layer)


def test_resnet18_has_eighteen_weight_layers():
    model = models.build("resnet18", (32, 32, 3), 10)
    convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D) and "proj" not in l.name]
    dense = [l for l in model.layers if isinstance(l, keras.layers.Dense)]
    assert len(convs) + len(dense) == 18
    assert 11_000_000 < model.count_params() < 11_300_000  # 11.2 M at 10 classes
    norms = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert len(norms) == 20 and {l.momentum for l in norms} == {0.9}


def test_unknown_model_and_too_small_images():
    with pytest.raises(UsageError) as info:
        models.build("vgg", (32, 32, 3), 10)
    assert str(info.value) == (
        "--model='vgg': unknown model. Accepted: mlp, cnn, resnet18, resnet50, mobilenetv2, "
        "efficientnetb0, transformer.")
    with pytest.raises(UsageError, match="too small for --model=resnet50"):
        models.build("resnet50", (16, 16, 3), 10)


# --- policies -----------------------------------------------------------------


def test_default_policies_follow_auto(monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(amx_bf16_usable=True))
    names, note = config.resolve_policies(())
    assert names == ("float32", "mixed_bfloat16")
    assert "enable('auto') = mixed_bfloat16" in note


def test_default_adds_bfloat16_where_auto_picks_float32(monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo())
    names, note = config.resolve_policies(())
    assert names == ("float32", "mixed_bfloat16")
    assert "picks float32 here" in note and "mixed_bfloat16 was added" in note


def test_default_on_tensor_core_gpu(monkeypatch):
    gpu = hardware.GpuInfo("A100", (8, 0))
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(gpus=(gpu,)))
    assert config.resolve_policies(())[0] == ("float32", "mixed_float16")


def test_requested_policies_are_canonical_deduplicated_float32_first():
    names, note = config.resolve_policies(("bf16", "fp32", "float32", "mixed_bfloat16", "fp16"))
    assert names == ("float32", "mixed_bfloat16", "mixed_float16")
    assert note.startswith("Policies as requested")
    with pytest.raises(UsageError) as info:
        config.resolve_policies(("float32", "half"))
    assert "--policies='half': unknown policy. Accepted: auto, mixed_float16" in str(info.value)


# --- runs ---------------------------------------------------------------------


def _check_figures(report, out_text):
    """Every figure is a real, finite, positive measurement and matches the table."""
    base = report["results"][0]
    assert base["policy"] == "float32"
    for r in report["results"]:
        for key in ("samples_per_sec", "samples_per_sec_mean", "step_time_ms", "step_time_ms_p90",
                    "train_time_s", "peak_memory_mb", "peak_rss_mb", "final_train_loss",
                    "final_val_loss"):
            assert _positive_finite(r[key]), (r["policy"], key, r[key])
        for key in ("final_train_accuracy", "final_val_accuracy"):
            assert 0.0 <= r[key] <= 1.0
        assert r["timed_steps"] == r["total_steps"] - r["warmup_steps"] > 0
        assert r["total_steps"] == r["epochs"] * r["steps_per_epoch"] == r["steps_run"]
        assert r["samples_per_sec"] == pytest.approx(
            1000 * r["global_batch_size"] / r["step_time_ms"])
        # Every round's figure is kept; the run's figure is their median.
        rounds = [x["samples_per_sec"] for x in r["rounds"]]
        assert sum(x["steps"] for x in r["rounds"]) == r["timed_steps"]
        assert r["samples_per_sec"] == pytest.approx(float(np.median(rounds)))
        spread = r["samples_per_sec_spread"]
        assert (spread["min"], spread["max"], spread["n"]) == (
            min(rounds), max(rounds), len(rounds))
        assert r["accuracy_compared"] and r["plan"]["full"]
        memory = r["activation_bytes"]
        assert memory["weights"] == 4 * r["model_params"]  # float32 variables
        assert memory["activations"] > 0 and memory["process_peak_bytes"] > 0
        assert r["step_time_ms"] <= r["step_time_ms_p90"] + 1e-9
        # Training took at least the timed steps.
        assert r["train_time_s"] * 1000 >= r["timed_steps"] * r["step_time_ms"] * 0.5
        assert len(r["history"]["val_loss"]) == r["epochs"]
        assert r["final_val_loss"] == r["history"]["val_loss"][-1]
        assert isinstance(r["skipped_steps"], int) and r["skipped_steps"] >= 0
        ratio = r["ratio_to_float32"]
        pairs = [x["samples_per_sec"] / b["samples_per_sec"]
                 for x, b in zip(r["rounds"], base["rounds"])]
        assert ratio["round_pairs"] == pytest.approx(pairs)
        assert ratio["samples_per_sec"] == pytest.approx(float(np.median(pairs)))
        assert ratio["peak_memory"] == pytest.approx(r["peak_memory_mb"] / base["peak_memory_mb"])
        assert ratio["activations"] == pytest.approx(
            memory["activations"] / base["activation_bytes"]["activations"])
        # The stdout table shows the same figures.
        mark = " (cut)" if r.get("cut") else ""
        row = next(line for line in out_text.splitlines()
                   if line.startswith(f"| {plan_row.label(r)}{mark} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{r['samples_per_sec']:,.1f}"
        assert cells[2] == f"{spread['min']:,.0f}-{spread['max']:,.0f}"
        # A ratio whose interval does not answer (too few pairs, or it holds 1) is none.
        assert cells[3] == ("no ratio" if bench_report.untrusted(r)
                            else f"{ratio['samples_per_sec']:.2f}x")
        low, high = ratio["interval"]
        assert low <= ratio["samples_per_sec"] <= high
        # The headline (bench.png's title, results.json's verdict) says the table's figure.
        if r["policy"] != "float32" and not bench_report.untrusted(r):
            assert r["verdict"].startswith(f"{ratio['samples_per_sec']:.2f}x float32 (90% "
                                           f"interval {low:.2f}-{high:.2f}x")
        census = r["census"]
        assert cells[5] == f"{100 * census['half_flop_share']:.0f}%"
        assert cells[6] == str(census["casts_per_step"])
        if r["policy"] == "float32":
            assert census["half_flop_share"] == 0.0 and census["casts_per_step"] == 0
        elif r["policy"] == plan_row.PLAN:
            # What the plan chose follows this host's timings: any share, none assumed.
            assert 0.0 <= census["half_flop_share"] <= 1.0
        else:
            assert census["half_flop_share"] > 0.5 and census["casts_per_step"] > 0
        assert cells[7] == f"{r['step_time_ms']:.1f}"
        assert cells[8] == f"{memory['activations'] / 2**20:,.1f}"
        assert cells[14] == f"{100 * r['final_val_accuracy']:.2f}"


@pytest.mark.slow
def test_default_pair_fit_loop_files_and_figures(tmp_path, capsys, monkeypatch, real_serving):
    # The default pair follows the hardware: fake an AMX CPU (auto: bfloat16). The plan
    # is injected: every layer bfloat16, i.e. mixed_bfloat16 (not trained again).
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(amx_bf16_usable=True))
    monkeypatch.setattr(plan_row, "make_plan", plans.injected(keep_first_float32=False))
    report, out_text, out = _run(tmp_path, capsys, "--model=cnn")
    assert sorted(os.listdir(out)) == ["bench.png", "results.json", "results.md"]
    assert open(out / "bench.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert report["suite"] == "compare"
    assert report["policies"][0] == "float32" and len(report["policies"]) == 3
    assert report["policies"][2] == "plan"
    assert out_text.count(report["policy_note"]) == 1  # once, before the training (issue 46)
    assert report["model"] == {"name": "cnn", "params": report["results"][0]["model_params"]}
    assert report["dataset"]["image_shape"] == [16, 16, 3]
    assert report["dataset"]["train_size"] == 96
    host = report["host"]
    assert host["tensorflow"] and host["keras"] == keras.__version__ and host["cpu_count"] >= 1
    assert report["flags"]["batch_size"] == 16 and report["flags"]["isolation"] == "inprocess"
    assert "--model=cnn" in report["command"]
    _check_figures(report, out_text)
    mixed = report["results"][1]
    assert (mixed["compute_dtype"] == "bfloat16"
            and report["results"][0]["compute_dtype"] == "float32")
    # In one process the policies run one after the other (subprocesses alternate);
    # the plan equals mixed_bfloat16, so it does not train: its row is mixed_bfloat16's.
    assert report["round_order"] == ["float32"] * 2 + ["mixed_bfloat16"] * 2
    plan = report["results"][2]
    assert plan["policy"] == "plan" and plan["same_as"] == "mixed_bfloat16"
    assert plan["layer_plan"]["summary"] == "injected by the test"
    for key in ("samples_per_sec", "rounds", "ratio_to_float32", "verdict", "final_val_loss"):
        assert plan[key] == mixed[key], key
    assert "| per-layer plan: the plan is mixed_bfloat16 |" in out_text
    assert "The per-layer plan is mixed_bfloat16: every layer in mixed_bfloat16's" in out_text
    # Half the activation bytes in bfloat16 (the float32 softmax head aside).
    assert 0.45 < mixed["ratio_to_float32"]["activations"] < 0.6
    assert 0 < report["matmul_ratio"] == report["matmul"]["ratio"]
    assert report["matmul"]["dtype"] == "bfloat16"
    assert f"host matmul 128^3 bfloat16/float32 {report['matmul_ratio']:.2f}x" in out_text
    assert all(line in out_text for line in report["notes"])
    assert any(line.startswith("Memory: activations MB is tf_mixed.audit's estimate")
               for line in report["notes"])
    assert mixed["loss_scale"] is None  # bfloat16 needs no loss scaling
    md = (out / "results.md").read_text()
    assert "| float32 |" in md and report["policy_note"] in md and report["command"] in md
    # What the mixed run leaves to serve: two LiteRT files, checked (issue 19).
    assert report["results"][0]["serving"] is None
    full, half = mixed["serving"]["float32"], mixed["serving"]["float16_weights"]
    assert 0 < half["bytes"] < full["bytes"]
    for figures in (full, half):
        assert 0 <= figures["max_rel_error"] <= figures["tolerance"]
    row = f"| mixed_bfloat16 | {full['bytes'] / 1024:,.1f} | {half['bytes'] / 1024:,.1f} |"
    assert row in out_text and row in md


@pytest.mark.slow
def test_float16_custom_loop_mirrored_records_loss_scale(tmp_path, capsys):
    report, out_text, _ = _run(
        tmp_path, capsys, "--model=mlp", "--policies=fp32,fp16", "--loop=custom",
        "--strategy=mirrored",
    )
    _check_figures(report, out_text)
    fp16 = report["results"][1]
    assert fp16["policy"] == "mixed_float16" and fp16["replicas"] == 2
    assert fp16["optimizer"] == "LossScaleOptimizer(Adam)"
    scale = fp16["loss_scale"]
    assert scale["initial"] == 2.0**15
    assert scale["trajectory"][0] == [0, scale["initial"]]
    steps = [s for s, _ in scale["trajectory"]]
    assert steps == sorted(steps) and steps[-1] <= fp16["total_steps"]
    assert scale["final"] == scale["trajectory"][-1][1]
    # Each halving of the scale is one skipped step (no growth in 6 steps).
    halvings = round(math.log2(scale["initial"] / scale["final"]))
    assert fp16["skipped_steps"] == halvings
    assert "loss scale" in out_text.split("Benchmarking")[1]


@pytest.mark.slow
def test_float16_fit_loop_uses_tf_mixed_optimizer(tmp_path, capsys):
    report, out_text, _ = _run(tmp_path, capsys, "--model=mlp", "--policies=mixed_float16,float32")
    assert [r["policy"] for r in report["results"]] == ["float32", "mixed_float16"]
    fp16 = report["results"][1]
    assert (fp16["optimizer"] == "LossScaleOptimizer(Adam)"
            and fp16["loss_scale"]["initial"] == 2.0**15)
    _check_figures(report, out_text)


@pytest.mark.slow
def test_folder_dataset_end_to_end(tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        os.makedirs(tmp_path / "imgs" / c)
        for i in range(20):
            Image.fromarray(rng.integers(0, 255, (18, 18, 3), np.uint8)).save(
                tmp_path / "imgs" / c / f"{i}.png")
    report, out_text, _ = _run(
        tmp_path, capsys, "--model=mlp", f"--dataset=folder:{tmp_path / 'imgs'}",
        "--policies=float32,bf16", "--train_size=0", "--val_size=0",
    )
    assert report["dataset"]["name"] == f"folder:{tmp_path / 'imgs'}"
    assert report["dataset"]["num_classes"] == 2
    assert report["dataset"]["train_size"] + report["dataset"]["val_size"] == 40
    _check_figures(report, out_text)


@pytest.mark.slow
def test_tfds_dataset_end_to_end(tmp_path, capsys):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=48):
        report, out_text, _ = _run(
            tmp_path, capsys, "--model=cnn", "--dataset=tfds:mnist", "--policies=float32,bf16",
            "--train_size=0", "--val_size=0", "--image_size=0",
        )
    assert report["dataset"]["name"] == "tfds:mnist:train"
    assert report["dataset"]["image_shape"] == [28, 28, 1]
    _check_figures(report, out_text)


# --- result files -------------------------------------------------------------


def _fake_result(policy, rate, acc):
    return {
        "policy": policy, "samples_per_sec": rate, "step_time_ms": 1000 * 32 / rate,
        "peak_memory_mb": 100.0, "final_train_loss": 0.5, "final_val_loss": 0.6,
        "final_val_accuracy": acc, "skipped_steps": 0, "loss_scale": None,
    }


def test_ratios_and_table_without_float32():
    results = [_fake_result("float32", 100.0, 0.90), _fake_result("mixed_bfloat16", 250.0, 0.895)]
    bench_report.add_ratios(results)
    assert results[1]["ratio_to_float32"]["samples_per_sec"] == 2.5
    assert results[1]["ratio_to_float32"]["step_time"] == pytest.approx(0.4)
    assert results[1]["ratio_to_float32"]["val_accuracy_diff_points"] == pytest.approx(-0.5)
    # One pair (no rounds: the ratio of the medians) is no verdict: no ratio printed.
    assert not results[1]["ratio_to_float32"]["trusted"]
    table = bench_report.markdown_table(results)
    assert ("| mixed_bfloat16 | 250.0 | n/a | no ratio | 1 pair(s) | n/a | n/a | 128.0 "
            "| n/a | n/a | n/a | 100 |") in table
    results[1]["ratio_to_float32"]["trusted"] = True
    results[1]["census"] = {"half_flop_share": 0.923, "casts_per_step": 14}
    assert "| 2.50x | 1 pair(s) | 92% | 14 | 128.0 |" in bench_report.markdown_table(results)
    # The base is the float32 row wherever it stands, not the first row.
    later = [_fake_result("mixed_bfloat16", 250.0, 0.895), _fake_result("float32", 125.0, 0.90)]
    bench_report.add_ratios(later)
    assert later[0]["ratio_to_float32"]["samples_per_sec"] == 2.0
    assert later[0]["ratio_to_float32"]["step_time"] == 0.5
    assert later[1]["ratio_to_float32"]["samples_per_sec"] == 1.0
    alone = [_fake_result("mixed_float16", 80.0, 0.5)]
    alone[0]["final_val_loss"] = None  # diverged run: stored as null, shown as nan
    bench_report.add_ratios(alone)
    assert alone[0]["ratio_to_float32"] is None
    assert "| n/a |" in bench_report.markdown_table(alone)
    assert "| 0.5000 | nan | 50.00 |" in bench_report.markdown_table(alone)


def test_write_outputs_refuses_non_finite_figures_and_leaves_nothing(tmp_path):
    bad = _fake_result("float32", 100.0, 0.9)
    bad["step_time_ms"] = float("nan")
    with pytest.raises(RuntimeError, match="step_time_ms=nan"):
        bench_report.write_outputs({"suite": "compare", "results": [bad]}, str(tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_failed_run_leaves_no_result_files(tmp_path, capsys, monkeypatch):
    out = tmp_path / "existing"
    os.makedirs(out)
    (out / "notes.txt").write_text("mine")
    calls = []

    def fail_second(config, policy, **kwargs):
        calls.append(policy)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return real(config, policy, **kwargs)

    real = run.run_policy
    monkeypatch.setattr(run, "run_policy", fail_second)
    with pytest.raises(RuntimeError, match="boom"):
        main(["tf_mixed", "bench", *TINY, "--model=mlp", f"--output_dir={out}"])
    assert os.listdir(out) == ["notes.txt"]
    fresh = tmp_path / "fresh"
    calls.clear()
    with pytest.raises(RuntimeError, match="boom"):
        main(["tf_mixed", "bench", *TINY, "--model=mlp", f"--output_dir={fresh}"])
    assert not fresh.exists()


def test_plot_without_matplotlib_is_skipped_with_a_note(monkeypatch, capsys, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now fails
    assert plot.plot({"suite": "compare", "results": []}, str(tmp_path / "b.png")) is False
    assert capsys.readouterr().out.strip() == (
        "bench.png skipped: matplotlib is not installed (pip install 'tf-mixed[plot]')."
    )
    assert not (tmp_path / "b.png").exists()


def test_warns_before_float16_convolutions_on_a_cpu(monkeypatch):
    cnn, mlp = config.BenchConfig(model="cnn"), config.BenchConfig(model="mlp")
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo())
    assert compare._slow_float16_convs(cnn, ("float32", "mixed_float16"))
    assert not compare._slow_float16_convs(mlp, ("float32", "mixed_float16"))
    assert not compare._slow_float16_convs(cnn, ("float32", "mixed_bfloat16"))
    gpu = hardware.HardwareInfo(gpus=(hardware.GpuInfo("V100", (7, 0)),))
    monkeypatch.setattr(hardware, "detect", lambda: gpu)
    assert not compare._slow_float16_convs(cnn, ("float32", "mixed_float16"))


@pytest.mark.slow
def test_plot_draws_loss_scale_and_diverged_runs(tmp_path):
    def result(policy, losses, scale):
        return {
            "policy": policy, "samples_per_sec": 100.0, "total_steps": 10,
            "rounds": [{"steps": 5, "samples_per_sec": 90.0},
                       {"steps": 5, "samples_per_sec": 110.0}],
            "samples_per_sec_spread": {"min": 90.0, "max": 110.0},
            "ratio_to_float32": {"samples_per_sec": 1.0, "round_pairs": [0.9, 1.1]},
            "peak_memory_mb": 800.0, "accuracy_compared": scale is None,
            "activation_bytes": {"activations": 2**20, "weights": 2**22, "gradients": 2**22,
                                 "optimizer_state": 2**23, "gpu_peak_bytes": None},
            "history": {"train_loss": losses, "val_loss": losses,
                        "val_accuracy": [0.5, None if None in losses else 0.7]},
            "loss_scale": scale,
        }

    report = {
        "suite": "compare", "model": {"name": "mlp"}, "dataset": {"name": "shapes"},
        "matmul": {"ratio": 1.9, "size": 1024, "dtype": "float16"},
        "results": [
            result("float32", [1.0, 0.5], None),
            result("mixed_float16", [1.0, None],
                   {"trajectory": [[0, 32768.0], [3, 16384.0]], "final": 16384.0}),
        ],
    }
    path = tmp_path / "bench.png"
    assert plot.plot(report, str(path)) is True
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Written at 100 dpi, 15 x 8.5 inches with the loss-scale panel: 1500 x 850 pixels.
    assert int.from_bytes(path.read_bytes()[16:20], "big") == 1500
    assert int.from_bytes(path.read_bytes()[20:24], "big") == 850
    # The picture says what the table says: the cut run marked, each verdict in the title.
    results = report["results"]

    def label(results):  # what report.add_ratios sets
        for r in results:
            r["cut"], r["verdict"] = bench_report.is_cut(r), bench_report.verdict(r)
        return results

    assert plot.tick_labels(label(results)) == ["float32", "mixed_float16\n(cut)"]
    assert plot.headline(results) == [
        "mixed_float16: 1.00x float32 (90% interval 0.90-1.10x); cut, timed only"]
    results[1]["ratio_to_float32"]["trusted"] = False  # no ratio drawn either
    assert plot.headline(label(results)) == [
        "mixed_float16: no ratio (only 2 round pair(s); re-run with more rounds); cut, timed only"]
    assert plot.plot(report, str(path)) is True


# --- float8 -------------------------------------------------------------------


def _no_gpu(monkeypatch):
    """The float8 figures must not depend on this host: pretend it has no GPU."""
    real = run.tf.config.list_logical_devices
    monkeypatch.setattr(run.tf.config, "list_logical_devices",
                        lambda kind=None: [] if kind == "GPU" else real(kind))


@pytest.mark.slow
def test_float8_policy_mirrored_reports_parity_and_no_speed(tmp_path, capsys, monkeypatch):
    _no_gpu(monkeypatch)
    report, out_text, out = _run(tmp_path, capsys, "--model=mlp", "--policy=float8",
                                 "--strategy=mirrored")
    assert report["policies"] == ["float32", "mixed_bfloat16", "float8"]
    float8 = report["results"][2]
    assert float8["compute_dtype"] == "bfloat16" and float8["replicas"] == 2
    plan = float8["float8"]
    # mlp: Flatten, dense_0..2 (1024), logits (10): first and last stay out.
    assert [c["layer"] for c in plan["choices"] if c["float8"]] == ["dense_1", "dense_2"]
    assert plan["speed"] == "emulated"
    assert math.isfinite(float8["final_val_loss"])
    md = (out / "results.md").read_text()
    # samples/s, its ratio and step ms say "emulated"; the census cells stay.
    assert re.search(r"^\| float8 \| emulated \| emulated \| emulated \| emulated \| [^|]+ "
                     r"\| [^|]+ \| emulated \|", md, re.M)
    assert "2 of 4 Dense layers in float8 (dense_1, dense_2)" in md
    assert "Its speed is not reported" in md
    assert report["results"][1]["float8"] is None


@pytest.mark.slow
def test_float8_layers_all_quantizes_every_dense(tmp_path, capsys, monkeypatch):
    _no_gpu(monkeypatch)
    report, _, _ = _run(tmp_path, capsys, "--model=cnn", "--policies=float8")
    plan = report["results"][0]["float8"]
    assert [c["float8"] for c in plan["choices"]] == [False]  # cnn: only the logits
    report, _, _ = _run(tmp_path, capsys, "--model=cnn", "--policies=float8",
                        "--float8_layers=all")
    assert [c["layer"] for c in report["results"][0]["float8"]["choices"]
            if c["float8"]] == ["logits"]


def test_float8_flags_are_checked(tmp_path, capsys):
    for flags, name in ((["--policy=float8", "--policies=float32"], "--policy"),
                        (["--policy=float8", "--float8_layers=some"], "--float8_layers"),
                        (["--policy=float9"], "--policy='float9': unknown policy")):
        code = main(["tf_mixed", "bench", *TINY, f"--output_dir={tmp_path / 'x'}", *flags])
        assert code == 2, flags
        assert name in capsys.readouterr().err
    assert config.resolve_policies(("float8", "fp32", "FLOAT8"))[0] == ("float32", "float8")


# --- rounds, the plan, memory, the matmul reference (issue 30) ----------------------


def _with_rounds(policy, rates, accuracy=0.9):
    result = _fake_result(policy, float(np.median(rates)), accuracy)
    result["rounds"] = [{"steps": 20, "samples_per_sec": r} for r in rates]
    result["samples_per_sec_spread"] = measuring.spread(rates)
    result["activation_bytes"] = {"activations": 1000 if policy == "float32" else 500,
                                  "weights": 400, "gradients": 400, "optimizer_state": 800,
                                  "gpu_peak_bytes": None}
    return result


def test_ratio_is_the_median_of_round_pairs_and_notes_say_when_to_distrust_it():
    # float32 slows in rounds 2-3 (a neighbour's load): the pairs still agree.
    results = [_with_rounds("float32", [100.0, 50.0, 50.0, 100.0, 100.0]),
               _with_rounds("mixed_bfloat16", [200.0, 100.0, 100.0, 210.0, 190.0])]
    bench_report.add_ratios(results)
    ratio = results[1]["ratio_to_float32"]
    assert ratio["round_pairs"] == [2.0, 2.0, 2.0, 2.1, 1.9]
    assert ratio["samples_per_sec"] == 2.0  # the ratio of the medians would say 1.9x
    assert ratio["activations"] == 0.5
    report = {"results": results, "load_average": [3.0], "host": {"cpu_count": 2},
              "matmul": {"ratio": 4.0, "size": 1024, "dtype": "bfloat16"}}
    notes = bench_report.notes(report)
    low, high = ratio["interval"]
    assert (low, high) == (2.0, 2.1) and ratio["trusted"]  # 3 of 5 pairs are 2.0
    assert notes[0] == ("mixed_bfloat16 / float32 = 2.00x float32 (90% interval 2.00-2.10x): the "
                        "median of 5 round pairs (min-max 1.90x-2.10x); the load average was 3.0 "
                        "at the end on 2 cores; taken on a busy host (load above its cores): the "
                        "interval answers for that load, and an idle host's ratio can differ "
                        "(re-run idle for it).")
    assert notes[1] == ("Reference: a 1024x1024 matmul runs 4.00x faster in bfloat16 than in "
                        "float32 on this host; mixed_bfloat16 gets 2.00x on this model "
                        "(50% of it).")
    # Pairs on both sides of 1: flagged, with the interval, the load and how to rerun.
    results[1] = _with_rounds("mixed_bfloat16", [50.0, 75.0, 30.0, 140.0, 100.0])
    results[0]["round_loads"] = [3.0, 4.0, 9.5, 9.0, 3.5]
    bench_report.add_ratios(results)
    ratio = results[1]["ratio_to_float32"]
    assert ratio["round_pairs"] == [0.5, 1.5, 0.6, 1.4, 1.0]
    assert ratio["interval"][0] < 1.0 < ratio["interval"][1] and not ratio["trusted"]
    assert ratio["widened_by"] == "the load average moved 3.0-9.5 during the rounds"
    # No ratio at all then: not in the notes, the table or the matmul reference.
    results[1]["plan"] = {"full": False, "extra_rounds": 2, "reason": "..."}
    results[1]["round_loads"] = [3.0, 4.0, 9.5, 9.0, 3.5]
    untrusted_notes = bench_report.notes(report)
    first = untrusted_notes[0]
    interval = f"{ratio['interval'][0]:.2f}-{ratio['interval'][1]:.2f}x"
    assert first == (
        f"mixed_bfloat16 / float32: NO RATIO: its 90% interval {interval} over 5 round pairs "
        "(median 1.00x) holds 1, so it is not known to be faster or slower here after 2 extra "
        "round(s); the load average was 3.0-9.5 during its rounds on 2 cores; what widened the "
        "interval: the load average moved 3.0-9.5 during the rounds. Re-run when the host is "
        "idle (or with more and shorter rounds, e.g. --round_steps=10 --epochs=8 "
        "--time_budget=0).")
    assert "1.00x float32" not in " ".join(untrusted_notes)
    assert not any(line.startswith("Reference:") for line in untrusted_notes)
    row = next(line for line in bench_report.markdown_table(results).splitlines()
               if line.startswith("| mixed_bfloat16"))
    assert f"| 75.0 | 30-140 | no ratio | {interval} |" in row
    assert bench_report.verdict(results[1]).startswith(f"no ratio (90% interval {interval} holds 1")
    assert "| 0.0 | 0.50x | 0.0 | 100 |" in row  # activations, vs float32, state, peak


def test_wide_pairs_that_all_say_faster_keep_their_ratio():
    """Issue 46: 34% spread at load 4 and 9.6, every pair faster: a ratio, not "no ratio"."""
    base = [100.0] * 9
    pairs = [3.06, 1.56, 3.4, 2.9, 3.1, 2.7, 3.3, 3.0, 2.8]
    results = [_with_rounds("float32", base),
               _with_rounds("mixed_bfloat16", [100.0 * p for p in pairs])]
    bench_report.add_ratios(results)
    ratio = results[1]["ratio_to_float32"]
    assert ratio["trusted"] and ratio["samples_per_sec"] == pytest.approx(3.0)
    assert 1.0 < ratio["interval"][0] <= 3.0 <= ratio["interval"][1]
    assert ratio["widened_by"] == "1 of 9 pairs far from the rest (1.56x)"
    interval = f"{ratio['interval'][0]:.2f}-{ratio['interval'][1]:.2f}x"
    # The headline (bench.png's title), the table and results.json agree.
    assert results[1]["verdict"] == f"3.00x float32 (90% interval {interval})"
    row = next(line for line in bench_report.markdown_table(results).splitlines()
               if line.startswith("| mixed_bfloat16"))
    assert f"| 3.00x | {interval} |" in row
    report = {"results": results, "load_average": [9.6], "host": {"cpu_count": 2}}
    assert bench_report.notes(report)[0].endswith(
        "the load average was 9.6 at the end on 2 cores; what widened the interval: 1 of 9 "
        "pairs far from the rest (1.56x); taken on a busy host (load above its cores): the "
        "interval answers for that load, and an idle host's ratio can differ (re-run idle for "
        "it).")
    report["load_average"] = [1.5]  # an idle host's note says nothing of it
    assert bench_report.notes(report)[0].endswith("pairs far from the rest (1.56x).")
    # About the same speed: a narrow interval around 1 is an answer too.
    results[1] = _with_rounds("mixed_bfloat16", [99.0, 101.0, 100.0, 102.0, 98.0, 100.0, 101.0,
                                                 100.0, 99.0])
    bench_report.add_ratios(results)
    assert results[1]["ratio_to_float32"]["trusted"]
    assert results[1]["verdict"].endswith(": about the same speed here)")


def test_a_timed_only_policy_shows_no_accuracy_and_says_why():
    results = [_with_rounds("float32", [100.0, 100.0, 100.0]),
               _with_rounds("mixed_bfloat16", [20.0, 20.0, 20.0], accuracy=None)]
    results[1]["plan"] = {"full": False, "reason": "bfloat16 is emulated on this CPU: ..."}
    bench_report.add_ratios(results)
    assert results[1]["ratio_to_float32"]["val_accuracy_diff_points"] is None
    results[1].update(steps_run=65, total_steps=500, final_train_loss=2.0982)
    row = bench_report.markdown_table(results).splitlines()[-1]
    assert "| not compared | n/a |" in row
    # Marked cut, its losses (65 steps against float32's 500) not shown beside float32's.
    assert row.startswith("| mixed_bfloat16 (cut) |")
    assert "| cut at step 65/500 | cut at step 65/500 |" in row and "2.0982" not in row
    notes = bench_report.notes({"results": results, "host": {}})
    assert "Cut to keep the time budget: bfloat16 is emulated on this CPU: ...." in notes
    assert ("mixed_bfloat16: cut at step 65/500, so its losses are not compared with float32's "
            "(results.json keeps them).") in notes
    assert bench_report.verdict(results[1]) == (
        "0.20x float32 (90% interval 0.20-0.20x); cut at step 65/500, timed only")
    assert bench_report.verdict(results[0]) == "the baseline"


@pytest.mark.slow
def test_time_budget_cuts_the_slower_policy_to_timed_rounds(tmp_path, capsys, monkeypatch):
    # A budget below the reserve for what follows training leaves nothing, and the
    # plan sees bfloat16 1000x slower than measured (a pure function: its timings
    # injected), so whatever this host's speed, float32 runs in full and
    # bfloat16 is only timed.
    real = schedule.plan_run

    def slow_bf16(step_s, *args, **kwargs):
        return real({p: t * (1000 if p != "float32" else 1) for p, t in step_s.items()},
                    *args, **kwargs)

    monkeypatch.setattr(schedule, "plan_run", slow_bf16)
    report, out_text, _ = _run(tmp_path, capsys, "--model=mlp", "--policies=fp32,bf16",
                               "--time_budget=1", "--epochs=3", "--steps=6", "--round_steps=2")
    base, bf16 = report["results"]
    assert base["plan"]["full"] and base["accuracy_compared"] and base["steps_run"] == 18
    assert not bf16["plan"]["full"] and not bf16["accuracy_compared"]
    assert bf16["final_val_accuracy"] is None
    # Warm-up 1, the 3 measured rounds of 2, two more rounds (the minimum size, 2
    # here); no extra round: the budget plus half of it is long spent.
    assert [r["steps"] for r in bf16["rounds"]] == [2] * 5 and bf16["steps_run"] == 11
    assert bf16["plan"]["reason"] in out_text and "timed on 5 rounds" in bf16["plan"]["reason"]
    assert bf16["plan"]["extra_rounds"] == 0
    assert "| not compared | n/a |" in out_text


@pytest.mark.slow
def test_transformer_learns_generated_tokens(tmp_path, capsys):
    report, out_text, out = _run(tmp_path, capsys, "--model=transformer", "--policies=fp32,bf16",
                                 "--train_size=256", "--batch_size=32", "--steps=8",
                                 "--epochs=2", "--image_size=0")
    assert report["model"]["name"] == "transformer" and report["dataset"]["name"] == "tokens"
    assert report["dataset"]["image_shape"] == [64]  # the sequence length
    assert report["flags"]["dataset"] == "tokens"  # the default data set, made for this model
    assert out_text.count("Model transformer (") == 1
    md = (out / "results.md").read_text()
    assert "Model transformer (" in md and report["matmul"]["dtype"] in md
    for r in report["results"]:
        assert r["final_val_accuracy"] > 0.2  # 10 classes: learning, not chance
    assert report["results"][1]["compute_dtype"] == "bfloat16"


def test_tokens_task_is_deterministic_and_marks_its_class():
    from tf_mixed.commands import data

    tokens, labels = data.make_tokens(50, seed=3, length=16)
    again, _ = data.make_tokens(50, seed=3, length=16)
    assert tokens.shape == (50, 16) and np.array_equal(tokens, again)
    assert sorted(np.bincount(labels)) == [5] * 10
    for row, label in zip(tokens, labels):
        counts = np.bincount(row, minlength=11)[1:11]
        assert counts[label] == 4 and counts.sum() == 5


def test_models_and_data_sets_must_match():
    with pytest.raises(UsageError, match="--model=transformer needs token sequences"):
        config.BenchConfig(model="transformer", dataset="tfds:mnist").validate()
    with pytest.raises(UsageError, match="--model=cnn needs images"):
        config.BenchConfig(model="cnn", dataset="tokens").validate()
    assert config.BenchConfig(model="transformer").validate().dataset == "tokens"


def test_gpu_suite_on_a_host_without_gpu_says_so_and_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo())
    out = tmp_path / "gpu"
    assert main(["tf_mixed", "bench", "--suite=gpu", f"--output_dir={out}"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == (
        "tf_mixed bench --suite=gpu: no GPU on this host (TensorFlow sees none), so there is "
        "nothing to measure; run it on a host with an NVIDIA GPU. The other suites run on a "
        "CPU (python -m tf_mixed bench --help).")
    assert not out.exists()


@pytest.mark.slow
def test_gpu_suite_path_with_the_gpu_faked(tmp_path, capsys, monkeypatch):
    """The GPU path end to end, hardware.detect faked (an H100), work run on this CPU.

    Honest where it fakes: the suite reads the GPU list (all-reduce skipped on one
    GPU, float8 checked at compute capability 9.0) from hardware.detect; the
    models and lowering_report run on the devices TensorFlow really has, and
    lowering_report says "no GPU" for them.
    """
    from tf_mixed.bench import gpu_suite

    h100 = hardware.HardwareInfo(gpus=(hardware.GpuInfo("NVIDIA H100 (faked)", (9, 0)),))
    monkeypatch.setattr(hardware, "detect", lambda: h100)
    out = tmp_path / "gpu"
    cfg = config.BenchConfig(suite="gpu", model="mlp", output_dir=str(out)).validate()
    sizes = gpu_suite.Sizes(image_size=16, batch_size=8, warmup_steps=1, rounds=2,
                            round_steps=2, float8_width=32)
    assert gpu_suite.run_gpu(cfg, "python -m tf_mixed bench --suite=gpu", sizes=sizes) == 0
    report = json.loads((out / "results.json").read_text())
    assert sorted(os.listdir(out)) == ["bench.png", "results.json", "results.md"]
    assert [r["name"] for r in report["results"]] == [v.name for v in gpu_suite.VARIANTS]
    timed = [r for r in report["results"] if "samples_per_sec" in r]
    assert timed and timed[0]["name"] == "float32" and timed[0]["ratio"] == 1.0
    for r in report["results"]:
        assert "samples_per_sec" in r or r["error"]
    assert report["allreduce"] == {"skipped": "one GPU: no all-reduce to measure"}
    assert report["float8_lowering"]["device"] == "no GPU"
    assert set(report["float8_lowering"]["verdicts"].values()) == {"emulated (no GPU)"}
    assert report["device"] == "NVIDIA H100 (faked) (cc 9.0)"
    # The per-layer plan timed float8 (Keras's emulation on this CPU) beside float32
    # and float16 for the Dense layers whose dimensions are multiples of 16.
    plan = report["float8_plan"]
    assert set(plan["choices"]) == {"dense_a", "dense_b", "dense_c", "out"}
    timed = {row["name"]: set(row["seconds"]) for row in plan["layers"]}
    assert timed["dense_a"] == {"float32", "float16", "float8"}
    assert timed["out"] == {"float32", "float16"}  # 10 outputs: not float8-ready
    assert ("Per-layer plan with float8 (tf_mixed.plan): dense_a "
            in (out / "results.md").read_text())
    assert "Loss-scale overhead" in capsys.readouterr().out


@pytest.mark.slow
def test_subprocess_policies_alternate_rounds(tmp_path):
    """The default isolation: each policy in its own process, rounds A B A B."""
    import subprocess
    import sys

    out = tmp_path / "out"
    flags = [f for f in TINY if f != "--isolation=inprocess"]
    env = dict(os.environ, TF_MIXED_PROGRESS="1")
    run_ = subprocess.run(
        [sys.executable, "-m", "tf_mixed", "bench", *flags, "--model=mlp",
         "--policies=fp32,bf16", "--steps=6", f"--output_dir={out}"],
        capture_output=True, text=True, timeout=900, env=env)
    assert run_.returncode == 0, run_.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    # 12 steps: warm-up 1, then rounds of 3, 3, 3, 2, the policies alternating.
    assert report["round_order"] == ["float32", "mixed_bfloat16"] * 4
    for r in report["results"]:
        assert [x["steps"] for x in r["rounds"]] == [3, 3, 3, 2] and r["accuracy_compared"]
    assert report["results"][1]["ratio_to_float32"]["round_pairs"] == pytest.approx(
        [m["samples_per_sec"] / f["samples_per_sec"]
         for m, f in zip(report["results"][1]["rounds"], report["results"][0]["rounds"])])
    assert "tf_mixed bench: " in run_.stderr  # the progress lines (absl logging)


@pytest.mark.gpu
def test_gpu_suite_on_a_real_gpu(tmp_path):
    """The whole GPU suite, as a user runs it (`pytest -m gpu` on a GPU host)."""
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("needs a GPU: TensorFlow sees none on this host")
    from tf_mixed.bench import gpu_suite

    out = tmp_path / "gpu"
    cfg = config.BenchConfig(suite="gpu", output_dir=str(out)).validate()
    assert gpu_suite.run_gpu(cfg, "python -m tf_mixed bench --suite=gpu") == 0
    report = json.loads((out / "results.json").read_text())
    assert report["wall_time_s"] < 8 * 60
    for r in report["results"]:
        assert _positive_finite(r.get("samples_per_sec")), r
    assert report["loss_scale_overhead"]["ratio"] > 0
    assert (out / "bench.png").exists()
