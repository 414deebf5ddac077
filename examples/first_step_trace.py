"""CPU time of a `make_train_step` loop's first step (its trace), with and
without AutoGraph converting tf_mixed's update pipeline.

    python examples/first_step_trace.py             # as shipped: apply not converted
    python examples/first_step_trace.py --convert   # apply converted, as before

`LossScaleOptimizer.apply` is marked `tf.autograph.experimental.do_not_convert`
(`fit` calls it from Keras's own, unconverted code). ``--convert`` gives the
class back its undecorated `apply`, so the loop's `tf.function` converts the
whole pipeline below it. Each run is a fresh process: run both a few times,
alternating, and read the spread (docs/custom-loops.md).
"""

import argparse
import os
import time

import keras
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling.optimizer import LossScaleOptimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--convert", action="store_true",
                        help="let AutoGraph convert LossScaleOptimizer.apply")
    args = parser.parse_args()
    if args.convert:
        LossScaleOptimizer.apply = LossScaleOptimizer.apply.__wrapped__
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1, use_bias=False)(inputs))
    optimizer = LossScaleOptimizer(keras.optimizers.SGD(0.25), initial_scale=4.0)
    step = tf_mixed.training.make_train_step(
        model, lambda y, p: tf.reduce_mean(tf.square(p - y)), optimizer)
    x, y = tf.constant([[1.0, 1.0]]), tf.constant([[0.0]])
    before, wall = os.times(), time.perf_counter()
    result = step(x, y)
    after = os.times()
    cpu = after.user + after.system - before.user - before.system
    print(f"first step ({'converted' if args.convert else 'not converted'}): "
          f"{cpu:.2f} s CPU, {time.perf_counter() - wall:.2f} s wall; "
          f"applied={bool(result['applied'])}")


if __name__ == "__main__":
    main()
