"""One worker of tests/integration/test_cross_worker_decisions.py.

    python _decisions_worker.py CONFIG.json

Started by `tf_mixed.distribute.workers.run_local_workers` (which sets
``TF_CONFIG``). Runs each scenario of the config's ``scenarios`` in order, one
fresh model each, and writes what this worker saw and decided to ``out``
(``{i}``: the worker index). Each worker feeds its own shard
(``distribute_datasets_from_function``, 4 rows a step); only worker 1's shard
holds the values that matter:

- ``first_batch``: under mixed_float16, a LayerNormalization fed the raw
  inputs (max |x| 1 on both shards); worker 1's first batch holds 1e5 (far
  outside the norm's safe float16 range), worker 0's second batch 7e5 (not a
  first batch: never read); alone, worker 0 would see nothing to warn about.
  Then a second fit of the same model on clean shards.
- ``patience``: tf_mixed's optimizer (scale 4, minimum 1), worker 1's rows NaN
  from step ``BAD_FROM`` of every epoch on: every such step is skipped, the
  scale falls to its minimum and the patience rule stops the run.
- ``plain_nan``: plain SGD (nothing skipped), a linear model, worker 1's rows
  NaN from step ``BAD_FROM``: the NaN reaches the loss, the loss rule stops
  the run.
- ``forward_state``: tf_mixed's optimizer, ``rollback_forward_state=False``,
  a BatchNormalization first, worker 1's step ``BAD_FROM`` NaN: the step is
  skipped on both, but only worker 1's copies of the moving statistics hold
  NaN; the weights rule stops the run naming them on both workers.
- ``epoch_fraction``: tf_mixed's optimizer, worker 1's rows inf on 5 of the 8
  steps of each epoch (patience out of reach): the epoch rule stops the run
  at the first epoch end.
- ``raise``: ``patience`` with ``raise_on_failure=True``: each worker catches
  `LossScaleFailure` and goes on.

Every scenario records the batch ends each worker saw, the optimizer's
counters, the monitor's ``stop_reason``, the MixedPrecisionWarnings and the
monitor's error log lines.
"""

import json
import logging
import pathlib
import sys
import warnings

import numpy as np

PER_WORKER_BATCH = 4
STEPS = 8
EPOCHS = 3
FEATURES = 4
BAD_FROM = 3  # 1-based step of each epoch from which worker 1's rows are bad
FRACTION_BAD = (2, 3, 5, 6, 8)  # 5 of 8 steps skipped: > max_skip_fraction 0.5


def shard(worker, scenario):
    """Worker ``worker``'s (x, y) for ``scenario``: ``STEPS * PER_WORKER_BATCH`` rows, fixed."""
    rng = np.random.default_rng(10 + worker)
    x = rng.uniform(-1.0, 1.0, (STEPS * PER_WORKER_BATCH, FEATURES)).astype("float32")
    x[:, 0] = 1.0  # max |x| of every row: exactly 1
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.25]], "float32")).astype("float32")

    def rows(step):  # the rows of 1-based ``step``
        return slice((step - 1) * PER_WORKER_BATCH, step * PER_WORKER_BATCH)

    if scenario == "first_batch":
        if worker == 1:
            x[0, 0] = 1e5
        else:
            x[PER_WORKER_BATCH, 0] = 7e5
    elif worker == 1 and scenario in ("patience", "plain_nan", "raise"):
        x[rows(BAD_FROM).start:] = np.nan
    elif worker == 1 and scenario == "forward_state":
        x[rows(BAD_FROM), 1] = np.nan
    elif worker == 1 and scenario == "epoch_fraction":
        for step in FRACTION_BAD:
            x[rows(step), 1] = np.inf
    return x, y


def build(keras, tf_mixed, scenario):
    keras.utils.set_random_seed(0)  # the same initial weights everywhere
    if scenario == "first_batch":
        inputs = keras.Input((FEATURES,))
        x = keras.layers.LayerNormalization(name="norm")(inputs)
        x = keras.layers.Dense(4, name="hidden")(x)
        model = keras.Model(inputs, keras.layers.Dense(1, name="out", dtype="float32")(x))
    elif scenario == "forward_state":
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.BatchNormalization(center=False, scale=False, name="norm"),
            keras.layers.Dense(1, name="out"),
        ])
    else:
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            # Linear for plain_nan: a NaN reaches the loss (a relu hides it).
            keras.layers.Dense(8, activation=None if scenario == "plain_nan" else "relu",
                               name="hidden"),
            keras.layers.Dense(1, name="out"),
        ])
    sgd = keras.optimizers.SGD(0.0 if scenario == "first_batch" else 0.0625)
    optimizer = sgd if scenario == "plain_nan" else tf_mixed.LossScaleOptimizer(
        sgd, initial_scale=4.0, min_scale=1.0)
    model.compile(optimizer=optimizer, loss="mse")
    return model, optimizer


class _ErrorLines(logging.Handler):
    """The monitor's absl error lines (``LossScaleMonitor stopped training: ...``)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def run(keras, tf, tf_mixed, strategy, scenario):
    from tf_mixed.callbacks import first_batch
    from tf_mixed.callbacks.monitor import LossScaleFailure, LossScaleMonitor

    def dataset(name):
        def per_worker(context):
            x, y = shard(context.input_pipeline_id, name)
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(
                context.get_per_replica_batch_size(2 * PER_WORKER_BATCH))

        return strategy.distribute_datasets_from_function(per_worker)

    keras.backend.clear_session()
    with tf_mixed.policy_scope("mixed_float16" if scenario == "first_batch" else "float32"):
        with strategy.scope():
            model, optimizer = build(keras, tf_mixed, scenario)
        monitor = LossScaleMonitor(
            check_policy=False, check_every_n_batches=1, raise_on_failure=scenario == "raise",
            patience=100 if scenario in ("epoch_fraction", "forward_state") else 2,
            rollback_forward_state=scenario != "forward_state")
        seen = []
        record_batches = keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: seen.append([epoch, 0]),
            on_train_batch_end=lambda batch, logs: seen[-1].__setitem__(1, batch + 1))
        errors = _ErrorLines()
        logging.getLogger("absl").addHandler(errors)
        result = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                model.fit(dataset(scenario), epochs=1 if scenario == "first_batch" else EPOCHS,
                          verbose=0, callbacks=[monitor, record_batches])
            except LossScaleFailure as failure:
                result["raised"] = str(failure)
            if scenario == "first_batch":
                result["magnitudes"] = first_batch._kept(model)["found"].read()
                found = first_batch.install(model)  # armed again: the next fit reads
                model.fit(dataset("clean"), epochs=1, verbose=0,
                          callbacks=[LossScaleMonitor(check_policy=False)])
                result["second_magnitudes"] = found.read()
        logging.getLogger("absl").removeHandler(errors)
    result.update(
        warnings=[str(w.message) for w in caught
                  if issubclass(w.category, tf_mixed.MixedPrecisionWarning)],
        errors=errors.lines, batches=seen, stop_reason=monitor.stop_reason,
        iterations=int(optimizer.iterations.numpy()),
        skipped=None if scenario == "plain_nan" else int(optimizer.skipped_steps.numpy()),
        loss_scale=None if scenario == "plain_nan" else float(optimizer.loss_scale.numpy()),
        norm_stats=[w.numpy().tolist() for w in model.layers[0].non_trainable_weights],
        weights_finite=all(bool(np.isfinite(w).all()) for w in model.get_weights()))
    return result


def main(config):
    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.distribute import cluster

    index = cluster.current_task().index
    strategy = cluster.multi_worker_strategy(timeout_seconds=config["collective_timeout"])
    results = {"worker": index, "replicas": int(strategy.num_replicas_in_sync)}
    for scenario in config["scenarios"]:
        results[scenario] = run(keras, tf, tf_mixed, strategy, scenario)
    # Read only after this process has exited: no partial file is ever read.
    pathlib.Path(config["out"].replace("{i}", str(index))).write_text(json.dumps(results))


if __name__ == "__main__":
    main(json.loads(pathlib.Path(sys.argv[1]).read_text()))
