"""``--suite=memory``: peak memory and speed of one training step per precision."""

#     python -m tf_mixed bench --suite=memory --batch_size=64 --steps=20 --rounds=3
#
# Every path trains the same wide Dense stack (``INPUT_DIM -> WIDTH x DEPTH ->
# CLASSES``, about 10.5 million parameters, so that the weights, gradients and
# optimizer state dominate) with Adam on the same generated batch of
# ``--batch_size`` examples per update, in a fresh process each (peak resident
# memory is per process), ``--rounds`` times, the paths interleaved so that
# changes of machine load hit them alike:
#
# * ``float32``, ``mixed_bfloat16``: ``tf_mixed.wrap_optimizer(Adam)``;
# * ``bfloat16 ...``: the pure policy (``tf_mixed.enable("bfloat16")``) with
#   the update rule named (`tf_mixed.scaling.compensated`) and Adam's state in the
#   dtype named;
# * ``... accumN``: the same update made of N micro-batches of
#   ``batch_size / N`` (``gradient_accumulation_steps=N``), when tf_mixed has
#   gradient accumulation.
#
# Per path: bytes per parameter of weights, gradients, optimizer state and
# extra buffers (`tf_mixed.tools.memory_report`), the peak resident memory of the
# process over the timed steps (Linux VmHWM, reset after warm-up, so it holds
# the state plus what one step allocates; and TensorFlow's own allocator
# peak, which counts tensors and variables only), and applied updates per second
# (median over rounds). Nothing here is asserted: it is measured.

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from tf_mixed._internal import measuring
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created

INPUT_DIM = 1024
WIDTH = 2048
DEPTH = 3
CLASSES = 10
DEFAULT_STEPS = 20
ACCUMULATION = 4
CHILD_TIMEOUT_S = 1800

# name -> (policy, compensation, state_dtype, accumulation steps)
PATHS: dict[str, tuple[str, str | None, str | None, int]] = {
    "float32": ("float32", None, None, 1),
    "mixed_bfloat16": ("mixed_bfloat16", None, None, 1),
    "bfloat16 kahan, float32 state": ("bfloat16", "kahan", "float32", 1),
    "bfloat16 kahan, bfloat16 state": ("bfloat16", "kahan", "bfloat16", 1),
    "bfloat16 stochastic, bfloat16 state": ("bfloat16", "stochastic", "bfloat16", 1),
    f"float32 accum{ACCUMULATION}": ("float32", None, None, ACCUMULATION),
    f"bfloat16 stochastic, bfloat16 state, accum{ACCUMULATION}": (
        "bfloat16", "stochastic", "bfloat16", ACCUMULATION),
}


def available_paths() -> list[str]:
    """The paths this tf_mixed can run (accumulation ones need the feature)."""
    import inspect

    import tf_mixed

    accumulates = "gradient_accumulation_steps" in inspect.signature(
        tf_mixed.LossScaleOptimizer).parameters
    return [name for name, spec in PATHS.items() if spec[3] == 1 or accumulates]


def selected_paths(policies: tuple[str, ...], batch_size: int,
                   available: list[str] | None = None) -> list[str]:
    """The paths ``--policies`` and ``--batch_size`` select, or the flag they cannot use.

    Reads names and numbers only (no TensorFlow): the command line calls it
    before TensorFlow loads, with every path of `PATHS`; `run_memory` again
    with `available_paths`.

    Args:
        policies: ``--policies`` as given (empty: every path); names of
            `tf_mixed.policy.POLICY_NAMES`, aliases included.
        batch_size: ``--batch_size``: split into `ACCUMULATION` micro-batches
            where an accumulating path is selected.
        available: The paths to choose from; None for all of `PATHS`.

    Returns:
        The selected paths, in `PATHS` order.

    Raises:
        UsageError: For a name that is no policy, a list no path uses, or a
            batch that does not split.
    """
    from tf_mixed._internal.cli_errors import UsageError
    from tf_mixed._internal.facts import POLICY_ALIASES, POLICY_NAMES

    paths = list(PATHS) if available is None else list(available)
    if policies:
        wanted = set()
        for name in policies:
            key = name.strip().lower()
            if key not in POLICY_ALIASES:
                raise UsageError("policies", name, "unknown policy", ", ".join(POLICY_NAMES))
            wanted.add(POLICY_ALIASES[key])
        paths = [p for p in paths if PATHS[p][0] in wanted]
        if not paths:
            raise UsageError("policies", ",".join(policies),
                             "no path of the memory suite uses it",
                             ", ".join(dict.fromkeys(spec[0] for spec in PATHS.values())))
    if any(PATHS[p][3] > 1 for p in paths) and batch_size % ACCUMULATION:
        raise UsageError("batch_size", batch_size,
                         f"must split into {ACCUMULATION} micro-batches",
                         f"a multiple of {ACCUMULATION}")
    return paths


def run_memory(config, command: str) -> dict[str, Any]:
    """Runs the suite: one fresh process per path and round; files; table.

    Args:
        config: A validated ``BenchConfig`` with ``suite="memory"`` (uses
            ``policies`` as a filter, ``batch_size``, ``steps``, ``rounds``,
            ``warmup_steps``, ``learning_rate``, ``seed``, ``output_dir``).
        command: The command line, for the report.

    Returns:
        The report written to results.json.

    Raises:
        UsageError: for flags this suite cannot honour, before any work.
        RuntimeError: if a path's process failed.
    """
    from tf_mixed.bench import report as bench_report

    paths = selected_paths(config.policies, config.batch_size, available_paths())
    created = check_output_dir(config.output_dir)
    settings = {
        "batch_size": config.batch_size,
        "steps": config.steps or DEFAULT_STEPS,
        "warmup_steps": max(1, config.warmup_steps),
        "learning_rate": config.learning_rate,
        "seed": config.seed,
    }
    print(f"Memory suite: Dense {INPUT_DIM}->{WIDTH}x{DEPTH}->{CLASSES}, "
          f"batch {config.batch_size} per update, {config.timing_rounds} rounds x "
          f"{settings['steps']} updates per path, a fresh process each.",
          flush=True)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in paths}
    try:
        staging = tempfile.mkdtemp(prefix=".tf_mixed_memory.", dir=config.output_dir)
        try:
            for round_index in range(config.timing_rounds):
                for path in measuring.rotated(paths, round_index):
                    runs[path].append(_run_child(path, settings, staging))
                    print(f"  round {round_index + 1}: {path} done", flush=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        rows = _rows(runs)
        markdown = _markdown(rows, runs[paths[0]][0]["parameters"], settings)
        report = {
            **bench_report.suite_header("memory", config, command),
            "model": {"name": f"dense_{WIDTH}x{DEPTH}",
                      "params": runs[paths[0]][0]["parameters"]},
            "settings": settings,
            "results": rows,
            "markdown": markdown,
        }
        written = bench_report.write_outputs(report, config.output_dir, plot=False)
    except BaseException:
        remove_if_created(config.output_dir, created)
        raise
    bench_report.print_written(markdown, written)
    return report


def _run_child(path: str, settings: dict[str, Any], staging: str) -> dict[str, Any]:
    out = os.path.join(staging, "path.json")
    argv = [sys.executable, "-m", "tf_mixed.bench.memory_suite", path,
            json.dumps(settings), out]
    result = subprocess.run(argv, capture_output=True, text=True,
                            timeout=CHILD_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"memory suite: path {path!r} failed "
                           f"(exit {result.returncode}):\n{result.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def _rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    base_peak = None
    for path, results in runs.items():
        policy, compensation, state_dtype, accumulation = PATHS[path]
        peak = statistics.median(r["peak_tensor_mb"] for r in results)
        base_peak = peak if base_peak is None else base_peak
        rows.append({
            "path": path,
            "policy": policy,
            "compensation": compensation,
            "state_dtype": state_dtype or ("bfloat16" if policy == "bfloat16" else "float32"),
            "accumulation_steps": accumulation,
            "bytes_per_parameter": results[0]["bytes_per_parameter"],
            "peak_tensor_mb": peak,
            "round_peak_tensor_mb": [r["peak_tensor_mb"] for r in results],
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in results),
            "peak_vs_first": peak / base_peak,
            "updates_per_sec": statistics.median(r["updates_per_sec"] for r in results),
            "round_updates_per_sec": [r["updates_per_sec"] for r in results],
            "final_loss": results[-1]["final_loss"],
        })
        rows[-1]["samples_per_sec"] = rows[-1]["updates_per_sec"] * results[0]["batch_size"]
    return rows


def _markdown(rows, params, settings) -> str:
    lines = [
        f"Dense stack, {params:,} parameters, Adam, {settings['batch_size']} "
        "examples per update.",
        "",
        "| path | weights | grads | state | extra | total B/param | peak tensor MB "
        "| vs first | peak RSS MB | updates/s | samples/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = r["bytes_per_parameter"]
        extra = b["compensation"] + b["accumulation"]
        lines.append(
            f"| {r['path']} | {b['weights']:.0f} | {b['gradients']:.0f} | "
            f"{b['optimizer_state']:.2f} | {extra:.0f} | {b['total']:.2f} | "
            f"{r['peak_tensor_mb']:,.0f} | {r['peak_vs_first']:.2f}x | "
            f"{r['peak_rss_mb']:,.0f} | "
            f"{r['updates_per_sec']:.2f} | {r['samples_per_sec']:.0f} |")
    lines += ["", "B/param: bytes per parameter from tf_mixed.tools.memory_report "
              "(extra: Kahan buffers and accumulation buffers). Peak tensor MB: "
              "TensorFlow's CPU allocator peak during the timed steps "
              "(tf.config.experimental.get_memory_info: variables and every "
              "tensor a step allocates), median over rounds. Peak RSS MB: the "
              "process's peak resident memory over the same steps (VmHWM); it "
              "includes TensorFlow's runtime and memory the C allocator keeps "
              "after freeing it."]
    return "\n".join(lines)


# ------------------------------------------------------------ one path


def _child(path: str, settings: dict[str, Any], out: str) -> None:
    """Trains one path and writes its figures to ``out`` (JSON)."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.bench import peak_memory

    policy, compensation, state_dtype, accumulation = PATHS[path]
    tf_mixed.enable(policy, quiet=True)
    keras.utils.set_random_seed(settings["seed"])
    model = keras.Sequential(
        [keras.Input((INPUT_DIM,))]
        + [keras.layers.Dense(WIDTH, activation="relu") for _ in range(DEPTH)]
        + [keras.layers.Dense(CLASSES)])
    inner = keras.optimizers.Adam(settings["learning_rate"])
    if compensation is not None:
        tf_mixed.scaling.compensate(inner, compensation, state_dtype=state_dtype,
                            seed=settings["seed"])
    knobs: dict[str, Any] = (
        {"gradient_accumulation_steps": accumulation} if accumulation > 1 else {})
    optimizer = tf_mixed.wrap_optimizer(inner, **knobs)
    optimizer.build(model.trainable_variables)
    micro = settings["batch_size"] // accumulation
    rng = np.random.default_rng(settings["seed"])
    x = tf.constant(rng.normal(size=(micro, INPUT_DIM)).astype(np.float32))
    y = tf.constant(rng.integers(0, CLASSES, size=(micro,)))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def micro_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    def update():
        for _ in range(accumulation):
            loss = micro_step()
        return loss

    for _ in range(settings["warmup_steps"]):
        update()
    peak_memory.reset()
    tf.config.experimental.reset_memory_stats("CPU:0")
    start = time.perf_counter()
    for _ in range(settings["steps"]):
        loss = update()
    final_loss = float(loss)
    elapsed = time.perf_counter() - start
    report = tf_mixed.tools.memory_report(model, optimizer)
    result = {
        "path": path,
        "parameters": report.parameters,
        "bytes_per_parameter": report.per_parameter(),
        "peak_rss_mb": peak_memory.peak_rss_mb(),
        "peak_tensor_mb": tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20,
        "updates_per_sec": settings["steps"] / elapsed,
        "batch_size": settings["batch_size"],
        "final_loss": final_loss,
    }
    with open(out, "w") as f:
        json.dump(result, f)


def main(argv: list[str]) -> int:
    """``python -m tf_mixed.bench.memory_suite PATH SETTINGS_JSON OUT``."""
    from tf_mixed._internal import quiet

    quiet.import_tensorflow(False)
    path, settings, out = argv
    _child(path, json.loads(settings), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
