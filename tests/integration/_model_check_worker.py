"""One worker of tests/integration/test_model_check_multi_worker.py.

    python _model_check_worker.py CONFIG.json

Started by `tf_mixed.distribute.workers.run_local_workers` (which sets
``TF_CONFIG``). Trains a small model under ``enable("auto")`` (auto's host
choice faked to mixed_bfloat16) with `LossScaleMonitor`, whose check times
the model's own steps with a faked clock that disagrees between workers, and
writes what this worker decided to ``out`` (``{i}``: the worker index). The
config (JSON) holds ``out`` and ``cache`` (worker 0's cache directory, holding
a verdict written for this model: a worker that read it would skip the rounds
its peer runs).
"""

import json
import os
import sys

PER_WORKER_BATCH = 4
STEPS = 24
FEATURES = 4
# Each worker's faked step seconds: worker 0 sees bfloat16 twice float32's
# speed, worker 1 a sixth of it. Alone, worker 1 would move to float32; the
# mean of the two workers' ratios, (2 + 1/6) / 2 = 1.083x, keeps bfloat16.
SECONDS = [{"bfloat16": 0.01, "float32": 0.02}, {"bfloat16": 0.06, "float32": 0.01}]


def build(keras, tf_mixed):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(1),
        tf_mixed.Float32Output(),
    ], name="checked")
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0625)), loss="mse")
    return model


def main(config):
    os.environ["TF_MIXED_MODEL_CHECK"] = "1"
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.distribute import cluster
    from tf_mixed.policy import global_policy, model_check

    task = cluster.current_task()
    index = task.index
    os.environ["TF_MIXED_CACHE_DIR"] = config["cache"] if index == 0 else config["cache"] + "-1"
    global_policy.resolve_auto = lambda info=None, measure=None: (
        "mixed_bfloat16", "host probe (faked)")
    strategy = cluster.multi_worker_strategy(timeout_seconds=60)
    tf_mixed.enable("auto")
    with strategy.scope():
        model = build(keras, tf_mixed)
    if index == 0:  # a cached "float32 is faster" for this model: must not be read
        key = model_check.cache_key(model_check.model_digest(model, None), "mixed_bfloat16")
        model_check.write_cached(key, model_check.Figures(0.5, 0.4, 0.6, 0.01, 0.02, 5), 1.0)
    hidden = model.get_layer("hidden")
    now = [0.0]

    def clock():  # two readings a step: half the step each
        now[0] += SECONDS[index][hidden.compute_dtype] / 2
        return now[0], now[0]

    model_check.clock = clock

    def per_worker(context):
        rng = np.random.default_rng(context.input_pipeline_id)
        x = rng.normal(size=(STEPS * PER_WORKER_BATCH, FEATURES)).astype("float32")
        return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(
            context.get_per_replica_batch_size(2 * PER_WORKER_BATCH))

    monitor = tf_mixed.LossScaleMonitor()
    model.fit(strategy.distribute_datasets_from_function(per_worker), epochs=1, verbose=0,
              callbacks=[monitor])
    verdict = monitor.model_check.verdict
    result = {"worker": index, "action": verdict.action, "policy": verdict.policy,
              "cached": verdict.cached, "figures": verdict.figures.as_list(),
              "rounds": monitor.model_check.rounds.rounds() if monitor.model_check.rounds
              else None,
              "hidden": hidden.compute_dtype, "message": verdict.message,
              "weights": [w.ravel().tolist() for w in model.get_weights()]}
    out = config["out"].replace("{i}", str(index))
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
