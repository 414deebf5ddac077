"""One worker of the two-process gradient accumulation test.

Run by tests/scaling/test_accumulation.py as
``python _accumulation_worker.py INDEX PORT0,PORT1 OUT.json SKIP``. Each
worker computes its half of every micro-batch (test_accumulation's data and
loss) and applies it through ``LossScaleOptimizer(...,
gradient_accumulation_steps=STEPS)`` under MultiWorkerMirroredStrategy; with
SKIP a window number, worker 1 alone gets NaN gradients at micro-step 2 of
that window. With RESUME ``window,micro`` (a fifth argument), every worker
saves the optimizer after that micro-step, and every worker restores the
chief's saved state into a fresh optimizer and goes on (a sixth argument
``checkpoint``: through ``tf.train.Checkpoint`` instead of the ``.keras``
entries). Writes its weights
and counters to ``OUT.json``.
"""

import json
import os
import sys
import time


def main(index, ports, out_path, skip, resume_at=None, how="keras"):
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.join(tests, "scaling"), os.path.join(tests, "support")]
    import keras
    import numpy as np
    import tensorflow as tf
    import test_accumulation as t

    import tf_mixed

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = keras.Variable(np.zeros(t.FEATURES, np.float32))
        opt = tf_mixed.LossScaleOptimizer(
            keras.optimizers.SGD(t.schedule()), initial_scale=16.0,
            gradient_accumulation_steps=t.STEPS)
        opt.build([w])

    def make_step(opt):
        @tf.function
        def step(xs, ys, start, poison):
            def replica_fn():
                residual = tf.linalg.matvec(xs, start) - ys
                grad = (tf.linalg.matvec(xs, residual, transpose_a=True) / t.MICRO
                        * opt.loss_scale.value)
                grad = tf.where(poison, grad * np.nan, grad)
                return opt.apply([grad], [w])

            return strategy.run(replica_fn)
        return step

    step = make_step(opt)

    x, y = t.data()
    half = t.MICRO // 2
    for window in range(t.WINDOWS):
        start = tf.constant(w.numpy())
        for micro in range(t.STEPS):
            first = (window * t.STEPS + micro) * t.MICRO + index * half
            poison = index == 1 and window == skip and micro == 2
            step(tf.constant(x[first:first + half]), tf.constant(y[first:first + half]),
                 start, tf.constant(poison))
            if resume_at == (window, micro) and how == "checkpoint":
                # tf.train.Checkpoint: every worker writes (a collective gathers
                # every replica's buffers), the chief into the shared path;
                # every worker then reads the CHIEF's checkpoint.
                folder = os.path.dirname(out_path)
                mine = "chief_ckpt" if index == 0 else f"worker{index}_ckpt"
                tf.train.Checkpoint(optimizer=opt).write(os.path.join(folder, mine, "c"))
                done = os.path.join(folder, "chief_ckpt.done")
                if index == 0:
                    open(done, "w").close()
                while not os.path.exists(done):
                    time.sleep(0.05)  # waits for a file, not for timing luck
                with strategy.scope():
                    resumed = tf_mixed.LossScaleOptimizer(
                        keras.optimizers.SGD(t.schedule()), initial_scale=16.0,
                        gradient_accumulation_steps=t.STEPS)
                    resumed.build([w])
                tf.train.Checkpoint(optimizer=resumed).read(
                    os.path.join(folder, "chief_ckpt", "c")).assert_consumed()
                opt, step = resumed, make_step(resumed)
            elif resume_at == (window, micro):
                # Every worker saves (a collective gathers all replicas); every
                # worker then restores the CHIEF's file into a fresh optimizer.
                # As a .keras file does: the wrapper's own entry and the inner's.
                own, inner = {}, {}
                opt.save_own_variables(own)
                opt.inner_optimizer.save_own_variables(inner)
                store = {**{f"own_{k}": v for k, v in own.items()},
                         **{f"inner_{k}": v for k, v in inner.items()}}
                chief = os.path.join(os.path.dirname(out_path), "chief_optimizer.npz")
                if index == 0:
                    np.savez(chief + ".tmp.npz", **store)
                    os.replace(chief + ".tmp.npz", chief)
                while not os.path.exists(chief):
                    time.sleep(0.05)  # waits for a file, not for timing luck
                with np.load(chief) as saved:
                    loaded = {key: saved[key] for key in saved.files}
                with strategy.scope():
                    resumed = tf_mixed.LossScaleOptimizer(
                        keras.optimizers.SGD(t.schedule()), initial_scale=16.0,
                        gradient_accumulation_steps=t.STEPS)
                    resumed.build([w])
                resumed.load_own_variables(
                    {k[4:]: v for k, v in loaded.items() if k.startswith("own_")})
                resumed.inner_optimizer.load_own_variables(
                    {k[6:]: v for k, v in loaded.items() if k.startswith("inner_")})
                opt, step = resumed, make_step(resumed)
    with open(out_path, "w") as f:
        json.dump({
            "weights": w.numpy().tolist(),
            "skipped_windows": opt.loss_scale_state().skipped_steps,
            "iterations": int(opt.iterations.numpy()),
        }, f)


if __name__ == "__main__":
    skip = None if sys.argv[4] == "none" else int(sys.argv[4])
    resume_at = tuple(map(int, sys.argv[5].split(","))) if len(sys.argv) > 5 else None
    how = sys.argv[6] if len(sys.argv) > 6 else "keras"
    main(int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")], sys.argv[3], skip,
         resume_at, how)
