"""``python -m tf_mixed litert-latency``: LiteRT files' latency over interleaved rounds."""

import json

import pytest

from tf_mixed.bench import litert_latency
from tf_mixed.cli.main import main


def test_latency_median_of_interleaved_rounds_with_a_fake_clock():
    now = [0.0]
    cost = {"a": 0.002, "b": 0.001}
    calls = []

    def runner(name):
        def run():
            calls.append(name)
            now[0] += cost[name]
        return run

    result = litert_latency.measure({"a": runner("a"), "b": runner("b")}, rounds=3,
                                    iterations=4, clock=lambda: now[0])
    assert result == pytest.approx({"a": 2.0, "b": 1.0})
    # Interleaved, each runner leading in turn (measuring.rotated): a round runs
    # one runner (1 warm call + 4 timed), then the other.
    a, b = ["a"] * 5, ["b"] * 5
    assert calls == [*a, *b, *b, *a, *b, *a]


@pytest.mark.slow
def test_latency_command_writes_sizes_parity_and_load(tmp_path, capsys):
    code = main(["tf_mixed", "litert-latency", "--model=mlp", "--image_size=16",
                 "--rounds=1", "--iterations=2", f"--output_dir={tmp_path}"])
    assert code == 0
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "latency.json").read_text())
    files = record["files"]
    assert files["float16_weights"]["bytes"] < files["float32"]["bytes"]
    assert "load average" in out and "| float16_weights |" in out
    assert len(record["load_average"]["before"]) == 3
