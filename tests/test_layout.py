"""The package's shape: the bench is a client of the library, never the reverse.

Static checks over the source (AST, pyproject.toml). That ``import tf_mixed``
loads no TensorFlow is tests/test_package.py's.
"""

import ast
import pathlib
import re
import sys
import tomllib

import pytest
import setuptools

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tf_mixed"
BENCH = PACKAGE / "bench"
ENTRY_POINT = PACKAGE / "__main__.py"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(path: pathlib.Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(path: pathlib.Path, package: str | None = None) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` for every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = package if package is not None else _package_of(path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            found.append((module, [a.name for a in node.names], node.lineno))
    return found


def _imported_modules(path, package=None):
    """Every module an import statement in ``path`` can load (``from a import b`` may load a.b)."""
    for module, names, line in _imports(path, package):
        yield module, line
        for name in names:
            yield f"{module}.{name}", line


def _py_files(directory):
    return sorted(p for p in directory.rglob("*.py"))


def test_walker_sees_imports_of_the_bench(tmp_path):
    """The check below can fail: each form of import is caught."""
    for source in ("import tf_mixed.bench.cli", "from tf_mixed.bench import run",
                   "from tf_mixed import bench", "from .bench import config"):
        fake = tmp_path / "probe.py"  # as if it were tf_mixed/probe.py
        fake.write_text(source + "\n")
        assert any(m == "tf_mixed.bench" or m.startswith("tf_mixed.bench.")
                   for m, _ in _imported_modules(fake, package="tf_mixed")), source


def test_nothing_outside_the_bench_imports_it():
    offenders = []
    for path in _py_files(PACKAGE):
        if BENCH in path.parents or path == ENTRY_POINT:
            continue
        for module, line in _imported_modules(path):
            if module == "tf_mixed.bench" or module.startswith("tf_mixed.bench."):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, offenders


def test_the_bench_uses_only_public_library_names():
    offenders = []
    for path in _py_files(BENCH):
        for module, names, line in _imports(path):
            if not module.startswith("tf_mixed") or module.startswith("tf_mixed.bench"):
                continue
            private = [p for p in module.split(".") + names
                       if p.startswith("_") and not p.startswith("__")]
            if private:
                offenders.append(f"{path.relative_to(ROOT)}:{line} {module} {names}")
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # tf_mixed.x._y as an attribute
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and "tf_mixed" in ast.unparse(node.value).split(".")[:1]):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, offenders


def test_policy_and_hardware_do_not_import_each_other():
    hardware_imports = {m for m, _ in _imported_modules(PACKAGE / "hardware.py")}
    assert not {"tf_mixed.policy", "tf_mixed"} & hardware_imports, hardware_imports


def _command_line_code(source: str) -> list[str]:
    """What makes a module a command line: a main(), argument parsing, sys.argv, __main__."""
    tree = ast.parse(source)
    found = [f"def {n.name}" for n in ast.walk(tree)
             if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == "main"]
    found += [m for m, _ in _imported_modules_of(tree) if m in ("absl.flags", "argparse")]
    found += ["sys.argv" for n in ast.walk(tree)
              if isinstance(n, ast.Attribute) and ast.unparse(n) == "sys.argv"]
    found += ["__main__" for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and n.value == "__main__"]
    return found


def _imported_modules_of(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, node.lineno
            yield from ((f"{node.module}.{a.name}", node.lineno) for a in node.names)


def test_the_command_line_check_can_fail():
    for source in ("def main():\n    pass", "import argparse", "from absl import flags",
                   "import sys\nx = sys.argv", "if __name__ == '__main__':\n    pass"):
        assert _command_line_code(source), source


def test_the_library_holds_no_command_line_code():
    offenders = {}
    for path in _py_files(PACKAGE):
        if BENCH in path.parents or path == ENTRY_POINT:
            continue
        found = _command_line_code(path.read_text())
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, offenders


def test_setuptools_ships_every_package():
    """What `pip install .` installs: every directory of tf_mixed with an __init__.py."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    if "packages" in config and isinstance(config["packages"], list):
        shipped = set(config["packages"])
    else:
        find = config["packages"]["find"]
        shipped = set(setuptools.find_packages(where=str(ROOT), include=find["include"]))
    on_disk = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert {"tf_mixed", "tf_mixed.bench"} <= on_disk
    assert shipped == on_disk


def test_every_third_party_import_of_the_library_is_declared():
    """`pip install .` must bring what the library imports (bench and tests aside)."""
    import importlib.metadata

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # An extra declares what an optional feature imports (matplotlib for plots).
    requirements = project["dependencies"] + [
        r for extra in project.get("optional-dependencies", {}).values() for r in extra]
    declared = {re.split(r"[ ;\[<>=!~]", d, maxsplit=1)[0].lower().replace("_", "-")
                for d in requirements}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for path in _py_files(PACKAGE):
        if BENCH in path.parents:
            continue
        for module, _, line in _imports(path):
            top = module.split(".")[0]
            if not top or top == "tf_mixed" or top in sys.stdlib_module_names:
                continue
            names = {d.lower().replace("_", "-") for d in distributions.get(top, [top])}
            if not names & declared:
                undeclared[f"{path.relative_to(ROOT)}:{line}"] = top
    assert not undeclared, sorted(set(undeclared.values()))


def _library_imports_reachable_from(module: str) -> set[str]:
    """Every tf_mixed module ``module`` imports, directly or through others."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = ROOT / (name.replace(".", "/") + ".py")
        if name in seen or not path.exists():
            continue
        seen.add(name)
        todo += [m for m, _ in _imported_modules(path) if m.startswith("tf_mixed.")]
    return seen - {module}


def test_the_optimizer_does_not_reach_the_fit_workaround():
    reached = _library_imports_reachable_from("tf_mixed.loss_scale")
    assert "tf_mixed.rollback" in reached  # the walk follows imports
    assert not {"tf_mixed.distribute", "tf_mixed._keras_fix_20585"} & reached, reached


def test_the_stop_rules_import_neither_keras_nor_tensorflow():
    imported = {m.split(".")[0] for m, _ in _imported_modules(PACKAGE / "stop_rules.py")}
    assert not {"keras", "tensorflow", "tf_mixed"} & imported, imported


@pytest.mark.parametrize("path, name, limit", [
    ("tf_mixed/loss_scale.py", "LossScaleOptimizer", 350),
    ("tf_mixed/callbacks.py", "LossScaleMonitor", 200),
])
def test_the_main_classes_stay_small(path, name, limit):
    """New jobs go into modules of their own (rollback, loss_tally, stop_rules, ...)."""
    tree = ast.parse((ROOT / path).read_text())
    node, = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert node.end_lineno - node.lineno + 1 <= limit
