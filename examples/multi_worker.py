"""MultiWorkerMirroredStrategy on one machine: two workers, one overflows.

    python examples/multi_worker.py [--steps=20] [--overflow_at=5]
        [--timeout=240]

With no ``--worker`` this script is the launcher: `tf_mixed.distribute.
run_local_workers` starts it twice as workers 0 and 1, each with its
``TF_CONFIG`` on free 127.0.0.1 ports, prints their output prefixed
``[worker i]``, stops both if one fails or ``--timeout`` seconds pass, and
then prints what each worker decided. At step ``--overflow_at`` only worker 1
gets an infinite loss; with tf_mixed both workers skip that step and end with
identical weights. On real machines, set ``TF_CONFIG`` yourself and run
``python examples/multi_worker.py --worker`` on each.
"""

import json
import os
import sys
import tempfile

from absl import app, flags

_WORKER = flags.DEFINE_bool("worker", False, "Run as one worker (reads TF_CONFIG).")
_OUT = flags.DEFINE_string("out", "", "Where a worker writes its JSON result ({i}: index).")
_STEPS = flags.DEFINE_integer("steps", 20, "Training steps.")
_OVERFLOW_AT = flags.DEFINE_integer(
    "overflow_at", 5, "Step where worker 1's loss is infinite (0: never).")
_TIMEOUT = flags.DEFINE_integer("timeout", 240, "Seconds to wait for workers.")


def run_worker(out_path):
    """Trains as the worker ``TF_CONFIG`` names; writes the result to ``out_path``."""
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed

    strategy = tf_mixed.distribute.multi_worker_strategy(timeout_seconds=120)
    index = tf_mixed.distribute.current_task().index
    keras.utils.set_random_seed(0)  # same initial weights on every worker
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1),
        ])
        optimizer = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.05))
        optimizer.build(model.trainable_variables)

    def loss_fn(y, pred):
        blow_up = tf.where(y[:, 1:] > 0, np.inf, 1.0)
        return tf.reduce_mean(tf.square(pred - y[:, :1]) * blow_up)

    step = tf_mixed.training.make_train_step(model, loss_fn, optimizer,
                                             strategy=strategy)
    rng = np.random.default_rng(100 + index)  # each worker its own shard
    applied = []
    for number in range(1, _STEPS.value + 1):
        x = rng.standard_normal((16, 8)).astype("float32")
        y = np.zeros((16, 2), "float32")
        y[:, 0] = x.sum(axis=1)
        y[:, 1] = float(index == 1 and number == _OVERFLOW_AT.value)
        result = step(tf.constant(x), tf.constant(y))
        applied.append(bool(result["applied"]))
    with open(out_path.replace("{i}", str(index)), "w") as f:
        json.dump({
            "applied": applied,
            "loss_scale": float(optimizer.loss_scale.numpy()),
            "skipped_steps": int(optimizer.skipped_steps.numpy()),
            "weights": [w.ravel().tolist() for w in model.get_weights()],
        }, f)


def launch():
    """Starts two workers, waits, and compares what they decided."""
    from tf_mixed.distribute import WorkersFailed, run_local_workers

    out = os.path.join(tempfile.mkdtemp(prefix="tf_mixed_mw_"), "worker{i}.json")
    outs = [out.replace("{i}", str(i)) for i in range(2)]
    try:
        run_local_workers(2, [
            sys.executable, os.path.abspath(__file__), "--worker", f"--out={out}",
            f"--steps={_STEPS.value}", f"--overflow_at={_OVERFLOW_AT.value}",
        ], timeout=_TIMEOUT.value)
    except WorkersFailed as error:
        print(f"the workers failed: {error}")
        return 1
    results = []
    for i, out in enumerate(outs):
        with open(out) as f:
            results.append(json.load(f))
        r = results[-1]
        skipped = [n + 1 for n, a in enumerate(r["applied"]) if not a]
        print(f"worker {i}: skipped steps {skipped}, loss scale "
              f"{r['loss_scale']:.0f}, skipped_steps {r['skipped_steps']}")
    same = results[0] == results[1]
    print(f"workers agree on every decision and weight: {same}")
    return 0 if same else 1


def main(argv):
    del argv
    if not _WORKER.value:
        return launch()
    run_worker(_OUT.value)
    return 0


if __name__ == "__main__":
    app.run(main)
