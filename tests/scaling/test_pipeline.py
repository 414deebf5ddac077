"""The step pipeline's stages: where the division by the loss scale happens."""

import keras
import numpy as np
import tensorflow as tf

from tf_mixed.scaling import pipeline


def _variables():
    plain = tf.Variable([1.0, 2.0])
    overwritten = tf.Variable([0.0])
    overwritten.overwrite_with_gradient = True  # as Keras marks float8 scales
    return [plain, overwritten]


def test_divide_all_leaves_what_keras_overwrites_with_its_gradient():
    grads = [tf.constant([8.0, 16.0]), tf.constant([3.0])]
    out = pipeline.divide_all(grads, _variables(), tf.constant(8.0))
    np.testing.assert_array_equal(out[0], [1.0, 2.0])
    assert out[1] is grads[1]


def test_a_deferred_division_returns_the_gradients_scaled_with_their_divisor():
    grads = [tf.constant([8.0, 16.0]), tf.constant([3.0])]
    scale = tf.constant(8.0)
    now = pipeline.reduce_with_flags(grads, _variables(), scale, False, None)
    later = pipeline.reduce_with_flags(grads, _variables(), scale, False, None,
                                       defer_division=True)
    np.testing.assert_array_equal(now[0][0], [1.0, 2.0])
    assert now[5] is None
    np.testing.assert_array_equal(later[0][0], [8.0, 16.0])  # still scaled
    assert later[5] is scale and bool(later[2])
    # Gradients the caller already unscaled (one replica) have nothing left to divide.
    unscaled = pipeline.reduce_with_flags(grads, _variables(), scale, True, None,
                                          defer_division=True)
    assert unscaled[5] is None


def test_a_skipped_step_divides_nothing_an_applied_step_divides_in_its_branch():
    import tf_mixed

    keras.utils.set_random_seed(0)
    variable = keras.Variable([1.0, 2.0])
    optimizer = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)

    @tf.function
    def step(c):
        with tf.GradientTape() as tape:
            scaled = optimizer.scale_loss(tf.reduce_sum(variable * c))
        optimizer.apply(tape.gradient(scaled, [variable]), [variable])

    graph = step.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
    outside = [op.type for op in graph.get_operations()]
    assert "RealDiv" not in outside  # the division sits in the applied branch only
    step(tf.constant([1.0, 2.0]))  # gradient [4, 8] scaled by 4: an update of -[1, 2]
    np.testing.assert_array_equal(variable.numpy(), [0.0, 0.0])
    step(tf.constant([np.inf, 2.0]))  # skipped: nothing applied
    np.testing.assert_array_equal(variable.numpy(), [0.0, 0.0])
