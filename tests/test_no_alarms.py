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


# ------------------------------------------------ the documented paths, in fresh processes
#
# Each runs from a script file (AutoGraph converts only code whose source it
# reads: `python -c` hides exactly this alarm) in a fresh process with Python
# showing every DeprecationWarning, and its output is read by
# `alarms.alarms`. The README's and docs' blocks run the same way in
# tests/test_doc_snippets.py. Small-default flags keep each example short.

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import alarms  # noqa: E402

EXAMPLES = {
    "auto_agreement.py": ["--runs=1"],
    "auto_probe_time.py": [],
    "cpu_float16_remapping.py": ["--samples=256", "--slow_samples=32", "--width=32",
                                 "--batch_size=32"],
    "cpu_matmul_dtypes.py": ["--size=128", "--repeats=2"],
    "custom_loop.py": ["--steps=6", "--overflow_at=3"],
    "first_step_trace.py": [],
    "fit_callback.py": ["--epochs=1", "--logdir={tmp}/logs"],
    "mirrored_custom_loop.py": ["--steps=6", "--overflow_at=3"],
    "model_check_cost.py": ["--model=dense", "--image_size=8", "--train_size=512",
                            "--epochs=2", "--steps_after=2"],
    "multi_worker.py": ["--steps=4", "--overflow_at=2"],
    "multi_worker_fit.py": ["--epochs=1", "--steps=2", "--overflow_at=1"],
    "save_bench_model.py": ["--out={tmp}/model.keras"],
}
_FIRST_ENABLE = "import tf_mixed\n\ntf_mixed.enable()\n"


def test_every_example_is_swept():
    assert sorted(EXAMPLES) == sorted(p.name for p in (ROOT / "examples").glob("*.py"))


def _run(argv, tmp_path, **env) -> str:
    environment = {**os.environ, **alarms.WARNINGS_ENV, "PYTHONPATH": str(ROOT), **env}
    environment.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user runs it
    environment.pop("TF_MIXED_AUTO_MEASURE", None)  # measured, as on a first enable()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          cwd=tmp_path, env=environment, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return output


PATHS = [f"examples/{name}" for name in EXAMPLES] + ["first_enable", "fit_and_make_train_step"]


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS)
def test_documented_paths_print_no_alarm(path, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()  # empty: the first enable() on this host measures
    if path == "first_enable":
        script = tmp_path / "first_enable.py"
        script.write_text(_FIRST_ENABLE)
        argv = [str(script)]
    elif path == "fit_and_make_train_step":
        script = ROOT / "tests" / "integration" / "_alarm_paths.py"
        argv = [str(script), "mixed_float16"]
    else:
        script = ROOT / path
        argv = [str(script), *(a.format(tmp=tmp_path) for a in EXAMPLES[script.name])]
    output = _run(argv, tmp_path, TF_MIXED_CACHE_DIR=str(cache))
    assert alarms.alarms(output, [ROOT / "tf_mixed", script]) == []


def test_the_alarm_reader_finds_each_kind_and_only_ours(tmp_path):
    ours = ROOT / "tf_mixed" / "scaling" / "scale_state.py"
    theirs = "/usr/lib/python3/site-packages/keras/src/backend/tensorflow/core.py"
    output = "\n".join([
        "WARNING:tensorflow:AutoGraph could not transform <function next_state> and will run it",
        "WARNING:tensorflow:5 out of the last 5 calls to <function step> triggered tf.function "
        "retracing. Tracing is expensive",
        f"WARNING:tensorflow:From {ours}:12: experimental_run_functions_eagerly (from "
        "tensorflow.python.eager.polymorphic_function) is deprecated and will be removed",
        f"{ours}:30: DeprecationWarning: tf_mixed.old is deprecated",
        f"{ours}:31: UserWarning: Argument `x` is deprecated. Use `y` instead.",
        "WARNING:absl:The `save_format` argument is deprecated in Keras 3.",
        f"{theirs}:172: DeprecationWarning: __array__ implementation doesn't accept a copy",
        f"{ours}:32: UserWarning: a warning about something else",
        f"WARNING:tensorflow:From {theirs}:9: x (from tensorflow) is deprecated and will be "
        "removed",
    ])
    found = alarms.alarms(output, [ROOT / "tf_mixed"])
    assert [line[:40] for line in found] == [line[:40] for line in output.splitlines()[:6]]
