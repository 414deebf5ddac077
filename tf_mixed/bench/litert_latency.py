"""``python -m tf_mixed litert-latency``: float32 vs float16-weight LiteRT files."""

# Builds one of the bench's models under ``--policy`` (seeded weights), exports
# it with `tf_mixed.export` as a float32 LiteRT file and as one with float16
# weights (both checked against the model on one batch), and times one
# ``invoke`` of each in ai_edge_litert's builtin interpreter: ``--rounds``
# rounds, alternating the two files, of ``--iterations`` invocations each; the
# figure is the median over rounds of each round's median. Prints a Markdown
# table with the load average (the machine may be shared) and writes
# ``latency.json`` to ``--output_dir``. A benchmark, not a test: the tests
# run it with a fake clock.

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from tf_mixed._internal import measuring, quiet
from tf_mixed._internal.cli_errors import below_minimum
from tf_mixed.commands.one_line_parser import OneLineParser
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created

__all__ = ["main", "measure"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m tf_mixed litert-latency",
        description="Size, parity and latency of float32 vs float16-weight LiteRT files.")
    parser.add_argument("--model", default="cnn", choices=("mlp", "cnn", "resnet18", "resnet50"))
    parser.add_argument("--policy", default="mixed_bfloat16",
                        choices=("float32", "mixed_bfloat16", "mixed_float16"))
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_dir", default="tf_mixed_litert_latency")
    args = parser.parse_args(argv)
    for name in ("image_size", "batch_size", "iterations", "rounds", "threads"):
        if getattr(args, name) < 1:
            # The wording every command uses for this fact.
            print(f"tf_mixed litert-latency: error: {below_minimum(name, getattr(args, name), 1)}",
                  file=sys.stderr)
            raise SystemExit(2)
    return args


def measure(runners: dict[str, Callable[[], object]], rounds: int, iterations: int,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median time of one call of each runner, in ms, over interleaved rounds.

    Args:
        runners: ``{name: function}``, each running one inference.
        rounds: Rounds; each calls every runner `iterations` times, in turn.
        iterations: Timed calls per runner per round (after one untimed call).
        clock: A clock in seconds (injected by the tests).

    Returns:
        ``{name: median over rounds of the round's median ms}``.
    """
    def one_round(run: Callable[[], object]) -> float:
        """The median ms of ``iterations`` timed calls, after one untimed call."""
        run()  # warm: first call allocates
        times = []
        for _ in range(iterations):
            start = clock()
            run()
            times.append(1000.0 * (clock() - start))
        return statistics.median(times)

    per_round = measuring.interleaved_rounds(  # each runner leads in turn
        {name: functools.partial(one_round, run) for name, run in runners.items()}, rounds)
    return {name: statistics.median(values) for name, values in per_round.items()}


def _invoke(runner, key: str, sample) -> object:
    return runner(**{key: sample})


def main(argv: list[str], clock: Callable[[], float] = time.perf_counter) -> int:
    """Runs the benchmark; see the module docstring.

    Args:
        argv: The flags after the subcommand.
        clock: The clock to time with (the tests inject a fake one).

    Returns:
        The exit status (argparse exits with 2 on bad flags).
    """
    args = _parse(argv)
    quiet.import_tensorflow()  # once the arguments are read
    from tf_mixed._internal.cli_errors import UsageError

    try:  # before the work, not after it
        remove_if_created(args.output_dir, check_output_dir(args.output_dir))
    except UsageError as error:
        print(f"tf_mixed litert-latency: error: {error}", file=sys.stderr)
        return 2
    import keras
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    import tf_mixed
    from tf_mixed.bench import models

    shape = (args.image_size, args.image_size, 3)  # every bench model takes images
    with tf_mixed.policy_scope(args.policy):
        keras.utils.set_random_seed(0)
        model = models.build(args.model, shape, 10)
    sample = np.random.default_rng(0).uniform(0, 255, (args.batch_size,) + shape).astype("float32")
    directory = tempfile.mkdtemp(prefix="tf_mixed_latency_")
    reports: dict[str, tf_mixed.serving.export_report.ExportReport] = {}
    runners: dict[str, Callable[[], object]] = {}
    for precision in ("float32", "float16_weights"):
        path = os.path.join(directory, f"{precision}.tflite")
        reports[precision] = tf_mixed.export(model, path, format="litert",
                                             precision=precision, sample=sample)
        runner = Interpreter(model_path=path, num_threads=args.threads).get_signature_runner()
        (key,) = runner.get_input_details()
        runners[precision] = functools.partial(_invoke, runner, key, sample)
    load_before = measuring.load_averages()
    latency = measure(runners, args.rounds, args.iterations, clock)
    load_after = measuring.load_averages()
    for report in reports.values():
        os.remove(report.path)
    os.rmdir(directory)

    rows = ["| LiteRT file | KB | max rel error vs model | median ms / invoke |",
            "|---|---|---|---|"]
    for precision, report in reports.items():
        rows.append(f"| {precision} | {report.bytes / 1024:,.1f} | {report.max_rel_error:.2e} "
                    f"| {latency[precision]:.3f} |")
    ratio = latency["float16_weights"] / latency["float32"]
    summary = (f"--model={args.model} trained-policy={args.policy} batch {args.batch_size}, "
               f"{args.threads} thread(s), {args.rounds} rounds x {args.iterations} invokes; "
               f"float16 weights / float32 latency: {ratio:.2f}x; load average "
               f"{_load_text(load_before)} before, {_load_text(load_after)} after.")
    text = "\n".join([*rows, "", summary])
    record = {
        "command": "python -m tf_mixed litert-latency " + " ".join(argv),
        "model": args.model, "policy": args.policy, "batch_size": args.batch_size,
        "threads": args.threads, "rounds": args.rounds, "iterations": args.iterations,
        "load_average": {"before": load_before, "after": load_after},
        "files": {p: {"bytes": r.bytes, "max_rel_error": r.max_rel_error,
                      "median_ms": latency[p]} for p, r in reports.items()},
        "latency_ratio_float16_weights": ratio,
    }
    os.makedirs(args.output_dir, exist_ok=True)
    partial = os.path.join(args.output_dir, "latency.json.partial")
    with open(partial, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(partial, os.path.join(args.output_dir, "latency.json"))
    print(text)
    return 0


def _load_text(loads: list[float] | None) -> str:
    return f"{loads[0]:.2f}" if loads else "unknown"
