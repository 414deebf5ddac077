"""The bench's two training paths and the per-step recorder they share."""

# `train_fit` is ``model.compile`` + ``model.fit`` with
# ``tf_mixed.LossScaleMonitor``; `train_custom` is a
# ``tf.GradientTape`` step under ``strategy.run`` whose gradients go through
# ``tf_mixed.training.apply_scaled_gradients``. Both report every step's wall
# time (the step is waited for, so the time is the step's own) and the loss
# scale after it to a `Recorder`, and every epoch's metrics.
#
# The steps run in segments (a warm-up, then rounds) that a gate hands out:
# `tf_mixed.bench.compare` interleaves the policies' rounds through it and may
# stop a policy early (its time budget, `tf_mixed.bench.schedule`). A gate has
# ``begin() -> steps``, ``report(times, finished)`` and ``next() -> steps`` (0:
# stop training now); `FreeGate` hands out rounds without waiting.

from __future__ import annotations

import statistics
import time
from typing import Protocol, Sequence

import keras
import tensorflow as tf


class Gate(Protocol):
    """Hands out the steps of each segment; see the module docstring."""

    def begin(self) -> int: ...

    def report(self, times: Sequence[float], finished: bool) -> None: ...

    def next(self) -> int: ...


class FreeGate:
    """A warm-up of ``warmup`` steps, then rounds of ``round_steps``, never waiting."""

    def __init__(self, warmup: int, round_steps: int):
        self.warmup, self.round_steps = warmup, round_steps

    def begin(self) -> int:
        return self.warmup or self.round_steps

    def report(self, times: Sequence[float], finished: bool) -> None:
        pass

    def next(self) -> int:
        return self.round_steps


class Segments:
    """Cuts the steps into the gate's segments and keeps each one's step times.

    A round also ends after ``round_seconds`` (at least one step), so a slow
    policy cannot hold the others for long.

    Attributes:
        warmup: Step seconds of the untimed warm-up segment.
        rounds: Step seconds of each timed round, in order.
        stopped: Whether the gate stopped training before its end.
    """

    def __init__(self, gate: Gate, round_seconds: float, *, has_warmup: bool = True):
        self.gate = gate
        self.round_seconds = round_seconds
        self.warmup: list[float] = []
        self.rounds: list[list[float]] = []
        self.stopped = False
        self._in_warmup = has_warmup
        self._times: list[float] = []
        self._target = 0
        self._start = 0.0

    def begin(self) -> None:
        self._target = self.gate.begin()
        self._start = time.perf_counter()

    def step(self, seconds: float) -> bool:
        """Records one step; returns True when training must stop now."""
        self._times.append(seconds)
        if (len(self._times) < self._target
                and time.perf_counter() - self._start < self.round_seconds):
            return False
        self._close(finished=False)
        self._target = self.gate.next()
        self._start = time.perf_counter()
        self.stopped = self._target == 0
        return self.stopped

    def finish(self) -> None:
        """Reports the last (possibly short) segment as the end of training."""
        self._close(finished=True)

    def _close(self, finished: bool) -> None:
        times, self._times = self._times, []
        if self._in_warmup:
            self.warmup = times
            self._in_warmup = False
        elif times:
            self.rounds.append(times)
        self.gate.report(times, finished)


class Recorder:
    """Per-step wall time and loss scale; per-epoch metrics; progress lines."""

    def __init__(self, policy: str, epochs: int, global_batch: int, optimizer, verbose: bool,
                 segments: Segments | None = None):
        self.policy = policy
        self.segments = segments
        self.epochs = epochs
        self.global_batch = global_batch
        self.optimizer = optimizer
        self.verbose = verbose
        self.step_times: list[float] = []
        # [step, scale]: the scale before step 1 (step 0), then after each change.
        self.scale_changes: list[list[float]] = []
        initial = loss_scale(optimizer)
        if initial is not None:
            self.scale_changes.append([0, initial])
        self.history: dict[str, list[float]] = {
            "train_loss": [], "train_accuracy": [], "val_loss": [], "val_accuracy": []
        }

    def begin(self) -> None:
        if self.segments is not None:
            self.segments.begin()

    def step_done(self, seconds: float) -> bool:
        """Records a step; returns True when the gate stops training."""
        self.step_times.append(seconds)
        scale = loss_scale(self.optimizer)
        if scale is not None and (not self.scale_changes or self.scale_changes[-1][1] != scale):
            self.scale_changes.append([len(self.step_times), scale])
        return self.segments is not None and self.segments.step(seconds)

    def finish(self) -> None:
        if self.segments is not None:
            self.segments.finish()

    def epoch_done(self, epoch: int, train_loss, train_acc, val_loss, val_acc) -> None:
        for key, value in zip(self.history, (train_loss, train_acc, val_loss, val_acc)):
            self.history[key].append(float(value))
        if self.verbose:
            recent = self.step_times[-max(1, len(self.step_times) // (epoch + 1)):]
            rate = self.global_batch / statistics.median(recent)
            scale = loss_scale(self.optimizer)
            extra = (f", loss scale {scale:g}, skipped {skipped_steps(self.optimizer)}" if scale
                     else "")
            print(
                f"[{self.policy}] epoch {epoch + 1}/{self.epochs}: loss {train_loss:.4f} "
                f"acc {train_acc:.4f} val_loss {val_loss:.4f} val_acc {val_acc:.4f} "
                f"{rate:,.0f} samples/s{extra}",
                flush=True,
            )


class _FitRecorder(keras.callbacks.Callback):
    """Adapts `Recorder` to ``model.fit``.

    Reading ``logs["loss"]`` as a float at each batch end waits for the step
    to finish, so the time between batch begin and end is the step's time.
    """

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder
        self._start = 0.0

    def on_train_begin(self, logs=None):
        self.recorder.begin()

    def on_train_end(self, logs=None):
        self.recorder.finish()

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        float(logs.get("loss", 0.0))  # synchronise
        if self.recorder.step_done(time.perf_counter() - self._start):
            self.model.stop_training = True  # Keras 3 ends the epoch after this batch

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        self.recorder.epoch_done(
            epoch, logs["loss"], logs["accuracy"], logs["val_loss"], logs["val_accuracy"]
        )


def loss_scale(optimizer) -> float | None:
    """The current loss scale, or None for an optimizer that does not scale."""
    from tf_mixed import loss_scale_state
    from tf_mixed.callbacks.monitor import is_loss_scaling

    if not is_loss_scaling(optimizer):
        return None
    return float(loss_scale_state(optimizer).scale)


def skipped_steps(optimizer) -> int:
    """Skipped steps so far (0 when the optimizer keeps no counter)."""
    from tf_mixed import loss_scale_state

    return loss_scale_state(optimizer).skipped_steps or 0


def batched(dataset: tf.data.Dataset, batch: int, *, train: bool, seed: int, size: int):
    def to_float(x, y):
        return tf.cast(x, tf.float32), y

    if train:
        # Same seed -> same order in every policy's run; reshuffled each epoch.
        dataset = dataset.shuffle(min(size, 10_000), seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.batch(batch, drop_remainder=True).repeat()
    else:
        dataset = dataset.batch(batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    return dataset.map(to_float).prefetch(2).with_options(options)


def train_fit(model, optimizer, train, val, steps: int, epochs: int, recorder: Recorder, *,
              check_policy: bool = False):
    """``compile`` + ``fit`` with tf_mixed's LossScaleMonitor and the step timer.

    Returns:
        The monitor's check of the policy on the model's own first steps
        (``check_policy``; `tf_mixed.policy.model_check.Verdict`), or None.
    """
    from tf_mixed.callbacks.monitor import LossScaleMonitor

    monitor = LossScaleMonitor(check_policy=check_policy)
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(
        train,
        validation_data=val,
        epochs=epochs,
        steps_per_epoch=steps,
        shuffle=False,
        verbose=0,
        callbacks=[monitor, _FitRecorder(recorder)],
    )
    return monitor.model_check.verdict if monitor.model_check is not None else None


def train_custom(
    model, optimizer, train, val, steps: int, epochs: int, global_batch: int,
    recorder: Recorder, strategy: tf.distribute.Strategy,
) -> None:
    """A GradientTape loop under ``strategy.run``, gradients applied by tf_mixed.training."""
    from tf_mixed import training

    loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            per_example = loss_fn(y, probs)
            # Sum over the global batch: all-reducing the replicas' gradients
            # then gives the gradient of the global mean.
            loss = tf.reduce_sum(per_example) / global_batch
        training.apply_scaled_gradients(tape, loss, model.trainable_variables, optimizer)
        correct = tf.reduce_sum(
            tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), y), tf.float32))
        return loss, correct

    def replica_eval(x, y):
        probs = model(x, training=False)
        correct = tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), y), tf.float32)
        return (tf.reduce_sum(loss_fn(y, probs)), tf.reduce_sum(correct),
                tf.cast(tf.shape(y)[0], tf.float32))

    def reduce(values):
        return [strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in values]

    @tf.function
    def train_step(iterator):
        return reduce(strategy.run(replica_step, args=next(iterator)))

    @tf.function
    def eval_step(batch):
        return reduce(strategy.run(replica_eval, args=batch))

    with strategy.scope():
        # Optimizer slots must exist before the first distributed step.
        optimizer.build(model.trainable_variables)
    iterator = iter(strategy.experimental_distribute_dataset(train))
    val_dist = strategy.experimental_distribute_dataset(val)
    recorder.begin()
    stop = False
    for epoch in range(epochs):
        loss_sum = correct_sum = 0.0
        done = 0
        while done < steps and not stop:
            start = time.perf_counter()
            loss, correct = train_step(iterator)
            loss, correct = float(loss), float(correct)  # synchronise
            stop = recorder.step_done(time.perf_counter() - start)
            loss_sum += loss
            correct_sum += correct
            done += 1
        totals = [0.0, 0.0, 0.0]
        for batch in val_dist:
            totals = [t + float(v) for t, v in zip(totals, eval_step(batch))]
        recorder.epoch_done(
            epoch, loss_sum / done, correct_sum / (done * global_batch),
            totals[0] / max(totals[2], 1.0), totals[1] / max(totals[2], 1.0),
        )
        if stop:
            break
    recorder.finish()
