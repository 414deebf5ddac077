"""A command's PNG, or one line naming the plot extra (tf_mixed/commands/png.py)."""

import sys

import pytest
import tomllib
from repo_paths import ROOT

from tf_mixed.commands import png


def _draw_with_matplotlib():
    import matplotlib.pyplot  # noqa: F401

    return b"PNG"


@pytest.mark.parametrize("command, filename", [("probe", "probe.png"),
                                               ("catalog", "catalog.png")])
def test_without_matplotlib_the_line_names_the_picture_and_the_extra(
        monkeypatch, capsys, command, filename):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now fails
    assert png.png_or_none(command, filename, _draw_with_matplotlib) is None
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"tf_mixed {command}: matplotlib is not installed: {filename} "
                            "not written (pip install 'tf-mixed[plot]')\n")


def test_the_extra_it_names_is_the_one_that_installs_matplotlib():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert png.INSTALL == "pip install 'tf-mixed[plot]'" and extras["plot"] == ["matplotlib"]


def test_the_png_comes_back_and_another_missing_module_is_not_hidden(capsys):
    assert png.png_or_none("probe", "probe.png", lambda: b"PNG") == b"PNG"

    def draw():
        import tf_mixed_no_such_module  # noqa: F401

    with pytest.raises(ImportError, match="tf_mixed_no_such_module"):
        png.png_or_none("probe", "probe.png", draw)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("module", ["catalog", "probe"])
def test_the_commands_that_draw_say_it_through_the_one_helper(module):
    source = (ROOT / "tf_mixed" / "cli" / f"{module}.py").read_text()
    assert f'png_or_none("{module}", "{module}.png", ' in source
    assert "matplotlib is not installed" not in source
