"""The bench: train one model under several policies and measure each run."""

# `run_policy(config, policy)` trains the model once under one policy, in the current process,
# and returns every figure of that run as a JSON-ready dict: steady-state throughput (median over
# timed steps, warm-up excluded), step time, peak memory, final train/validation loss and
# accuracy, skipped steps, the loss-scale trajectory and, from `tf_mixed.census` of the trained
# model's step, the share of matmul/conv FLOPs in half precision and the casts per step.
# `tf_mixed.bench.compare` calls it once per policy, each in a fresh process by default;
# `tf_mixed.bench.report` turns the dicts into the table and files. Every policy sees the same
# seed, initial weights and data order.
#
# Two training paths exercise tf_mixed's two integrations:
#
# * ``loop="fit"``: ``model.compile(optimizer=tf_mixed.wrap_optimizer(Adam))``
#   and ``model.fit(..., callbacks=[tf_mixed.LossScaleMonitor()])``.
# * ``loop="custom"``: a ``tf.GradientTape`` step run with ``strategy.run``,
#   the gradients applied through ``tf_mixed.training.apply_scaled_gradients``.

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

import keras
import tensorflow as tf

import tf_mixed
from tf_mixed import training
from tf_mixed._internal import measuring
from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.bench import config as config_module
from tf_mixed.bench import models, peak_memory, plan_row, serving, train
from tf_mixed.bench.config import BenchConfig
from tf_mixed.policy import global_policy as policy
from tf_mixed.tools.planning.plan_table import Plan

AUTO_CHECKED = "auto-checked"
"""The bench row of enable("auto") checked on the model's own first steps."""
AUTO_CHECKED_BUDGET_S = 600
"""The auto-checked row's check budget in seconds (TF_MIXED_MODEL_CHECK_SECONDS)."""

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
        # Checks TF_CONFIG, bounds every collective wait, and makes fit work
        # (keras-team/keras#20585) whatever optimizer the policy gets.
        from tf_mixed.distribute import cluster as distribute

        return distribute.multi_worker_strategy(timeout_seconds=600)
    if config.strategy == "mirrored":
        # Shared per process: two MirroredStrategy objects over the same
        # devices clash in TF 2.21 (see training.shared_mirrored_strategy).
        if tf.config.list_logical_devices("GPU"):
            return training.shared_mirrored_strategy()
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")][: config.replicas]
        return training.shared_mirrored_strategy(cpus)
    return tf.distribute.get_strategy()


# --- one policy -------------------------------------------------------------------


def plan_layers(config: BenchConfig, bench_data=None, train_set=None) -> dict[str, Any]:
    """The per-layer plan (`tf_mixed.plan`) of the float32 bench model, as a record.

    Args:
        config: A validated `BenchConfig`.
        bench_data: Its loaded data (loaded from ``config`` when None).
        train_set: Its batched training set (made from ``bench_data`` when None);
            the plan is timed on the first batch.

    Returns:
        `tf_mixed.bench.plan_row.plan_record` of the plan.
    """
    if bench_data is None:
        bench_data = config_module.load_data(config)
    if train_set is None:
        train_set = train.batched(bench_data.train, config.batch_size, train=True,
                                  seed=config.seed, size=bench_data.train_size)
    # Fresh layer names, as each policy's run builds its model with: the plan
    # names the layers it keeps in float32.
    keras.backend.clear_session()
    with policy.policy_scope("float32"):
        keras.utils.set_random_seed(config.seed)
        planned = models.build(config.model_name, bench_data.image_shape,
                               bench_data.num_classes)
        return plan_row.plan_record(plan_row.make_plan(planned, train_set))


def run_policy(
    config: BenchConfig,
    policy_name: str,
    *,
    bench_data=None,
    strategy: tf.distribute.Strategy | None = None,
    verbose: bool = True,
    gate: train.Gate | None = None,
    plan_record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Trains ``config.model`` under one policy in this process and measures it.

    Args:
        config: A validated `BenchConfig`.
        policy_name: A canonical policy name.
        bench_data: A loaded `tf_mixed.commands.data.BenchData` to reuse;
            loaded from ``config`` when None.
        strategy: The strategy to use; `make_strategy(config)` when None.
        verbose: Print one line per epoch.
        gate: Hands out the warm-up and each round (`tf_mixed.bench.train`);
            None: rounds of ``config.round_steps`` without waiting.
        plan_record: For the "plan" policy, the plan to train (`plan_layers`'s
            record, made once by the job); None: plan here.

    Returns:
        The run's figures as a JSON-ready dict (see the module docstring of
        `tf_mixed.bench.report` for the fields).

    Raises:
        UsageError: For data or model settings that turn out unusable.
    """
    strategy = strategy or make_strategy(config)
    if bench_data is None:
        bench_data = config_module.load_data(config)
    else:
        config_module.check_batch(config, bench_data.train_size, bench_data.name)
    steps = config.steps or bench_data.train_size // config.batch_size
    total_steps = steps * config.epochs
    warmup = min(config.warmup_steps, total_steps - 1)
    gate = gate or train.FreeGate(warmup, config.round_steps)
    segments = train.Segments(gate, config.round_seconds, has_warmup=warmup > 0)
    train_set = train.batched(
        bench_data.train, config.batch_size, train=True, seed=config.seed,
        size=bench_data.train_size
    )
    val_set = train.batched(
        bench_data.val, config.batch_size, train=False, seed=config.seed, size=bench_data.val_size
    )

    keras.backend.clear_session()
    memory_reset = peak_memory.reset()
    compute_policy = config_module.BENCH_POLICIES.get(policy_name, policy_name)
    float8_plan = None
    layer_plan = None
    checked = None
    if policy_name == plan_row.PLAN:
        # The per-layer plan (tf_mixed.plan) the job made before training
        # (`plan_layers`); its policy is the run's (the float32 layers kept).
        plan_record = plan_record or plan_layers(config, bench_data, train_set)
        layer_plan = Plan.from_dict(plan_record)
        compute_policy = layer_plan.policy
    if policy_name == AUTO_CHECKED:
        # The bench's epochs are short: 5% of one would never cover the float32
        # trace of a real model. The row checks in full (its cost is in its
        # figures) unless TF_MIXED_MODEL_CHECK_SECONDS says otherwise.
        os.environ.setdefault("TF_MIXED_MODEL_CHECK_SECONDS", str(AUTO_CHECKED_BUDGET_S))
    with policy.policy_scope(compute_policy) as enabled:
        keras.utils.set_random_seed(config.seed)  # same initial weights for every policy
        with strategy.scope():
            if layer_plan is not None:
                with policy.policy_scope("float32"):
                    model = models.build(config.model_name, bench_data.image_shape,
                                         bench_data.num_classes)
                model = layer_plan.apply(model)  # tf_mixed.convert: same weights
            else:
                model = models.build(config.model_name, bench_data.image_shape,
                                     bench_data.num_classes)
            if policy_name == "float8":
                # Created in the strategy's scope: the float8 scales are
                # mirrored variables the optimizer agrees across replicas.
                float8_plan = tf_mixed.float8.quantize(
                    model, keep_float32="auto" if config.float8_layers == "auto" else [])
            optimizer = tf_mixed.wrap_optimizer(
                keras.optimizers.Adam(_schedule(config, total_steps)))
        recorder = train.Recorder(policy_name, config.epochs, config.batch_size, optimizer, verbose,
                                  segments)
        start = time.perf_counter()
        try:
            if config.loop == "fit":
                # Only the auto-checked row checks its policy on its first steps:
                # the others train exactly the policy they name.
                checked = train.train_fit(model, optimizer, train_set, val_set, steps,
                                          config.epochs, recorder,
                                          check_policy=policy_name == AUTO_CHECKED)
            else:
                train.train_custom(
                    model, optimizer, train_set, val_set, steps, config.epochs,
                    config.batch_size, recorder, strategy,
                )
        except tf.errors.InvalidArgumentError as error:
            raise _unreadable_data(config, error) from None
        train_time = time.perf_counter() - start
        peak_rss = peak_memory.peak_rss_mb()
        peak_gpu = peak_memory.peak_gpu_mb()
        compute_dtype = model.dtype_policy.compute_dtype
        jit = bool(getattr(model, "jit_compile", False)) if config.loop == "fit" else False
        census = _census(config, model, train_set)
        memory = _memory(model, optimizer, config.batch_size, peak_gpu, peak_rss)
        if checked is not None and checked.action == "moved":
            # tf_mixed.audit reads the dtypes the graph was built with; every
            # layer computes in float32 since the check moved the model.
            memory["activations"] = memory["activations_if_float32"]
            memory["activations_source"] += "; the model was moved to float32: its float32 size"
    # What the mixed run leaves to serve (tf_mixed.bench.serving); measured
    # after the timings, so it costs none of them.
    servable = compute_dtype != "float32" and config.strategy != "multiworker"
    serving_figures = (serving.measure(model, next(iter(val_set))[0]) if servable else None)

    timed = [t for r in segments.rounds for t in r]
    # A diverged run is a result too: non-finite losses are stored as None
    # (JSON null) rather than refused.
    history = {k: [_finite_or_none(v) for v in values] for k, values in recorder.history.items()}
    # Each round's figure is the batch over its median step; the run's is the
    # median of its rounds (tf_mixed.bench.schedule).
    rates = [config.batch_size / statistics.median(r) for r in segments.rounds]
    rate_spread = measuring.spread(rates)
    median_step = config.batch_size / rate_spread["median"]
    compared = not segments.stopped
    scale_changes = recorder.scale_changes
    result = {
        "policy": policy_name,
        "policy_reason": (layer_plan.summary if layer_plan is not None
                          else checked.message if checked is not None else enabled.reason),
        # The auto-checked row: auto's choice checked on the model's own first
        # steps (tf_mixed.policy.model_check), its figures and cost.
        "model_check": None if checked is None else checked.to_dict(),
        "layer_plan": None if layer_plan is None else plan_record,
        # float8 on a host without a GPU is quantize-dequantize emulation:
        # its speed says nothing about float8 GEMMs, so none is claimed.
        "float8": None if float8_plan is None else {
            **float8_plan.to_dict(),
            "speed": "measured" if tf.config.list_logical_devices("GPU") else "emulated",
        },
        "compute_dtype": compute_dtype,
        "variable_dtype": "float32",
        "optimizer": type(optimizer).__name__
        + (f"({type(optimizer.inner_optimizer).__name__})"
           if hasattr(optimizer, "inner_optimizer") else ""),
        "loop": config.loop,
        "strategy": config.strategy,
        "replicas": int(strategy.num_replicas_in_sync),
        "workers": config.workers if config.strategy == "multiworker" else 1,
        "jit_compile": jit,
        "global_batch_size": config.batch_size,
        "epochs": config.epochs,
        "steps_per_epoch": steps,
        "total_steps": total_steps,
        "steps_run": len(recorder.step_times),
        "warmup_steps": len(segments.warmup),
        "timed_steps": len(timed),
        "rounds": [{"steps": len(r), "samples_per_sec": rate}
                   for r, rate in zip(segments.rounds, rates)],
        "samples_per_sec_spread": rate_spread,
        "accuracy_compared": compared,
        "samples_per_sec": rate_spread["median"],
        "samples_per_sec_mean": config.batch_size * len(timed) / sum(timed),
        "step_time_ms": 1000.0 * median_step,
        "step_time_ms_p90": 1000.0 * measuring.quantile(timed, 0.9),
        "train_time_s": train_time,
        "peak_memory_mb": peak_gpu if peak_gpu is not None else peak_rss,
        "memory_kind": "gpu_peak_allocated" if peak_gpu is not None else "process_peak_rss",
        "peak_rss_mb": peak_rss,
        "memory_counter_reset": memory_reset,
        "activation_bytes": memory,
        # A run the time budget stopped early trained part of an epoch: its
        # losses are shown, its accuracy is not compared.
        "final_train_loss": history["train_loss"][-1],
        "final_train_accuracy": history["train_accuracy"][-1] if compared else None,
        "final_val_loss": history["val_loss"][-1],
        "final_val_accuracy": history["val_accuracy"][-1] if compared else None,
        "history": history,
        "skipped_steps": train.skipped_steps(optimizer),
        "loss_scale": None
        if not scale_changes
        else {
            "initial": scale_changes[0][1],
            "final": scale_changes[-1][1],
            "min": min(v for _, v in scale_changes),
            "max": max(v for _, v in scale_changes),
            "trajectory": scale_changes,  # [step, scale]: step 0, then every change
        },
        "census": census,
        "model_params": int(model.count_params()),
        "dataset": bench_data.describe(),
        "serving": serving_figures,
    }
    keras.backend.clear_session()
    return result


def _memory(model, optimizer, batch_size: int, peak_gpu_mb: float | None,
            peak_rss_mb: float) -> dict[str, Any]:
    """The bytes the run needs, apart from the runtime's own: weights, state, activations.

    Weights, gradients and optimizer state come from `tf_mixed.tools.memory_report`
    (exact: the variables' own sizes); activations from `tf_mixed.audit`'s
    estimate (every layer output of one batch, in the dtypes the model
    produces: an estimate, since the runtime frees and fuses buffers). On a
    GPU the allocator's peak is measured too (``gpu_peak_bytes``).
    """
    state = tf_mixed.tools.memory_report(model, optimizer)
    try:
        estimate = tf_mixed.audit(model, batch_size=batch_size, check_global_policy=False).memory
    except Exception:  # noqa: BLE001 - the other figures stand without it
        estimate = None
    return {
        "weights": state.weights,
        "gradients": state.gradients,
        "optimizer_state": state.optimizer_state,
        "activations": None if estimate is None else estimate.policy_bytes,
        "activations_if_float32": None if estimate is None else estimate.float32_bytes,
        "activations_source": "estimate: tf_mixed.audit, layer outputs of one batch",
        "weights_source": "exact: tf_mixed.tools.memory_report, the variables' sizes",
        "gpu_peak_bytes": None if peak_gpu_mb is None else int(peak_gpu_mb * 2**20),
        "process_peak_bytes": int(peak_rss_mb * 2**20),
    }


def _census(config: BenchConfig, model, train_set) -> dict[str, Any]:
    """The half-precision FLOP share and casts of the trained model's fit step.

    Taken after training, outside the timing. For the custom loop the model
    is compiled for the census (its step computes the same forward and
    backward pass). Under several workers it is not taken (a trace there
    would join the workers' collectives); a failure is recorded, not raised.
    """
    if config.strategy == "multiworker":
        return {"error": "not taken under multiworker"}
    loss = None if model.compiled else "sparse_categorical_crossentropy"
    try:
        report = tf_mixed.census(model, train_set.take(1), loss=loss)
    except Exception as error:  # noqa: BLE001 - the figures stand without it
        return {"error": f"{type(error).__name__}: {str(error).strip()[:300]}"}
    return {
        "half_flop_share": report.half_flop_share,
        "casts_per_step": report.casts_per_step,
        "cast_bytes_per_step": report.cast_bytes_per_step,
        "source": report.source,
        "findings": [finding.code for finding in report.findings],
    }


def _unreadable_data(config: BenchConfig, error: Exception) -> Exception:
    """An image that passed the pre-check but does not decode is bad input too."""
    message = str(error)
    if not any(word in message for word in ("decode", "image", "Image", "JPEG", "PNG")):
        return error
    first = message.strip().splitlines()[0][:300] if message.strip() else ""
    return UsageError(
        "dataset", config.dataset,
        f"an image could not be decoded ({type(error).__name__}: {first})",
        "image files TensorFlow decodes (JPEG, PNG, GIF, BMP)",
        "Remove or re-encode the damaged file.",
    )


def _schedule(config: BenchConfig, total_steps: int):
    """Cosine decay to 0 over the run: the last epoch's accuracy is then a
    converged figure rather than one noisy Adam step, so policies compare."""
    return keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=total_steps)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
