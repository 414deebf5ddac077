"""The bench: train one model under several policies and measure each run.

`run_policy(config, policy)` trains the model once under one policy, in the
current process, and returns every figure of that run as a JSON-ready dict:
steady-state throughput (median over timed steps, warm-up excluded), step
time, peak memory, final train/validation loss and accuracy, skipped steps and
the loss-scale trajectory. `bench_launch` calls it once per policy, each in a
fresh process by default; `bench_report` turns the dicts into the table and
files. Every policy sees the same seed, initial weights and data order.

Two training paths exercise tf_mixed's two integrations:

* ``loop="fit"``: ``model.compile(optimizer=tf_mixed.wrap_optimizer(Adam))``
  and ``model.fit(..., callbacks=[tf_mixed.callbacks.LossScaleMonitor()])``.
* ``loop="custom"``: a ``tf.GradientTape`` step run with ``strategy.run``,
  the gradients applied through ``tf_mixed.training.apply_scaled_gradients``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from typing import Any

import keras
import tensorflow as tf

from tf_mixed import bench_train
from tf_mixed import training
from tf_mixed.bench_errors import UsageError

STRATEGIES = ("default", "mirrored", "multiworker")
LOOPS = ("fit", "custom")
SUITES = ("compare", "overhead", "comm")
ISOLATIONS = ("subprocess", "inprocess")
DEFAULT_MODEL = {"compare": "cnn", "overhead": "mlp", "comm": "mlp"}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a bench run (the CLI flags, validated).

    Attributes:
        policies: Policy names as given; empty for the default pair.
        model: One of `tf_mixed.models.MODEL_NAMES`; "" for the suite's default.
        dataset: A `tf_mixed.data` spec: "shapes", "tfds:NAME[:SPLIT]", "folder:PATH".
        data_dir: TFDS data directory ("" for TFDS's default).
        download: Whether TFDS may download a missing data set.
        image_size: Square image side; 0 for the data set's default.
        train_size: Training examples (shapes: generated; others: a cap; 0: default).
        val_size: Validation examples, as ``train_size``.
        batch_size: Global batch size (split across replicas).
        epochs: Number of epochs.
        steps: Steps per epoch; 0 for one pass over the training data.
        warmup_steps: Leading steps left out of the timing (tracing, caches).
        learning_rate: Adam's initial learning rate (cosine decay to 0 over the run).
        strategy: One of `STRATEGIES`.
        replicas: Replicas for "mirrored" on a host without GPUs (the CPU is
            split into this many logical devices).
        workers: Worker processes for "multiworker".
        loop: One of `LOOPS`.
        suite: One of `SUITES`.
        isolation: One of `ISOLATIONS`: a fresh process per policy, or all in this one.
        output_dir: Where results.json, results.md and bench.png go.
        seed: Seed for data, initial weights and data order.
        rounds: Overhead suite: alternating timing rounds per path.
    """

    policies: tuple[str, ...] = ()
    model: str = ""
    dataset: str = "shapes"
    data_dir: str = ""
    download: bool = True
    image_size: int = 0
    train_size: int = 0
    val_size: int = 0
    batch_size: int = 64
    epochs: int = 4
    steps: int = 0
    warmup_steps: int = 5
    learning_rate: float = 1e-3
    strategy: str = "default"
    replicas: int = 2
    workers: int = 2
    loop: str = "fit"
    suite: str = "compare"
    isolation: str = "subprocess"
    output_dir: str = "tf_mixed_bench"
    seed: int = 0
    rounds: int = 3

    @property
    def model_name(self) -> str:
        return self.model or DEFAULT_MODEL[self.suite]

    def validate(self) -> "BenchConfig":
        """Checks every field that can be checked without loading anything.

        Returns:
            A copy with canonical model name.

        Raises:
            UsageError: Naming the first bad flag.
        """
        from tf_mixed import models

        for flag, value, choices in (
            ("strategy", self.strategy, STRATEGIES),
            ("loop", self.loop, LOOPS),
            ("suite", self.suite, SUITES),
            ("isolation", self.isolation, ISOLATIONS),
        ):
            if value not in choices:
                raise UsageError(flag, value, f"unknown {flag}", ", ".join(choices))
        for flag, value, minimum in (
            ("batch_size", self.batch_size, 1),
            ("epochs", self.epochs, 1),
            ("steps", self.steps, 0),
            ("warmup_steps", self.warmup_steps, 0),
            ("replicas", self.replicas, 1),
            ("workers", self.workers, 1),
            ("train_size", self.train_size, 0),
            ("val_size", self.val_size, 0),
            ("image_size", self.image_size, 0),
            ("rounds", self.rounds, 1),
        ):
            if value < minimum:
                raise UsageError(flag, value, f"must be >= {minimum}", f"an integer >= {minimum}")
        if self.strategy == "multiworker" and self.loop == "fit" and self.suite == "compare":
            raise UsageError(
                "loop", self.loop,
                "Keras 3's model.fit fails under MultiWorkerMirroredStrategy (PerReplica "
                "inputs reach a Tensor conversion; keras-team/keras#20585), so "
                "--strategy=multiworker needs the GradientTape loop",
                "custom", "Add --loop=custom.",
            )
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise UsageError("learning_rate", self.learning_rate, "must be a positive number", "e.g. 0.001")
        if not self.output_dir:
            raise UsageError("output_dir", self.output_dir, "empty path", "a writable directory")
        model = models.check_name(self.model_name)
        return dataclasses.replace(self, model=model)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def resolve_policies(requested: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """Turns ``--policies`` into canonical, de-duplicated policy names.

    With nothing requested the pair is float32 and what ``enable("auto")``
    picks; where auto picks float32 (a CPU without fast half precision),
    mixed_bfloat16 is added so that two policies are always compared.

    Args:
        requested: Names as given (aliases and "auto" accepted).

    Returns:
        ``(policies, note)``: the names, float32 first when present, and a
        sentence saying how the list was chosen.

    Raises:
        UsageError: For an unknown name.
    """
    from tf_mixed import hardware, policy

    auto, reason = policy.choose_auto(hardware.detect())
    names = []
    for name in requested or ("float32", "auto"):
        try:
            canonical = policy.canonical_name(name)
        except (TypeError, ValueError):
            raise UsageError(
                "policies", name, "unknown policy", ", ".join(policy.POLICY_NAMES)
            ) from None
        canonical = auto if canonical == "auto" else canonical
        if canonical not in names:
            names.append(canonical)
    if not requested:
        if auto == "float32":
            names.append("mixed_bfloat16")
            note = (
                f"Default policies: float32 and enable('auto'), which picks float32 here "
                f"({reason}); mixed_bfloat16 was added so two policies are compared."
            )
        else:
            note = f"Default policies: float32 and enable('auto') = {auto} ({reason})."
    else:
        note = f"Policies as requested (--policies); enable('auto') would pick {auto} ({reason})."
    names.sort(key=lambda n: n != "float32")
    return tuple(names), note


# --- memory -------------------------------------------------------------------


def _reset_peak_memory() -> bool:
    """Resets the peak-memory counters this process can reset."""
    for gpu in tf.config.list_logical_devices("GPU"):
        try:
            tf.config.experimental.reset_memory_stats(gpu.name)
        except (ValueError, RuntimeError):
            pass
    try:  # Linux: "5" resets VmHWM (peak RSS) to the current RSS.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource  # fallback: lifetime peak (cannot be reset)

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _peak_gpu_mb() -> float | None:
    peaks = []
    for gpu in tf.config.list_logical_devices("GPU"):
        try:
            peaks.append(tf.config.experimental.get_memory_info(gpu.name)["peak"])
        except (ValueError, RuntimeError):
            pass
    return sum(peaks) / 2**20 if peaks else None


# --- strategy -------------------------------------------------------------------


def split_cpu_for_replicas(replicas: int) -> None:
    """Splits the CPU into ``replicas`` logical devices if TF is not yet initialised.

    Call before any TF op runs; does nothing when GPUs are present, when the
    split is already in place, or when the runtime is already initialised.
    """
    if tf.config.list_physical_devices("GPU") or replicas < 2:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
        )
    except RuntimeError:
        pass  # already initialised: use whatever devices exist


def make_strategy(config: BenchConfig) -> tf.distribute.Strategy:
    """The `tf.distribute` strategy that ``--strategy`` names."""
    if config.strategy == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if config.strategy == "mirrored":
        # Shared per process: two MirroredStrategy objects over the same
        # devices clash in TF 2.21 (see training.shared_mirrored_strategy).
        if tf.config.list_logical_devices("GPU"):
            return training.shared_mirrored_strategy()
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")][: config.replicas]
        return training.shared_mirrored_strategy(cpus)
    return tf.distribute.get_strategy()


# --- one policy -------------------------------------------------------------------


def run_policy(
    config: BenchConfig,
    policy_name: str,
    *,
    bench_data=None,
    strategy: tf.distribute.Strategy | None = None,
    verbose: bool = True,
) -> dict[str, Any]:
    """Trains ``config.model`` under one policy in this process and measures it.

    Args:
        config: A validated `BenchConfig`.
        policy_name: A canonical policy name.
        bench_data: A loaded `tf_mixed.data.BenchData` to reuse; loaded from
            ``config`` when None.
        strategy: The strategy to use; `make_strategy(config)` when None.
        verbose: Print one line per epoch.

    Returns:
        The run's figures as a JSON-ready dict (see the module docstring of
        `bench_report` for the fields).

    Raises:
        UsageError: For data or model settings that turn out unusable.
    """
    from tf_mixed import data as data_module
    from tf_mixed import models, policy, wrap_optimizer

    strategy = strategy or make_strategy(config)
    if bench_data is None:
        bench_data = data_module.load(
            config.dataset, seed=config.seed, image_size=config.image_size,
            train_size=config.train_size, val_size=config.val_size,
            data_dir=config.data_dir or None, download=config.download,
        )
    if bench_data.train_size < config.batch_size:
        raise UsageError(
            "batch_size", config.batch_size,
            f"larger than the {bench_data.train_size} training examples of {bench_data.name}",
            f"1 to {bench_data.train_size}",
        )
    steps = config.steps or bench_data.train_size // config.batch_size
    total_steps = steps * config.epochs
    warmup = min(config.warmup_steps, total_steps - 1)
    train = bench_train.batched(bench_data.train, config.batch_size, train=True, seed=config.seed, size=bench_data.train_size)
    val = bench_train.batched(bench_data.val, config.batch_size, train=False, seed=config.seed, size=bench_data.val_size)

    keras.backend.clear_session()
    memory_reset = _reset_peak_memory()
    with policy.policy_scope(policy_name) as enabled:
        keras.utils.set_random_seed(config.seed)  # same initial weights for every policy
        with strategy.scope():
            model = models.build(config.model_name, bench_data.image_shape, bench_data.num_classes)
            optimizer = wrap_optimizer(keras.optimizers.Adam(_schedule(config, total_steps)))
        recorder = bench_train.Recorder(policy_name, config.epochs, config.batch_size, optimizer, verbose)
        start = time.perf_counter()
        if config.loop == "fit":
            bench_train.train_fit(model, optimizer, train, val, steps, config.epochs, recorder)
        else:
            bench_train.train_custom(
                model, optimizer, train, val, steps, config.epochs, config.batch_size, recorder, strategy
            )
        train_time = time.perf_counter() - start
        peak_rss = _peak_rss_mb()
        peak_gpu = _peak_gpu_mb()
        compute_dtype = model.dtype_policy.compute_dtype
        jit = bool(getattr(model, "jit_compile", False)) if config.loop == "fit" else False

    timed = recorder.step_times[warmup:]
    # A diverged run is a result too: non-finite losses are stored as None
    # (JSON null) rather than refused.
    history = {k: [_finite_or_none(v) for v in values] for k, values in recorder.history.items()}
    median_step = statistics.median(timed)
    scale_changes = recorder.scale_changes
    result = {
        "policy": policy_name,
        "policy_reason": enabled.reason,
        "compute_dtype": compute_dtype,
        "variable_dtype": "float32",
        "optimizer": type(optimizer).__name__
        + (f"({type(optimizer.inner_optimizer).__name__})" if hasattr(optimizer, "inner_optimizer") else ""),
        "loop": config.loop,
        "strategy": config.strategy,
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": config.workers if config.strategy == "multiworker" else 1,
        "jit_compile": jit,
        "global_batch_size": config.batch_size,
        "epochs": config.epochs,
        "steps_per_epoch": steps,
        "total_steps": total_steps,
        "warmup_steps": warmup,
        "timed_steps": len(timed),
        "samples_per_sec": config.batch_size / median_step,
        "samples_per_sec_mean": config.batch_size * len(timed) / sum(timed),
        "step_time_ms": 1000.0 * median_step,
        "step_time_ms_p90": 1000.0 * _percentile(timed, 0.9),
        "train_time_s": train_time,
        "peak_memory_mb": peak_gpu if peak_gpu is not None else peak_rss,
        "memory_kind": "gpu_peak_allocated" if peak_gpu is not None else "process_peak_rss",
        "peak_rss_mb": peak_rss,
        "memory_counter_reset": memory_reset,
        "final_train_loss": history["train_loss"][-1],
        "final_train_accuracy": history["train_accuracy"][-1],
        "final_val_loss": history["val_loss"][-1],
        "final_val_accuracy": history["val_accuracy"][-1],
        "history": history,
        "skipped_steps": bench_train.skipped_steps(optimizer),
        "loss_scale": None
        if not scale_changes
        else {
            "initial": scale_changes[0][1],
            "final": scale_changes[-1][1],
            "min": min(v for _, v in scale_changes),
            "max": max(v for _, v in scale_changes),
            "trajectory": scale_changes,  # [step, scale]: step 0, then every change
        },
        "model_params": int(model.count_params()),
        "dataset": bench_data.describe(),
    }
    keras.backend.clear_session()
    return result


def _schedule(config: BenchConfig, total_steps: int):
    """Cosine decay to 0 over the run: the last epoch's accuracy is then a
    converged figure rather than one noisy Adam step, so policies compare."""
    return keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=total_steps)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def check_data(config: BenchConfig):
    """Loads (or, for shapes, only validates) the data so bad input fails early.

    Returns:
        The loaded `BenchData`, or None for the generated shapes set.
    """
    from tf_mixed import data as data_module

    kind, _, _ = data_module.parse_spec(config.dataset)
    if kind == data_module.SHAPES:
        size = config.image_size or data_module.DEFAULT_SHAPES_SIZE
        if size < 16:
            raise UsageError("image_size", config.image_size, "too small for the shapes data set", "16 or more (0 picks 32)")
        train_size = config.train_size or 8000
        if train_size < config.batch_size:
            raise UsageError(
                "batch_size", config.batch_size,
                f"larger than the {train_size} training examples", f"1 to {train_size}",
            )
        return None
    return data_module.load(
        config.dataset, seed=config.seed, image_size=config.image_size,
        train_size=config.train_size, val_size=config.val_size,
        data_dir=config.data_dir or None, download=config.download,
    )


def host_info() -> dict[str, Any]:
    """Host, TF and Keras versions for results.json."""
    import platform
    import socket

    import numpy as np

    import tf_mixed
    from tf_mixed import hardware

    info = hardware.detect()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": info.cpu_model,
        "cpu_count": os.cpu_count(),
        "amx_bf16_usable": info.amx_bf16_usable,
        "gpus": [
            {"name": g.name, "compute_capability": list(g.compute_capability or ())}
            for g in info.gpus
        ],
        "tpu": info.tpu,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "tf_mixed": tf_mixed.__version__,
    }
