"""tf_mixed.scaling.allreduce and LossScaleOptimizer(communication_dtype=...).

Under the ``mirrored`` fixture (two logical CPUs) each replica builds its own
gradient from ``replica_id_in_sync_group``; the reduced gradients and the
verdict must be the same on both replicas, the sum must be the one Keras
computes (exactly in float32, within float16 rounding in float16), and the
step must be reduced in ONE collective with no separate flag collective.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_mixed.scaling import allreduce
from tf_mixed.scaling.optimizer import LossScaleOptimizer, wrap_optimizer
from tf_mixed.scaling.portable import constructor_args

# These tests hand the optimizer gradients they made themselves (chosen values,
# infs on one replica), not a scaled loss's: tf_mixed's misuse check warns about
# that (tested in tests/scaling/test_optimizer.py); here it is expected, not news.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*never\ went\ through\ scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")

INF = float("inf")
HALF_EPS = 2.0**-10  # float16 relative rounding step


def _locals(strategy, value):
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def _reduce_on_replicas(strategy, make_grads, dtype, **kwargs):
    """Runs reduce_gradients on every replica; per-replica numpy results."""

    def replica_fn():
        replica = tf.cast(
            tf.distribute.get_replica_context().replica_id_in_sync_group,
            tf.float32)
        grads = make_grads(replica)
        reduced, finite = allreduce.reduce_gradients(grads, dtype, **kwargs)
        dense = [tf.convert_to_tensor(g) for g in reduced]
        return dense, finite

    dense, finite = tf.function(lambda: strategy.run(replica_fn))()
    # [gradient][replica] numpy arrays, [replica] verdicts.
    return ([_locals(strategy, d) for d in dense],
            [bool(f) for f in _locals(strategy, finite)])


def _collectives(concrete_function):
    """The collective ops of a traced function, nested functions included."""
    graph_def = concrete_function.graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return [n for n in nodes if n.op.startswith("Collective")]


# ------------------------------------------------------------ validation


@pytest.mark.slow
@pytest.mark.parametrize("value,name", [(None, None), ("float32", None),
                                        ("float16", "float16"),
                                        ("bfloat16", "bfloat16")])
def test_valid_names_are_canonical(value, name):
    assert allreduce.validate_communication_dtype(value) == name


@pytest.mark.slow
@pytest.mark.parametrize("value", ["fp16", "half", "", "Float16", 16,
                                   tf.float16, True])
def test_bad_dtype_is_refused_with_the_choices(value):
    with pytest.raises(ValueError) as error:
        allreduce.validate_communication_dtype(value)
    message = str(error.value)
    for choice in ("None", "'float32'", "'float16'", "'bfloat16'"):
        assert choice in message
    assert f"communication_dtype={value!r}" in message
    with pytest.raises(ValueError, match="communication_dtype"):
        LossScaleOptimizer(keras.optimizers.SGD(), communication_dtype=value)


def test_one_replica_is_a_no_op_without_warnings():
    grads = [tf.constant([1.0, 2.0]), None,
             tf.IndexedSlices(tf.constant([[3.0]]), tf.constant([1]),
                              tf.constant([4, 1]))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reduced, finite = allreduce.reduce_gradients(grads, "float16")
    assert reduced[0] is grads[0] and reduced[1] is None
    assert reduced[2] is grads[2]
    assert bool(finite)
    _, finite = allreduce.reduce_gradients([tf.constant([INF])], "bfloat16")
    assert not bool(finite)


def test_local_needs_one_flag_per_gradient():
    with pytest.raises(ValueError, match="2 flags for 1 gradients"):
        allreduce.reduce_gradients([tf.constant(1.0)], local=[True, False])


def test_wire_bytes_halve_in_half_precision():
    shapes = [((1000, 1000), "float32"), ((1000,), "float32")]
    assert allreduce.wire_bytes(shapes) == 4 * 1_001_000
    assert allreduce.wire_bytes(shapes, "float16") == 2 * 1_001_000
    assert allreduce.wire_bytes(shapes, "bfloat16") == 2 * 1_001_000


# ------------------------------------------------ reduce_gradients, 2 replicas


def test_float32_sum_is_exact_and_shared(mirrored):
    (kernel, bias), finite = _reduce_on_replicas(
        mirrored,
        lambda r: [tf.fill([2, 3], 1.0 + r), tf.fill([3], 0.1 * (r + 1))],
        None)
    assert finite == [True, True]
    for copy in kernel:
        np.testing.assert_array_equal(copy, np.full([2, 3], 3.0))
    np.testing.assert_array_equal(bias[0], bias[1])
    np.testing.assert_array_equal(bias[0], np.float32(0.1) + np.float32(0.2))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_sum_is_close_and_identical_on_replicas(mirrored, dtype):
    values = np.array([0.1, -1.7, 12.345, 3e-3], np.float32)
    (grad,), finite = _reduce_on_replicas(
        mirrored, lambda r: [tf.constant(values) * (1.0 + r)], dtype)
    assert finite == [True, True]
    assert grad[0].dtype == np.float32
    np.testing.assert_array_equal(grad[0], grad[1])
    step = HALF_EPS if dtype == "float16" else 2.0**-7
    np.testing.assert_allclose(grad[0], 3 * values, rtol=2 * step)
    assert not np.array_equal(grad[0], 3 * values)  # it did travel narrow


def test_pre_division_keeps_a_representable_mean_finite(mirrored):
    # 40000 + 40000 overflows float16 (max 65504); 20000 + 20000 does not.
    (grad,), finite = _reduce_on_replicas(
        mirrored, lambda r: [tf.fill([2], 40000.0)], "float16")
    assert finite == [True, True]
    for copy in grad:
        np.testing.assert_array_equal(copy, [80000.0, 80000.0])


@pytest.mark.slow
@pytest.mark.parametrize("dtype,expected", [(None, True), ("float16", False),
                                            ("bfloat16", True)])
def test_overflow_made_by_the_half_sum_is_caught(mirrored, dtype, expected):
    # Each replica sends 1e5 / 2 = 5e4 (a finite float16); the sum 1e5 is
    # not a float16. float32 and bfloat16 carry it.
    (grad,), finite = _reduce_on_replicas(
        mirrored, lambda r: [tf.fill([3], 1e5)], dtype)
    assert finite == [expected, expected]
    assert np.isfinite(grad[0]).all() == expected
    np.testing.assert_array_equal(grad[0], grad[1])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("bad", [INF, float("nan")], ids=["inf", "nan"])
def test_non_finite_on_replica_1_only_is_seen_by_both(mirrored, dtype, bad):
    def grads(r):
        return [tf.ones([2]), tf.where(r > 0, tf.constant([bad, 1.0]),
                                       tf.constant([1.0, 1.0]))]

    _, finite = _reduce_on_replicas(mirrored, grads, dtype)
    assert finite == [False, False]


@pytest.mark.slow
def test_sparse_gradients_stay_sparse_and_sum(mirrored):
    seen = {}

    def replica_fn():
        r = tf.cast(
            tf.distribute.get_replica_context().replica_id_in_sync_group,
            tf.float32)
        sparse = tf.IndexedSlices(tf.fill([1, 2], 1.0 + r),
                                  tf.cast(tf.reshape(r, [1]), tf.int64),
                                  tf.constant([3, 2], tf.int64))
        reduced, finite = allreduce.reduce_gradients(
            [tf.ones([2]), sparse], "float16")
        seen["type"] = type(reduced[1])
        return tf.convert_to_tensor(reduced[1]), finite

    dense, finite = tf.function(lambda: mirrored.run(replica_fn))()
    assert seen["type"] is tf.IndexedSlices
    assert [bool(f) for f in _locals(mirrored, finite)] == [True, True]
    for copy in _locals(mirrored, dense):
        np.testing.assert_array_equal(copy, [[1, 1], [2, 2], [0, 0]])


def test_local_gradients_are_not_summed_but_join_the_verdict(mirrored):
    def grads(r):
        local = tf.where(r > 0, tf.constant([INF]), tf.constant([5.0]))
        return [tf.ones([2]), local]

    (_, local), finite = _reduce_on_replicas(
        mirrored, lambda r: [tf.ones([2]), tf.fill([1], 5.0 + r)], "float16",
        local=[False, True])
    assert finite == [True, True]
    assert [float(c[0]) for c in local] == [5.0, 6.0]
    _, finite = _reduce_on_replicas(mirrored, grads, "float16",
                                    local=[False, True])
    assert finite == [False, False]


def test_bfloat16_over_nccl_is_refused(mirrored, monkeypatch):
    from tf_mixed._internal import shims as _internals

    monkeypatch.setattr(_internals, "reduces_with_nccl", lambda s: True)
    with pytest.raises(ValueError, match="NCCL.*float16"):
        _reduce_on_replicas(mirrored, lambda r: [tf.ones([2])], "bfloat16")
    (grad,), _ = _reduce_on_replicas(mirrored, lambda r: [tf.ones([2])],
                                     "float16")
    np.testing.assert_array_equal(grad[0], [2.0, 2.0])


# ------------------------------------------- LossScaleOptimizer, 2 replicas


def _setup(strategy, values, **knobs):
    with strategy.scope():
        var = keras.Variable(values)
        opt = LossScaleOptimizer(keras.optimizers.SGD(2.0**-15), **knobs)
        opt.build([var])
    return var, opt


def _step(strategy, opt, var, make_grad):
    def replica_fn():
        r = tf.cast(
            tf.distribute.get_replica_context().replica_id_in_sync_group,
            tf.float32)
        return opt.apply([make_grad(r)], [var])

    return tf.function(lambda: strategy.run(replica_fn))


@pytest.mark.slow
def test_float16_update_matches_float32_within_rounding(mirrored):
    values = np.array([0.3, -1.7, 12.345, 1e-3], np.float32)
    results = {}
    for dtype in (None, "float16"):
        var, opt = _setup(mirrored, np.zeros(4, np.float32),
                          initial_scale=1024.0, communication_dtype=dtype)
        # Scaled gradient of replica r: values * (1 + r) * scale.
        step = _step(mirrored, opt, var,
                     lambda r: tf.constant(values) * (1.0 + r) * 1024.0)
        applied = step()
        assert [bool(a) for a in _locals(mirrored, applied)] == [True, True]
        copies = _locals(mirrored, var.value)
        np.testing.assert_array_equal(copies[0], copies[1])
        results[dtype] = copies[0]
    np.testing.assert_array_equal(results[None], -3 * values * 2.0**-15)
    np.testing.assert_allclose(results["float16"], results[None],
                               rtol=2 * HALF_EPS)


def test_half_sum_overflow_is_skipped_everywhere_and_backs_off(mirrored):
    # Unscaled gradient 24576 = 1.5 * 2**14 on each replica. At scale 4 each
    # replica sends 4 * 24576 / 2 = 49152 (a float16); the sum 98304 is not:
    # skipped, scale 2. At scale 2: 24576 + 24576 = 49152 fits: applied,
    # update lr * 2 * 24576 = 2**-15 * 49152 = 1.5.
    var, opt = _setup(mirrored, [1.0], initial_scale=4.0,
                      communication_dtype="float16")
    step = _step(mirrored, opt, var,
                 lambda r: tf.fill([1], 24576.0) * opt.loss_scale.value)
    assert [bool(a) for a in _locals(mirrored, step())] == [False, False]
    for copy in _locals(mirrored, var.value):
        np.testing.assert_array_equal(copy, [1.0])
    assert [float(s) for s in _locals(mirrored, opt.loss_scale.value)] == [2.0, 2.0]
    assert [bool(a) for a in _locals(mirrored, step())] == [True, True]
    for copy in _locals(mirrored, var.value):
        np.testing.assert_array_equal(copy, [-0.5])
    assert int(opt.iterations.numpy()) == 1
    assert [int(s) for s in _locals(mirrored, opt.skipped_steps.value)] == [1, 1]


def test_same_gradients_in_float32_are_applied(mirrored):
    var, opt = _setup(mirrored, [1.0], initial_scale=4.0)
    step = _step(mirrored, opt, var,
                 lambda r: tf.fill([1], 24576.0) * opt.loss_scale.value)
    assert [bool(a) for a in _locals(mirrored, step())] == [True, True]
    for copy in _locals(mirrored, var.value):
        np.testing.assert_array_equal(copy, [-0.5])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_inf_on_replica_1_only_is_skipped_everywhere(mirrored, dtype):
    var, opt = _setup(mirrored, [1.0, 1.0], initial_scale=4.0,
                      communication_dtype=dtype)
    step = _step(mirrored, opt, var,
                 lambda r: tf.where(r > 0, tf.constant([INF, 4.0]),
                                    tf.constant([4.0, 4.0])))
    assert [bool(a) for a in _locals(mirrored, step())] == [False, False]
    for copy in _locals(mirrored, var.value):
        np.testing.assert_array_equal(copy, [1.0, 1.0])
    assert [float(s) for s in _locals(mirrored, opt.loss_scale.value)] == [2.0, 2.0]
    assert int(opt.iterations.numpy()) == 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype,wire", [(None, tf.float32),
                                        ("float16", tf.float16),
                                        ("bfloat16", tf.bfloat16)])
def test_traced_step_has_one_gradient_all_reduce_and_no_flag(mirrored, dtype,
                                                             wire):
    with mirrored.scope():
        kernel = keras.Variable(tf.ones([3, 2]))
        bias = keras.Variable(tf.ones([2]))
        opt = LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=4.0,
                                 communication_dtype=dtype)
        opt.build([kernel, bias])

    def replica_fn():
        return opt.apply([tf.ones([3, 2]), tf.ones([2])], [kernel, bias])

    step = tf.function(lambda: mirrored.run(replica_fn))
    collectives = _collectives(step.get_concrete_function())
    # One all-reduce, entered by each of the 2 replicas; nothing else.
    assert [n.op for n in collectives] == ["CollectiveReduceV2"] * 2
    assert {n.attr["T"].type for n in collectives} == {wire.as_datatype_enum}
    step()
    assert int(opt.iterations.numpy()) == 1


@pytest.mark.slow
def test_unscaled_gradients_travel_scaled(mirrored):
    # 2**-26 / 2 flushes to zero in float16 unless it travels scaled by 2**10.
    var, opt = _setup(mirrored, [0.0], initial_scale=1024.0,
                      communication_dtype="float16")

    def replica_fn():
        grads = opt.unscale_gradients([tf.fill([1], 2.0**-26 * 1024.0)])
        return opt.apply(grads, [var], unscaled=True)

    tf.function(lambda: mirrored.run(replica_fn))()
    for copy in _locals(mirrored, var.value):
        np.testing.assert_array_equal(copy, [-(2.0**-15) * 2 * 2.0**-26])


# ------------------------------------------------------ config and wrapping


def test_communication_dtype_round_trips():
    opt = LossScaleOptimizer(keras.optimizers.SGD(), communication_dtype="bfloat16")
    # Under the inner optimizer's entry: Keras's wrapper loads the rest (scaling/portable.py).
    assert constructor_args(opt.get_config())["communication_dtype"] == "bfloat16"
    clone = LossScaleOptimizer.from_config(opt.get_config())
    assert clone.communication_dtype == "bfloat16"
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert restored.communication_dtype == "bfloat16"
    canonical = LossScaleOptimizer(keras.optimizers.SGD(),
                                   communication_dtype="float32")
    assert canonical.communication_dtype is None


def test_wrap_optimizer_without_loss_scaling_keeps_the_scale_at_one():
    # Under bfloat16 wrap_optimizer gives the pass-through wrapper (scale 1,
    # fixed); communication_dtype rides on it.
    keras.config.set_dtype_policy("mixed_bfloat16")
    plain = wrap_optimizer(keras.optimizers.SGD())
    assert plain.communication_dtype is None and not plain.dynamic
    wrapped = wrap_optimizer(keras.optimizers.SGD(), communication_dtype="bfloat16")
    assert isinstance(wrapped, LossScaleOptimizer)
    assert wrapped.communication_dtype == "bfloat16"
    assert not wrapped.dynamic
    assert (wrapped.initial_scale, wrapped.min_scale) == (1.0, 1.0)
    with pytest.raises(ValueError, match="communication_dtype"):
        wrap_optimizer(keras.optimizers.SGD(), communication_dtype="fp8")


def test_wrap_optimizer_keeps_communication_dtype_under_mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    wrapped = wrap_optimizer("sgd", communication_dtype="float16")
    assert wrapped.communication_dtype == "float16"
    assert wrapped.initial_scale == 2.0**15
    assert wrap_optimizer(wrapped, communication_dtype="float16") is wrapped
    with pytest.raises(ValueError, match="different settings"):
        wrap_optimizer(wrapped, communication_dtype="bfloat16")


@pytest.mark.slow
@pytest.mark.parametrize("width", [2, 3])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_sparse_gradients_in_every_wire_dtype_on_cpu(mirrored, dtype, width):
    """bfloat16 too: TF's CPU gather has no bfloat16 kernel, so it travels packed."""

    def replica_fn():
        r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
        sparse = tf.IndexedSlices(tf.fill([1, width], 1.5 + r),  # 1.5, 2.5: exact in bfloat16
                                  tf.cast(tf.reshape(r, [1]), tf.int64),
                                  tf.constant([3, width], tf.int64))
        reduced, finite = allreduce.reduce_gradients([tf.ones([2]), sparse], dtype)
        return tf.convert_to_tensor(reduced[1]), finite

    dense, finite = tf.function(lambda: mirrored.run(replica_fn))()
    assert [bool(f) for f in _locals(mirrored, finite)] == [True, True]
    for copy in _locals(mirrored, dense):
        np.testing.assert_array_equal(copy, [[1.5] * width, [2.5] * width, [0] * width])


@pytest.mark.slow
def test_embedding_fit_with_bfloat16_wire_on_cpu_matches_float32_wire(mirrored):
    def fit(dtype):
        with mirrored.scope():
            inputs = keras.Input((3,), dtype="int32")
            h = keras.layers.Embedding(10, 4, embeddings_initializer="ones")(inputs)
            out = keras.layers.Dense(1, kernel_initializer="ones")(
                keras.layers.GlobalAveragePooling1D()(h))
            model = keras.Model(inputs, out)
            model.compile(optimizer=LossScaleOptimizer(keras.optimizers.SGD(2.0**-4),
                                                       communication_dtype=dtype), loss="mse")
        x = np.arange(24).reshape(8, 3) % 10
        model.fit(x, np.zeros((8, 1), "float32"), batch_size=8, epochs=1, verbose=0)
        return model.get_weights()

    for a, b in zip(fit("bfloat16"), fit(None)):
        np.testing.assert_allclose(a, b, rtol=2.0**-7)


def test_float32_wire_equals_none_everywhere():
    inner = keras.optimizers.SGD()
    wrapped = LossScaleOptimizer(inner)
    assert wrap_optimizer(wrapped, communication_dtype="float32") is wrapped
    assert LossScaleOptimizer(keras.optimizers.SGD(), communication_dtype="float32") \
        .communication_dtype is None
    assert allreduce.wire_bytes([((4,), "float32")], "float32") == allreduce.wire_bytes(
        [((4,), "float32")], None) == 16
    with pytest.raises(ValueError, match="different settings"):
        wrap_optimizer(wrapped, communication_dtype="float16")

def test_float16_wire_under_a_float32_policy_backs_off_instead_of_skipping_forever(mirrored):
    """Issue 16, case 3: no loss scaling is needed, but a mean gradient above
    65504 overflows a float16 wire. The wire scale halves (1 -> 0.5) and the
    next step is applied; with a scale pinned at 1 every step was skipped."""
    keras.config.set_dtype_policy("float32")
    with mirrored.scope():
        var = keras.Variable([1.0])
        opt = wrap_optimizer(keras.optimizers.SGD(2.0**-15), communication_dtype="float16")
        opt.build([var])
    assert (opt.initial_scale, opt.max_scale, opt.min_scale) == (1.0, 1.0, 2.0**-24)
    assert opt.dynamic
    # Unscaled gradient 98304 = 1.5 * 2**16 on each replica: at scale 1 each
    # sends 49152, the sum 98304 overflows; at 0.5 the sum 49152 fits.
    step = _step(mirrored, opt, var, lambda r: tf.fill([1], 98304.0) * opt.loss_scale.value)
    assert [bool(a) for a in _locals(mirrored, step())] == [False, False]
    assert [float(s) for s in _locals(mirrored, opt.loss_scale.value)] == [0.5, 0.5]
    assert [bool(a) for a in _locals(mirrored, step())] == [True, True]
    for copy in _locals(mirrored, var.value):  # 1 - 2**-15 * 2 * 98304
        np.testing.assert_array_equal(copy, [-5.0])


def test_the_monitor_blames_the_wire_not_the_forward_pass():
    from tf_mixed.callbacks import stop_rules

    assert stop_rules.wire_cause("float32", None) is None
    assert stop_rules.wire_cause("float16", "float16") is None  # may be either
    assert stop_rules.wire_cause("bfloat16", "bfloat16") is None
    cause = stop_rules.wire_cause("float32", "float16")
    assert "computes in float32, so its forward pass cannot overflow float16" in cause
    assert "communication_dtype='bfloat16'" in cause
    first = stop_rules.Snapshot(scale=2.0**-24, applied=0)
    progress = stop_rules.Progress(first, first, skipped_in_epoch=30, steps_in_epoch=30,
                                   total_skipped=30, streak=30)
    reason = stop_rules.decide(stop_rules.StopRules(20, 0.5), stop_rules.Reading(
        kind="tf_mixed", progress=progress, threshold=2.0**-24, cause=cause))
    assert "communication_dtype='float16'" in reason
    assert "forward pass (tf_mixed.audit" not in reason
