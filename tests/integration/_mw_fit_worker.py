"""One worker (or the single-process reference) of tests/integration/test_multi_worker_fit.py.

    python _mw_fit_worker.py CONFIG.json

Started by `tf_mixed.distribute.workers.run_local_workers` (which sets ``TF_CONFIG``), or
with ``"mode": "reference"`` as one plain process. The config (JSON) holds:

- ``mode``: "fit" (fit, evaluate, predict under each policy), "reference"
  (the same training without a strategy, on the same global batches), or
  "backup" (fit with BackupAndRestore; worker ``die_worker`` SIGKILLs itself
  after batch ``die_batch`` of epoch ``die_epoch``).
- ``policies``, ``epochs``, ``bad_step`` (per policy: the 1-based step whose
  batch on worker 1 holds a value that overflows float16; absent or 0: none),
  ``out`` (result JSON path; worker i writes ``out`` with ``{i}`` replaced), ``backup_dir``,
  ``growth_interval``, ``collective_timeout`` (seconds), ``hand_built`` (true:
  the workers build ``tf.distribute.MultiWorkerMirroredStrategy()`` themselves
  instead of calling ``tf_mixed.distribute.multi_worker_strategy()``).

Data: worker i's shard is a fixed function of i (no shuffling), 4 samples per
step and worker, 8 per global step; the reference trains on the two shards
concatenated step by step, so it sees the same global batches.
"""

import json
import os
import signal
import sys

import numpy as np

PER_WORKER_BATCH = 4
STEPS = 4
FEATURES = 4
BAD_VALUE = 1e5  # > float16 max (65504): inf in a float16 layer


def shard(worker, epochs_unused=None):
    """Worker ``worker``'s (x, y), ``STEPS * PER_WORKER_BATCH`` rows, fixed."""
    rng = np.random.default_rng(10 + worker)
    x = rng.integers(-4, 5, size=(STEPS * PER_WORKER_BATCH, FEATURES)).astype("float32") / 4
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.25]], "float32")).astype("float32")
    return x, y


def with_overflow(x, worker, bad_step):
    x = x.copy()
    if worker == 1 and bad_step:
        x[(bad_step - 1) * PER_WORKER_BATCH, 0] = BAD_VALUE
    return x


def global_batches(bad_step):
    """The reference's data: step t's global batch is worker 0's then worker 1's."""
    (x0, y0), (x1, y1) = shard(0), shard(1)
    x0, x1 = with_overflow(x0, 0, bad_step), with_overflow(x1, 1, bad_step)
    xs, ys = [], []
    for t in range(STEPS):
        rows = slice(t * PER_WORKER_BATCH, (t + 1) * PER_WORKER_BATCH)
        xs += [x0[rows], x1[rows]]
        ys += [y0[rows], y1[rows]]
    return np.concatenate(xs), np.concatenate(ys)


def build(keras, tf_mixed, growth_interval):
    keras.utils.set_random_seed(0)  # same initial weights everywhere
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.Dense(1),
        tf_mixed.Float32Output(),
    ])
    optimizer = tf_mixed.LossScaleOptimizer(
        keras.optimizers.SGD(0.0625), initial_scale=2.0**10, growth_interval=growth_interval)
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model, optimizer


def state(model, optimizer, history):
    return {
        "weights": [w.ravel().tolist() for w in model.get_weights()],
        "loss_scale": float(optimizer.loss_scale.numpy()),
        "skipped_steps": int(optimizer.skipped_steps.numpy()),
        "iterations": int(optimizer.iterations.numpy()),
        "calibration_skips": optimizer.loss_scale_state().calibration_skips,
        "loss": [float(v) for v in history.get("loss", [])],
        "epoch_logs": {k: [float(v) for v in vals] for k, vals in history.items()},
    }


def main(config):
    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.distribute import cluster as distribute

    mode = config["mode"]
    task = distribute.current_task()
    index = task.index if task else 0
    results = {"worker": index}
    if mode == "reference":
        strategy = None
    elif config.get("hand_built"):
        # As most multi-worker scripts do: no tf_mixed.distribute call at all.
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        results["replicas"] = int(strategy.num_replicas_in_sync)
        results["fix_installed_before_fit"] = _fix_installed()
    else:
        strategy = distribute.multi_worker_strategy(
            timeout_seconds=config.get("collective_timeout", 60))
        results["replicas"] = int(strategy.num_replicas_in_sync)

    def dataset(bad_step):
        if strategy is None:
            x, y = global_batches(bad_step)
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(2 * PER_WORKER_BATCH)

        def per_worker(context):
            x, y = shard(context.input_pipeline_id)
            x = with_overflow(x, context.input_pipeline_id, bad_step)
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(
                context.get_per_replica_batch_size(2 * PER_WORKER_BATCH))

        return strategy.distribute_datasets_from_function(per_worker)

    for policy in config["policies"]:
        keras.backend.clear_session()
        with tf_mixed.policy_scope(policy):
            if strategy is None:
                model, optimizer = build(keras, tf_mixed, config.get("growth_interval", 1000))
            else:
                with strategy.scope():
                    model, optimizer = build(keras, tf_mixed, config.get("growth_interval", 1000))
            callbacks = [tf_mixed.callbacks.monitor.LossScaleMonitor()]
            if mode == "backup":
                # Each worker its own backup directory: they hold the same
                # state, and two processes must not write one file. First in
                # the list, so the state is restored before the monitor
                # reads its starting counters.
                callbacks.insert(0, keras.callbacks.BackupAndRestore(
                    os.path.join(config["backup_dir"], f"worker-{index}"),
                    save_freq="epoch"))
                model.build((None, FEATURES))
                if index == config.get("die_worker", -1):
                    callbacks.append(_DieAt(config["die_epoch"], config["die_batch"]))
            history = model.fit(dataset(config["bad_step"].get(policy, 0)), epochs=config["epochs"],
                                verbose=0, shuffle=False, callbacks=callbacks)
            result = state(model, optimizer, history.history)
            if config.get("hand_built"):
                result["fix_installed_after_fit"] = _fix_installed()
            if mode == "fit":
                # Every worker saves; the chief's file is the one to keep.
                name = "model" if task.is_chief else f"scratch-{index}"
                path = os.path.splitext(config["out"].replace("{i}", ""))[0]
                path = f"{path}-{policy}-{name}.keras"
                model.save(path)
                results.setdefault("saved", {})[policy] = path
            if mode != "backup":
                x, y = global_batches(0)
                result["evaluate"] = [float(v) for v in model.evaluate(
                    dataset(0), verbose=0)]
                # predict on plain arrays: auto-sharded, gathered from all workers.
                result["predict"] = model.predict(x, batch_size=2 * PER_WORKER_BATCH,
                                                  verbose=0).ravel().tolist()
            results[policy] = result
    out = config["out"].replace("{i}", str(index))
    with open(out + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(out + ".tmp", out)


def _fix_installed():
    from tf_mixed.distribute import keras_fix_20585

    return keras_fix_20585.is_applied()


class _DieAt:
    """A callback that SIGKILLs this process after one batch (a crashed machine)."""

    def __new__(cls, epoch, batch):
        import keras

        class DieAt(keras.callbacks.Callback):
            def on_epoch_begin(self, e, logs=None):
                self.epoch = e

            def on_train_batch_end(self, b, logs=None):
                if self.epoch == epoch and b == batch:
                    print(f"worker dies after epoch {epoch} batch {batch}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        return DieAt()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
