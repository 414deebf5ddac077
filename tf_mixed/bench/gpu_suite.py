"""``--suite=gpu``: what mixed precision gives on one GPU, in one command."""

# On a host without a GPU it says so and exits 0 at once. On a GPU host it
# measures, within `BUDGET_S` seconds (8 minutes on one H100 is the aim; a
# part that would start after the budget is skipped and says so):
#
# 1. ``--model`` (default ResNet-50, random weights, no download) trained on
#    one synthetic batch repeated, in five variants whose rounds alternate:
#    float32, float32 + XLA, mixed_float16, mixed_float16 + XLA (these two
#    with ``tf_mixed.wrap_optimizer``), and mixed_float16 + XLA with Keras's
#    own ``LossScaleOptimizer`` (what ``compile`` wraps by itself): the last
#    pair is the loss scale's overhead, tf_mixed's against Keras's.
# 2. The gradient all-reduce in float32 and float16 across the GPUs, where
#    there are several (`tf.distribute.MirroredStrategy`); skipped on one.
# 3. On a GPU of compute capability 8.9 or more, whether a float8 model's
#    matrix products were lowered to float8 GEMMs
#    (`tf_mixed.float8.lowering_report`), and the per-layer plan
#    (`tf_mixed.plan`) of a Dense stack of ``float8_width`` with float8
#    among the precisions timed: which layers it puts in float8, half or
#    float32, each measured on this GPU.
#
# It writes results.json, results.md and bench.png to ``--output_dir``.

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

from tf_mixed._internal import measuring, progress
from tf_mixed.bench.config import BenchConfig
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created

BUDGET_S = 450.0
FLOAT8_CAPABILITY = (8, 9)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The work of each part (the defaults fit `BUDGET_S` on one H100)."""

    image_size: int = 224
    batch_size: int = 128
    warmup_steps: int = 10
    rounds: int = 5
    round_steps: int = 10
    allreduce_elements: int = 25_000_000  # about ResNet-50's parameters
    float8_width: int = 4096


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    policy: str
    jit_compile: bool
    optimizer: str  # "tf_mixed" or "keras"


VARIANTS = (
    Variant("float32", "float32", False, "tf_mixed"),
    Variant("float32 XLA", "float32", True, "tf_mixed"),
    Variant("mixed_float16", "mixed_float16", False, "tf_mixed"),
    Variant("mixed_float16 XLA", "mixed_float16", True, "tf_mixed"),
    Variant("mixed_float16 XLA, Keras LSO", "mixed_float16", True, "keras"),
)


def no_gpu_message() -> str:
    return ("tf_mixed bench --suite=gpu: no GPU on this host (TensorFlow sees none), so there "
            "is nothing to measure; run it on a host with an NVIDIA GPU. The other suites run "
            "on a CPU (python -m tf_mixed bench --help).")


def run_gpu(config: BenchConfig, command: str, *, sizes: Sizes = Sizes(),
            clock: Callable[[], float] = time.monotonic) -> int:
    """Runs the GPU suite (see the module docstring).

    Args:
        config: A validated `BenchConfig` with ``suite="gpu"``.
        command: The command line, for the report.
        sizes: The work of each part.
        clock: Seconds, for the budget.

    Returns:
        0 (a part that fails is recorded in the report, not raised).
    """
    from tf_mixed.policy import hardware

    info = hardware.detect()
    if not info.has_gpu:
        print(no_gpu_message(), flush=True)
        return 0
    from tf_mixed.bench import report as report_module

    created = check_output_dir(config.output_dir)
    start = clock()

    def left() -> float:
        return BUDGET_S - (clock() - start)

    gpus = info.gpus
    print(f"GPU suite on {', '.join(g.name for g in gpus)}: {config.model_name}, "
          f"{len(VARIANTS)} variants, rounds alternating; budget {BUDGET_S:.0f} s.", flush=True)
    try:
        results = _train_variants(config, sizes, left)
        allreduce = (_allreduce(sizes) if len(gpus) > 1 and left() > 0 else
                     {"skipped": "one GPU: no all-reduce to measure" if len(gpus) < 2
                      else "time budget spent"})
        capable = [g for g in gpus if tuple(g.compute_capability or ()) >= FLOAT8_CAPABILITY]
        float8 = (_float8_lowering(sizes) if capable and left() > 0 else
                  {"skipped": "no GPU of compute capability 8.9 or more" if not capable
                   else "time budget spent"})
        float8_plan = (_float8_plan(sizes) if capable and left() > 0 else
                       {"skipped": "no GPU of compute capability 8.9 or more" if not capable
                        else "time budget spent"})
        report = report_module.suite_header("gpu", config, command)
        report.update({
            "model": {"name": config.model_name},
            "device": ", ".join(f"{g.name} (cc {'.'.join(map(str, g.compute_capability or ()))})"
                                for g in gpus),
            "sizes": dataclasses.asdict(sizes),
            "results": results,
            "loss_scale_overhead": _overhead(results),
            "allreduce": allreduce,
            "float8_lowering": float8,
            "float8_plan": float8_plan,
            "wall_time_s": clock() - start,
        })
        report["markdown"] = markdown(report)
        paths = report_module.write_outputs(report, config.output_dir)
    except BaseException:
        remove_if_created(config.output_dir, created)
        raise
    report_module.print_written(report["markdown"], paths)
    return 0


def _train_variants(config: BenchConfig, sizes: Sizes, left: Callable[[], float]) -> list[dict]:
    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.bench import models
    from tf_mixed.commands.step_timer import StepTimer
    from tf_mixed.policy import global_policy as policy

    shape = (sizes.image_size, sizes.image_size, 3)
    x = tf.random.stateless_uniform((sizes.batch_size, *shape), (0, 1), maxval=255.0)
    y = tf.random.stateless_uniform((sizes.batch_size,), (0, 2), maxval=10, dtype=tf.int32)
    data = tf.data.Dataset.from_tensors((x, y)).repeat()
    runs: list[dict[str, Any]] = []
    for variant in VARIANTS:
        if left() <= 0:
            runs.append({"name": variant.name, "error": "skipped: time budget spent"})
            continue
        progress.update(f"building and warming up {variant.name} ({len(runs) + 1}/{len(VARIANTS)})")
        try:
            with policy.policy_scope(variant.policy):
                keras.utils.set_random_seed(config.seed)
                model = models.build(config.model_name, shape, 10)
                adam = keras.optimizers.Adam(1e-3)
                optimizer = (
                    tf_mixed.wrap_optimizer(adam) if variant.optimizer == "tf_mixed" else adam)
                model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                              jit_compile=variant.jit_compile)
                timer = StepTimer()
                model.fit(data, epochs=1, steps_per_epoch=sizes.warmup_steps, verbose=0,
                          shuffle=False, callbacks=[timer])
            runs.append({"name": variant.name, "model": model, "timer": timer,
                         "policy": variant.policy, "jit_compile": variant.jit_compile,
                         "optimizer": type(model.optimizer).__module__.split(".")[0] + "."
                         + type(model.optimizer).__name__})
        except Exception as error:  # noqa: BLE001 - a failed variant is a result too
            runs.append({"name": variant.name,
                         "error": f"{type(error).__name__}: {str(error)[:300]}"})
    live = [r for r in runs if "model" in r]
    for index in range(sizes.rounds):
        if left() <= 0:
            break
        progress.update(f"round {index + 1}/{sizes.rounds} of {len(live)} variants")
        by_name = {r["name"]: r for r in live}
        for name in measuring.rotated(list(by_name), index):  # each variant leads in turn
            run = by_name[name]
            run["timer"].times.clear()
            run["model"].fit(data, epochs=1, steps_per_epoch=sizes.round_steps, verbose=0,
                             shuffle=False, callbacks=[run["timer"]])
            run.setdefault("rounds", []).append(
                sizes.batch_size / statistics.median(run["timer"].times))
    results = []
    base = next((r for r in live if r["name"] == "float32" and r.get("rounds")), None)
    for run in runs:
        row = {k: v for k, v in run.items() if k not in ("model", "timer")}
        if run.get("rounds"):
            row["samples_per_sec"] = statistics.median(run["rounds"])
            row["step_time_ms"] = 1000 * sizes.batch_size / row["samples_per_sec"]
            if base is not None:
                row["ratio"] = statistics.median(
                    [r / b for r, b in zip(run["rounds"], base["rounds"])])
        elif "error" not in row:
            row["error"] = "not timed: time budget spent"
        results.append(row)
    return results


def _overhead(results: list[dict]) -> dict[str, Any] | None:
    """tf_mixed's loss-scaling step time over Keras's, both mixed_float16 + XLA."""
    ours = next((r for r in results if r["name"] == "mixed_float16 XLA"), {})
    keras_row = next((r for r in results if r["name"] == "mixed_float16 XLA, Keras LSO"), {})
    if not ours.get("rounds") or not keras_row.get("rounds"):
        return None
    return {"ratio": statistics.median(
        [k / o for o, k in zip(ours["rounds"], keras_row["rounds"])]),
        "meaning": "tf_mixed step time / Keras LossScaleOptimizer step time (per round pair)"}


def _allreduce(sizes: Sizes) -> dict[str, Any]:  # pragma: no cover - several GPUs only
    import tensorflow as tf

    progress.update("all-reduce across the GPUs, float32 and float16")
    strategy = tf.distribute.MirroredStrategy()
    figures: dict[str, Any] = {}
    for dtype in ("float32", "float16"):
        @tf.function
        def reduce(dtype=dtype):
            def replica():
                value = tf.ones((sizes.allreduce_elements,), dtype)
                return tf.distribute.get_replica_context().all_reduce("sum", value)[0]
            return strategy.run(replica)

        reduce()
        times = []
        for _ in range(10):
            begin = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(),
                                  strategy.experimental_local_results(reduce()))
            times.append(time.perf_counter() - begin)
        figures[dtype] = {"ms": 1000 * statistics.median(times),
                          "bytes": sizes.allreduce_elements * (4 if dtype == "float32" else 2)}
    figures["ratio"] = figures["float32"]["ms"] / figures["float16"]["ms"]
    figures["replicas"] = strategy.num_replicas_in_sync
    return figures


def _float8_lowering(sizes: Sizes) -> dict[str, Any]:
    """Quantizes a Dense stack to float8 and reads how XLA lowered its matmuls."""
    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.policy import global_policy as policy

    progress.update("float8: compiling a Dense model with XLA, reading its GEMMs")
    try:
        width = sizes.float8_width
        with policy.policy_scope("mixed_bfloat16"):
            inputs = keras.Input((width,))
            h = keras.layers.Dense(width, name="dense_a")(inputs)
            h = keras.layers.Dense(width, name="dense_b")(h)
            model = keras.Model(inputs, keras.layers.Dense(16, name="out")(h))
            tf_mixed.float8.quantize(model, keep_float32=[])
        x = tf.random.stateless_normal((64, width), (5, 6))
        y = tf.random.stateless_normal((64, 16), (7, 8))
        report = tf_mixed.float8.lowering_report(model, x, y, loss="mse")
        return {"device": report.device, "verdicts": report.verdicts(), "text": str(report)}
    except Exception as error:  # noqa: BLE001 - recorded, the other figures stand
        return {"error": f"{type(error).__name__}: {str(error)[:300]}"}


def _float8_plan(sizes: Sizes) -> dict[str, Any]:
    """`tf_mixed.plan` of a Dense stack, float8 among the precisions (cc >= 8.9)."""
    import keras
    import numpy as np

    import tf_mixed

    progress.update("float8: the per-layer plan of a Dense stack (tf_mixed.plan)")
    try:
        width = sizes.float8_width
        inputs = keras.Input((width,))
        h = keras.layers.Dense(width, name="dense_a")(inputs)
        h = keras.layers.Dense(width, name="dense_b")(h)
        h = keras.layers.Dense(width // 4, name="dense_c")(h)
        model = keras.Model(inputs, keras.layers.Dense(10, name="out")(h), name="dense_stack")
        rng = np.random.default_rng(0)
        x = rng.normal(size=(256, width)).astype("float32")
        y = rng.integers(0, 10, 256)
        plan = tf_mixed.plan(model, x, y, loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        record = plan.to_dict()
        return {"choices": plan.choices, "float8_layers": list(plan.float8_layers),
                "policy": plan.policy, "summary": plan.summary, "layers": record["layers"],
                "text": str(plan)}
    except Exception as error:  # noqa: BLE001 - recorded, the other figures stand
        return {"error": f"{type(error).__name__}: {str(error)[:300]}"}


def markdown(report: dict[str, Any]) -> str:
    """results.md: the variants' table, the loss-scale overhead, all-reduce, float8."""
    lines = [f"# tf_mixed GPU suite: {report['model']['name']} on {report['device']}", "",
             f"Command: `{report['command']}`", "",
             "| variant | samples/s | vs float32 | step ms | optimizer |", "|---|---|---|---|---|"]
    for r in report["results"]:
        if "samples_per_sec" in r:
            lines.append(f"| {r['name']} | {r['samples_per_sec']:,.1f} "
                         f"| {r.get('ratio', 1.0):.2f}x "
                         f"| {r['step_time_ms']:.1f} | {r.get('optimizer', '')} |")
        else:
            lines.append(f"| {r['name']} | {r['error']} | | | |")
    overhead = report["loss_scale_overhead"]
    lines += ["", "Loss-scale overhead (mixed_float16 + XLA, tf_mixed / Keras): "
              + ("not measured" if overhead is None else f"{overhead['ratio']:.3f}x")]
    allreduce = report["allreduce"]
    lines.append("All-reduce: " + (allreduce["skipped"] if "skipped" in allreduce else
                                   f"float16 {allreduce['ratio']:.2f}x faster than float32 "
                                   f"over {allreduce['replicas']} GPUs"))
    float8 = report["float8_lowering"]
    lines.append("Float8 lowering: " + (float8.get("skipped") or float8.get("error")
                                        or f"{float8['device']}: {float8['verdicts']}"))
    plan = report.get("float8_plan") or {}
    if plan:
        lines.append("Per-layer plan with float8 (tf_mixed.plan): " + (
            plan.get("skipped") or plan.get("error")
            or ", ".join(f"{name} {choice}" for name, choice in plan["choices"].items())))
    lines.append(f"Wall time {report['wall_time_s']:.0f} s (budget {BUDGET_S:.0f} s).")
    return "\n".join(lines) + "\n"
