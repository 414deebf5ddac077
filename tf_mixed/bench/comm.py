"""``--suite=comm``: the gradient all-reduce in float32, float16 and bfloat16."""

#     python -m tf_mixed bench --suite=comm --batch_size=8 --rounds=3 --steps=5
#
# Two (``--workers``) local worker processes join a MultiWorkerMirroredStrategy
# over 127.0.0.1 and train a wide Dense stack (about 22 million float32
# parameters) on a small synthetic batch, so that a step is dominated by the
# gradient exchange. Four paths train the same model from the same weights on
# the same data, in alternating timing rounds inside the same two processes
# (so load on the machine hits them alike):
#
# * ``keras``: a plain ``keras.optimizers.SGD`` (Keras's own float32 all-reduce);
# * ``float32``, ``float16``, ``bfloat16``: ``tf_mixed.LossScaleOptimizer`` with
#   the loss scale pinned at 1 (no loss scaling: a float32 run that only wants
#   a cheaper all-reduce) and that ``communication_dtype``.
#
# Per path: median step time over the rounds, bytes each worker puts into the
# gradient all-reduce per step (from the gradient sizes and the wire dtype, and
# cross-checked against the collective ops of the traced step), collectives per
# traced step (the gradient all-reduce plus the loss-reporting reduce), the
# final loss. Worker 0 writes them; this process writes results.json and
# results.md into ``--output_dir`` and prints the table.
#
# The workers are started like tests/integration/test_multi_worker.py starts its own (one
# ``python -m tf_mixed.bench.comm`` per worker with its ``TF_CONFIG``; every wait
# bounded, no process left behind).

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from tf_mixed._internal import measuring
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created

PATHS = ("keras", "float32", "float16", "bfloat16")
INPUT_DIM = 512
WIDTH = 2048
DEPTH = 6
CLASSES = 10
DEFAULT_STEPS = 5
WORKER_TIMEOUT_S = 1800


def run_comm(config, command: str) -> dict[str, Any]:
    """Runs the suite: starts the workers, writes the files, prints the table.

    Args:
        config: A validated ``bench.BenchConfig`` with ``suite="comm"``
            (uses ``workers``, ``batch_size``, ``steps``, ``rounds``,
            ``warmup_steps``, ``learning_rate``, ``seed``, ``output_dir``).
        command: The command line, for the report.

    Returns:
        The report written to results.json.

    Raises:
        UsageError: for an output directory that cannot be written (the flags
            this suite cannot honour are refused by ``BenchConfig.validate``).
        RuntimeError: if a worker failed or did not finish in time.
    """
    from tf_mixed.bench import report as bench_report

    created = check_output_dir(config.output_dir)
    settings = {
        "workers": config.workers,
        "batch_size": config.batch_size,
        "steps": config.steps or DEFAULT_STEPS,
        "rounds": config.timing_rounds,
        "warmup_steps": max(1, config.warmup_steps),
        "learning_rate": config.learning_rate,
        "seed": config.seed,
        "width": WIDTH,
        "depth": DEPTH,
    }
    print(f"Comm suite: {config.workers} local workers over 127.0.0.1, Dense "
          f"{INPUT_DIM}->{WIDTH}x{DEPTH}->{CLASSES}, global batch "
          f"{config.batch_size}, {settings['rounds']} rounds x "
          f"{settings['steps']} steps per path ({', '.join(PATHS)}).",
          flush=True)
    try:
        worker = _run_workers(settings, config.output_dir)
        rows = _rows(worker)
        markdown = _markdown(rows, worker)
        report = {
            **bench_report.suite_header("comm", config, command),
            "model": {"name": f"dense_{settings['width']}x{settings['depth']}",
                      "params": worker["params"]},
            "settings": settings,
            "results": rows,
            "markdown": markdown,
        }
        paths = bench_report.write_outputs(report, config.output_dir,
                                           plot=False)
    except BaseException:
        remove_if_created(config.output_dir, created)
        raise
    bench_report.print_written(markdown, paths)
    return report


def _rows(worker: dict[str, Any]) -> list[dict[str, Any]]:
    base = statistics.median(worker["paths"]["keras"]["round_step_s"])
    rows = []
    for name in PATHS:
        path = worker["paths"][name]
        step = statistics.median(path["round_step_s"])
        rows.append({
            "path": name,
            "communication_dtype": None if name in ("keras", "float32") else name,
            "step_s": step,
            "round_step_s": path["round_step_s"],
            "step_time_vs_keras": step / base,
            "bytes_per_step": path["bytes_computed"],
            "bytes_per_step_traced": path["bytes_traced"],
            "bytes_vs_float32": path["bytes_computed"]
            / worker["paths"]["keras"]["bytes_computed"],
            "collectives_per_step": path["collectives"],
            "gradient_collectives_per_step": path["gradient_collectives"],
            "final_loss": path["final_loss"],
            "skipped_steps": path["skipped_steps"],
        })
    return rows


def _markdown(rows, worker) -> str:
    lines = [
        f"Dense stack, {worker['params']:,} float32 parameters; "
        f"{worker['workers']} workers on 127.0.0.1 (loopback).",
        "",
        "| path | wire dtype | step (s) | vs keras | MB per step | vs float32 "
        "| collectives (gradient) | final loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        wire = r["communication_dtype"] or "float32"
        lines.append(
            f"| {r['path']} | {wire} | {r['step_s']:.3f} | "
            f"{r['step_time_vs_keras']:.2f}x | {r['bytes_per_step'] / 1e6:.1f} | "
            f"{r['bytes_vs_float32']:.2f}x | {r['collectives_per_step']} "
            f"({r['gradient_collectives_per_step']}) | {r['final_loss']:.6f} |")
    lines += ["", "MB per step: what each worker puts into the gradient "
              "all-reduce (computed from gradient sizes and wire dtype; equal "
              "to the traced collectives' input sizes, checked). Collectives: "
              "per traced step, the gradient all-reduce plus the "
              "loss-reporting reduce."]
    return "\n".join(lines)


# ------------------------------------------------------------ the launcher


def _run_workers(settings: dict[str, Any], output_dir: str) -> dict[str, Any]:
    """Starts the workers (`tf_mixed.distribute.run_local_workers`); returns worker 0's record."""
    from tf_mixed.distribute import workers as launch

    staging = tempfile.mkdtemp(prefix=".tf_mixed_comm.", dir=output_dir)
    try:
        settings_path = os.path.join(staging, "settings.json")
        with open(settings_path, "w") as f:
            json.dump(settings, f)
        out = os.path.join(staging, "worker0.json")
        ports = launch.free_ports(settings["workers"])
        joined = ",".join(str(p) for p in ports)
        try:
            launch.run_local_workers(
                settings["workers"],
                lambda i: [sys.executable, "-m", "tf_mixed.bench.comm", str(i),
                           joined, settings_path, out if i == 0 else ""],
                ports=ports, timeout=WORKER_TIMEOUT_S)
        except launch.WorkersFailed as error:
            raise RuntimeError(f"comm suite: {error}") from None
        with open(out) as f:
            return json.load(f)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# --------------------------------------------------------------- a worker


def _worker(index: int, ports: list[int], settings_path: str, out: str) -> None:
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.scaling import allreduce
    from tf_mixed.training import make_train_step

    with open(settings_path) as f:
        settings = json.load(f)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = len(ports)
    local_batch = settings["batch_size"] // workers

    # Synthetic classification: a fixed random projection labels the inputs;
    # each worker draws its own shard from its own seed.
    rng = np.random.default_rng(settings["seed"] + 1000 * index)
    x = rng.standard_normal((local_batch, INPUT_DIM)).astype("float32")
    projection = np.random.default_rng(settings["seed"]).standard_normal(
        (INPUT_DIM, CLASSES))
    y = np.argmax(x @ projection, axis=1).astype("int32")
    x_dist = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(x))
    y_dist = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(y))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def build(name):
        keras.utils.set_random_seed(settings["seed"])
        with strategy.scope():
            layers = [keras.Input((INPUT_DIM,))]
            layers += [keras.layers.Dense(settings["width"], activation="relu")
                       for _ in range(settings["depth"])]
            layers += [keras.layers.Dense(CLASSES)]
            model = keras.Sequential(layers)
            sgd = keras.optimizers.SGD(settings["learning_rate"])
            if name == "keras":
                optimizer = sgd
            else:
                optimizer = tf_mixed.LossScaleOptimizer(
                    sgd, initial_scale=1.0, min_scale=1.0, max_scale=1.0,
                    communication_dtype=name)
            optimizer.build(model.trainable_variables)
        step = make_train_step(model, loss_fn, optimizer, strategy=strategy)
        concrete = step.get_concrete_function(x_dist, y_dist)
        shapes = [(v.shape, v.dtype) for v in model.trainable_variables]
        wire = None if name == "keras" else name
        return {
            "model": model, "optimizer": optimizer, "step": step,
            "bytes_computed": allreduce.wire_bytes(shapes, wire),
            **_traced_collectives(concrete),
        }

    paths = {name: build(name) for name in PATHS}
    for _ in range(settings["warmup_steps"]):
        for name in PATHS:
            paths[name]["step"](x_dist, y_dist)
    def round_step_s(name: str) -> float:
        """Seconds per step of one round of ``name``'s steps."""
        start = time.perf_counter()
        for _ in range(settings["steps"]):
            result = paths[name]["step"](x_dist, y_dist)
        paths[name]["loss"] = float(result["loss"])
        return (time.perf_counter() - start) / settings["steps"]

    # Rotated rounds (the same order on every worker): load hits every path alike.
    times = measuring.interleaved_rounds(
        {name: functools.partial(round_step_s, name) for name in PATHS}, settings["rounds"])
    report: dict[str, Any] = {"workers": workers,
              "params": int(paths["keras"]["model"].count_params()),
              "paths": {}}
    for name in PATHS:
        path = paths[name]
        if path["bytes_traced"] != path["bytes_computed"]:
            raise RuntimeError(
                f"comm suite, path {name}: the traced gradient all-reduce "
                f"sends {path['bytes_traced']} bytes, the gradient sizes say "
                f"{path['bytes_computed']}")
        skipped = getattr(path["optimizer"], "skipped_steps", None)
        report["paths"][name] = {
            "round_step_s": times[name],
            "bytes_computed": path["bytes_computed"],
            "bytes_traced": path["bytes_traced"],
            "collectives": path["collectives"],
            "gradient_collectives": path["gradient_collectives"],
            "final_loss": path["loss"],
            "skipped_steps": int(skipped.numpy()) if skipped is not None else 0,
        }
    if out:
        with open(out + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(out + ".tmp", out)


def _traced_collectives(concrete) -> dict[str, int]:
    """Collectives in a traced step, and the bytes the big one sends.

    The gradient all-reduce is told apart from the loss-reporting reduce by
    size: every collective whose input has more than one element.
    """
    import tensorflow as tf

    graphs = [concrete.graph]
    graphs += [f.graph for f in getattr(concrete.graph, "_functions", {}).values()
               if hasattr(f, "graph")]
    count, gradient, sent = 0, 0, 0
    for graph in graphs:
        for op in graph.get_operations():
            if not op.type.startswith("Collective"):
                continue
            count += 1
            size = op.inputs[0].shape.num_elements()
            if size is None or size > 1:
                gradient += 1
                sent += (size or 0) * tf.as_dtype(op.inputs[0].dtype).size
    return {"collectives": count, "gradient_collectives": gradient,
            "bytes_traced": sent}


def main(argv: list[str]) -> int:
    """Worker entry point: ``INDEX PORT0,PORT1,... SETTINGS.json OUT.json``."""
    if len(argv) != 4:
        print("usage: python -m tf_mixed.bench.comm INDEX PORTS SETTINGS OUT "
              "(started by `python -m tf_mixed bench --suite=comm`)",
              file=sys.stderr)
        return 2
    _worker(int(argv[0]), [int(p) for p in argv[1].split(",")], argv[2],
            argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
