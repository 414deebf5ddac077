"""The overhead suite's train steps timed step by step, for BUILD_NOTES' figures.

``python tests/support/overhead_split.py [--steps=400] [--own_weights]
[--paths=keras,tf_mixed,keras,tf_mixed]`` builds the overhead suite's mlp
(mixed_float16), one set-up per name in ``--paths`` (a name may repeat: each is
its own set-up), runs one ``fit`` step on each to build its train function,
then calls those train functions one step at a time in rotated order
(`tf_mixed._internal.measuring.rotated`), and prints each set-up's median step
time against the first's, with a 90% bootstrap interval over blocks of 10
steps. Set-ups share one set of weights (and one Adam) unless
``--own_weights``. Names: ``keras`` (Keras's wrapper, as ``compile`` makes
it), ``tf_mixed`` (``wrap_optimizer`` + ``LossScaleMonitor``: the skip
contract is in the train function), ``tf_mixed_optimizer`` (no monitor).

Not a test and not the suite: the train function alone, without ``fit``'s
loop and callbacks, but alternating every step, so drift in the host's load
lands on every set-up alike.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--paths", default="keras,tf_mixed,keras,tf_mixed")
    parser.add_argument("--own_weights", action="store_true")
    args = parser.parse_args()

    import keras

    import tf_mixed
    from tf_mixed._internal import measuring
    from tf_mixed.bench import config as config_module
    from tf_mixed.bench import models, overhead, train
    from tf_mixed.policy import global_policy as policy

    names = args.paths.split(",")
    labels = [f"{n}#{i}" for i, n in enumerate(names)]
    config = config_module.BenchConfig(suite="overhead")
    data = config_module.load_data(config, default_train_size=2048, default_val_size=64)
    train_set = train.batched(data.train, config.batch_size, train=True, seed=0,
                              size=data.train_size)
    with policy.policy_scope("mixed_float16"):
        keras.utils.set_random_seed(0)
        base = models.build("mlp", data.image_shape, data.num_classes)
        adam = keras.optimizers.Adam(1e-3)
        functions, iterators = {}, {}
        for label, name in zip(labels, names):
            if args.own_weights:
                keras.utils.set_random_seed(0)
                model = models.build("mlp", data.image_shape, data.num_classes)
                inner = keras.optimizers.Adam(1e-3)
            else:
                model, inner = overhead._same_weights(base, label.replace("#", "_")), adam
            optimizer = inner if name == "keras" else tf_mixed.wrap_optimizer(inner)
            callbacks = [tf_mixed.LossScaleMonitor()] if name == "tf_mixed" else []
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
            model.fit(train_set, steps_per_epoch=2, verbose=0, callbacks=callbacks)
            functions[label], iterators[label] = model.train_function, iter(train_set)
        times: dict[str, list[float]] = {label: [] for label in labels}
        for index in range(args.steps):
            for label in measuring.rotated(labels, index):
                start = time.perf_counter()
                float(functions[label](iterators[label])["loss"])
                times[label].append(time.perf_counter() - start)
    first = labels[0]
    blocks = {label: [t[i:i + 10] for i in range(0, len(t), 10)] for label, t in times.items()}
    for label in labels:
        low, high = measuring.ratio_interval(blocks[first], blocks[label])
        print(f"{label:22s} {1000 * statistics.median(times[label]):8.3f} ms/step  "
              f"{measuring.pooled_ratio(blocks[first], blocks[label]):.4f}x of {first} "
              f"(90% interval {low:.4f}-{high:.4f})")


if __name__ == "__main__":
    main()
