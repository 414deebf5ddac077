"""`model.fit` on two local workers: a CNN with BatchNorm, mixed precision, one overflow.

    python examples/multi_worker_fit.py [--policy=mixed_float16] [--epochs=2]
        [--overflow_at=3] [--timeout=300]

With no ``--worker`` this script is the launcher: `tf_mixed.distribute.
run_local_workers` starts it twice as workers 0 and 1 (each with its own
``TF_CONFIG`` on 127.0.0.1), prints their output prefixed ``[worker i]``, and
stops both if one fails. Each worker trains the same small CNN (Conv2D +
BatchNormalization(synchronized=True)) with ``model.fit`` under MultiWorkerMirroredStrategy,
tf_mixed's LossScaleOptimizer and LossScaleMonitor, on its own shard of
generated images. At step ``--overflow_at`` of each epoch one pixel of
worker 1's batch is 1e5, which is inf in float16: that step must be skipped
on both workers, and BatchNorm's moving statistics on worker 1 must not keep
the inf/NaN its forward pass wrote. The launcher then prints whether both
workers agree on every decision (skip, loss scale, stop) and every weight,
BatchNorm statistics included.

On several machines the worker part is all there is: set ``TF_CONFIG`` on each
and run ``python examples/multi_worker_fit.py --worker`` everywhere.
"""

import json
import os
import sys
import tempfile

from absl import app, flags

_WORKER = flags.DEFINE_bool("worker", False, "Run as one worker (reads TF_CONFIG).")
_OUT = flags.DEFINE_string("out", "", "Where a worker writes its JSON result ({i}: index).")
_POLICY = flags.DEFINE_string("policy", "mixed_float16", "tf_mixed policy name.")
_EPOCHS = flags.DEFINE_integer("epochs", 2, "Epochs.")
_STEPS = flags.DEFINE_integer("steps", 6, "Steps per epoch.")
_OVERFLOW_AT = flags.DEFINE_integer(
    "overflow_at", 3, "Step of each epoch where worker 1's batch overflows (0: never).")
_TIMEOUT = flags.DEFINE_integer("timeout", 300, "Seconds to wait for the workers.")

PER_WORKER_BATCH = 8
IMAGE = (8, 8, 1)


def worker_shard(index, steps, overflow_at):
    """Worker ``index``'s images and labels: a fixed function of the index."""
    import numpy as np

    rng = np.random.default_rng(100 + index)
    n = steps * PER_WORKER_BATCH
    labels = rng.integers(0, 2, size=n)
    images = rng.normal(size=(n, *IMAGE)).astype("float32")
    images[labels == 1, :4] += 1.0  # class 1: brighter top half
    if index == 1 and overflow_at:
        images[(overflow_at - 1) * PER_WORKER_BATCH, 0, 0, 0] = 1e5  # inf in float16
    return images, labels.astype("int32")


def run_worker():
    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed import distribute

    strategy = distribute.multi_worker_strategy(timeout_seconds=120)
    task = distribute.current_task()
    tf_mixed.enable(_POLICY.value)

    def per_worker(context):
        x, y = worker_shard(context.input_pipeline_id, _STEPS.value, _OVERFLOW_AT.value)
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(
            context.get_per_replica_batch_size(2 * PER_WORKER_BATCH))

    keras.utils.set_random_seed(0)  # the same initial weights on every worker
    with strategy.scope():
        model = keras.Sequential([
            keras.Input(IMAGE),
            keras.layers.Conv2D(4, 3, padding="same", use_bias=False),
            # synchronized: batch statistics all-reduced across workers, so
            # the moving statistics are the same everywhere (plain Keras
            # BatchNorm keeps each replica's own statistics).
            keras.layers.BatchNormalization(synchronized=True),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
            tf_mixed.OutputActivation("softmax"),
        ])
        optimizer = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")

    decisions = []

    class RecordDecisions(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            decisions.append({
                "skipped": int(optimizer.last_step_skipped.numpy()),
                "loss_scale": float(optimizer.loss_scale.numpy()),
                "stop_training": bool(model.stop_training),
            })

    history = model.fit(
        strategy.distribute_datasets_from_function(per_worker),
        epochs=_EPOCHS.value, verbose=0, shuffle=False,
        callbacks=[tf_mixed.callbacks.LossScaleMonitor(), RecordDecisions()])
    result = {
        "decisions": decisions,
        "epoch_logs": {k: [float(v) for v in vals] for k, vals in history.history.items()},
        "weights": {v.path: v.numpy().ravel().tolist() for v in model.weights},
    }
    print(f"epochs run: {len(history.history.get('loss', []))}, skipped steps: "
          f"{int(optimizer.skipped_steps.numpy())}, loss scale: "
          f"{float(optimizer.loss_scale.numpy()):.0f}", flush=True)
    with open(_OUT.value.replace("{i}", str(task.index)), "w") as f:
        json.dump(result, f)


def launch():
    from tf_mixed.distribute import WorkersFailed, run_local_workers

    out = os.path.join(tempfile.mkdtemp(prefix="tf_mixed_mw_fit_"), "worker{i}.json")
    argv = [sys.executable, os.path.abspath(__file__), "--worker", f"--out={out}",
            f"--policy={_POLICY.value}", f"--epochs={_EPOCHS.value}",
            f"--steps={_STEPS.value}", f"--overflow_at={_OVERFLOW_AT.value}"]
    try:
        run_local_workers(2, argv, timeout=_TIMEOUT.value, grace_seconds=30)
    except WorkersFailed as error:
        print(f"the workers failed: {error}")
        return 1
    results = []
    for index in range(2):
        with open(out.replace("{i}", str(index))) as f:
            results.append(json.load(f))
    a, b = results
    skipped = [n + 1 for n, d in enumerate(a["decisions"]) if d["skipped"]]
    print(f"steps skipped (counted over all epochs): {skipped}")
    print(f"workers agree on every decision: {a['decisions'] == b['decisions']}")
    differing = [name for name in a["weights"] if a["weights"][name] != b["weights"][name]]
    print(f"workers agree on every weight: {not differing}"
          + (f" (differ: {', '.join(differing)})" if differing else ""))
    finite = all(abs(v) < float("inf") for w in a["weights"].values() for v in w)
    print(f"all weights finite (BatchNorm statistics included): {finite}")
    return 0 if (a["decisions"] == b["decisions"] and not differing and finite) else 1


def main(argv):
    del argv
    if _WORKER.value:
        run_worker()
        return 0
    return launch()


if __name__ == "__main__":
    app.run(main)
