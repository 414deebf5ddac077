"""Every ```python block in README.md and docs/ runs as written.

A block that starts with its own imports (an ``import`` before any other
statement) runs alone; every other block starts from the shared prelude of
docs/prelude.md. Pages are found by globbing, so a new page under docs/ is
picked up without editing this file.

The fast tier checks every block's syntax and the rules above (no ``...``
standing for an argument, no indented fragment); the slow tier runs each
page's blocks in a fresh process (one process per page, a fresh namespace
and a reset dtype policy per block), in a temporary directory, each block
from a script file of its own (AutoGraph converts only code whose source it
can read), and fails on a TensorFlow or Keras alarm in the output
(`alarms.alarms`: AutoGraph giving up, retracing, a deprecation raised by
tf_mixed or the block).
"""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRELUDE_PAGE = ROOT / "docs" / "prelude.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def pages() -> list[pathlib.Path]:
    """README.md and every Markdown page under docs/ holding a python block."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if _BLOCK.search(p.read_text())]


def blocks(page: pathlib.Path) -> list[tuple[int, str]]:
    """``(line, code)`` of every ```python block of ``page``."""
    text = page.read_text()
    return [(text[:m.start()].count("\n") + 2, m.group(1)) for m in _BLOCK.finditer(text)]


def stands_alone(code: str) -> bool:
    """Whether a block starts with its own imports (then it runs without the prelude)."""
    body = ast.parse(code).body
    return bool(body) and isinstance(body[0], (ast.Import, ast.ImportFrom))


def _name(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


ALL_BLOCKS = [(page, line, code) for page in pages() for line, code in blocks(page)]


@pytest.mark.slow
@pytest.mark.parametrize("page,line,code", ALL_BLOCKS,
                         ids=[f"{_name(p)}:{n}" for p, n, _ in ALL_BLOCKS])
def test_every_block_is_complete_python(page, line, code):
    assert not code.startswith((" ", "\t")), f"{_name(page)}:{line} is an indented fragment"
    tree = ast.parse(code, filename=f"{_name(page)}:{line}")
    placeholders = [node.lineno for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and node.value is Ellipsis]
    assert not placeholders, (
        f"{_name(page)}:{line}: `...` stands for a value (lines {placeholders})")


def test_the_prelude_is_one_block_that_stands_alone():
    (only,) = blocks(PRELUDE_PAGE)
    assert stands_alone(only[1])


def test_markdown_tables_are_not_split_by_a_blank_line():
    # README's "Read next" table was split in two by a blank line.
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines = page.read_text().splitlines()
        for i in range(2, len(lines)):
            assert not (lines[i].startswith("|") and not lines[i - 1].strip()
                        and lines[i - 2].startswith("|")), f"{_name(page)}:{i + 1}"


# Runs in a fresh interpreter: the blocks of one page, each in its own
# namespace (with the prelude's names unless it stands alone), the dtype
# policy reset in between.
_RUNNER = r'''
import ast, json, sys, traceback
prelude, blocks = json.loads(sys.stdin.read())
import keras, tf_mixed
def run(path, namespace):
    with open(path) as file:
        exec(compile(file.read(), path, "exec"), namespace)
for name, path in blocks:
    with open(path) as file:
        body = ast.parse(file.read()).body
    alone = bool(body) and isinstance(body[0], (ast.Import, ast.ImportFrom))
    namespace = {"__name__": "__main__"}
    try:
        if not alone:
            run(prelude, namespace)
        run(path, namespace)
    except BaseException:
        traceback.print_exc()
        print("SNIPPET FAILED: " + name, file=sys.stderr)
        sys.exit(1)
    finally:
        try:
            tf_mixed.disable()
        except Exception:
            pass
        keras.config.set_dtype_policy("float32")
        keras.backend.clear_session()
    print("ran " + name, flush=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("page", pages(), ids=_name)
def test_every_block_of_the_page_runs(page, tmp_path):
    import json

    import alarms

    scripts = tmp_path / "blocks"
    scripts.mkdir()
    (prelude,) = [code for _, code in blocks(PRELUDE_PAGE)]
    (scripts / "prelude.py").write_text(prelude)
    named = []
    for line, code in blocks(page):
        path = scripts / f"{page.stem.replace('-', '_')}_line_{line}.py"
        path.write_text(code)
        named.append((f"{_name(page)}:{line}", str(path)))
    payload = json.dumps([str(scripts / "prelude.py"), named])
    done = subprocess.run([sys.executable, "-c", _RUNNER], input=payload, capture_output=True,
                          text=True, cwd=tmp_path, timeout=900,
                          env={**__import__("os").environ, **alarms.WARNINGS_ENV,
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("ran ") == len(blocks(page))
    assert alarms.alarms(done.stdout + done.stderr, [ROOT / "tf_mixed", scripts]) == []
