"""One worker of tests/integration/test_heal_multi_worker.py.

    python _heal_worker.py CONFIG.json

Started by `tf_mixed.distribute.workers.run_local_workers` (which sets
``TF_CONFIG``). Trains a small model with `tf_mixed.callbacks.Heal` under
MultiWorkerMirroredStrategy; only worker 1's shard overflows float16 in the
``gate`` layer (one row per step), so worker 0 sees finite values only and
heals because the all-reduced flags say so. Writes what it saw as JSON to
``out`` with ``{i}`` replaced by its index.
"""

import json
import sys

import numpy as np

PER_WORKER_BATCH = 4
STEPS = 8


def main(config):
    import keras
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.distribute import cluster as distribute

    task = distribute.current_task()
    index = task.index if task else 0
    strategy = distribute.multi_worker_strategy(timeout_seconds=60)
    tf_mixed.enable("mixed_float16", quiet=True)

    class Gate(keras.layers.Layer):
        def call(self, x):
            squared = x * x
            return squared / (1.0 + squared)

    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)),
                                  keras.layers.Dense(4, name="d1", kernel_initializer="ones"),
                                  Gate(name="gate"), keras.layers.Dense(2, name="d2")])
        model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)), "mse")

    def per_worker(context):
        worker = context.input_pipeline_id
        x = np.full((STEPS * PER_WORKER_BATCH, 4), 0.1, "float32")
        if worker == 1:
            x[::PER_WORKER_BATCH] = 100.0
        y = np.zeros((STEPS * PER_WORKER_BATCH, 2), "float32")
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(
            context.get_per_replica_batch_size(2 * PER_WORKER_BATCH))

    heal = tf_mixed.callbacks.Heal()
    history = model.fit(strategy.distribute_datasets_from_function(per_worker), epochs=1,
                        verbose=0, callbacks=[tf_mixed.LossScaleMonitor(), heal])
    result = {
        "worker": index,
        "healings": heal.healings,
        "healed_layers": list(heal.healed_layers),
        "gate_dtype": model.get_layer("gate").compute_dtype,
        "skipped_steps": model.optimizer.loss_scale_state().skipped_steps,
        "healed_logged": history.history["healed_layers"],
        "weights": [w.tolist() for w in model.get_weights()],
    }
    with open(config["out"].replace("{i}", str(index)), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
