"""The documents name only code that exists, and the code cites no outside document.

Every `tf_mixed.<name>` (dotted names resolved attribute by attribute, modules
imported as needed) and every repository path (``tf_mixed/...``, ``tests/...``,
``examples/...``, ``docs/...``) quoted in README.md, docs/*.md or
BUILD_NOTES.md must exist. A name that resolves only through a deprecated
alias (``tf_mixed._MOVED``: ``tf_mixed.loss_scale``) counts as gone. A bare
file name (``optimizer.py``) must be the name of a file in the repository, and
no module name that the 0.2.0 move retired (``loss_scale.``, ``_internals.``)
may be quoted, qualified or not. CHANGELOG.md is history and may name what is
gone.
"""

import importlib
import pathlib
import re
import warnings

import pytest

import tf_mixed

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "BUILD_NOTES.md", *(ROOT / "docs").glob("*.md")])

_NAME = re.compile(r"(?<![\w/.-])tf_mixed(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_PATH = re.compile(r"(?<![\w/.-])(?:tf_mixed|tests|examples|docs|\.ci)/[\w./-]*[\w/]")
_FILE = re.compile(r"(?<![\w/.-])[A-Za-z_][\w-]*\.py\b")

# Module names the 0.2.0 move retired without a deprecated alias (private
# modules, the bench's command modules); the public ones are `tf_mixed._MOVED`'s.
_RETIRED_PRIVATE = ("_internals", "_facts", "_validate", "_losses", "_cloning", "_keras_fix_20585",
                    "_on_keras_import", "_remapping", "audit_command", "export_command", "errors")


def _module_names_on_disk() -> set[str]:
    package = ROOT / "tf_mixed"
    return ({p.stem for p in package.rglob("*.py")}
            | {p.name for p in package.rglob("*") if p.is_dir() and (p / "__init__.py").exists()})


def _retired_module_names() -> list[str]:
    """Old module names that no module or package of today's tree carries."""
    moved = [name for name, (_, attribute) in tf_mixed._MOVED.items() if attribute is None]
    on_disk = _module_names_on_disk()
    return sorted({*moved, *_RETIRED_PRIVATE} - on_disk)


_RETIRED = re.compile(r"(?<![\w/.-])(?:" + "|".join(map(re.escape, _retired_module_names()))
                      + r")\.(?:py\b|[A-Za-z_]\w*)")
_FILE_NAMES = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}


def _resolves(dotted: str) -> bool:
    """Whether ``tf_mixed.a.b`` names a module, or an attribute of one, by its current name.

    A step that resolves only through a deprecated alias (a DeprecationWarning
    from tf_mixed saying where the name moved) does not count.
    """
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = hasattr(obj, part)
        if any(issubclass(w.category, DeprecationWarning) and str(w.message).startswith("tf_mixed.")
               for w in caught):
            return False
        if found:
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
    for match in _FILE.finditer(text):
        if match.group(0) not in _FILE_NAMES:
            missing.append(match.group(0))
    for match in _RETIRED.finditer(text):
        if match.group(0) not in missing:
            missing.append(match.group(0))
    return missing


def test_the_check_finds_names_and_paths_that_do_not_exist():
    text = ("Use `tf_mixed.enable()` and `tf_mixed.scaling.optimizer.LossScaleOptimizer.apply`, "
            "not `tf_mixed.scaling.optimizer._global_finite` or tf_mixed.audit._layer_outputs; "
            "see tf_mixed/scaling/rollback.py and tests/test_convert.py.")
    assert _missing(text) == ["tf_mixed.scaling.optimizer._global_finite",
                              "tf_mixed.audit._layer_outputs", "tests/test_convert.py"]


def test_the_check_refuses_deprecated_aliases_and_retired_module_names():
    text = ("`tf_mixed.scaling.optimizer.wrap_optimizer` in `optimizer.py`, `float8_sync.py` and "
            "`tf_mixed._internal.shims.apply_reduced_gradients` are today's names; "
            "`tf_mixed.loss_scale.LossScaleOptimizer` (a deprecated alias), `tf_mixed.memory_report`, "
            "`selfcheck.py`, `nowhere.py`, `loss_scale._apply_unscaled` and "
            "`_internals.apply_reduced_gradients` are not. "
            "keras/src/backend/tensorflow/trainer.py is Keras's file, not ours.")
    assert _missing(text) == ["tf_mixed.loss_scale.LossScaleOptimizer", "tf_mixed.memory_report",
                              "selfcheck.py", "nowhere.py", "loss_scale._apply_unscaled",
                              "_internals.apply_reduced_gradients"]


@pytest.mark.slow
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
