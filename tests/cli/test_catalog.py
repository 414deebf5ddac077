"""``python -m tf_mixed catalog``: flags, files, --compare, and one line per bad input."""

import json

import pytest

from tf_mixed.cli.main import main
from tf_mixed.tools.catalog import results
from tf_mixed.tools.catalog.reading import SafeRange


def _run(capsys, *flags):
    code = main(["tf_mixed", "catalog", *flags])
    return code, capsys.readouterr()


def test_help_is_registered_in_the_dispatcher(capsys):
    code, out = _run(capsys, "--help")
    assert code == 0 and "python -m tf_mixed catalog" in out.out and "--compare" in out.out


@pytest.mark.parametrize("flags, text", [
    (["extra"], "unexpected argument 'extra'"),
    (["--new=b.json"], "needs --compare=OLD.json"),
    (["--tolerance=0"], "--tolerance=0.0 must be a positive number"),
    (["--compare=missing.json"], "--compare='missing.json': no catalog file"),
    (["--hub=maybe"], "hub"),
])
def test_bad_input_is_one_line_and_status_2(capsys, tmp_path, flags, text):
    code, out = _run(capsys, f"--output_dir={tmp_path / 'out'}", *flags)
    lines = out.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and text in lines[0], out.err
    assert lines[0].startswith("tf_mixed catalog: error: ")
    assert not (tmp_path / "out").exists()


def _file(tmp_path, name, high):
    row = results.Row("Dense", "units=64", "mixed_float16", "keras", (0.001, 0.001),
                      (0.001, 0.001), ("ok", "ok"), SafeRange(1.0, high, "", ""))
    catalog = results.Catalog((row,), (1.0, 10.0), {"mixed_float16": 0.0078125},
                              {"keras": "3.15.1"})
    path = tmp_path / name
    path.write_text(catalog.to_json())
    return path


def test_compare_two_files_lists_changes_and_exits_1(capsys, tmp_path):
    old, new = _file(tmp_path, "old.json", 10.0), _file(tmp_path, "new.json", 1.0)
    code, out = _run(capsys, f"--compare={old}", f"--new={new}")
    assert code == 1 and "Dense[units=64] mixed_float16: <=1 .. >=10 -> <=1 .. >=1" in out.out
    code, out = _run(capsys, f"--compare={old}", f"--new={old}")
    assert code == 0 and "no layer's safe range changed" in out.out


def test_one_layer_writes_results_and_picture_and_compares_with_the_stored(capsys, tmp_path):
    out_dir = tmp_path / "cat"
    code, out = _run(capsys, "--layers=Identity", "--policies=mixed_bfloat16",
                     f"--output_dir={out_dir}", "--compare=stored")
    assert code == 0, out.err
    assert "Identity[default]" in out.out and "no layer's safe range changed" in out.out
    data = json.loads((out_dir / "results.json").read_text())
    assert [r["layer"] for r in data["rows"]] == ["Identity"]
    assert (out_dir / "catalog.png").read_bytes()[:4] == b"\x89PNG"
