"""The write guard: a step is skipped when any of its writes would not be finite.

Finite gradients can write non-finite state (Adam's second
moment squares |g| > ~1.8e19 to inf; BatchNormalization's statistics of a
huge batch overflow while every gradient stays finite). Under float32,
mixed_bfloat16 and mixed_float16 alike, such a step is skipped with its
reason (tf_mixed.scaling.write_guard), weights, slots, iterations and
forward state left exactly as they were.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import write_guard
from tf_mixed.scaling.optimizer import step_guard
from tf_mixed.scaling.rollback import ForwardState
from tf_mixed.scaling.write_guard import REASONS, SkipReasons

POLICIES = ["float32", "mixed_bfloat16", "mixed_float16"]
INF = float("inf")


def _wrapped(policy, inner):
    """`wrap_optimizer` as a user gets it under ``policy`` (scale 1 unless float16)."""
    keras.config.set_dtype_policy(policy)
    return tf_mixed.wrap_optimizer(inner, initial_scale=4.0)


def _scale(optimizer):
    return float(optimizer.dynamic_scale.numpy()) if optimizer.built else (
        optimizer.config.initial_scale)


# ------------------------------------------------------------- the bounds


def test_the_bound_is_the_largest_value_whose_square_is_finite():
    adam = keras.optimizers.Adam()
    bound = write_guard.update_bound(adam, keras.Variable(1.0))
    assert bound < 2.0 ** 64 and np.isfinite(np.float32(bound) ** 2)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.nextafter(np.float32(bound), np.float32(INF)) ** 2)
    # float16 slots: 255.875 ** 2 = 65472 fits, 256 ** 2 does not.
    half = keras.Variable(np.float16(1.0), dtype="float16")
    assert write_guard.update_bound(adam, half) == 255.875


@pytest.mark.parametrize("name", ["SGD", "Lion", "Adamax"])
def test_linear_optimizers_refuse_only_non_finite_gradients(name):
    inner = getattr(keras.optimizers, name)()
    assert write_guard.update_bound(inner, keras.Variable(1.0)) == math.inf


def test_an_unknown_optimizer_gets_the_square_bound():
    class Mine(keras.optimizers.SGD):  # a user's class, not Keras's own
        pass

    Mine.__module__ = "users_code"
    bound = write_guard.update_bound(Mine(), keras.Variable(1.0))
    assert bound == write_guard.update_bound(keras.optimizers.RMSprop(),
                                             keras.Variable(1.0))


def test_inputs_flag_reads_floating_tensors_only():
    assert write_guard.inputs_flag({"ids": tf.constant([1, 2])}) is None
    assert not bool(write_guard.inputs_flag((tf.ones([2, 3]), tf.constant([1, 2]))))
    bad = np.ones([2, 3], "float32")
    bad[1, 2] = np.nan
    assert bool(write_guard.inputs_flag(({"x": tf.constant(bad)}, tf.constant([1, 2]))))


# ------------------------------------------- an update that would overflow


@pytest.mark.filterwarnings("ignore:.*never went through scale_loss")
@pytest.mark.parametrize("policy", POLICIES)
def test_a_finite_gradient_whose_adam_update_overflows_is_skipped(policy):
    # On main this step was applied: v = 0.001 * g**2 = inf, and the next
    # update wrote NaN into the weight (inf - inf).
    opt = _wrapped(policy, keras.optimizers.Adam(0.5))
    v = keras.Variable(np.array([1.0, 1.0], "float32"))
    scale = _scale(opt)

    @tf.function
    def step(g):
        return opt.apply([g * scale], [v])

    assert not bool(step(tf.constant([1e20, 1.0])))
    np.testing.assert_array_equal(v.numpy(), [1.0, 1.0])
    assert int(opt.iterations.numpy()) == 0
    for slot in opt.inner_optimizer.variables[2:]:
        np.testing.assert_array_equal(slot.numpy(), np.zeros(2))
    state = tf_mixed.loss_scale_state(opt)
    assert state.skip_reasons == SkipReasons(0, 0, 0, 1, 0)
    assert state.skipped_steps == 1
    # The next ordinary step is applied: Adam's first step moves by lr.
    assert bool(step(tf.constant([1.0, 1.0])))
    np.testing.assert_allclose(v.numpy(), [0.5, 0.5], rtol=1e-5)
    assert np.isfinite(v.numpy()).all()


def test_sgd_applies_the_same_gradient():
    opt = _wrapped("float32", keras.optimizers.SGD(0.5))
    v = keras.Variable(np.array([1.0], "float32"))
    assert bool(opt.apply([tf.constant([1e20])], [v]))
    assert v.numpy()[0] == np.float32(1.0) - np.float32(0.5e20)


# ------------------------------------------- forward state that overflows


class _Statistic(keras.layers.Layer):
    """A layer whose forward pass writes a statistic (as BatchNormalization)."""

    def build(self, shape):
        self.kernel = self.add_weight(shape=(), initializer="ones")
        self.moving = self.add_weight(shape=(), initializer="ones", trainable=False)

    def call(self, x, training=False):
        if training:
            self.moving.assign(tf.cast(tf.reduce_max(tf.abs(x)) ** 2, "float32"))
        return x * tf.cast(self.kernel, x.dtype)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_forward_state_that_overflows_is_rolled_back_and_the_step_skipped(policy):
    keras.config.set_dtype_policy(policy)
    model = keras.Sequential([keras.Input((2,)), _Statistic()])
    opt = _wrapped(policy, keras.optimizers.SGD(0.5))
    opt.track_forward_state(model)
    layer = model.layers[0]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = model(x, training=True)
            # Finite loss and gradients whatever the statistic holds.
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * 0.0) + layer.kernel * 1.0
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, model.trainable_variables, opt)

    assert bool(step(tf.constant([[1.0, 2.0]])))
    assert float(layer.moving.numpy()) == 4.0
    assert float(layer.kernel.numpy()) == 0.5
    # 1e20 ** 2 overflows float32: the statistic would be inf.
    assert not bool(step(tf.constant([[1e20, 2.0]])))
    assert float(layer.moving.numpy()) == 4.0
    assert float(layer.kernel.numpy()) == 0.5
    assert tf_mixed.loss_scale_state(opt).skip_reasons == SkipReasons(0, 1, 0, 0, 0)


# --------------------------------------------------------- the reasons


def test_the_first_reason_that_holds_is_the_steps_reason():
    guard = write_guard.StepGuard(forward=ForwardState())
    guard.build(None, accumulating=False)
    big, bad = [tf.constant(1e20)], [tf.constant(INF)]

    def code(flags, grads, applied=False):
        flags = None if flags is None else tf.constant(flags, tf.float32)
        return int(guard.settle(tf.constant(applied), flags, grads))

    assert code([1.0, 1.0], bad) == REASONS.index("input") + 1
    assert code([0.0, 2.0], bad) == REASONS.index("forward") + 1
    assert code([0.0, 0.0], bad) == REASONS.index("gradients") + 1
    assert code(None, big) == REASONS.index("update") + 1
    assert guard.read() == SkipReasons(1, 1, 1, 1, 0)
    assert int(guard.last_reason.numpy()) == REASONS.index("update") + 1
    # An applied step writes nothing.
    assert code(None, big, applied=True) == 0
    assert guard.read() == SkipReasons(1, 1, 1, 1, 0)
    assert int(guard.last_reason.numpy()) == REASONS.index("update") + 1


def test_the_verdict_reads_the_bounds_in_the_finite_check():
    from tf_mixed.scaling import allreduce

    bounds = [write_guard.update_bound(keras.optimizers.Adam(), keras.Variable(1.0))]
    _, within = allreduce.reduce_gradients([tf.constant([1e19, 1.0])], bounds=bounds)
    assert bool(within)
    _, within = allreduce.reduce_gradients([tf.constant([1e20, 1.0])], bounds=bounds)
    assert not bool(within)
    # Still scaled: the bound is multiplied by the scale they carry.
    _, within = allreduce.reduce_gradients([tf.constant([4e19])], bounds=bounds,
                                           bound_scale=tf.constant(4.0))
    assert bool(within)
    _, within = allreduce.reduce_gradients([tf.constant([np.nan])], bounds=[None])
    assert not bool(within)


def test_loss_scale_state_counts_reasons_for_every_kind_of_optimizer():
    assert tf_mixed.loss_scale_state(keras.optimizers.SGD()).skip_reasons == (0,) * 5
    keras_wrapper = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    assert tf_mixed.loss_scale_state(keras_wrapper).skip_reasons is None
    unbuilt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD())
    assert tf_mixed.loss_scale_state(unbuilt).skip_reasons == SkipReasons(0, 0, 0, 0, 0)


@pytest.mark.filterwarnings("ignore:.*no forward state is handed")
def test_noted_inputs_make_the_reason_input_and_are_used_once():
    opt = _wrapped("float32", keras.optimizers.SGD(0.5))
    v = keras.Variable(1.0)
    step_guard(opt).note_inputs((tf.constant([INF]),))
    assert not bool(opt.apply([tf.constant(INF)], [v]))
    # The note is taken by that step; the next one is judged on its own.
    assert not bool(opt.apply([tf.constant(INF)], [v]))
    assert tf_mixed.loss_scale_state(opt).skip_reasons == SkipReasons(1, 0, 1, 0, 0)
    assert float(v.numpy()) == 1.0


# ------------------------------------------------------- several replicas


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*never went through scale_loss")
@pytest.mark.parametrize("replica", [0, 1])
@pytest.mark.parametrize("policy", POLICIES)
def test_forward_state_bad_on_one_replica_skips_every_replica_in_one_collective(
        mirrored, policy, replica):
    keras.config.set_dtype_policy(policy)
    with mirrored.scope():
        v = keras.Variable(np.array([1.0], "float32"))
        stat = tf.Variable(1.0, aggregation=tf.VariableAggregation.NONE)
        opt = tf_mixed.wrap_optimizer(keras.optimizers.Adam(0.5))
        opt.build([v])
        opt.track_forward_state([stat])

    def replica_fn():
        index = tf.distribute.get_replica_context().replica_id_in_sync_group
        stat.assign(tf.where(tf.equal(index, replica), INF, 2.0))
        return opt.apply([tf.constant([1.0])], [v])

    step = tf.function(lambda: mirrored.run(replica_fn))
    collectives = [n for n in step.get_concrete_function().graph.as_graph_def().library
                   .function for n in n.node_def if n.op.startswith("Collective")]
    collectives += [n for n in step.get_concrete_function().graph.as_graph_def().node
                    if n.op.startswith("Collective")]
    assert len(collectives) == 2  # the one all-reduce, entered by each replica
    applied = mirrored.experimental_local_results(step())
    assert [bool(a) for a in applied] == [False, False]
    assert [float(c) for c in mirrored.experimental_local_results(stat)] == [1.0, 1.0]
    np.testing.assert_array_equal(v.numpy(), [1.0])
    assert tf_mixed.loss_scale_state(opt).skip_reasons == SkipReasons(0, 1, 0, 0, 0)
