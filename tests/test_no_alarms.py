"""tf_mixed's code prints no TensorFlow or Keras alarm (issue 45).

Fast: the package holds no annotation AutoGraph refuses (below). Slow: every
documented path runs in a fresh process from a script file and prints no
alarm (`test_documented_paths_print_no_alarm`).


An annotated assignment inside a branch or loop of a function (``x: Any = ...``
under an ``if``), or a bare annotation (``x: int``) anywhere in a function,
makes AutoGraph give up on the whole function with "AutoGraph could not
transform ... Please report this to the TensorFlow team" whenever a
``tf.function`` calls it (a custom loop calling tf_mixed's step). An annotated
assignment with a value directly in the function's body converts.
"""

import ast

import pytest
import tensorflow as tf
from repo_paths import ROOT

_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith,
             ast.Match)


def unconvertible_annotations(source: str) -> list[int]:
    """Lines of annotations in functions that AutoGraph cannot convert."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for statement in function.body:
            if isinstance(statement, ast.AnnAssign) and statement.value is None:
                found.append(statement.lineno)
            if isinstance(statement, _COMPOUND):
                found += [node.lineno for node in ast.walk(statement)
                          if isinstance(node, ast.AnnAssign)]
    return sorted(set(found))


def test_no_function_of_the_package_holds_an_annotation_autograph_refuses():
    found = {str(path.relative_to(ROOT)): lines
             for path in sorted((ROOT / "tf_mixed").rglob("*.py"))
             if (lines := unconvertible_annotations(path.read_text()))}
    assert not found, (
        f"annotated assignments AutoGraph cannot convert: {found}; "
        "annotate once directly in the function body, before the branch")


_REFUSED = '''
def f(x):
    if x > 0:
        y: int = 1
    else:
        y = 2
    return y
'''
_CONVERTED = '''
def f(x):
    y: int = 2
    if x > 0:
        y = 1
    return y
'''


@pytest.mark.parametrize("source,lines", [(_REFUSED, [4]), (_CONVERTED, [])])
def test_the_rule_matches_what_autograph_does(source, lines, tmp_path):
    assert unconvertible_annotations(source) == lines
    # AutoGraph reads a function's source: write it to a file and import it.
    path = tmp_path / "annotated_module.py"
    path.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)
    if lines:
        with pytest.raises(Exception, match="can't be nonlocal"):
            tf.autograph.to_graph(namespace["f"])
    else:
        tf.autograph.to_graph(namespace["f"])
