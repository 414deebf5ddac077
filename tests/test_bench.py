"""Tests for the bench: models, policy choice, tiny in-process runs, result files.

Runs go through `tf_mixed.cli.main.main` in this process (TF start-up is
shared) with tiny images and a few steps; one test per distinct path.
"""

import json
import math
import re
import os

import keras
import numpy as np
import pytest

from tf_mixed.policy import hardware
from tf_mixed.policy import global_policy as policy_module
from tf_mixed.bench import compare, config, models, plot, run
from tf_mixed.bench import report as bench_report
from tf_mixed.cli.main import main
from tf_mixed._internal.cli_errors import UsageError

TINY = [
    "--isolation=inprocess",
    "--image_size=16",
    "--train_size=96",
    "--val_size=40",
    "--batch_size=16",
    "--epochs=2",
    "--steps=3",
    "--warmup_steps=1",
]


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


@pytest.mark.parametrize("name", models.MODEL_NAMES)
def test_models_compute_in_policy_and_return_float32(name):
    size = 32  # ResNet-50's minimum
    with policy_module.policy_scope("mixed_bfloat16"):
        model = models.build(name, (size, size, 3), 5)
    out = model(np.zeros((2, size, size, 3), np.float32))
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
    assert str(info.value) == "--model='vgg': unknown model. Accepted: mlp, cnn, resnet18, resnet50."
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
        assert r["total_steps"] == r["epochs"] * r["steps_per_epoch"]
        assert r["samples_per_sec"] == pytest.approx(1000 * r["global_batch_size"] / r["step_time_ms"])
        assert r["step_time_ms"] <= r["step_time_ms_p90"] + 1e-9
        # Training took at least the timed steps.
        assert r["train_time_s"] * 1000 >= r["timed_steps"] * r["step_time_ms"] * 0.5
        assert len(r["history"]["val_loss"]) == r["epochs"]
        assert r["final_val_loss"] == r["history"]["val_loss"][-1]
        assert isinstance(r["skipped_steps"], int) and r["skipped_steps"] >= 0
        ratio = r["ratio_to_float32"]
        assert ratio["samples_per_sec"] == pytest.approx(r["samples_per_sec"] / base["samples_per_sec"])
        assert ratio["peak_memory"] == pytest.approx(r["peak_memory_mb"] / base["peak_memory_mb"])
        # The stdout table shows the same figures.
        row = next(line for line in out_text.splitlines() if line.startswith(f"| {r['policy']} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{r['samples_per_sec']:,.1f}"
        assert cells[2] == f"{ratio['samples_per_sec']:.2f}x"
        census = r["census"]
        assert cells[3] == f"{100 * census['half_flop_share']:.0f}%"
        assert cells[4] == str(census["casts_per_step"])
        if r["policy"] == "float32":
            assert census["half_flop_share"] == 0.0 and census["casts_per_step"] == 0
        else:
            assert census["half_flop_share"] > 0.5 and census["casts_per_step"] > 0
        assert cells[5] == f"{r['step_time_ms']:.1f}"
        assert cells[10] == f"{100 * r['final_val_accuracy']:.2f}"


def test_default_pair_fit_loop_files_and_figures(tmp_path, capsys, monkeypatch):
    # The default pair follows the hardware: fake an AMX CPU (auto: bfloat16).
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(amx_bf16_usable=True))
    report, out_text, out = _run(tmp_path, capsys, "--model=cnn")
    assert sorted(os.listdir(out)) == ["bench.png", "results.json", "results.md"]
    assert open(out / "bench.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert report["suite"] == "compare"
    assert report["policies"][0] == "float32" and len(report["policies"]) == 2
    assert report["policy_note"] in out_text
    assert report["model"] == {"name": "cnn", "params": report["results"][0]["model_params"]}
    assert report["dataset"]["image_shape"] == [16, 16, 3]
    assert report["dataset"]["train_size"] == 96
    host = report["host"]
    assert host["tensorflow"] and host["keras"] == keras.__version__ and host["cpu_count"] >= 1
    assert report["flags"]["batch_size"] == 16 and report["flags"]["isolation"] == "inprocess"
    assert "--model=cnn" in report["command"]
    _check_figures(report, out_text)
    mixed = report["results"][1]
    assert mixed["compute_dtype"] == "bfloat16" and report["results"][0]["compute_dtype"] == "float32"
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


def test_float16_fit_loop_uses_tf_mixed_optimizer(tmp_path, capsys):
    report, out_text, _ = _run(tmp_path, capsys, "--model=mlp", "--policies=mixed_float16,float32")
    assert [r["policy"] for r in report["results"]] == ["float32", "mixed_float16"]
    fp16 = report["results"][1]
    assert fp16["optimizer"] == "LossScaleOptimizer(Adam)" and fp16["loss_scale"]["initial"] == 2.0**15
    _check_figures(report, out_text)


def test_folder_dataset_end_to_end(tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        os.makedirs(tmp_path / "imgs" / c)
        for i in range(20):
            Image.fromarray(rng.integers(0, 255, (18, 18, 3), np.uint8)).save(tmp_path / "imgs" / c / f"{i}.png")
    report, out_text, _ = _run(
        tmp_path, capsys, "--model=mlp", f"--dataset=folder:{tmp_path / 'imgs'}",
        "--policies=float32,bf16", "--train_size=0", "--val_size=0",
    )
    assert report["dataset"]["name"] == f"folder:{tmp_path / 'imgs'}"
    assert report["dataset"]["num_classes"] == 2
    assert report["dataset"]["train_size"] + report["dataset"]["val_size"] == 40
    _check_figures(report, out_text)


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


def test_overhead_suite(tmp_path, capsys):
    out = tmp_path / "over"
    code = main([
        "tf_mixed", "bench", "--suite=overhead", "--image_size=16", "--train_size=64",
        "--batch_size=16", "--steps=3", "--rounds=2", "--warmup_steps=1", f"--output_dir={out}",
    ])
    text = capsys.readouterr().out
    assert code == 0
    report = json.loads((out / "results.json").read_text())
    assert report["suite"] == "overhead" and report["policy"] == "mixed_float16"
    assert report["model"]["name"] == "mlp"
    keras_row, ours = report["results"]
    assert keras_row["path"] == "keras" and ours["path"] == "tf_mixed"
    assert keras_row["optimizer"] == "keras.LossScaleOptimizer"
    assert ours["optimizer"] == "tf_mixed.LossScaleOptimizer" and ours["callbacks"] == ["LossScaleMonitor"]
    for r in report["results"]:
        assert _positive_finite(r["step_time_ms"]) and r["timed_steps"] == 6
    assert report["overhead_ratio"] == pytest.approx(ours["step_time_ms"] / keras_row["step_time_ms"])
    assert f"**{report['overhead_ratio']:.3f}x**" in text
    assert sorted(os.listdir(out)) == ["bench.png", "results.json", "results.md"]


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
    table = bench_report.markdown_table(results)
    assert "| mixed_bfloat16 | 250.0 | 2.50x | n/a | n/a | 128.0 | 100 | 1.00x |" in table
    results[1]["census"] = {"half_flop_share": 0.923, "casts_per_step": 14}
    assert "| 2.50x | 92% | 14 | 128.0 |" in bench_report.markdown_table(results)
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


def test_plot_draws_loss_scale_and_diverged_runs(tmp_path):
    def result(policy, losses, scale):
        return {
            "policy": policy, "samples_per_sec": 100.0, "total_steps": 10,
            "ratio_to_float32": {"samples_per_sec": 1.0},
            "history": {"train_loss": losses, "val_loss": losses}, "loss_scale": scale,
        }

    report = {
        "suite": "compare", "model": {"name": "mlp"}, "dataset": {"name": "shapes"},
        "results": [
            result("float32", [1.0, 0.5], None),
            result("mixed_float16", [1.0, None],
                   {"trajectory": [[0, 32768.0], [3, 16384.0]], "final": 16384.0}),
        ],
    }
    path = tmp_path / "bench.png"
    assert plot.plot(report, str(path)) is True
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- float8 -------------------------------------------------------------------


def _no_gpu(monkeypatch):
    """The float8 figures must not depend on this host: pretend it has no GPU."""
    real = run.tf.config.list_logical_devices
    monkeypatch.setattr(run.tf.config, "list_logical_devices",
                        lambda kind=None: [] if kind == "GPU" else real(kind))


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
    assert re.search(r"^\| float8 \| emulated \| emulated \| [^|]+ \| [^|]+ \| emulated \|",
                     md, re.M)
    assert "2 of 4 Dense layers in float8 (dense_1, dense_2)" in md
    assert "Its speed is not reported" in md
    assert report["results"][1]["float8"] is None


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
                        (["--policy=float9"], "--policies")):
        code = main(["tf_mixed", "bench", *TINY, f"--output_dir={tmp_path / 'x'}", *flags])
        assert code == 2, flags
        assert name in capsys.readouterr().err
    assert config.resolve_policies(("float8", "fp32", "FLOAT8"))[0] == ("float32", "float8")
