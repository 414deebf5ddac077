"""MultiWorkerMirroredStrategy on one machine: two workers, one overflows.

    python examples/multi_worker.py [--steps=20] [--overflow_at=5]
        [--timeout=240]

With no ``--worker_index`` this script is the launcher: it picks two free
127.0.0.1 ports, starts itself twice as workers 0 and 1 with ``TF_CONFIG``
set, waits (at most ``--timeout`` seconds), and prints what each worker
decided. At step ``--overflow_at`` only worker 1 gets an infinite loss; with
tf_mixed both workers skip that step and end with identical weights. On real
machines, set ``TF_CONFIG`` yourself and run the worker part on each.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile

from absl import app
from absl import flags

_WORKER = flags.DEFINE_integer("worker_index", None, "Run as this worker.")
_PORTS = flags.DEFINE_string("ports", "", "Comma-separated worker ports.")
_OUT = flags.DEFINE_string("out", "", "Where a worker writes its JSON result.")
_STEPS = flags.DEFINE_integer("steps", 20, "Training steps.")
_OVERFLOW_AT = flags.DEFINE_integer(
    "overflow_at", 5, "Step where worker 1's loss is infinite (0: never).")
_TIMEOUT = flags.DEFINE_integer("timeout", 240, "Seconds to wait for workers.")


def run_worker(index, ports, out_path):
    """Trains as worker ``index`` and writes the result to ``out_path``."""
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
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
    with open(out_path, "w") as f:
        json.dump({
            "applied": applied,
            "loss_scale": float(optimizer.loss_scale.numpy()),
            "skipped_steps": int(optimizer.skipped_steps.numpy()),
            "weights": [w.ravel().tolist() for w in model.get_weights()],
        }, f)


def free_ports(count):
    """``count`` TCP ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch():
    """Starts two workers, waits, and compares what they decided."""
    ports = ",".join(str(p) for p in free_ports(2))
    workdir = tempfile.mkdtemp(prefix="tf_mixed_mw_")
    outs = [os.path.join(workdir, f"worker{i}.json") for i in range(2)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), f"--worker_index={i}",
             f"--ports={ports}", f"--out={outs[i]}", f"--steps={_STEPS.value}",
             f"--overflow_at={_OVERFLOW_AT.value}"],
            env=env)
        for i in range(2)
    ]
    try:
        codes = [p.wait(timeout=_TIMEOUT.value) for p in procs]
    except subprocess.TimeoutExpired:
        print(f"workers did not finish in {_TIMEOUT.value} s")
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        print(f"worker exit codes: {codes}")
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
    if _WORKER.value is None:
        return launch()
    run_worker(_WORKER.value, [int(p) for p in _PORTS.value.split(",")],
               _OUT.value)
    return 0


if __name__ == "__main__":
    app.run(main)
