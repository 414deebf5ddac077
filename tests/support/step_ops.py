"""The ops of ``fit``'s train step, each cond's branches apart (docs/skipped-step.md).

``python tests/support/step_ops.py`` builds the overhead suite's model (mlp,
mixed_float16) with Keras's wrapper and with tf_mixed's optimizer and monitor,
and prints, per graph, the ops traced (function arguments left out).
"""

from __future__ import annotations


def census(model, batch) -> dict:
    """``{"ops": n, "branches": {name: census}}`` of ``model.train_step`` on ``batch``."""
    import tensorflow as tf

    from tf_mixed._internal.shims import function_graphs

    def walk(graph):
        ops = [op for op in graph.get_operations() if op.type != "Placeholder"]
        return {"ops": len(ops),
                "branches": {f"{op.name}.{attr}": walk(g)
                             for op in ops for attr, g in function_graphs(op)}}

    specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in batch)
    return walk(tf.function(model.train_step).get_concrete_function(specs).graph)


def _show(node, indent="  "):
    for name, branch in node["branches"].items():
        print(f"{indent}{name}: {branch['ops']} ops")
        _show(branch, indent + "  ")


def main():
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.bench import models
    from tf_mixed.policy import global_policy as policy

    x = np.random.rand(32, 28, 28, 1).astype("float32")
    y = np.random.randint(0, 10, 32).astype("int32")
    for name in ("keras", "tf_mixed"):
        keras.backend.clear_session()  # resets the policy: set it after
        with policy.policy_scope("mixed_float16"):
            keras.utils.set_random_seed(0)
            model = models.build("mlp", (28, 28, 1), 10)
            adam = keras.optimizers.Adam(1e-3)
            optimizer = tf_mixed.wrap_optimizer(adam) if name == "tf_mixed" else adam
            callbacks = [tf_mixed.LossScaleMonitor()] if name == "tf_mixed" else []
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
            model.fit(x, y, batch_size=32, verbose=0, callbacks=callbacks)
            result = census(model, (tf.constant(x), tf.constant(y)))
        print(f"{name} ({type(model.optimizer).__module__.split('.')[0]}): "
              f"{result['ops']} ops outside any cond")
        _show(result)


if __name__ == "__main__":
    main()
