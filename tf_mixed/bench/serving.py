"""What the main job's mixed run leaves to serve: LiteRT files, sizes and parity."""

# `measure(model, sample)` exports the trained model with `tf_mixed.export` as
# a float32 LiteRT file and as one with float16 weights (both float32 compute,
# run in the builtin LiteRT interpreter), each checked on `sample` against the
# model in memory, and returns the JSON-ready figures that go into
# results.json (``results[i]["serving"]``) and the table under the main one.
# The files are written to a temporary directory and removed.

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import tf_mixed

PRECISIONS = ("float32", "float16_weights")


def measure(model, sample) -> dict[str, Any]:
    """Exports `model` to LiteRT in each of `PRECISIONS` and checks it on `sample`.

    Args:
        model: The trained Keras model.
        sample: One batch of its inputs.

    Returns:
        ``{precision: {"bytes", "max_abs_error", "max_rel_error", "tolerance",
        "worst_output"}}``, or ``{precision: {"error": message}}`` for an
        export that failed (a diverged model, say): the bench reports it and
        goes on.
    """
    directory = tempfile.mkdtemp(prefix="tf_mixed_serving_")
    figures: dict[str, Any] = {}
    try:
        for precision in PRECISIONS:
            path = os.path.join(directory, f"{precision}.tflite")
            try:
                report = tf_mixed.export(model, path, format="litert", precision=precision,
                                         sample=sample)
            except (ValueError, TypeError) as error:
                figures[precision] = {"error": str(error).splitlines()[0][:300]}
                continue
            figures[precision] = {
                "bytes": report.bytes,
                "max_abs_error": report.max_abs_error,
                "max_rel_error": report.max_rel_error,
                "tolerance": report.tolerance,
                "worst_output": report.worst_output,
            }
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return figures


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per run that has serving figures; "" when none has. A plan equal to a
    whole-model policy (``same_as``) is that policy's run: not listed twice."""
    rows = [r for r in results if r.get("serving") and not r.get("same_as")]
    if not rows:
        return ""
    header = ("| policy | LiteRT float32 KB | float16 weights KB | size ratio "
              "| max rel error float32 | max rel error float16 weights |")
    title = ("Serving the trained model (LiteRT, builtin interpreter, checked on one "
             "validation batch against the trained model):")
    lines = [title, "", header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        full, half = (r["serving"].get(p, {}) for p in PRECISIONS)

        def size(f):
            return f"{f['bytes'] / 1024:,.1f}" if "bytes" in f else "failed"

        def error(f):
            return f"{f['max_rel_error']:.2e}" if "bytes" in f else f.get("error", "-")

        ratio = (f"{half['bytes'] / full['bytes']:.2f}x"
                 if "bytes" in full and "bytes" in half else "n/a")
        lines.append(f"| {r['policy']} | {size(full)} | {size(half)} | {ratio} "
                     f"| {error(full)} | {error(half)} |")
    return "\n".join(lines)
