"""One worker of the two-process communication-dtype test.

Run by tests/integration/test_comm_multi_worker.py as
``python _comm_worker.py INDEX PORT0,PORT1 OUT.json``. Each scenario gets its
own variable and ``LossScaleOptimizer`` under one
MultiWorkerMirroredStrategy (one replica per worker); worker ``i`` builds the
gradient of replica ``i``. Writes what it decided and holds to ``OUT.json``.
"""

import json
import os
import sys

INF = float("inf")
VALUES = [0.3, -1.7, 12.345, 1e-3]


def main(index, ports, out_path):
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from tf_mixed.scaling.optimizer import LossScaleOptimizer

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def setup(values, dtype, scale):
        with strategy.scope():
            var = keras.Variable(values)
            opt = LossScaleOptimizer(keras.optimizers.SGD(2.0**-15),
                                     initial_scale=scale,
                                     communication_dtype=dtype)
            opt.build([var])
        return var, opt

    def make_step(var, opt, make_grad):
        def replica_fn():
            r = tf.cast(
                tf.distribute.get_replica_context().replica_id_in_sync_group,
                tf.float32)
            return opt.apply([make_grad(r, opt)], [var])

        step = tf.function(lambda: strategy.run(replica_fn))
        graph = step.get_concrete_function().graph.as_graph_def()
        nodes = list(graph.node)
        for function in graph.library.function:
            nodes.extend(function.node_def)
        collectives = [(n.op, tf.dtypes.as_dtype(n.attr["T"].type).name)
                       for n in nodes if n.op.startswith("Collective")]
        return step, collectives

    def run(var, opt, make_grad, steps):
        step, collectives = make_step(var, opt, make_grad)
        applied, scales = [], []
        for _ in range(steps):
            applied.append(bool(step()))
            scales.append(float(opt.loss_scale.numpy()))
        return {"applied": applied, "scales": scales,
                "var": [float(x) for x in var.numpy()],
                "iterations": int(opt.iterations.numpy()),
                "collectives": collectives}

    result = {"replicas": strategy.num_replicas_in_sync}
    # A finite step in float16 and in float32 communication.
    for dtype in ("float16", None):
        var, opt = setup([0.0] * 4, dtype, 1024.0)
        result[f"finite_{dtype}"] = run(
            var, opt,
            lambda r, opt: tf.constant(VALUES) * (1.0 + r) * 1024.0, 1)
    # Overflow made by the float16 sum only (see the test for the numbers).
    var, opt = setup([1.0], "float16", 4.0)
    result["half_sum"] = run(
        var, opt, lambda r, opt: tf.fill([1], 24576.0) * opt.loss_scale.value,
        2)
    # inf on worker 1 only.
    var, opt = setup([1.0, 1.0], "float16", 4.0)
    result["inf_worker1"] = run(
        var, opt,
        lambda r, opt: tf.where(r > 0, tf.constant([INF, 4.0]),
                                tf.constant([4.0, 4.0])), 1)
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")],
         sys.argv[3])
