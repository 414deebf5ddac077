"""The package itself: flat lazy namespace, no shadowing, no import circle."""

import ast
import importlib
import pathlib
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
    "AuditReport", "ConversionNote", "Enabled", "Finding", "Float32Loss",
    "Float32Output", "LossScaleFailure", "LossScaleMonitor",
    "LossScaleOptimizer", "MixedPrecisionWarning", "OutputActivation",
    "POLICY_NAMES", "audit", "convert", "disable", "enable", "float32_loss",
    "policy_scope", "wrap_optimizer",
)


# --------------------------------------------------------------- namespace


def test_every_name_in_all_is_importable():
    for name in tf_mixed.__all__:
        value = getattr(tf_mixed, name)
        module_name = tf_mixed._EXPORTS.get(name)
        if name == "__version__":
            assert isinstance(value, str)
        elif name == module_name:
            assert isinstance(value, types.ModuleType)
            assert value.__name__ == f"tf_mixed.{name}"
        else:  # the very object its module defines
            module = importlib.import_module(f"tf_mixed.{module_name}")
            assert value is getattr(module, name)


def test_no_public_name_missing_from_all():
    assert set(FLAT_NAMES) <= set(tf_mixed.__all__)
    assert set(tf_mixed._EXPORTS) | {"__version__"} == set(tf_mixed.__all__)
    assert sorted(dir(tf_mixed)) == sorted(tf_mixed.__all__)
    assert len(tf_mixed.__all__) == len(set(tf_mixed.__all__))
    # The __all__ of every module lending flat names is exported, but for
    # these, deliberately left in their module.
    in_module_only = {
        "auditing": {"LayerRow", "MemoryEstimate"},
        "probe_report": {"DTYPE_LIMITS", "LayerStats", "VariableStats"},
        "scale_state": {"initial_state", "next_state", "validate_knob"},
        "callbacks": {"model_setup_problems"},
        "compensated": {"METHODS", "STATE_DTYPES", "compensate_if_asked",
                        "compensation_buffers", "compensation_config", "compensation_of",
                        "config_from_arguments", "kahan_add", "stochastic_round"},
    }
    lending = {m for n, m in tf_mixed._EXPORTS.items() if n != m}
    for module_name in lending:
        module = importlib.import_module(f"tf_mixed.{module_name}")
        missing = set(getattr(module, "__all__", ())) - set(tf_mixed.__all__)
        assert missing <= in_module_only.get(module_name, set()), module_name


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
    # tf_mixed.audit is the function; its module is tf_mixed.auditing.
    from tf_mixed import auditing, conversion

    assert tf_mixed.audit is auditing.audit
    assert tf_mixed.convert is conversion.convert
    for name, module_name in tf_mixed._EXPORTS.items():
        if name != module_name:
            assert not (PACKAGE_DIR / f"{name}.py").exists(), name
            assert not (PACKAGE_DIR / name).is_dir(), name
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tf_mixed.audit")


def test_import_does_not_load_tensorflow():
    code = textwrap.dedent("""
        import sys
        import tf_mixed
        import tf_mixed.bench.cli  # the command line sets TF's log level first
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
        assert tf_mixed.callbacks.LossScaleMonitor is LossScaleMonitor
        print("ok")
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=300, cwd=SOURCE_ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(SOURCE_ROOT),
             "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


# --------------------------------------------------------------- import graph


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        getattr(test, "id", None) == "TYPE_CHECKING"
        or getattr(test, "attr", None) == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement, at any depth, except `if TYPE_CHECKING:` ones."""
    for node in ast.iter_child_nodes(tree):
        if _is_type_checking(node):
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


def test_import_graph_reads_function_level_and_relative_imports():
    graph = import_graph()
    assert "tf_mixed.loss_scale" in graph["tf_mixed.training"]
    assert "tf_mixed.auditing" in graph["tf_mixed.callbacks"]  # in a function
    assert graph["tf_mixed"] == set()


def test_no_import_circle():
    # Fails on the tree branched at a764a7d: policy imports hardware and
    # hardware.report() imports policy. report() leaves the library in
    # house-bench's part of issue 8; this passes once that is merged.
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)
