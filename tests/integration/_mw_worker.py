"""One worker of the two-process MultiWorkerMirroredStrategy test.

Run by tests/integration/test_multi_worker.py as
``python _mw_worker.py INDEX PORT0,PORT1 OUT.json BAD_WORKER BAD_STEP [bn]``.
Trains a one-weight linear model for four steps with
``tf_mixed.training.make_train_step``. Worker ``i`` sees the gradient
``1 + 2 * i`` (so the all-reduced mean is 2); at ``BAD_STEP`` (1-based) the
worker ``BAD_WORKER`` alone gets an infinite gradient (-1 means none). With
``bn`` the model also runs its input through a BatchNormalization branch that
does not reach the output, and the bad step's *input* is inf instead: the
forward pass poisons that worker's moving statistics before the skip. Writes
what it decided and what it holds to ``OUT.json``.
"""

import json
import os
import sys


def main(index, ports, out_path, bad_worker, bad_step, bn=False):
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from tf_mixed.scaling.optimizer import LossScaleOptimizer
    from tf_mixed.training import make_train_step

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        inputs = keras.Input((1,))
        outputs = keras.layers.Dense(1, use_bias=False,
                                     kernel_initializer="ones")(inputs)
        if bn:
            branch = keras.layers.BatchNormalization(name="bn")(inputs)
            outputs = outputs + 0.0 * branch  # no effect on finite steps
        model = keras.Model(inputs, outputs)
        optimizer = LossScaleOptimizer(
            keras.optimizers.SGD(0.5), initial_scale=4.0, growth_interval=2
        )
        optimizer.build(model.trainable_variables)

    def loss_fn(y, pred):
        # d loss / d kernel = y[:, 0] (x is 1); y[:, 1] > 0 makes it inf.
        blow_up = tf.where(y[:, 1:] > 0, float("inf"), 1.0)
        return tf.reduce_mean(pred * y[:, :1] * blow_up)

    step = make_train_step(model, loss_fn, optimizer, strategy=strategy)
    applied, scales = [], []
    for number in range(1, 5):
        bad = index == bad_worker and number == bad_step
        x = tf.fill((1, 1), float("inf") if bad and bn else 1.0)
        flag = 1.0 if bad and not bn else 0.0
        y = tf.constant([[1.0 + 2.0 * index, flag]])
        result = step(x, y)
        applied.append(bool(result["applied"]))
        scales.append(float(optimizer.loss_scale.numpy()))
    dense = next(layer for layer in model.layers
                 if isinstance(layer, keras.layers.Dense))
    stats = {}
    if bn:
        layer = model.get_layer("bn")
        stats = {"bn": [[float(c.numpy()[0]) for c in
                         strategy.experimental_local_results(v.value)]
                        for v in (layer.moving_mean, layer.moving_variance)]}
    with open(out_path, "w") as f:
        json.dump({
            **stats,
            "applied": applied,
            "scales": scales,
            "kernel": dense.kernel.numpy().ravel().tolist(),
            "iterations": int(optimizer.iterations.numpy()),
            "skipped_steps": int(optimizer.skipped_steps.numpy()),
            "replicas": strategy.num_replicas_in_sync,
        }, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")],
         sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
         bn=sys.argv[6:] == ["bn"])
