"""The bench's real models (keras.applications) and its auto-checked row (issue 47)."""

import json

import keras
import pytest

from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.bench import config, models, serving
from tf_mixed.cli.main import main
from tf_mixed.policy import global_policy, hardware, model_check

TINY = ["--isolation=inprocess", "--image_size=16", "--train_size=128", "--val_size=32",
        "--batch_size=16", "--epochs=2", "--steps=8", "--warmup_steps=1", "--round_steps=4",
        "--time_budget=0", "--matmul_size=128", "--model=mlp"]


@pytest.mark.parametrize("name, application", [
    ("mobilenetv2", "mobilenetv2_1.00_32"),
    pytest.param("efficientnetb0", "efficientnetb0", marks=pytest.mark.slow),
])
def test_the_applications_build_with_a_float32_head(name, application):
    model = models.build(name, (32, 32, 3), 5)
    assert model.layers[2].name == application and model.layers[2].weights
    assert model.output.dtype == "float32" and model.output.shape == (None, 5)
    with pytest.raises(UsageError, match=f"too small for --model={name}"):
        models.build(name, (16, 16, 3), 5)


def test_auto_checked_is_a_bench_row_of_its_own(monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(amx_bf16_usable=True))
    names, _ = config.resolve_policies(("float32", "auto", "plan", "auto-checked"))
    assert names == ("float32", "mixed_bfloat16", "plan", "auto-checked")


@pytest.mark.slow  # three in-process bench runs: about 10 s of CPU
def test_the_auto_checked_row_moves_a_slower_model_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(model_check.ENV, "1")
    monkeypatch.setenv(model_check.SECONDS_ENV, "600")
    monkeypatch.setattr(global_policy, "resolve_auto",
                        lambda info=None, measure=None: ("mixed_bfloat16", "host probe (faked)"))
    monkeypatch.setattr(serving, "measure", lambda model, sample: None)
    record = model_check.Check.record
    fake = {"float32": 0.01, "mixed_bfloat16": 0.02}  # bfloat16 twice as slow, by fiat
    monkeypatch.setattr(model_check.Check, "record",
                        lambda self, seconds: record(self, fake[self._current]))
    out = tmp_path / "out"
    code = main(["tf_mixed", "bench", *TINY, "--policies=float32,mixed_bfloat16,auto-checked",
                 f"--output_dir={out}"])
    assert code == 0, capsys.readouterr().err
    results = {r["policy"]: r for r in json.loads((out / "results.json").read_text())["results"]}
    row = results["auto-checked"]
    assert row["model_check"]["action"] == "moved" and row["compute_dtype"] == "float32"
    assert row["model_check"]["figures"]["ratio"] == pytest.approx(0.5)
    # The explicit rows train the policy they name, unchecked.
    assert results["mixed_bfloat16"]["model_check"] is None
    assert results["mixed_bfloat16"]["compute_dtype"] == "bfloat16"
    text = (out / "results.md").read_text()
    assert ("auto-checked (trains in float32; its first steps, the check's rounds, are in its "
            "figures): tf_mixed: auto chose mixed_bfloat16") in text
    keras.backend.clear_session()
