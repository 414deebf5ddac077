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
CLI = PACKAGE / "cli"
ENTRY_POINT = PACKAGE / "__main__.py"
# Library modules that look like a command (``python -m tf_mixed.distribute.launch``)
# and may end with one ``if __name__ == "__main__":`` block that only hands over
# to the command line module named here (issue 27).
HAND_OVERS = {PACKAGE / "distribute" / "launch.py": "tf_mixed.cli.launch"}


def _hand_over(tree: ast.Module, command: str) -> ast.If | None:
    """The final ``__main__`` block of ``tree`` if it only imports ``command`` and exits."""
    last = tree.body[-1] if tree.body else None
    if not (isinstance(last, ast.If) and ast.unparse(last.test) == "__name__ == '__main__'"):
        return None
    module, _, name = command.rpartition(".")
    body = [ast.unparse(node) for node in last.body]
    if (len(body) == 2 and body[0] == f"from {module} import {name} as _launch_command"
            and body[1] == "raise SystemExit(_launch_command.module_entry())"):
        return last
    return None


def _without_hand_over(path: pathlib.Path) -> ast.Module:
    """``path``'s syntax tree, less an allowed hand-over block (`HAND_OVERS`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    command = HAND_OVERS.get(path)
    block = _hand_over(tree, command) if command else None
    if block is not None:
        tree.body.remove(block)
    return tree


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
    tree = _without_hand_over(path)
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


LAYOUT = ROOT / "docs" / "layout.md"
CLIENTS = ("tf_mixed.bench", "tf_mixed.cli")  # clients of the public API
CLIENT_HELPERS = {"tf_mixed._internal.quiet", "tf_mixed._internal.cli_errors",
                  "tf_mixed._internal.progress"}


def _documented_units() -> list[tuple[str, list[str]]]:
    """``(unit, modules)`` per concern in docs/layout.md, lowest first."""
    units, current = [], None
    for line in LAYOUT.read_text().splitlines():
        heading = re.match(r"### (.+)", line)
        if heading:
            paths = re.findall(r"`tf_mixed/([^`]*)`", heading.group(1))
            current = [p.rstrip("/") for p in paths]
            units.append((current, []))
        elif current is not None and line.startswith("- "):
            units[-1][1].extend(re.findall(r"`([\w/]+\.py|\w+/)`", line.split(":")[0]))
    return [(u, mods) for names, mods in units for u in names]


def _unit_of(module: str) -> str:
    """The concern a ``tf_mixed.x.y`` module belongs to: its first part under tf_mixed."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    path = PACKAGE / parts[1]
    return parts[1] if path.is_dir() else parts[1] + ".py"


def _rank() -> dict[str, int]:
    return {unit: i for i, (unit, _) in enumerate(_documented_units())}


def test_layout_lists_every_folder_and_module_on_disk():
    units = dict(_documented_units())
    on_disk = {p.name for p in PACKAGE.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert set(units) == on_disk
    for unit, modules in units.items():
        if not (PACKAGE / unit).is_dir():
            continue
        files = {p.name for p in (PACKAGE / unit).glob("*.py") if p.name != "__init__.py"}
        files |= {p.name + "/" for p in (PACKAGE / unit).iterdir()
                  if p.is_dir() and (p / "__init__.py").exists()}
        listed = set()
        for entry in modules:
            listed.add(entry)
        for sub in [f for f in files if f.endswith("/")]:  # a subfolder lists its own files
            inside = {p.name for p in (PACKAGE / unit / sub).glob("*.py") if p.name != "__init__.py"}
            text = LAYOUT.read_text()
            assert all(f"`{name}`" in text for name in inside), (unit, sub, inside)
        assert files == listed, (unit, files ^ listed)


def test_no_import_runs_upward_and_the_check_can_fail(tmp_path):
    rank = _rank()
    fake = tmp_path / "fake.py"
    fake.write_text("from tf_mixed.callbacks import monitor\n")
    upward = [m for m, _ in _imported_modules(fake, package="tf_mixed.policy")
              if m.startswith("tf_mixed.") and rank[_unit_of(m)] > rank["policy"]]
    assert upward  # policy importing callbacks is caught
    offenders = []
    for path in _py_files(PACKAGE):
        own = _unit_of(_module_name(path))
        if own in ("__init__.py", "__main__.py"):
            continue
        for module, line in _imported_modules(path):
            if not module.startswith("tf_mixed.") or module.split(".")[1] not in {
                    p.name.removesuffix(".py") for p in PACKAGE.iterdir()}:
                continue
            if rank[_unit_of(module)] > rank[own]:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, offenders


def test_every_folder_init_only_hands_names_on():
    offenders = []
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent == PACKAGE:
            continue
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
                continue
            offenders.append(f"{init.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_clients_use_only_public_library_names():
    """bench/ and cli/ reach the library through public names (and two stdlib helpers)."""
    offenders = []
    for client in CLIENTS:
        for path in _py_files(PACKAGE / client.split(".")[1]):
            for module, names, line in _imports(path):
                if not module.startswith("tf_mixed") or module.startswith(CLIENTS):
                    continue
                if module in CLIENT_HELPERS or (module == "tf_mixed._internal" and
                                                {f"{module}.{n}" for n in names} <= CLIENT_HELPERS):
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
    hardware_imports = {m for m, _ in _imported_modules(PACKAGE / "policy" / "hardware.py")}
    assert not {"tf_mixed.policy.global_policy", "tf_mixed"} & hardware_imports, hardware_imports


def _command_line_code(source: str | ast.Module) -> list[str]:
    """What makes a module a command line: a main(), argument parsing, sys.argv, __main__."""
    tree = ast.parse(source) if isinstance(source, str) else source
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
        if BENCH in path.parents or CLI in path.parents or path == ENTRY_POINT:
            continue
        found = _command_line_code(_without_hand_over(path))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, offenders


def test_a_hand_over_is_allowed_only_as_written_and_only_where_listed():
    allowed = ("if __name__ == '__main__':\n    from tf_mixed.cli import launch as _launch_command\n\n"
               "    raise SystemExit(_launch_command.module_entry())\n")
    for path, command in HAND_OVERS.items():
        assert _hand_over(ast.parse(path.read_text()), command) is not None, path
    assert _hand_over(ast.parse(allowed), "tf_mixed.cli.launch") is not None
    more = allowed + "    import sys\n    print(sys.argv)\n"
    assert _hand_over(ast.parse(more), "tf_mixed.cli.launch") is None
    assert _command_line_code(more)


def test_setuptools_ships_every_package():
    """What `pip install .` installs: every directory of tf_mixed with an __init__.py."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    if "packages" in config and isinstance(config["packages"], list):
        shipped = set(config["packages"])
    else:
        find = config["packages"]["find"]
        shipped = set(setuptools.find_packages(where=str(ROOT), include=find["include"]))
    on_disk = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert {"tf_mixed", "tf_mixed.bench", "tf_mixed.cli"} <= on_disk
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
        if BENCH in path.parents or CLI in path.parents:
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
    reached = _library_imports_reachable_from("tf_mixed.scaling.optimizer")
    assert "tf_mixed.scaling.rollback" in reached  # the walk follows imports
    assert not {"tf_mixed.distribute.cluster", "tf_mixed.distribute.keras_fix_20585"} & reached, reached


def test_the_stop_rules_import_neither_keras_nor_tensorflow():
    imported = {m.split(".")[0] for m, _ in _imported_modules(PACKAGE / "callbacks" / "stop_rules.py")}
    assert not {"keras", "tensorflow", "tf_mixed"} & imported, imported


@pytest.mark.slow
@pytest.mark.parametrize("path, name, limit", [
    ("tf_mixed/scaling/optimizer.py", "LossScaleOptimizer", 350),
    ("tf_mixed/callbacks/monitor.py", "LossScaleMonitor", 200),
])
def test_the_main_classes_stay_small(path, name, limit):
    """New jobs go into modules of their own (rollback, loss_tally, stop_rules, ...)."""
    tree = ast.parse((ROOT / path).read_text())
    node, = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert node.end_lineno - node.lineno + 1 <= limit


# tests/ mirrors the package (issue 33 item 4): tests/<concern>/test_<module>[_<topic>].py
# beside tf_mixed/<concern>/<module>.py; multi-process and subprocess tests in
# tests/integration/; helpers in tests/support/; cross-cutting checks at the top.
TESTS = ROOT / "tests"
TEST_FOLDERS_OUTSIDE_THE_PACKAGE = {"integration", "support", "data"}
CROSS_CUTTING_TESTS = {"test_docs.py", "test_layout.py", "test_package.py", "test_tiers.py",
                       "test_zoo.py", "test_real_zoo.py"}


def _misplaced_tests(tests: pathlib.Path, package: pathlib.Path) -> list[str]:
    """Test files under ``tests`` that do not sit beside a module of ``package``."""
    misplaced = []
    for path in sorted(tests.rglob("*.py")):
        relative = path.relative_to(tests)
        top = relative.parts[0]
        if path.name == "conftest.py" and len(relative.parts) == 1:
            continue
        if top == "support":
            if path.name.startswith("test_"):
                misplaced.append(f"{relative}: tests/support/ holds helpers, not tests")
            continue
        if top == "integration":
            if not path.name.startswith(("test_", "_")):
                misplaced.append(f"{relative}: tests/integration/ holds test_*.py and _*.py workers")
            continue
        if top == "data":
            continue
        if not path.name.startswith("test_"):
            misplaced.append(f"{relative}: helpers belong in tests/support/")
            continue
        folder = package.joinpath(*["_internal" if p == "internal" else p
                                    for p in relative.parts[:-1]])
        if len(relative.parts) == 1 and path.name in CROSS_CUTTING_TESTS:
            continue
        stem = path.stem[len("test_"):]
        modules = {m.stem for m in folder.glob("*.py") if m.stem != "__init__"}
        if not any(stem == m or stem.startswith(m + "_") for m in modules):
            misplaced.append(f"{relative}: no module tf_mixed/{folder.relative_to(package)}/"
                             f"{stem.split('_')[0]}*.py beside which it belongs")
    return misplaced


def test_tests_mirror_the_package():
    assert _misplaced_tests(TESTS, PACKAGE) == []


def test_a_test_named_after_no_module_is_found(tmp_path):
    (tmp_path / "scaling").mkdir()
    (tmp_path / "scaling" / "test_loss_scale.py").write_text("")
    (tmp_path / "scaling" / "test_optimizer_mirrored.py").write_text("")
    (tmp_path / "support").mkdir()
    (tmp_path / "support" / "test_helper.py").write_text("")
    (tmp_path / "zoo.py").write_text("")
    assert _misplaced_tests(tmp_path, PACKAGE) == [
        "scaling/test_loss_scale.py: no module tf_mixed/scaling/loss*.py beside which it belongs",
        "support/test_helper.py: tests/support/ holds helpers, not tests",
        "zoo.py: helpers belong in tests/support/",
    ]
