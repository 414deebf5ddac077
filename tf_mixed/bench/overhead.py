"""``--suite=overhead``: tf_mixed's optimizer and callback against plain Keras."""

# Both paths train the same model (same seed, same initial weights, same data)
# under the same mixed policy in one process:
#
# * ``keras``: ``model.compile(optimizer=Adam)``, which Keras wraps in its own
#   ``keras.optimizers.LossScaleOptimizer`` when the policy is mixed_float16
#   (custom loop: ``scale_loss`` and ``apply`` on that optimizer by hand);
# * ``tf_mixed``: ``tf_mixed.wrap_optimizer(Adam)`` plus
#   ``tf_mixed.LossScaleMonitor`` (custom loop:
#   ``tf_mixed.training.apply_scaled_gradients``).
#
# The paths alternate for ``--rounds`` rounds of ``--steps`` steps (after
# ``--warmup_steps`` untimed steps each) so that a change in machine load hits
# both; the report is the ratio of median step times, tf_mixed / Keras.

from __future__ import annotations

import datetime
import statistics
import time
from typing import Any

import keras
import tensorflow as tf

import tf_mixed
from tf_mixed import training
from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.bench import config as config_module
from tf_mixed.bench import models, train
from tf_mixed.bench import report as report_module
from tf_mixed.bench.config import BenchConfig
from tf_mixed.callbacks.monitor import LossScaleMonitor
from tf_mixed.policy import global_policy as policy

PATHS = ("keras", "tf_mixed")
DEFAULT_STEPS = 40
DEFAULT_TRAIN_SIZE = 2048
DEFAULT_VAL_SIZE = 64


def _overhead_policy(config: BenchConfig) -> tuple[str, str]:
    if not config.policies:
        return "mixed_float16", (
            "mixed_float16 (the default for this suite: the policy with loss scaling, "
            "where the optimizer paths differ most)"
        )
    names, _ = config_module.resolve_policies(config.policies)
    mixed = [n for n in names if n != "float32"]
    if len(mixed) != 1:
        raise UsageError(
            "policies", ",".join(config.policies),
            "the overhead suite times exactly one mixed policy",
            "mixed_float16 or mixed_bfloat16",
        )
    return mixed[0], f"{mixed[0]} (as requested)"


class StepTimer(keras.callbacks.Callback):
    """Each fit step's wall time, the step waited for (also doctor --measure's).

    ``cpu_times`` holds each step's CPU time of this process (all its
    threads): on a busy machine other processes stretch the wall time, not
    the work a step does.
    """

    def __init__(self):
        super().__init__()
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self._start = self._cpu_start = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()
        self._cpu_start = time.process_time()

    def on_train_batch_end(self, batch, logs=None):
        float((logs or {}).get("loss", 0.0))  # wait for the step
        self.times.append(time.perf_counter() - self._start)
        self.cpu_times.append(time.process_time() - self._cpu_start)


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

        if name == "tf_mixed":
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


def run_overhead(config: BenchConfig, command: str) -> dict[str, Any]:
    """Times both paths, writes results.json / results.md / bench.png, prints the ratio.

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
    created = report_module.check_output_dir(config.output_dir)
    steps = config.steps or DEFAULT_STEPS
    print(f"Overhead suite: --model={config.model_name}, policy {why}, loop={config.loop}, "
          f"{config.rounds} rounds x {steps} steps per path.", flush=True)
    try:
        train_set = train.batched(bench_data.train, config.batch_size, train=True,
                               seed=config.seed, size=bench_data.train_size)
        keras.backend.clear_session()
        with policy.policy_scope(policy_name):
            paths: dict[str, Any] = {}
            for name in PATHS:
                keras.utils.set_random_seed(config.seed)
                model = models.build(config.model_name, bench_data.image_shape,
                                     bench_data.num_classes)
                adam = keras.optimizers.Adam(config.learning_rate)
                if name == "tf_mixed":
                    optimizer, callbacks = tf_mixed.wrap_optimizer(adam), [LossScaleMonitor()]
                elif config.loop == "custom" and policy_name == "mixed_float16":
                    optimizer, callbacks = keras.optimizers.LossScaleOptimizer(adam), []
                else:
                    optimizer, callbacks = adam, []
                if config.loop == "fit":
                    paths[name] = _FitPath(name, model, optimizer, train_set, callbacks)
                else:
                    paths[name] = _CustomPath(name, model, optimizer, train_set, config.batch_size)
            times: dict[str, list[float]] = {name: [] for name in PATHS}
            cpu_times: dict[str, list[float]] = {name: [] for name in PATHS}
            for path in paths.values():
                path.steps(max(1, config.warmup_steps))  # tracing, not timed
            for round_index in range(config.rounds):
                for name, path in paths.items():
                    wall, cpu = path.steps(steps)
                    times[name] += wall
                    cpu_times[name] += cpu
                print(f"round {round_index + 1}/{config.rounds}: " + ", ".join(
                    f"{n} {1000 * statistics.median(times[n]):.2f} ms/step" for n in PATHS),
                    flush=True)
        results: list[dict[str, Any]] = []
        for name in PATHS:
            median = statistics.median(times[name])
            optimizer = paths[name].optimizer
            results.append({
                "path": name,
                "optimizer": f"{type(optimizer).__module__.split('.')[0]}."
                             f"{type(optimizer).__name__}",
                "callbacks": (["LossScaleMonitor"] if name == "tf_mixed" and config.loop == "fit"
                              else []),
                "timed_steps": len(times[name]),
                "step_time_ms": 1000 * median,
                "cpu_step_time_ms": 1000 * statistics.median(cpu_times[name]),
                "samples_per_sec": config.batch_size / median,
            })
        ratio = results[1]["step_time_ms"] / results[0]["step_time_ms"]
        cpu_ratio = results[1]["cpu_step_time_ms"] / results[0]["cpu_step_time_ms"]
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
            f"Step-time ratio tf_mixed / Keras: **{ratio:.3f}x** "
            f"({'slower' if ratio > 1 else 'faster'} by {abs(ratio - 1) * 100:.1f}%).",
            "",
            f"CPU time per step (this process, all threads; what other processes on a "
            f"busy machine do not stretch): {cpu_ratio:.3f}x.",
            "",
        ])
        report = {
            "suite": "overhead",
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "command": command,
            "flags": config.to_json(),
            "host": report_module.host_info(),
            "policy": policy_name,
            "model": {"name": config.model_name},
            "dataset": bench_data.describe(),
            "loop": config.loop,
            "results": results,
            "overhead_ratio": ratio,
            "cpu_overhead_ratio": cpu_ratio,
            "markdown": markdown,
        }
        written = report_module.write_outputs(report, config.output_dir)
    except BaseException:
        report_module.remove_if_created(config.output_dir, created)
        raise
    report_module.print_written(markdown, written)
    return report
