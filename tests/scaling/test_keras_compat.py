"""tf-keras's LossScaleOptimizer tests, translated: the last differences (issue 34.5)."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed._internal.warning import MixedPrecisionWarning


def test_get_scaled_loss_scales_any_tensor_as_tf_keras():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0)
    per_example = tf.constant([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(opt.get_scaled_loss(per_example).numpy(), [8.0, 16.0, 24.0])
    matrix = tf.ones((2, 2), "float16")
    scaled = opt.get_scaled_loss(matrix)
    assert scaled.dtype == tf.float32 and scaled.shape == (2, 2)
    np.testing.assert_array_equal(scaled.numpy(), np.full((2, 2), 8.0))
    np.testing.assert_array_equal(opt.get_scaled_loss(lambda: per_example)().numpy(),
                                  [8.0, 16.0, 24.0])
    assert float(opt.get_scaled_loss(tf.constant(0.5)).numpy()) == 4.0
    with pytest.raises(ValueError, match="scalar"):
        opt.scale_loss(per_example)  # Keras 3's name keeps asking for a scalar


def test_get_scaled_loss_of_a_per_example_loss_trains_as_the_mean_would():
    var = keras.Variable([1.0, 1.0])
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    with tf.GradientTape() as tape:
        per_example = var * tf.constant([1.0, 3.0])
        scaled = opt.get_scaled_loss(per_example)
    grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
    opt.apply_gradients(zip(grads, [var]))
    np.testing.assert_array_equal(var.numpy(), [0.0, -2.0])


def test_loss_scale_reads_as_tf_keras_tensor():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=8.0)
    before = opt.loss_scale
    assert tf.is_tensor(before) and before.dtype == tf.float32 and float(before) == 8.0
    opt.build([keras.Variable(1.0)])
    tensor = tf.convert_to_tensor(opt.loss_scale)
    assert tensor.dtype == tf.float32 and tensor.shape == () and float(tensor) == 8.0
    assert float(opt.loss_scale * 2.0) == 16.0 and float(opt.loss_scale.numpy()) == 8.0


@pytest.mark.parametrize("inner", [
    lambda: tf_mixed.LossScaleOptimizer(keras.optimizers.SGD()),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
], ids=["tf_mixed", "keras"])
def test_wrapping_a_wrapper_is_a_type_error_as_tf_keras(inner):
    with pytest.raises(TypeError, match="cannot wrap another loss-scale optimizer"):
        tf_mixed.LossScaleOptimizer(inner())


def test_an_unbuilt_wrapper_in_a_tf_function_under_mirrored_is_refused_naming_build(mirrored):
    with mirrored.scope():
        var = keras.Variable(1.0)
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=2.0)

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(var * 2.0)
            return opt.apply(tape.gradient(scaled, [var]), [var])

        return mirrored.run(replica_fn)

    with pytest.raises(ValueError, match=r"must be built before.*optimizer.build"):
        step()


def test_a_wrapper_made_every_batch_and_dropped_is_said_once():
    inner = keras.optimizers.SGD(0.1)
    var = keras.Variable(1.0)
    with pytest.warns(MixedPrecisionWarning) as record:
        for _ in range(4):
            opt = tf_mixed.LossScaleOptimizer(inner, initial_scale=4.0)
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(var * 2.0)
            opt.apply(tape.gradient(scaled, [var]), [var])
            del opt, tape, scaled
            gc.collect()
    said = [str(w.message) for w in record if "never adapts" in str(w.message)]
    assert len(said) == 1
    assert "earlier wrapper (now dropped)" in said[0] and "Create the wrapper once" in said[0]
