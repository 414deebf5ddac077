"""One worker of the two-process float8 agreement test.

Run by tests/test_float8_multi_worker.py as
``python _float8_worker.py INDEX PORT0,PORT1 OUT.json MODE``. Trains the
model of tests/_float8_common.py for 3 steps under
MultiWorkerMirroredStrategy; worker ``i`` feeds rows ``[4i, 4i + 4)`` of
each global batch (worker 1's shard is 10x larger). ``MODE`` is
``tf_mixed`` (``tf_mixed.wrap_optimizer``) or ``keras`` (plain SGD, the
defect). Writes every float8 scale and history it holds to ``OUT.json``.
"""

import json
import os
import sys


def main(index, ports, out_path, mode):
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "support"))
    import keras
    import tensorflow as tf
    from _float8_common import (
        GLOBAL_BATCH,
        batches,
        build_model,
        float8_values,
        loss_fn,
    )

    import tf_mixed

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(0.01)
        if mode == "tf_mixed":
            optimizer = tf_mixed.wrap_optimizer(optimizer)
        optimizer.build(model.trainable_variables)
    step = tf_mixed.training.make_train_step(model, loss_fn, optimizer,
                                             strategy=strategy)
    x, y = batches(3)
    half = GLOBAL_BATCH // 2
    for i in range(3):
        rows = slice(index * half, (index + 1) * half)
        step(tf.constant(x[i][rows]), tf.constant(y[i][rows]))
    with open(out_path, "w") as f:
        json.dump({"replicas": strategy.num_replicas_in_sync,
                   "values": float8_values(model)}, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")],
         sys.argv[3], sys.argv[4])
