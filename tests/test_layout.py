"""The package's shape: the bench is a client of the library, never the reverse.

Static checks over the source (AST, pyproject.toml). That ``import tf_mixed``
loads no TensorFlow is tests/test_package.py's.
"""

import ast
import pathlib
import re
import sys

import pytest
import setuptools
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tf_mixed"
BENCH = PACKAGE / "bench"
CLI = PACKAGE / "cli"
COMMANDS = PACKAGE / "commands"  # what cli/ and bench/ share, below both
DISPATCHER = CLI / "main.py"  # the one module of cli/ that imports bench/
ENTRY_POINT = PACKAGE / "__main__.py"


def _is_pointer(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` that only prints where a command went and exits 2.

    The one shape of command-line code the library may hold: a module that
    used to be a command (``python -m tf_mixed.distribute.launch``) says, for
    one release, which command replaced it; it imports nothing and reads no
    argument.
    """
    if not (isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"):
        return False
    body = [ast.unparse(n) for n in node.body]
    return (len(body) == 2 and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Call)
            and ast.unparse(node.body[0].value.func) == "print"
            and all(isinstance(a, ast.Constant) for a in node.body[0].value.args)
            and [ast.unparse(k) for k in node.body[0].value.keywords] == ["file=sys.stderr"]
            and body[1] == "raise SystemExit(2)")


def _without_pointer(path: pathlib.Path | str) -> ast.Module:
    """The syntax tree of ``path`` (or of source text), less a final `_is_pointer` block."""
    tree = ast.parse(path.read_text() if isinstance(path, pathlib.Path) else path)
    if tree.body and _is_pointer(tree.body[-1]):
        tree.body.pop()
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
    tree = _without_pointer(path)
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


def _is_client(path: pathlib.Path) -> bool:
    """Whether ``path`` is in commands/, bench/ or cli/: the command line and what it runs."""
    return any(folder in path.parents for folder in (COMMANDS, BENCH, CLI))


LAYOUT = ROOT / "docs" / "layout.md"
CLIENTS = ("tf_mixed.commands", "tf_mixed.bench", "tf_mixed.cli")  # clients of the public API
# facts: the TensorFlow-free tables (policy names and aliases, export formats and
# precisions) the command line checks its flags against before TensorFlow loads.
CLIENT_HELPERS = {"tf_mixed._internal.quiet", "tf_mixed._internal.cli_errors",
                  "tf_mixed._internal.progress", "tf_mixed._internal.facts",
                  "tf_mixed._internal.measuring"}


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
            inside = {p.name for p in (PACKAGE / unit / sub).glob("*.py")
                      if p.name != "__init__.py"}
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
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and [
                    ast.unparse(t)
                    for t in getattr(node, "targets", [getattr(node, "target", None)])
            ] == ["__all__"]:
                continue
            if (isinstance(node, ast.Assign)
                    and [ast.unparse(t) for t in node.targets] == ["__getattr__"]
                    and ast.unparse(node.value.func) == "_moved.face_getattr"):
                continue  # the names it handed on before, for one release
            offenders.append(f"{init.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_clients_use_only_public_library_names():
    """commands/, bench/ and cli/ reach the library through public names (and `CLIENT_HELPERS`)."""
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


@pytest.mark.slow
def test_the_library_holds_no_command_line_code():
    offenders = {}
    for path in _py_files(PACKAGE):
        if _is_client(path) or path == ENTRY_POINT:
            continue
        found = _command_line_code(_without_pointer(path))
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, offenders


def test_only_a_pointer_to_a_command_is_allowed():
    pointer = ('if __name__ == "__main__":\n'
               '    print("python -m x moved: run python -m tf_mixed x",'
               ' file=sys.stderr)\n    raise SystemExit(2)\n')
    assert _is_pointer(ast.parse(pointer).body[0])
    assert not _command_line_code(_without_pointer(pointer))
    for more in (pointer + "    import sys\n",
                 pointer.replace('"python -m x moved: run python -m tf_mixed x"', "sys.argv"),
                 pointer.replace("raise SystemExit(2)", "from tf_mixed.cli import launch")):
        assert not _is_pointer(ast.parse(more).body[0]), more
        assert _command_line_code(more)


def test_the_library_does_not_import_the_command_line():
    """The circle cli/launch.py <-> distribute/launch.py went with the old spelling (issue 33)."""
    offenders = [f"{path.relative_to(ROOT)}:{line} imports {module}"
                 for path in _py_files(PACKAGE)
                 if not _is_client(path) and path != ENTRY_POINT
                 for module, line in _imported_modules_of(ast.parse(path.read_text()))
                 if module.startswith(CLIENTS)]
    assert not offenders, offenders


def _bench_imports(path: pathlib.Path, package: str | None = None) -> list[str]:
    """Where ``path`` imports the bench (``tf_mixed.bench`` or a module of it)."""
    return [f"{path.name}:{line} imports {module}"
            for module, line in _imported_modules(path, package)
            if module == "tf_mixed.bench" or module.startswith("tf_mixed.bench.")]


def test_the_bench_import_check_can_fail(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from tf_mixed.bench import report\n"
                    "from tf_mixed import bench\nfrom tf_mixed.commands import data\n")
    assert sorted(set(_bench_imports(fake, package="tf_mixed.cli"))) == [
        "fake.py:2 imports tf_mixed.bench", "fake.py:2 imports tf_mixed.bench.report",
        "fake.py:3 imports tf_mixed.bench"]


def test_only_the_dispatcher_imports_the_bench():
    """bench/ is a leaf: the command line's dispatcher reaches it, nothing else (issue 43).

    What a command shares with the bench (data sets, names, the output
    directory) is in commands/, below both.
    """
    offenders = [found for path in _py_files(PACKAGE)
                 if BENCH not in path.parents and path != DISPATCHER
                 for found in _bench_imports(path)]
    assert not offenders, offenders
    assert _bench_imports(DISPATCHER)  # the dispatcher does reach it


def test_what_the_commands_share_sits_below_the_bench_and_the_command_line():
    rank = _rank()
    assert rank["commands"] < rank["bench"] < rank["cli"], rank


MEASURING = PACKAGE / "_internal" / "measuring.py"  # the primitives of measuring (issue 43)
_QUANTILE_NAME = re.compile(r"quartile|quantile|percentile", re.IGNORECASE)


def _measuring_code(source: str) -> dict[str, list[str]]:
    """What only measuring.py may hold: quantile functions and reads of the load average.

    ``quantiles``: a function defined with quartile, quantile or percentile
    in its name, or a call of ``statistics.quantiles`` (a median is
    ``statistics.median``'s); ``load``: any ``getloadavg`` or ``/proc/loadavg``.
    """
    tree = ast.parse(source)
    quantiles = [f"def {n.name}" for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef) and _QUANTILE_NAME.search(n.name)]
    quantiles += [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and ast.unparse(n.func).endswith("statistics.quantiles")]
    load = [ast.unparse(n) for n in ast.walk(tree)
            if (isinstance(n, ast.Attribute) and n.attr == "getloadavg")
            or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                and "/proc/loadavg" in n.value)]
    load += [f"import {a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             for a in n.names if a.name == "getloadavg"]
    return {kind: found for kind, found in (("quantiles", quantiles), ("load", load)) if found}


def test_the_measuring_check_can_fail():
    assert _measuring_code(
        "import os, statistics\n"
        "def _percentile(v, q):\n    return sorted(v)[int(q * len(v))]\n"
        "def iqr(v):\n    return statistics.quantiles(v, n=4)\n"
        "load = os.getloadavg()[0]\n"
        "text = open('/proc/loadavg').read()\n") == {
        "quantiles": ["def _percentile", "statistics.quantiles"],
        "load": ["os.getloadavg", "'/proc/loadavg'"]}
    assert _measuring_code("from os import getloadavg\n") == {"load": ["import getloadavg"]}
    assert _measuring_code("import statistics\nm = statistics.median([1.0])\n") == {}


def test_one_quantile_function_and_one_read_of_the_load():
    """measuring.py holds the package's one quantile function and its one read of the load."""
    offenders = {str(path.relative_to(ROOT)): found for path in _py_files(PACKAGE)
                 if path != MEASURING
                 for found in [_measuring_code(path.read_text())] if found}
    assert not offenders, offenders
    assert _measuring_code(MEASURING.read_text()) == {
        "quantiles": ["def quantile", "def quartiles"], "load": ["os.getloadavg"]}


def _fixed_order_rounds(source: str) -> list[str]:
    """Loops over rounds that run their candidates in one fixed order.

    A ``for`` over ``range(...rounds...)`` whose body loops over anything but
    a ``range`` (the steps of one candidate) or ``measuring.rotated`` (each
    candidate leading in turn): the candidate that always runs first carries
    the load of the round's start alone.
    """
    found = []
    for outer in ast.walk(ast.parse(source)):
        if not (isinstance(outer, ast.For) and isinstance(outer.iter, ast.Call)
                and ast.unparse(outer.iter.func) == "range"
                and "round" in ast.unparse(outer.iter).lower()):
            continue
        for inner in (n for stmt in outer.body for n in ast.walk(stmt)):
            if isinstance(inner, ast.For) and not (
                    isinstance(inner.iter, ast.Call)
                    and ast.unparse(inner.iter.func).rpartition(".")[2] in ("range", "rotated")):
                found.append(f"{inner.lineno}: for {ast.unparse(inner.target)} in "
                             f"{ast.unparse(inner.iter)}")
    return found


def test_the_round_order_check_can_fail():
    assert _fixed_order_rounds(
        "for _ in range(rounds):\n    for name, step in steps.items():\n        step()\n"
        "for i in range(args.rounds):\n    for name in measuring.rotated(names, i):\n"
        "        for _ in range(steps):\n            run(name)\n") == [
        "2: for (name, step) in steps.items()"]


def test_the_round_order_check_finds_the_plans_fixed_order_loops():
    """The plan's two loops as they were before issue 43 (layer_timing.py, step_check.py)."""
    layer_loop = ("for r in range(max(rounds, 1)):\n"
                  "    progress.update(f'plan: round {r + 1}/{rounds}')\n"
                  "    for layer in timed:\n"
                  "        for precision in precisions:\n"
                  "            figures[layer.name, precision].append(time_steps(layer))\n"
                  "        cast_figures[layer.name].append(time_steps(casts[layer.name]))\n"
                  "    if r + 1 >= min_rounds and clock() - start >= budget_s:\n"
                  "        break\n")
    step_loop = ("for r in range(rounds):\n"
                 "    for name, step in steps.items():\n"
                 "        figures[name].append(autotune.time_steps(step, batch, 1))\n")
    assert _fixed_order_rounds(layer_loop) == ["3: for layer in timed",
                                               "4: for precision in precisions"]
    assert _fixed_order_rounds(step_loop) == ["2: for (name, step) in steps.items()"]


def test_rounds_take_their_order_from_measuring():
    """Every loop over rounds interleaves its candidates as measuring.py does (issue 43)."""
    offenders = {str(path.relative_to(ROOT)): found for path in _py_files(PACKAGE)
                 for found in [_fixed_order_rounds(path.read_text())] if found}
    assert not offenders, offenders


# Who measures speed: `auto`, the model check, the plan, doctor --measure and the suites
# that time (bf16_quality and heal_sweep count accuracy and skips, no time).
MEASURING_USERS = ("policy/autotune.py", "policy/model_check.py", "tools/planning/planner.py",
                   "tools/planning/step_check.py", "cli/doctor.py", "bench/compare.py",
                   "bench/schedule.py", "bench/report.py", "bench/matmul.py",
                   "bench/overhead.py", "bench/comm.py", "bench/memory_suite.py",
                   "bench/gpu_suite.py", "bench/heal_suite.py", "bench/rollback_cost.py",
                   "bench/litert_latency.py")


@pytest.mark.parametrize("name", MEASURING_USERS)
def test_who_measures_uses_the_primitives_of_measuring(name):
    imported = {m for m, _ in _imported_modules(PACKAGE / name)}
    assert "tf_mixed._internal.measuring" in imported, name


def test_setuptools_ships_every_package():
    """What `pip install .` installs: every directory of tf_mixed with an __init__.py."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    if "packages" in config and isinstance(config["packages"], list):
        shipped = set(config["packages"])
    else:
        find = config["packages"]["find"]
        shipped = set(setuptools.find_packages(where=str(ROOT), include=find["include"]))
    on_disk = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert {"tf_mixed", *CLIENTS} <= on_disk
    assert shipped == on_disk


@pytest.mark.slow
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
        if _is_client(path):
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
    assert not ({"tf_mixed.distribute.cluster", "tf_mixed.distribute.keras_fix_20585"}
                & reached), reached


def test_the_stop_rules_import_neither_keras_nor_tensorflow():
    imported = {m.split(".")[0]
                for m, _ in _imported_modules(PACKAGE / "callbacks" / "stop_rules.py")}
    assert not {"keras", "tensorflow", "tf_mixed"} & imported, imported


@pytest.mark.slow
@pytest.mark.parametrize("path, name, limit", [
    # 430 after issue 33 moved get_config/from_config onto it; back to 350 once a step's
    # riders went into one record (issue 43, tf_mixed/scaling/step_state.py).
    ("tf_mixed/scaling/optimizer.py", "LossScaleOptimizer", 350),
    ("tf_mixed/callbacks/monitor.py", "LossScaleMonitor", 200),
])
def test_the_main_classes_stay_small(path, name, limit):
    """New jobs go into modules of their own (rollback, loss_tally, stop_rules, ...)."""
    tree = ast.parse((ROOT / path).read_text())
    node, = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert node.end_lineno - node.lineno + 1 <= limit


# ------------------------------------------------ one owner of a step's state (issue 43)

SCALING = PACKAGE / "scaling"
# Objects whose private names a scaling module may read: itself, its class,
# modules imported under a private alias (``_internals``), a NamedTuple's API.
_OWN = ("self", "cls")
_NAMED_TUPLE_API = {"_replace", "_fields", "_asdict", "_make"}


def _private_reads(path: pathlib.Path) -> list[str]:
    """``x._name`` reads in ``path`` of another object ``x`` (not self, not a module alias)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__") and node.attr not in _NAMED_TUPLE_API):
            owner = ast.unparse(node.value)
            if owner in _OWN or owner.startswith("_"):
                continue
            found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}"
                         f":{node.lineno} {ast.unparse(node)}")
    return found


def test_the_private_read_check_can_fail(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("a = optimizer._scratch.tally\nb = self._x\nc = _internals._y\n"
                    "d = state._replace(x=1)\ne = optimizer._variables\n")
    assert sorted(_private_reads(fake)) == ["fake.py:1 optimizer._scratch",
                                            "fake.py:5 optimizer._variables"]


def test_scaling_modules_read_no_other_objects_private_names():
    """The optimizer's record is handed on as an argument (``optimizer.step_state`` or a
    parameter); Keras's private attributes are read only in tf_mixed/_internal/shims.py."""
    offenders = [found for path in _py_files(SCALING) if path.name != "optimizer.py"
                 for found in _private_reads(path)]
    assert not offenders, offenders


def test_only_the_optimizer_module_names_its_record_attribute():
    """``_step_state`` (and the bag it replaced, ``_scratch``) appear in optimizer.py alone."""
    offenders = [f"{path.relative_to(ROOT)}:{node.lineno}"
                 for path in _py_files(PACKAGE) if path != SCALING / "optimizer.py"
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Attribute) and node.attr in ("_step_state", "_scratch")]
    assert not offenders, offenders
    assert "_scratch" not in (SCALING / "optimizer.py").read_text()


_WEAK_REGISTRIES = {"WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}


def _module_registries(path: pathlib.Path) -> list[str]:
    """Module-level names bound to a weak registry (a table keyed by live objects)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if (isinstance(value, ast.Call)
                and ast.unparse(value.func).rpartition(".")[2] in _WEAK_REGISTRIES):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_registry_check_can_fail(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("import weakref\n_A = weakref.WeakKeyDictionary()\n"
                    "_B: 'weakref.WeakSet' = weakref.WeakSet()\n"
                    "def f():\n    c = weakref.WeakSet()\n")
    assert _module_registries(fake) == ["fake.py:2", "fake.py:3"]


def test_no_module_level_registry_keyed_by_an_object():
    """State lives with its owner: an optimizer's in its record, what a user's inner optimizer
    shares with its wrappers on it (``shims.rider``). policy/state.py alone keeps the hidden
    per-layer policy state (one module owns it, one function resets it)."""
    offenders = [found for path in _py_files(PACKAGE)
                 if path != PACKAGE / "policy" / "state.py"
                 for found in _module_registries(path)]
    assert not offenders, offenders


def test_saving_names_no_part_of_the_step_state():
    """formats.py iterates the record's saving parts (`StepState.saved_parts`): it imports
    none of the riders' modules."""
    riders = {"tf_mixed.scaling." + m for m in
              ("attribution", "spike", "write_guard", "rollback", "loss_tally", "float8_sync",
               "misuse")}
    imported = {m for m, _ in _imported_modules(SCALING / "formats.py")}
    assert not riders & imported, riders & imported


def test_every_pipeline_stage_takes_the_step_state():
    tree = ast.parse((SCALING / "pipeline.py").read_text())
    stages = {node.name: [a.arg for a in node.args.args] for node in tree.body
              if isinstance(node, ast.FunctionDef)
              and node.name in ("step", "advance_state", "roll_back", "finish_float8")}
    assert len(stages) == 4 and all("state" in args for args in stages.values()), stages


def _faces() -> set[str]:
    return {_module_name(p) for p in PACKAGE.rglob("__init__.py")}


def _is_module(dotted: str) -> bool:
    base = ROOT / dotted.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _through_a_face(path: pathlib.Path) -> list[str]:
    """Imports of a non-module name from a folder's face, and ``tf_mixed.<face>.<name>`` uses.

    commands/, bench/ and cli/ are clients of the public API: the names a face hands on
    are theirs to use.
    """
    faces = _faces() - {"tf_mixed"}
    if _is_client(path):
        return []
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in faces:
            names = [a.name for a in node.names if not _is_module(f"{node.module}.{a.name}")]
            if names:
                found.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {names}")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            dotted = ast.unparse(node)
            owner = dotted.rpartition(".")[0]
            if owner in faces and not _is_module(dotted):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {dotted}")
    return found


def test_the_face_check_finds_imports_through_a_face(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("from tf_mixed.scaling import LossTally, optimizer\n"
                    "from tf_mixed.scaling.loss_tally import LossTally\n"
                    "import tf_mixed\nx = tf_mixed.float8.quantize\n"
                    "y = tf_mixed.float8.reading.state\n")
    fake_in_package = PACKAGE / "_fake_face_check.py"
    fake_in_package.write_text(fake.read_text())
    try:
        found = _through_a_face(fake_in_package)
    finally:
        fake_in_package.unlink()
    assert found == ["tf_mixed/_fake_face_check.py:1 from tf_mixed.scaling import ['LossTally']",
                     "tf_mixed/_fake_face_check.py:4 tf_mixed.float8.quantize"]


def test_library_code_imports_modules_by_path_never_through_a_face():
    """A face hands names on to users; inside the package a module names the module it needs."""
    offenders = [found for path in _py_files(PACKAGE) if path.name != "__init__.py"
                 for found in _through_a_face(path)]
    assert not offenders, offenders


# tests/ mirrors the package (issue 33 item 4): tests/<concern>/test_<module>[_<topic>].py
# beside tf_mixed/<concern>/<module>.py; multi-process and subprocess tests in
# tests/integration/; helpers in tests/support/; cross-cutting checks at the top.
TESTS = ROOT / "tests"
TEST_FOLDERS_OUTSIDE_THE_PACKAGE = {"integration", "support", "data"}
CROSS_CUTTING_TESTS = {"test_docs.py", "test_layout.py", "test_package.py", "test_tiers.py",
                       "test_zoo.py", "test_real_zoo.py", "test_adapted_zoo.py",
                       "test_hub_zoo.py", "test_doc_snippets.py", "test_no_alarms.py"}


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
                misplaced.append(
                    f"{relative}: tests/integration/ holds test_*.py and _*.py workers")
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


def _long_module_docstrings(paths) -> list[str]:
    long = []
    for path in paths:
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        if docstring is None or len(docstring.splitlines()) > 5:
            long.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}: "
                        f"{'none' if docstring is None else len(docstring.splitlines())}")
    return long


def test_the_docstring_check_can_fail(tmp_path):
    (tmp_path / "long.py").write_text('"""One.\n\nTwo.\nThree.\nFour.\nFive.\n"""\n')
    (tmp_path / "short.py").write_text('"""One.\n\nTwo.\nThree.\n"""\n')
    (tmp_path / "none.py").write_text("x = 1\n")
    assert _long_module_docstrings(sorted(tmp_path.glob("*.py"))) == ["long.py: 6", "none.py: none"]


def test_every_module_opens_with_its_job_in_at_most_five_lines():
    """Keras and optax: one line; the reasons stay as comments where the code is (issue 33)."""
    assert _long_module_docstrings(_py_files(PACKAGE)) == []
