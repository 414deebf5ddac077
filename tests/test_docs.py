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
            "`tf_mixed.loss_scale.LossScaleOptimizer` (a deprecated alias), "
            "`tf_mixed.memory_report`, "
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


# ------------------------------------------------ public spellings (issue 33)
#
# Static (AST only, no TensorFlow): which spelling of a name is the public one.
# An object's public spellings are `tf_mixed.<name>` where the top level hands
# it on (`tf_mixed._EXPORTS`) and `tf_mixed.<folder>.<name>` where a folder's
# face lists it in `__all__`; a message, docstring or document that names such
# an object by any other path (`tf_mixed.float8.quantization.quantize` for
# `tf_mixed.float8.quantize`), or names a spelling kept only for one release
# (a face's or the top level's moved names), names it wrongly.

import ast  # noqa: E402
import functools  # noqa: E402

PACKAGE = ROOT / "tf_mixed"
_SOURCES = sorted(p for p in PACKAGE.rglob("*.py"))
_PUBLIC_TEXTS = sorted([ROOT / "README.md", ROOT / "BUILD_NOTES.md", *(ROOT / "docs").glob("*.md"),
                        *(ROOT / "examples").glob("*.py")])


def _module_path(module: str) -> pathlib.Path | None:
    base = ROOT / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_module_path(module).read_text())


def _face_table(module: str, name: str) -> dict:
    """A face's literal dict assigned to ``name`` (``_EXPORTS``), or its moved
    names (the dict given to ``_moved.face_getattr``)."""
    for node in _tree(module).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
            value = node.value
            if isinstance(value, ast.Call):
                value = value.args[1]
            return ast.literal_eval(value)
    return {}


def _all(module: str) -> list[str]:
    for node in _tree(module).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if [ast.unparse(t) for t in targets] == ["__all__"] and node.value is not None:
                return list(ast.literal_eval(node.value))
    return []


@functools.cache
def _defining(module: str, name: str) -> tuple[str, str]:
    """Where ``module.name`` is defined: follows ``from tf_mixed.x import name`` re-exports."""
    if _module_path(f"{module}.{name}") is not None:
        return (f"{module}.{name}", "")  # a submodule
    for node in _tree(module).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tf_mixed"):
            for alias in node.names:
                if (alias.asname or alias.name) == name and _module_path(node.module):
                    return _defining(node.module, alias.name)
    return (module, name)


def _faces() -> list[str]:
    return sorted(_module_name(p) for p in PACKAGE.rglob("__init__.py")
                  if p.parent != PACKAGE and p.parent.name not in ("_internal", "bench", "cli"))


def _module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).parent.parts if path.name == "__init__.py"
                    else path.relative_to(ROOT).with_suffix("").parts)


@functools.cache
def _public_spellings() -> dict[tuple[str, str], set[str]]:
    spellings: dict[tuple[str, str], set[str]] = {}
    for name, module in tf_mixed._EXPORTS.items():
        if name != module.rpartition(".")[2]:
            spellings.setdefault(_defining(f"tf_mixed.{module}", name), set()).add(
                f"tf_mixed.{name}")
    for face in _faces():
        for name in _all(face):
            spellings.setdefault(_defining(face, name), set()).add(f"{face}.{name}")
    return spellings


def _moved_spellings() -> dict[str, str]:
    """Every spelling kept for one release -> what to write instead."""
    moved = {}
    for name, (where, attribute) in tf_mixed._MOVED.items():
        moved[f"tf_mixed.{name}"] = f"tf_mixed.{where}" + (f".{attribute}" if attribute else "")
    for face in _faces():
        for name, where in _face_table(face, "__getattr__").items():
            moved[f"{face}.{name}"] = f"{where}.{name}"
    return moved


def _not_public(dotted: str) -> str | None:
    """What ``dotted`` should read, when it names a public object by another path."""
    moved = _moved_spellings()
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in moved:
            return ".".join([moved[".".join(parts[:end])], *parts[end:]])
    end = 1
    while end < len(parts) and _module_path(".".join(parts[: end + 1])) is not None:
        end += 1
    if end == len(parts):
        return None  # a module
    module, name = ".".join(parts[:end]), parts[end]
    spellings = _public_spellings().get(_defining(module, name))
    if spellings and f"{module}.{name}" not in spellings:
        return ".".join([min(spellings, key=len), *parts[end + 1:]])
    return None


def _strings(path: pathlib.Path):
    """``(line, text)`` of every string constant in a module: messages and docstrings."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _wrong_spellings(text: str) -> list[str]:
    found = []
    for match in _NAME.finditer(text):
        dotted = match.group(0).rstrip(".")
        should = _not_public(dotted)
        if should is not None:
            found.append(f"{dotted} (write {should})")
    return found


def test_the_spelling_check_finds_private_paths_and_moved_names():
    assert _wrong_spellings("`tf_mixed.float8.quantization.quantize(model)`") == [
        "tf_mixed.float8.quantization.quantize (write tf_mixed.float8.quantize)"]
    assert _wrong_spellings("`tf_mixed.scaling.optimizer.LossScaleOptimizer.apply`") == [
        "tf_mixed.scaling.optimizer.LossScaleOptimizer.apply "
        "(write tf_mixed.LossScaleOptimizer.apply)"]
    assert _wrong_spellings("tf_mixed.scaling.Accumulator and tf_mixed.memory_report") == [
        "tf_mixed.scaling.Accumulator (write tf_mixed.scaling.accumulation.Accumulator)",
        "tf_mixed.memory_report (write tf_mixed.tools.memory_report)"]
    assert _wrong_spellings("tf_mixed.float8.quantize, tf_mixed.scaling.accumulation.Accumulator, "
                            "tf_mixed.scaling.optimizer, tf_mixed.LossScaleOptimizer") == []


@pytest.mark.slow
def test_messages_and_docstrings_name_public_objects_by_their_public_path():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {wrong}"
                 for path in _SOURCES for line, text in _strings(path)
                 for wrong in _wrong_spellings(text)]
    assert offenders == []


@pytest.mark.slow
@pytest.mark.parametrize("document", _PUBLIC_TEXTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_documents_name_public_objects_by_their_public_path(document):
    assert _wrong_spellings(document.read_text()) == []


def test_documents_name_errors_users_catch_by_a_public_path():
    error = re.compile(r"(?<![\w/.-])tf_mixed(?:\.\w+)*\._\w*(?:\.\w+)*"
                       r"\.\w*(?:Error|Warning|Failure)\b")
    assert error.search("catch tf_mixed._internal.tf_keras_check.TfKerasError")
    offenders = [f"{document.relative_to(ROOT)}: {match.group(0)}"
                 for document in _PUBLIC_TEXTS for match in error.finditer(document.read_text())]
    assert offenders == []


# --------------------------------------------------- BUILD_NOTES sections

_NOTES_HEADINGS = {line.lstrip("#").strip()
                   for line in (ROOT / "BUILD_NOTES.md").read_text().splitlines()
                   if line.startswith("#")}
# A citation of a section: BUILD_NOTES.md, "Heading" / BUILD_NOTES.md ("Heading") /
# BUILD_NOTES.md, section "Heading" / [text](BUILD_NOTES.md#heading), and the
# retired habit of citing notes by issue (BUILD_NOTES.md, issue 21).
_CITATION = re.compile(r'BUILD_NOTES\.md(?:#([\w-]+)|[,:]?\s*\(?(?:section\s+)?"([^"]+)"'
                       r'|[^.\n]{0,30}?\b([Ii]ssue \d+))')


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _missing_sections(text: str) -> list[str]:
    missing = []
    for match in _CITATION.finditer(text.replace("\n", " ")):
        anchor, quoted, issue = match.groups()
        if anchor is not None and anchor not in {_slug(h) for h in _NOTES_HEADINGS}:
            missing.append(f"#{anchor}")
        elif quoted is not None and quoted not in _NOTES_HEADINGS:
            missing.append(quoted)
        elif issue is not None:
            missing.append(issue)
    return missing


def test_the_section_check_finds_missing_sections():
    heading = sorted(_NOTES_HEADINGS)[0]
    text = (f'(BUILD_NOTES.md, "{heading}"), BUILD_NOTES.md ("Issue 22"), BUILD_NOTES.md, '
            'issue 21; BUILD_NOTES.md (section "Nowhere"); [x](BUILD_NOTES.md#no-such-part)')
    assert _missing_sections(text) == ["Issue 22", "issue 21", "Nowhere", "#no-such-part"]


def test_citations_of_build_notes_name_sections_that_exist():
    texts = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *_SOURCES,
             *(ROOT / "examples").glob("*.py")]
    offenders = [f"{path.relative_to(ROOT)}: {section}" for path in sorted(texts)
                 for section in _missing_sections(path.read_text())]
    assert offenders == []



def test_build_notes_stay_short():
    """History goes to CHANGELOG.md; the notes describe the code as it is (issue 33)."""
    assert len((ROOT / "BUILD_NOTES.md").read_text().splitlines()) <= 400


# ------------------------------------------------ documents speak the faces (issue 43)
#
# A user reads README.md and docs/ to learn what to call: every dotted
# `tf_mixed.` name there starts on a face (a name `tf_mixed/__init__.py` hands
# on, then names in each folder face's `__all__`), never a module path such as
# `tf_mixed.scaling.healing.HealRule`. Code is pointed at by file path
# (`tf_mixed/scaling/healing.py`); a command (`python -m tf_mixed.x`) is a
# command. docs/layout.md is the map of the modules and names them.

_COMMAND = re.compile(r"-m\s+$")


def _off_face(dotted: str) -> bool:
    """Whether ``tf_mixed.a.b...`` leaves the faces before it reaches an object."""
    parts = dotted.split(".")[1:]
    if not parts:
        return False
    if parts[0] not in tf_mixed._EXPORTS:
        return True
    face = f"tf_mixed.{parts[0]}"
    if tf_mixed._EXPORTS[parts[0]] != parts[0]:
        return False  # a function or class handed on at the top: the rest are its attributes
    for part in parts[1:]:
        face_path = ROOT / face.replace(".", "/") / "__init__.py"
        if not face_path.exists():
            return False  # a module the face hands on (tf_mixed.layers): its attributes
        if part not in _all(face):
            return True
        face = f"{face}.{part}"
    return False


def _names_off_face(text: str) -> list[str]:
    return [match.group(0).rstrip(".") for match in _NAME.finditer(text)
            if not _COMMAND.search(text[max(0, match.start() - 8):match.start()])
            and _off_face(match.group(0).rstrip("."))]


def test_the_face_check_finds_module_paths():
    assert _names_off_face(
        "`tf_mixed.scaling.healing.HealRule`, `tf_mixed._internal.facts`, "
        "`tf_mixed.models.cloning.CopyRefused`, `tf_mixed.callbacks.skip_contract.install`; "
        "`tf_mixed.scaling.HealRule(skips=5)`, `tf_mixed.LossScaleOptimizer.apply`, "
        "`tf_mixed.tools.planning.Plan.to_dict`, `tf_mixed.layers.OutputActivation`, "
        "`python -m tf_mixed.distribute.launch`") == [
        "tf_mixed.scaling.healing.HealRule", "tf_mixed._internal.facts",
        "tf_mixed.models.cloning.CopyRefused", "tf_mixed.callbacks.skip_contract.install"]


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d.name not in ("layout.md",
                                                                            "BUILD_NOTES.md")],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_documents_send_users_only_to_faces(document):
    assert _names_off_face(document.read_text()) == []


def test_the_readme_is_a_front_page():
    """At most 200 lines: the rest lives in docs/ (issue 43)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
