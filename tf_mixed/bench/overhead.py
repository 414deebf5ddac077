"""``--suite=overhead``: tf_mixed's optimizer and callback against plain Keras."""

# The paths train under the same mixed policy in one process:
#
# * ``keras``: ``model.compile(optimizer=Adam)``, which Keras wraps in its own
#   ``keras.optimizers.LossScaleOptimizer`` when the policy is mixed_float16
#   (custom loop: ``scale_loss`` and ``apply`` on that optimizer by hand);
# * ``tf_mixed``: ``tf_mixed.wrap_optimizer(Adam)`` plus
#   ``tf_mixed.LossScaleMonitor`` (custom loop:
#   ``tf_mixed.training.apply_scaled_gradients``);
# * ``keras_control``: the ``keras`` path again, a second identical set-up:
#   its ratio to ``keras`` is what this machine's noise alone makes of the
#   same work (the A/A control).
#
# **The paths share one set of weights**: each is a functional model over the
# same layers (custom loop: the same model), with its own optimizer. Identical
# Keras set-ups, each with its *own* weights, differ by several percent in one
# process (the buffers' placement), on one set of weights much less, but not
# nothing: hence the control (BUILD_NOTES.md, "Loss scaling").
#
# Rounds: each path runs ``--steps`` steps per round, in the order
# `tf_mixed._internal.measuring.rotated` gives (each path leads in turn), for
# ``--rounds`` rounds after ``--warmup_steps`` untimed steps each; each round's
# first step (``fit`` starting its data pipeline) is left out. The ratio is
# the median of tf_mixed's timed steps over the median of both Keras set-ups'
# (pooled: half the variance of one set-up), with a bootstrap interval
# (`CONFIDENCE`) over the rounds (`tf_mixed._internal.measuring.ratio_interval`);
# the control's ratio is ``keras_control`` over ``keras``. The verdict
# (`verdict`) says whether tf_mixed is at most 1% slower (`TOLERANCE`), more,
# or whether this run cannot tell (too few rounds, or an interval across
# the line).

from __future__ import annotations

import statistics
import time
from typing import Any

import keras
import tensorflow as tf

import tf_mixed
from tf_mixed import training
from tf_mixed._internal import measuring
from tf_mixed.bench import config as config_module
from tf_mixed.bench import models, train
from tf_mixed.bench import report as report_module
from tf_mixed.bench.config import BenchConfig
from tf_mixed.callbacks.monitor import LossScaleMonitor
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created
from tf_mixed.commands.step_timer import StepTimer
from tf_mixed.policy import global_policy as policy

PATHS = ("keras", "tf_mixed", "keras_control")
BASE, OURS, CONTROL = PATHS
DEFAULT_STEPS = 20
DEFAULT_TRAIN_SIZE = 2048
DEFAULT_VAL_SIZE = 64
TOLERANCE = 0.01  # the goal: tf_mixed's step at most 1% slower than Keras's
CONFIDENCE = 0.9  # the ratios' bootstrap intervals
# Fewer rounds make no verdict: a percentile bootstrap over 1-4 rounds covers
# far less than CONFIDENCE (over one round its interval has no width at all).
MIN_VERDICT_ROUNDS = 5


def _overhead_policy(config: BenchConfig) -> tuple[str, str]:
    if not config.policies:
        return "mixed_float16", (
            "mixed_float16 (the default for this suite: the policy with loss scaling, "
            "where the optimizer paths differ most)"
        )
    names, _ = config_module.resolve_policies(config.policies)
    mixed = [n for n in names if n != "float32"]
    if len(mixed) != 1:
        # Only "auto" gets here: BenchConfig.validate counted the other names.
        raise config_module.not_one_mixed_policy(config.policies)
    return mixed[0], f"{mixed[0]} (as requested)"


def _same_weights(model: keras.Model, name: str) -> keras.Model:
    """A functional model over ``model``'s own layers: the same weight variables."""
    return keras.Model(model.inputs, model.outputs, name=name)


class _FitPath:
    def __init__(self, name, model, optimizer, train, extra_callbacks):
        self.name = name
        self.model = model
        self.train = train
        self.callbacks = extra_callbacks
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        self.optimizer = model.optimizer

    def steps(self, count: int) -> tuple[list[float], list[float]]:
        timer = StepTimer()
        self.model.fit(self.train, epochs=1, steps_per_epoch=count, verbose=0, shuffle=False,
                       callbacks=[*self.callbacks, timer])
        return timer.times, timer.cpu_times


class _CustomPath:
    def __init__(self, name, model, optimizer, train, batch_size):
        self.name = name
        self.optimizer = optimizer
        self.iterator = iter(train)
        loss_fn = keras.losses.SparseCategoricalCrossentropy()
        variables = model.trainable_variables

        if name == OURS:
            @tf.function
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                training.apply_scaled_gradients(tape, loss, variables, optimizer)
                return loss
        else:
            @tf.function
            def step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                    scaled = (optimizer.scale_loss(loss) if hasattr(optimizer, "scale_loss")
                              else loss)
                optimizer.apply(tape.gradient(scaled, variables), variables)
                return loss

        self.step = step

    def steps(self, count: int) -> tuple[list[float], list[float]]:
        times, cpu_times = [], []
        for _ in range(count):
            x, y = next(self.iterator)
            start, cpu_start = time.perf_counter(), time.process_time()
            float(self.step(x, y))
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        return times, cpu_times


def verdict(ratio: dict[str, float], control: dict[str, float], rounds: int) -> str:
    """One sentence: whether tf_mixed's step is at most `TOLERANCE` slower than Keras's.

    The bootstrap interval covers the noise from round to round, not the
    difference between two set-ups in one process (buffers placed
    elsewhere), which the control samples once (two identical Keras
    set-ups measured 1.02x apart, say). So the interval judged is
    tf_mixed's widened on both sides by the control's distance from 1: a
    heuristic guard, not a bound (a control that lands near 1 by chance
    widens nothing).

    Args:
        ratio: tf_mixed / Keras: ``{"ratio", "low", "high"}``.
        control: keras_control / keras, the same keys.
        rounds: The rounds the ratios come from.

    Returns:
        "at most 1% slower" when the judged interval ends at most at 1 +
        `TOLERANCE`, "more than 1% slower" when it starts above that, else
        that this run cannot tell (so too with fewer than
        `MIN_VERDICT_ROUNDS` rounds).
    """
    if rounds < MIN_VERDICT_ROUNDS:
        return (f"No verdict from {rounds} round{'s' if rounds != 1 else ''}: at least "
                f"{MIN_VERDICT_ROUNDS} are needed (--rounds={MIN_VERDICT_ROUNDS} or more).")
    margin = abs(control["ratio"] - 1.0)
    low, high = ratio["low"] - margin, ratio["high"] + margin
    share = f"{CONFIDENCE:.0%}"
    limit = f"{1 + TOLERANCE:.2f}x"
    judged = (f"the {share} interval, widened by the control's {margin:.1%}, is "
              f"{low:.3f}-{high:.3f}x")
    if high <= 1 + TOLERANCE:
        return f"tf_mixed's step is at most {TOLERANCE:.0%} slower than Keras's: {judged}."
    if low > 1 + TOLERANCE:
        return f"tf_mixed's step is more than {TOLERANCE:.0%} slower than Keras's: {judged}."
    return (f"Not resolved to {TOLERANCE:.0%} on this host: {judged}, across {limit}. "
            "Run more --rounds, or on a quieter machine.")


def _build_paths(config: BenchConfig, policy_name: str, bench_data, train_set) -> dict[str, Any]:
    """The paths over one set of weights (module comment), each with its own optimizer."""
    keras.utils.set_random_seed(config.seed)
    model = models.build(config.model_name, bench_data.image_shape, bench_data.num_classes)
    paths: dict[str, Any] = {}
    for name in PATHS:
        adam = keras.optimizers.Adam(config.learning_rate)
        if name == OURS:
            optimizer, callbacks = tf_mixed.wrap_optimizer(adam), [LossScaleMonitor()]
        elif config.loop == "custom" and policy_name == "mixed_float16":
            optimizer, callbacks = keras.optimizers.LossScaleOptimizer(adam), []
        else:
            optimizer, callbacks = adam, []
        if config.loop == "fit":
            paths[name] = _FitPath(name, _same_weights(model, name), optimizer, train_set,
                                   callbacks)
        else:
            paths[name] = _CustomPath(name, model, optimizer, train_set, config.batch_size)
    return paths


def _time_rounds(paths: dict[str, Any], rounds: int, steps: int, warmup_steps: int):
    """``(wall, cpu, order)``: each path's step seconds per round, and the order run."""
    wall: dict[str, list[list[float]]] = {name: [] for name in paths}
    cpu: dict[str, list[list[float]]] = {name: [] for name in paths}
    order: list[str] = []
    for path in paths.values():
        path.steps(max(1, warmup_steps))  # tracing, not timed
    for round_index in range(rounds):
        for name in measuring.rotated(list(paths), round_index):
            times, cpu_times = paths[name].steps(steps + 1)
            wall[name].append(times[1:])  # the first: fit starting its data pipeline
            cpu[name].append(cpu_times[1:])
            order.append(name)
        print(f"round {round_index + 1}/{rounds}: " + ", ".join(
            f"{name} {1000 * statistics.median(v for r in wall[name] for v in r):.2f} ms/step"
            for name in paths), flush=True)
    return wall, cpu, order


def run_overhead(config: BenchConfig, command: str) -> dict[str, Any]:
    """Times the paths, writes results.json / results.md / bench.png, prints the ratio.

    Raises:
        UsageError: For bad input (before any training).
    """
    policy_name, why = _overhead_policy(config)
    if (config.model_name != "mlp" and policy_name == "mixed_float16"
            and not tf.config.list_physical_devices("GPU")):
        print(f"Note: --model={config.model_name} with mixed_float16 on a CPU is very slow "
              "(TF's float16 Conv2D filter gradient); --model=mlp is the quick choice here.")
    bench_data = config_module.load_data(
        config, default_train_size=DEFAULT_TRAIN_SIZE, default_val_size=DEFAULT_VAL_SIZE
    )
    created = check_output_dir(config.output_dir)
    steps, rounds = config.steps or DEFAULT_STEPS, config.timing_rounds
    print(f"Overhead suite: --model={config.model_name}, policy {why}, loop={config.loop}, "
          f"{rounds} rounds x {steps} steps per path ({', '.join(PATHS)}), one set of "
          "weights.", flush=True)
    try:
        train_set = train.batched(bench_data.train, config.batch_size, train=True,
                                  seed=config.seed, size=bench_data.train_size)
        keras.backend.clear_session()
        with policy.policy_scope(policy_name):
            paths = _build_paths(config, policy_name, bench_data, train_set)
            wall, cpu, order = _time_rounds(paths, rounds, steps, config.warmup_steps)
        report = _report(config, command, policy_name, bench_data, paths, wall, cpu, order)
        written = report_module.write_outputs(report, config.output_dir)
    except BaseException:
        remove_if_created(config.output_dir, created)
        raise
    report_module.print_written(report["markdown"], written)
    return report


def _report(config, command, policy_name, bench_data, paths, wall, cpu, order) -> dict[str, Any]:
    def ratio(name, times=wall, base=(BASE,)):
        # Round i of the base: the steps of round i of every path in ``base``.
        base_rounds = [sum(rounds, []) for rounds in zip(*(times[b] for b in base))]
        low, high = measuring.ratio_interval(base_rounds, times[name], confidence=CONFIDENCE)
        return {"ratio": measuring.pooled_ratio(base_rounds, times[name]),
                "low": low, "high": high, "confidence": CONFIDENCE}

    results: list[dict[str, Any]] = []
    for name in PATHS:
        median = statistics.median(v for r in wall[name] for v in r)
        optimizer = paths[name].optimizer
        results.append({
            "path": name,
            "optimizer": f"{type(optimizer).__module__.split('.')[0]}."
                         f"{type(optimizer).__name__}",
            "callbacks": (["LossScaleMonitor"] if name == OURS and config.loop == "fit"
                          else []),
            "timed_steps": sum(len(r) for r in wall[name]),
            "step_time_ms": 1000 * median,
            "cpu_step_time_ms": 1000 * statistics.median(v for r in cpu[name] for v in r),
            "samples_per_sec": config.batch_size / median,
        })
    keras_paths = (BASE, CONTROL)  # both Keras set-ups: half the variance of one
    ours, cpu_ratio = ratio(OURS, base=keras_paths), ratio(OURS, cpu, keras_paths)
    control = ratio(CONTROL)
    sentence = verdict(ours, control, len(wall[BASE]))
    share = f"{CONFIDENCE:.0%}"
    markdown = "\n".join([
        f"# tf_mixed overhead: {config.model_name}, {policy_name}, loop={config.loop}",
        "",
        f"Command: `{command}`",
        "",
        "| path | optimizer | callbacks | median step ms | samples/s | timed steps |",
        "|---|---|---|---|---|---|",
        *(f"| {r['path']} | {r['optimizer']} | {', '.join(r['callbacks']) or '-'} "
          f"| {r['step_time_ms']:.2f} | {r['samples_per_sec']:,.1f} | {r['timed_steps']} |"
          for r in results),
        "",
        f"Step-time ratio tf_mixed / Keras (both Keras set-ups' steps): "
        f"**{ours['ratio']:.3f}x** ({share} interval {ours['low']:.3f}-{ours['high']:.3f}x).",
        "",
        f"Control, keras_control / keras (the same set-up twice): {control['ratio']:.3f}x "
        f"({share} interval {control['low']:.3f}-{control['high']:.3f}x): what this host's "
        "noise alone makes of the same work.",
        "",
        f"CPU time per step (this process, all threads; what other processes on a "
        f"busy machine do not stretch): {cpu_ratio['ratio']:.3f}x ({share} interval "
        f"{cpu_ratio['low']:.3f}-{cpu_ratio['high']:.3f}x).",
        "",
        f"Verdict: {sentence}",
        "",
        "Method: the paths share one set of weights (each its own optimizer), their rounds "
        "rotate, each round's first step is left out; a ratio is the median of all timed "
        "steps over the baseline's, its interval a bootstrap over the rounds.",
        "",
    ])
    return {
        **report_module.suite_header("overhead", config, command),
        "policy": policy_name,
        "model": {"name": config.model_name},
        "dataset": bench_data.describe(),
        "loop": config.loop,
        "rounds": len(wall[BASE]),
        "round_order": order,
        # Every timed step, per path and round: the figures can be recomputed.
        "step_times_ms": {name: [[1000 * v for v in r] for r in wall[name]] for name in PATHS},
        "results": results,
        "overhead_ratio": ours["ratio"],
        "overhead_interval": [ours["low"], ours["high"]],
        "control_ratio": control["ratio"],
        "control_interval": [control["low"], control["high"]],
        "cpu_overhead_ratio": cpu_ratio["ratio"],
        "cpu_overhead_interval": [cpu_ratio["low"], cpu_ratio["high"]],
        "confidence": CONFIDENCE,
        "verdict": sentence,
        "markdown": markdown,
    }
