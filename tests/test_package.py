"""The package itself: flat lazy namespace, no shadowing, no import circle."""

import ast
import importlib
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import pytest

import tf_mixed

PACKAGE_DIR = pathlib.Path(tf_mixed.__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent

# What a Keras user expects to import from tf_mixed directly.
FLAT_NAMES = (
    "Enabled", "Float32Loss", "Float32Output", "LossScaleMonitor",
    "LossScaleOptimizer", "ModelCheckpoint", "OutputActivation",
    "audit", "convert", "disable", "enable", "float32_loss",
    "policy_scope", "wrap_optimizer",
)


# --------------------------------------------------------------- namespace


def test_every_name_in_all_is_importable():
    for name in tf_mixed.__all__:
        value = getattr(tf_mixed, name)
        module_name = tf_mixed._EXPORTS.get(name)
        if name == "__version__":
            assert isinstance(value, str)
        elif name == module_name.rpartition(".")[2]:
            assert isinstance(value, types.ModuleType)
            assert value.__name__ == f"tf_mixed.{module_name}"
        else:  # the very object its module defines
            module = importlib.import_module(f"tf_mixed.{module_name}")
            assert value is getattr(module, name)


def test_no_public_name_missing_from_all():
    assert set(FLAT_NAMES) <= set(tf_mixed.__all__)
    assert set(tf_mixed._EXPORTS) | {"__version__"} == set(tf_mixed.__all__)
    assert sorted(dir(tf_mixed)) == sorted(tf_mixed.__all__)
    assert len(tf_mixed.__all__) == len(set(tf_mixed.__all__))
    assert not set(tf_mixed._EXPORTS) & set(tf_mixed._MOVED)


def test_the_public_face_is_short():
    """The README's flows at the top; the rest under its concern (issue 29)."""
    functions_and_classes = [n for n, m in tf_mixed._EXPORTS.items()
                             if n != m.rpartition(".")[2]]
    assert len(functions_and_classes) <= 20, functions_and_classes


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(tf_mixed._MOVED))
def test_a_moved_name_still_imports_with_a_deprecation_warning(name):
    where, attribute = tf_mixed._MOVED[name]
    module = importlib.import_module(f"tf_mixed.{where}")
    expected = getattr(module, attribute) if attribute else module
    with pytest.warns(DeprecationWarning, match=rf"tf_mixed\.{name} moved to tf_mixed\.{where}"):
        value = getattr(tf_mixed, name)
    assert value is expected
    with pytest.warns(DeprecationWarning):  # every use says so, not only the first
        getattr(tf_mixed, name)


# --------------------------------------------------------------- folder faces

DOCUMENTS = sorted([SOURCE_ROOT / "README.md", *(SOURCE_ROOT / "docs").glob("*.md"),
                    *(SOURCE_ROOT / "examples").glob("*.py")])


def _folder_faces() -> list[str]:
    return sorted(".".join(p.relative_to(SOURCE_ROOT).parent.parts)
                  for p in PACKAGE_DIR.rglob("__init__.py") if p.parent != PACKAGE_DIR)


def _face_source(face: str) -> ast.Module:
    return ast.parse((SOURCE_ROOT / face.replace(".", "/") / "__init__.py").read_text())


def _face_all(face: str) -> list[str]:
    for node in _face_source(face).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if [ast.unparse(t) for t in targets if t is not None] == ["__all__"] and node.value:
            return list(ast.literal_eval(node.value))
    return []


def _face_moved(face: str) -> dict[str, str]:
    for node in _face_source(face).body:
        if (isinstance(node, ast.Assign)
                and [ast.unparse(t) for t in node.targets] == ["__getattr__"]):
            return ast.literal_eval(node.value.args[1])
    return {}


def _documented(face: str, name: str, text: str) -> bool:
    """``face.name`` written out, or ``name`` imported from ``face``, in ``text``."""
    spelled = re.search(rf"(?<![\w.]){re.escape(face)}\.{re.escape(name)}\b", text)
    imported = re.search(
        rf"from {re.escape(face)} import (?:\([^)]*|[^\n]*)\b{re.escape(name)}\b", text)
    return bool(spelled or imported)


def test_the_documentation_check_reads_both_spellings():
    text = ("`tf_mixed.scaling.LossTally`\n"
            "from tf_mixed.distribute import (\n    WorkersFailed,\n)\n")
    assert _documented("tf_mixed.scaling", "LossTally", text)
    assert _documented("tf_mixed.distribute", "WorkersFailed", text)
    assert not _documented("tf_mixed.scaling", "Loss", text)
    assert not _documented("tf_mixed.policy", "LossTally", text)


def test_every_name_a_face_hands_on_is_documented():
    """A face is as short as the docs (issue 33): README.md, docs/ or examples/ use each name."""
    text = "\n".join(p.read_text() for p in DOCUMENTS)
    undocumented = [f"{face}.{name}" for face in _folder_faces() for name in _face_all(face)
                    if not _documented(face, name, text)]
    assert undocumented == []


def test_a_face_names_each_moved_name_once_and_not_in_all():
    for face in _folder_faces():
        moved, public = _face_moved(face), set(_face_all(face))
        assert not moved.keys() & public, face
        for name, module in moved.items():
            assert module == "tf_mixed" and name in tf_mixed._EXPORTS or (
                (SOURCE_ROOT / module.replace(".", "/")).with_suffix(".py").exists()), (face, name)


def test_a_moved_name_warns_with_its_new_spelling():
    """The mechanism every face and the top level share (`tf_mixed._internal.moved`)."""
    from tf_mixed._internal import moved

    getattr_ = moved.face_getattr("tf_mixed.fake", {"resolve": "tf_mixed._internal.moved"})
    with pytest.warns(DeprecationWarning) as caught:
        assert getattr_("resolve") is moved.resolve
    assert str(caught[0].message) == (
        "tf_mixed.fake.resolve moved to tf_mixed._internal.moved.resolve in tf_mixed 0.2.0; "
        "the old name goes in 0.3.0. Use tf_mixed._internal.moved.resolve.")
    assert caught[0].filename == __file__  # the warning points at the caller's line
    with pytest.raises(AttributeError, match="module 'tf_mixed.fake' has no attribute 'nope'"):
        getattr_("nope")


@pytest.mark.slow
@pytest.mark.parametrize("face", [f for f in _folder_faces() if _face_moved(f)])
def test_the_names_a_face_no_longer_hands_on_still_import_with_a_warning(face):
    module = importlib.import_module(face)
    for name, new_home in sorted(_face_moved(face).items()):
        expected = getattr(importlib.import_module(new_home), name)
        with pytest.warns(DeprecationWarning, match=rf"^{re.escape(face)}\.{name} moved to "
                          rf"{re.escape(new_home)}\.{name} in"):
            value = getattr(module, name)
        assert value is expected, name
        assert name not in module.__all__


def test_type_checking_imports_match_the_table():
    tree = ast.parse((PACKAGE_DIR / "__init__.py").read_text())
    block, = [node for node in tree.body if isinstance(node, ast.If)
              and getattr(node.test, "id", None) == "TYPE_CHECKING"]
    imported = {}
    for node in block.body:
        for alias in node.names:
            imported[alias.asname or alias.name] = (
                alias.name if node.module == "tf_mixed"
                else node.module.removeprefix("tf_mixed."))
    assert imported == tf_mixed._EXPORTS


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tf_mixed.nope  # noqa: B018


def test_no_function_shadows_its_module():
    # tf_mixed.audit is the function; its module is tf_mixed.tools.auditing.
    from tf_mixed.models import conversion
    from tf_mixed.tools import auditing

    assert tf_mixed.audit is auditing.audit
    assert tf_mixed.convert is conversion.convert
    for name, module_name in tf_mixed._EXPORTS.items():
        if name != module_name:
            assert not (PACKAGE_DIR / f"{name}.py").exists(), name
            assert not (PACKAGE_DIR / name).is_dir(), name
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tf_mixed.audit")


def _run_fresh(code, *args, cwd=SOURCE_ROOT) -> str:
    """Runs ``code`` in a fresh Python with this checkout first on the path."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True,
        timeout=300, cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(SOURCE_ROOT),
             "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


@pytest.mark.slow
def test_import_does_not_load_tensorflow():
    code = textwrap.dedent("""
        import sys
        import tf_mixed
        import tf_mixed.cli.main  # the command line sets TF's log level first
        assert "tensorflow" not in sys.modules, "import tf_mixed loaded TF"
        assert "keras" not in sys.modules, "import tf_mixed loaded Keras"
        assert tf_mixed.__version__ and "enable" in dir(tf_mixed)
        assert "tensorflow" not in sys.modules, "__version__/dir loaded TF"
        tf_mixed.enable("float32", quiet=True)
        assert "tensorflow" in sys.modules
        # The first name used registered tf_mixed's objects for loading.
        import keras
        assert keras.saving.get_registered_object(
            "tf_mixed>OutputActivation") is tf_mixed.OutputActivation
        from tf_mixed import LossScaleMonitor, wrap_optimizer
        assert tf_mixed.callbacks.monitor.LossScaleMonitor is LossScaleMonitor
        print("ok")
    """)
    assert _run_fresh(code) == "ok"


_LOAD_IN_FRESH_PROCESS = """
import sys
{imports}
import numpy as np
model = keras.models.load_model(sys.argv[1])
names = [type(layer).__name__ for layer in model.layers]
assert names == ["Dense", "Identity", "Activation"], names  # the heads save as Keras's
assert type(model.optimizer) is tf_mixed.LossScaleOptimizer, type(model.optimizer)
assert model.optimizer.inner_optimizer.__class__.__name__ == "SGD"
expected = np.load(sys.argv[2])
got = model.predict(np.ones((2, 3), "float32"), verbose=0)
assert np.array_equal(got, expected), (got, expected)
print("loaded")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "imports",
    ["import tf_mixed\nimport keras", "import keras\nimport tf_mixed"],
    ids=["tf_mixed-first", "keras-first"],
)
def test_import_tf_mixed_is_enough_to_load_a_saved_model(tmp_path, imports):
    """Issue 16, case 1: a fresh process loads a .keras file with tf_mixed's
    layers and optimizer after nothing but ``import tf_mixed`` (Keras imports
    only packages named keras* on its own)."""
    import keras
    import numpy as np

    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, kernel_initializer="ones"),
        tf_mixed.Float32Output(),
        tf_mixed.OutputActivation("softmax"),
    ])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5), force=True),
                  loss="mse")
    model.fit(np.ones((2, 3), "float32"), np.zeros((2, 4), "float32"), verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    np.save(tmp_path / "expected.npy", model.predict(np.ones((2, 3), "float32"), verbose=0))
    code = _LOAD_IN_FRESH_PROCESS.format(imports=imports)
    out = _run_fresh(code, path, str(tmp_path / "expected.npy"), cwd=tmp_path)
    assert out.splitlines()[-1] == "loaded"


@pytest.mark.slow
def test_registration_waits_for_keras_and_leaves_the_import_system():
    code = textwrap.dedent("""
        import sys
        import tf_mixed
        from tf_mixed._internal import on_keras_import as _on_keras_import
        hooks = [f for f in sys.meta_path if isinstance(f, _on_keras_import._AfterKeras)]
        assert len(hooks) == 1, sys.meta_path
        assert "tf_mixed.layers" not in sys.modules
        import keras
        assert "tf_mixed.layers" in sys.modules and "tf_mixed.scaling.optimizer" in sys.modules
        assert keras.saving.get_registered_object(
            "tf_mixed>Float32Output").__module__ == "tf_mixed.layers"
        assert not [f for f in sys.meta_path
                    if isinstance(f, _on_keras_import._AfterKeras)], sys.meta_path
        print("ok")
    """)
    assert _run_fresh(code) == "ok"


@pytest.mark.slow
def test_a_failing_registration_warns_and_keeps_keras_importable():
    from tf_mixed._internal import on_keras_import as _on_keras_import

    with pytest.warns(UserWarning, match="could not register its Keras objects "
                      r"\(tf_mixed.no_such_module: ModuleNotFoundError"):
        _on_keras_import.register_when_keras_loads(["tf_mixed.no_such_module"])


# --------------------------------------------------------------- import graph


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        getattr(test, "id", None) == "TYPE_CHECKING"
        or getattr(test, "attr", None) == "TYPE_CHECKING")


def _is_main_block(node: ast.AST) -> bool:
    """``if __name__ == "__main__":``: runs only when the module is the program,
    never when it is imported, so its imports are no edge."""
    return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def _imports(tree: ast.AST):
    """Every import statement, at any depth, except `if TYPE_CHECKING:` and
    `if __name__ == "__main__":` ones."""
    for node in ast.iter_child_nodes(tree):
        if _is_type_checking(node) or _is_main_block(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def import_graph() -> dict[str, set[str]]:
    """tf_mixed module -> tf_mixed modules it imports (anywhere in its code).

    Imports inside functions count (they run when the function does). The
    package's own ``__init__`` has no edges: it imports nothing at import
    time (its names resolve lazily), and an edge to it from every module
    that says ``import tf_mixed`` would say nothing.
    """
    paths = sorted(PACKAGE_DIR.rglob("*.py"))
    modules = {_module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        edges = set()
        if name != "tf_mixed":
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            for node in _imports(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                else:
                    base = node.module or ""
                    if node.level:
                        anchor = package.rsplit(".", node.level - 1)[0]
                        base = f"{anchor}.{base}".rstrip(".")
                    # `from a import b` imports a, and a.b when b is a module.
                    targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
                    # A module's own package is already importing when it runs.
                    if name.startswith(base + "."):
                        targets = targets[1:]
                edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state = {}  # name -> "open" while on the path, "done" after

    def visit(name, path):
        state[name] = "open"
        path = path + [name]
        for target in sorted(graph[name]):
            if state.get(target) == "open":  # back on the path: a circle
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target, path)
                if found:
                    return found
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            found = visit(name, [])
            if found:
                return found
    return None


def test_find_cycle_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.slow
def test_import_graph_reads_function_level_and_relative_imports():
    graph = import_graph()
    assert "tf_mixed.scaling.optimizer" in graph["tf_mixed.training"]
    assert "tf_mixed.tools.auditing" in graph["tf_mixed.callbacks.monitor"]  # in a function
    assert graph["tf_mixed"] == set()


def test_no_import_circle():
    # Fails on the tree branched at a764a7d: policy imports hardware and
    # hardware.report() imports policy. report() leaves the library in
    # house-bench's part of issue 8; this passes once that is merged.
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)
