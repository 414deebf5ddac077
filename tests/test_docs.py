"""The documents name only code that exists, and the code cites no outside document.

Every `tf_mixed.<name>` (dotted names resolved attribute by attribute, modules
imported as needed) and every repository path (``tf_mixed/...``, ``tests/...``,
``examples/...``, ``docs/...``) quoted in README.md, docs/*.md or
BUILD_NOTES.md must exist. CHANGELOG.md is history and may name what is gone.
"""

import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "BUILD_NOTES.md", *(ROOT / "docs").glob("*.md")])

_NAME = re.compile(r"(?<![\w/.-])tf_mixed(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_PATH = re.compile(r"(?<![\w/.-])(?:tf_mixed|tests|examples|docs|\.ci)/[\w./-]*[\w/]")


def _resolves(dotted: str) -> bool:
    """Whether ``tf_mixed.a.b`` names a module, or an attribute of one."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ModuleNotFoundError:
            return False
    return True


def _missing(text: str) -> list[str]:
    missing = []
    for match in _NAME.finditer(text):
        name = match.group(0).rstrip(".")
        if not _resolves(name):
            missing.append(name)
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip(".")
        if not (ROOT / path).exists():
            missing.append(path)
    return missing


def test_the_check_finds_names_and_paths_that_do_not_exist():
    text = ("Use `tf_mixed.enable()` and `tf_mixed.scaling.optimizer.LossScaleOptimizer.apply`, "
            "not `tf_mixed.scaling.optimizer._global_finite` or tf_mixed.audit._layer_outputs; "
            "see tf_mixed/scaling/rollback.py and tests/test_convert.py.")
    assert _missing(text) == ["tf_mixed.scaling.optimizer._global_finite",
                              "tf_mixed.audit._layer_outputs", "tests/test_convert.py"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_documents_quote_only_names_and_paths_that_exist(document):
    assert _missing(document.read_text()) == []


def test_no_source_cites_a_document_outside_the_repository():
    citing = re.compile(r"design\.md|design fact|fact \d+ of", re.IGNORECASE)
    offenders = []
    for directory in ("tf_mixed", "tests", "examples"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            if path == pathlib.Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if citing.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
