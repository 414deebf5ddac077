"""``python -m tf_mixed rollback-cost``: what forward-state rollback costs."""

# Trains the bench's ResNet-18 (BatchNormalization after every convolution)
# with two ``tf_mixed.LossScaleOptimizer`` set-ups in one process, same seed
# and data: one with ``track_forward_state(model)`` (backups of the moving
# statistics refreshed on every applied step), one without. The two alternate
# for ``--rounds`` rounds of ``--steps`` timed steps; the report is the ratio
# of median step times and the memory the backups take (their exact size).

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

from tf_mixed._internal import measuring, quiet
from tf_mixed._internal.cli_errors import below_minimum
from tf_mixed.commands.one_line_parser import OneLineParser

__all__ = ["main"]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m tf_mixed rollback-cost",
        description="Step time and memory of forward-state rollback on "
                    "ResNet-18.")
    parser.add_argument("--policy", default="mixed_bfloat16",
                        choices=("float32", "mixed_bfloat16", "mixed_float16"))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for name in ("batch_size", "image_size", "steps", "rounds"):
        if getattr(args, name) < 1:
            # The wording every command uses for this fact.
            print(f"tf_mixed rollback-cost: error: {below_minimum(name, getattr(args, name), 1)}",
                  file=sys.stderr)
            raise SystemExit(2)
    return args


def main(argv: list[str]) -> int:
    """Runs the measurement and prints a Markdown table.

    Args:
        argv: The flags after the subcommand.

    Returns:
        The exit status (argparse exits with 2 on bad flags).
    """
    args = _parse(argv)
    quiet.import_tensorflow()  # once the arguments are read
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.bench import models

    tf_mixed.enable(args.policy, quiet=True)
    rng = np.random.default_rng(0)
    shape = (args.image_size, args.image_size, 3)
    x = tf.constant(rng.standard_normal((args.batch_size,) + shape), tf.float32)
    y = tf.constant(rng.integers(0, 10, args.batch_size), tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def build(track: bool):
        keras.utils.set_random_seed(0)
        model = models.build("resnet18", shape, 10)
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01), force=True)
        opt.build(model.trainable_variables)
        tracked = opt.track_forward_state(model) if track else 0

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
                scaled = opt.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)
            return loss

        for _ in range(3):  # trace and warm up, not timed
            float(step())
        backup_bytes = sum(
            int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
            for v in opt.tracked_forward_variables)
        weight_bytes = sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
                           for v in model.weights)
        return step, tracked, backup_bytes, weight_bytes

    paths = {"without rollback": build(False), "with rollback": build(True)}
    times: dict[str, list[float]] = {name: [] for name in paths}

    def one_round(name: str) -> float:
        """Times ``args.steps`` steps of ``name`` into ``times``; their seconds."""
        step = paths[name][0]
        for _ in range(args.steps):
            start = time.perf_counter()
            float(step())
            times[name].append(time.perf_counter() - start)
        return sum(times[name][-args.steps:])

    measuring.interleaved_rounds(  # each set-up leads in turn
        {name: functools.partial(one_round, name) for name in paths}, args.rounds)
    base = statistics.median(times["without rollback"])
    print(f"# Forward-state rollback cost: resnet18, {args.policy}, "
          f"batch {args.batch_size}, {args.image_size}x{args.image_size}")
    print()
    print("| set-up | tracked variables | backup memory | model weights | "
          "median step ms | ratio |")
    print("|---|---|---|---|---|---|")
    for name, (_, tracked, backup, weights) in paths.items():
        median = statistics.median(times[name])
        print(f"| {name} | {tracked} | {backup / 2**20:.3f} MiB | "
              f"{weights / 2**20:.2f} MiB | {1000 * median:.2f} | "
              f"{median / base:.3f}x |")
    return 0
