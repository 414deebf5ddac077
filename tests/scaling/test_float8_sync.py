"""Float8 scales and histories every replica and worker agrees on.

Under MirroredStrategy (2 logical CPUs) with replica 1's shard 10x larger:
every replica holds the same scales and histories, equal to one device fed
the global batch; the checkpoint restores that state and training continues
bit-exact; an inf in one replica's activations skips the step on every
replica and freezes no scale; under mixed_float16 loss-scale changes leave
the output-gradient history in unscaled units. Keras alone fails each of
these (the contrast runs show it).
"""


import keras
import numpy as np
import pytest
import tensorflow as tf
from _float8_common import (
    batches,
    build_model,
    float8_values,
    loss_fn,
    one_device_run,
    shard,
)

import tf_mixed

STEPS = 3


def _sgd():
    return keras.optimizers.SGD(0.01)


def _mirrored_run(strategy, steps, optimizer_fn, *, x=None, y=None,
                  model=None, optimizer=None, start=0, **quantize_args):
    with strategy.scope():
        if model is None:
            model = build_model(**quantize_args)
            optimizer = optimizer_fn()
            optimizer.build(model.trainable_variables)
    step = tf_mixed.training.make_train_step(model, loss_fn, optimizer,
                                             strategy=strategy)
    if x is None:
        x, y = batches(start + steps)
    for i in range(start, start + steps):
        step(shard(strategy, x[i]), shard(strategy, y[i]))
    return model, optimizer


def _assert_replicas_agree(values):
    for name, copies in values.items():
        for copy in copies[1:]:
            np.testing.assert_array_equal(copy, copies[0], err_msg=name)


def _assert_equal_to(values, reference, exact_names=(), rtol=1e-5):
    for name, copies in values.items():
        expected = reference[name][0]
        if name in exact_names:
            np.testing.assert_array_equal(copies[0], expected, err_msg=name)
        else:
            np.testing.assert_allclose(copies[0], expected, rtol=rtol, err_msg=name)


@pytest.mark.slow
def test_one_device_writes_exactly_what_keras_writes():
    ours, _ = one_device_run(STEPS, lambda: tf_mixed.wrap_optimizer(_sgd()))
    keras_model, _ = one_device_run(STEPS, _sgd)
    mine, theirs = float8_values(ours), float8_values(keras_model)
    for name in mine:
        np.testing.assert_array_equal(mine[name][0], theirs[name][0], err_msg=name)


@pytest.mark.slow
def test_replicas_agree_and_equal_one_device(mirrored):
    reference = float8_values(one_device_run(
        STEPS, lambda: tf_mixed.wrap_optimizer(_sgd()))[0])
    model, _ = _mirrored_run(mirrored, STEPS,
                             lambda: tf_mixed.wrap_optimizer(_sgd()))
    values = float8_values(model)
    _assert_replicas_agree(values)
    # The first layer's inputs are the data: the MAX of the shards' amaxes
    # is the global batch's amax, bit for bit.
    _assert_equal_to(values, reference,
                     exact_names=("a/inputs_scale", "a/inputs_amax_history"))
    # The large shard's amax wins: about 10x the small one's.
    history = values["a/inputs_amax_history"][0]
    assert history[0] == pytest.approx(max(np.abs(batches(STEPS)[0][STEPS - 1]).ravel()))
    state = tf_mixed.float8.state(model)
    assert all(t.replicas_agree for t in state.tensors)


@pytest.mark.slow
def test_half_precision_communication_agrees_too(mirrored):
    """float16 gradients: the amaxes take their own float32 collective."""
    model, _ = _mirrored_run(
        mirrored, STEPS,
        lambda: tf_mixed.wrap_optimizer(_sgd(), communication_dtype="float16"))
    values = float8_values(model)
    _assert_replicas_agree(values)
    reference = float8_values(one_device_run(
        STEPS, lambda: tf_mixed.wrap_optimizer(_sgd()))[0])
    np.testing.assert_array_equal(values["a/inputs_amax_history"][0],
                                  reference["a/inputs_amax_history"][0])


@pytest.mark.slow
def test_keras_alone_disagrees(mirrored):
    """Keras alone: each replica keeps its own scales, so the tests above can fail."""
    model, _ = _mirrored_run(mirrored, STEPS, _sgd)
    copies = float8_values(model)["a/inputs_scale"]
    assert copies[0] != copies[1]
    assert not all(t.replicas_agree for t in tf_mixed.float8.state(model).tensors)


@pytest.mark.slow
def test_checkpoint_holds_agreed_state_and_resumes_bit_exact(mirrored, tmp_path):
    def make():
        return tf_mixed.wrap_optimizer(_sgd())

    x, y = batches(2 * STEPS)
    straight, _ = _mirrored_run(mirrored, 2 * STEPS, make, x=x, y=y)

    first, optimizer = _mirrored_run(mirrored, STEPS, make, x=x, y=y)
    path = tf.train.Checkpoint(model=first, optimizer=optimizer).write(
        str(tmp_path / "ckpt"))
    saved = float8_values(first)
    first.save_weights(str(tmp_path / "w.weights.h5"))

    # On one device, the file holds the agreed state (replica 0's copy is
    # every replica's).
    single = build_model()
    single.load_weights(str(tmp_path / "w.weights.h5"))
    for name, copies in float8_values(single).items():
        np.testing.assert_array_equal(copies[0], saved[name][1], err_msg=name)

    with mirrored.scope():
        resumed = build_model()
        resumed_opt = make()
        resumed_opt.build(resumed.trainable_variables)
    tf.train.Checkpoint(model=resumed, optimizer=resumed_opt).read(path) \
        .assert_consumed()
    _mirrored_run(mirrored, STEPS, make, x=x, y=y, model=resumed,
                  optimizer=resumed_opt, start=STEPS)
    ours, theirs = float8_values(resumed), float8_values(straight)
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    for a, b in zip(resumed.weights, straight.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


@pytest.mark.slow
def test_inf_in_one_replica_skips_the_step_everywhere_and_freezes_no_scale(mirrored):
    x, y = batches(6)
    x[1, -1, 0] = np.inf  # replica 1's shard, step 2, first layer's input
    model, optimizer = _mirrored_run(
        mirrored, 6, lambda: tf_mixed.wrap_optimizer(_sgd()), x=x, y=y)
    values = float8_values(model)
    _assert_replicas_agree(values)
    history = np.array(values["a/inputs_amax_history"][0])
    assert np.isfinite(history).all()
    # Five finite amaxes entered (steps 1, 3-6), the inf did not.
    assert np.count_nonzero(history) == 5
    # Keras's quantization clips the inf, so the gradients are finite; the
    # gathered inf amax skipped the step on both replicas (replica 0's own
    # amaxes were finite), and the scale kept following the history.
    state = tf_mixed.loss_scale_state(optimizer)
    assert state.skipped_steps == 1 and int(optimizer.iterations.numpy()) == 5
    scale = values["a/inputs_scale"][0][0]
    before_last = history[1:]  # the history step 6 computed its scale from
    expected = keras.quantizers.compute_float8_scale(
        np.float32(before_last.max()), np.float32(1.0), np.float32(448.0))
    assert scale == pytest.approx(float(expected), rel=1e-6)
    state = tf_mixed.float8.state(model, optimizer=optimizer).get("a", "inputs")
    assert state.nonfinite_amax == 1

    # Keras alone: the inf enters replica 1's history and freezes its scale.
    plain, _ = _mirrored_run(mirrored, 6, _sgd, x=x, y=y)
    copies = float8_values(plain)["a/inputs_amax_history"]
    assert np.isinf(copies[1]).any()


@pytest.mark.slow
@pytest.mark.parametrize("use_tf_mixed", [True, False])
def test_loss_scale_changes_keep_output_gradient_history_unscaled(use_tf_mixed):
    keras.config.set_dtype_policy("mixed_float16")
    inputs = keras.Input((16,))
    outputs = keras.layers.Dense(16, use_bias=False, name="d",
                                 kernel_initializer="ones")(inputs)
    model = keras.Model(inputs, outputs)
    tf_mixed.float8.quantize(model, keep_float32=[])
    if use_tf_mixed:
        optimizer = tf_mixed.LossScaleOptimizer(
            keras.optimizers.SGD(0.0), initial_scale=2.0**10,
            dynamic_growth_steps=2)
    else:
        optimizer = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.0), initial_scale=2.0**10,
            dynamic_growth_steps=2)

    def mean_output(y, pred):  # d loss / d pred = 1 / (4 * 16) = 2**-6
        return tf.reduce_mean(tf.cast(pred, tf.float32))

    step = tf_mixed.training.make_train_step(model, mean_output, optimizer)
    scales = []
    for number in range(1, 6):
        x = np.full((4, 16), 0.5, np.float32)
        if number == 3:
            x[0, 0] = np.nan  # a non-finite step: skipped, scale halves
        step(tf.constant(x), tf.zeros((4, 16)))
        scales.append(float(optimizer.dynamic_scale.numpy()))
    # growth after 2 good steps; the NaN step halves; 2 good steps grow again
    assert scales == [2.0**10, 2.0**11, 2.0**10, 2.0**10, 2.0**11]
    layer = model.get_layer("d")
    history = layer.outputs_grad_amax_history.numpy()
    entered = history[history != 0]
    if use_tf_mixed:
        # Four applied steps, each the unscaled 2**-6, whatever the scale.
        np.testing.assert_array_equal(entered, [2.0**-6] * 4)
        state = tf_mixed.float8.state(model, optimizer=optimizer).get(
            "d", "outputs_grad")
        expected = keras.quantizers.compute_float8_scale(
            np.float32(2.0**-6), np.float32(1.0), np.float32(57344.0))
        assert state.scale == float(expected)
        # The variable Keras divides the *scaled* gradient by carries the
        # next step's loss scale.
        assert layer.outputs_grad_scale.numpy() == float(expected) * 2.0**11
    else:
        # Keras records scaled units: 2**-6 times the scale of each step.
        assert sorted(set(entered.tolist())) != [2.0**-6]
