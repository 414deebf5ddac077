"""``--suite=heal`` and ``--suite=heal_cost``: a run that heals itself; what attribution costs."""

# ``heal``: one model written as a user writes it (`demo_model`: an MLP whose
# first layer's activation is the smooth ReLU typed from its formula,
# ``log(1 + exp(x))``) on tabular data in raw units (`demo_data`). Training
# grows the first layer's pre-activations past 11.09, where ``exp`` passes
# float16's 65504 (float32's limit, 88.7, is never near); float32 reaches its
# plateau (test accuracy 1.0 on data with a margin) well within the run.
# Three runs, same seed and data: float32; mixed_float16 with
# `tf_mixed.LossScaleMonitor` (which stops it); mixed_float16 with the monitor
# and `tf_mixed.callbacks.Heal`. The table gives the step of the stop or of
# each healing, the final test accuracy, the healed layers and the time.
#
# ``heal_cost``: the main job's model (``--model``, default cnn) trained under
# mixed_float16 and mixed_bfloat16 (or ``--policies``), with and without layer attribution
# (`tf_mixed.callbacks.Heal` attached, nothing to heal), alternating timed
# rounds; the median step times and their ratio.


from __future__ import annotations

import statistics
import time
from typing import Callable

import keras
import numpy as np

import tf_mixed
from tf_mixed._internal import measuring
from tf_mixed.bench.config import BenchConfig
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created
from tf_mixed.commands.step_timer import StepTimer

__all__ = ["demo_data", "demo_model", "run_demo", "run_heal", "run_heal_cost",
           "smooth_relu"]

FEATURES = 16
CLASSES = 3
RAW_SCALE = 3.5
MARGIN = 1.0
LEARNING_RATE = 0.01


@keras.saving.register_keras_serializable(package="tf_mixed_bench")
def smooth_relu(x):
    """``log(1 + exp(x))`` as its formula reads (Keras's softplus avoids the overflow)."""
    return keras.ops.log(1.0 + keras.ops.exp(x))


def demo_data(train: int = 6144, test: int = 2000, seed: int = 0):
    """A tabular task in raw units: 16 features, 3 classes, a linear rule with a margin.

    Features are normal with standard deviation `RAW_SCALE` (not
    standardised, as a user reads them from a table); the class is the
    largest of three fixed linear scores of the standardised features, kept
    only where it leads the second by `MARGIN`, so a model that learns the
    rule scores 1.0 and float32's accuracy has a plateau to reach.

    Returns:
        ``(x_train, y_train, x_test, y_test)``.
    """
    rng = np.random.default_rng(seed)
    weights = rng.normal(0, 1, (FEATURES, CLASSES))

    def draw(n):
        xs, ys, kept = [], [], 0
        while kept < n:
            x = rng.normal(0, 1, (2 * n, FEATURES))
            scores = x @ weights
            top = np.sort(scores, axis=1)
            keep = top[:, -1] - top[:, -2] >= MARGIN
            xs.append((RAW_SCALE * x[keep]).astype("float32"))
            ys.append(np.argmax(scores[keep], axis=1))
            kept += int(keep.sum())
        return np.concatenate(xs)[:n], np.concatenate(ys)[:n]

    return (*draw(train), *draw(test))


def demo_model(seed: int = 1) -> keras.Model:
    """The demo model under the current global policy."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(64, activation=smooth_relu, name="hidden"),
        keras.layers.Dense(64, activation="relu", name="hidden2"),
        keras.layers.Dense(CLASSES, name="logits"), tf_mixed.OutputActivation("softmax"),
    ], name="heal_demo")


class _Stops(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.step = 0
        self.stopped_at = None

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self._note()

    def on_epoch_end(self, epoch, logs=None):
        self._note()                # LossScaleMonitor's per-epoch rule stops here

    def _note(self):
        if self.model.stop_training and self.stopped_at is None:
            self.stopped_at = self.step


def run_demo(policy: str, heal: bool, *, epochs: int = 4, batch_size: int = 32,
             strategy=None, data=None) -> dict:
    """One run of the demo; returns its row (plain values).

    Args:
        policy: ``"float32"`` or ``"mixed_float16"``.
        heal: Attach `tf_mixed.callbacks.Heal`.
        epochs, batch_size: Training length.
        strategy: Optional ``tf.distribute`` strategy to train under.
        data: `demo_data` output (made here when None).
    """
    keras.backend.clear_session()
    tf_mixed.enable(policy, quiet=True)
    x, y, x_test, y_test = data if data is not None else demo_data()
    scope = strategy.scope() if strategy is not None else _nothing()
    with scope:
        model = demo_model()
        model.compile(tf_mixed.wrap_optimizer(keras.optimizers.Adam(LEARNING_RATE)),
                      "sparse_categorical_crossentropy", metrics=["accuracy"])
    monitor = tf_mixed.LossScaleMonitor()
    healer = tf_mixed.callbacks.Heal() if heal else None
    stops = _Stops()
    callbacks = [monitor] + ([healer] if healer else []) + [stops]
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
              callbacks=callbacks)
    seconds = time.perf_counter() - start
    accuracy = float(model.evaluate(x_test, y_test, verbose=0)[1])
    return {
        "run": f"{policy}{' + Heal' if heal else ''}",
        "stopped_at": stops.stopped_at,
        "healings": list(healer.healings) if healer else [],
        "healed_layers": list(healer.healed_layers) if healer else [],
        "skipped_steps": int(tf_mixed.loss_scale_state(model.optimizer).skipped_steps or 0),
        "accuracy": accuracy,
        "seconds": seconds,
    }


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _written(config: BenchConfig, command: str, suite: str, rows: list[dict],
             table: Callable[[list[dict]], list[str]], work: Callable[[], object]) -> list[dict]:
    """Runs ``work`` (which fills ``rows``), then writes results.json and results.md
    to ``--output_dir`` as every suite does, and prints the table; nothing is left
    behind when the work fails."""
    from tf_mixed.bench import report as bench_report

    created = check_output_dir(config.output_dir)
    try:
        work()
        markdown = "\n".join([f"# tf_mixed bench --suite={suite}", "",
                               f"Command: `{command}`", "", *table(rows), ""])
        report = {**bench_report.suite_header(suite, config, command), "results": rows,
                  "markdown": markdown}
        written = bench_report.write_outputs(report, config.output_dir, plot=False)
    except BaseException:
        remove_if_created(config.output_dir, created)
        raise
    bench_report.print_written(markdown, written)
    return rows


def run_heal(config: BenchConfig, command: str) -> list[dict]:
    """``--suite=heal``: the three runs side by side (a Markdown table), written to
    ``--output_dir`` as results.json and results.md."""
    rows: list[dict] = []

    def work():
        data = demo_data(seed=config.seed)
        epochs = config.epochs
        rows.extend([run_demo("float32", False, epochs=epochs, data=data),
                     run_demo("mixed_float16", False, epochs=epochs, data=data),
                     run_demo("mixed_float16", True, epochs=epochs, data=data)])

    return _written(config, command, "heal", rows, heal_table, work)


def heal_table(rows: list[dict]) -> list[str]:
    """The heal suite's Markdown table, one line per run."""
    lines = ["| run | stopped at step | healed (step: layer) | skipped steps "
             "| test accuracy | time (s) |", "|---|---|---|---|---|---|"]
    for row in rows:
        healed = "; ".join(h.split(":")[0].replace("tf_mixed healing at ", "")
                           + ": " + ", ".join(row["healed_layers"])
                           for h in row["healings"]) or "-"
        lines.append(f"| {row['run']} | {row['stopped_at'] or '-'} | {healed} | "
                     f"{row['skipped_steps']} | {row['accuracy']:.4f} | {row['seconds']:.1f} |")
    return lines


def _interval(ratios: list[float]) -> tuple[float, float]:
    estimate = measuring.estimate(ratios)
    return estimate.low, estimate.high


def _timed_round(model, x, y, steps: int) -> tuple[float, float]:
    """Median wall and process-CPU seconds per step of one round of ``steps`` fit steps.

    CPU seconds (all of this process's threads) are the steadier figure on a
    shared machine: other processes slow the wall clock, not this work.
    """
    timer = StepTimer()
    callbacks = [timer] + list(getattr(model, "_heal_callbacks", []))
    model.fit(x, y, batch_size=len(x) // steps, epochs=1, shuffle=False, verbose=0,
              callbacks=callbacks)
    return statistics.median(timer.times), statistics.median(timer.cpu_times)


def _record_cost(model, calls: int = 300) -> float:
    """Median seconds of what attribution adds to an applied step, timed alone.

    The attribution's record (`tf_mixed.scaling.attribution.LayerAttribution.record`,
    a cond on the verdict and the counters' writes) on the model's real
    gradients-shaped zeros, plus the callback's one-scalar read, in a loop
    of ``calls``: small and repeated, so steady on a busy machine.
    """
    import tensorflow as tf

    attributed = model.optimizer.step_state.attribution.attached
    assert attributed is not None                     # Heal attached it
    variables = list(model.trainable_variables)
    grads = [tf.zeros_like(v) for v in variables]

    @tf.function
    def record():
        attributed.record(tf.constant(True), grads, variables,
                          lambda: attributed.forward_flags(attributed.local_outputs()))

    record()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        record()
        attributed.log_size()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_heal_cost(config: BenchConfig, command: str) -> list[dict]:
    """``--suite=heal_cost``: step time with and without attribution, both half policies.

    The two models (same seed, same data) alternate round by round; the ratio
    is the median over rounds of each round pair's ratio (a pair is close in
    time, so load that drifts cancels out).
    """
    rows: list[dict] = []
    return _written(config, command, "heal_cost", rows, heal_cost_table,
                    lambda: rows.extend(_heal_cost_rows(config)))


def _heal_cost_rows(config: BenchConfig) -> list[dict]:
    from tf_mixed.bench import models

    name = config.model_name
    size = config.image_size or 32
    batch = config.batch_size
    steps = config.round_steps
    rng = np.random.default_rng(config.seed)
    x = rng.standard_normal((batch * steps, size, size, 3)).astype("float32")
    y = rng.integers(0, 10, batch * steps)
    rows: list[dict] = []
    for policy in config.policies or ("mixed_float16", "mixed_bfloat16"):
        keras.backend.clear_session()
        tf_mixed.enable(policy, quiet=True)
        paths = {}
        for with_heal in (False, True):
            keras.utils.set_random_seed(config.seed)
            model = models.build(name, (size, size, 3), 10)
            model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(1e-3)),
                          "sparse_categorical_crossentropy")
            model._heal_callbacks = [tf_mixed.callbacks.Heal()] if with_heal else []
            _timed_round(model, x, y, steps)                      # warm-up, trace
            paths[with_heal] = model
        sides = {"plain": paths[False], "attributed": paths[True]}
        pairs = []
        for index in range(config.timing_rounds):  # each side leads in turn
            timed = {side: _timed_round(sides[side], x, y, steps)
                     for side in measuring.rotated(list(sides), index)}
            pairs.append((timed["plain"], timed["attributed"]))
        rows.append({
            "policy": policy, "model": name,
            "record_us": _record_cost(paths[True]) * 1e6,
            "plain_ms": statistics.median(p[0][0] for p in pairs) * 1e3,
            "attributed_ms": statistics.median(p[1][0] for p in pairs) * 1e3,
            "wall_ratio": statistics.median(p[1][0] / p[0][0] for p in pairs),
            "wall_interval": list(_interval([p[1][0] / p[0][0] for p in pairs])),
            "cpu_ratio": statistics.median(p[1][1] / p[0][1] for p in pairs),
            "pairs": pairs})
    return rows


def heal_cost_table(rows: list[dict]) -> list[str]:
    """The heal_cost suite's Markdown table, one line per policy."""
    lines = ["| policy | model | step, no attribution (ms) | step, attribution (ms) | "
             "wall ratio (90% interval) | CPU-time ratio | attribution's ops alone (us/step) "
             "| their share |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        low, high = row["wall_interval"]
        lines.append(
            f"| {row['policy']} | {row['model']} | {row['plain_ms']:.2f} | "
            f"{row['attributed_ms']:.2f} | {row['wall_ratio']:.3f} ({low:.3f}-{high:.3f}) "
            f"| {row['cpu_ratio']:.3f} | {row['record_us']:.0f} "
            f"| {row['record_us'] / 1e3 / row['plain_ms']:.2%} |")
    return lines
