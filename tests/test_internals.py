"""Every private Keras/TF access in tf_mixed/_internals.py, one test each.

Each test fails when Keras or TF changes what the function relies on.
"""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_mixed import _internals


def _locals(strategy, value):
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


# ---------------------------------------------------- apply_reduced_gradients


def _per_replica_step(strategy, *applies):
    """Applies gradient 1 + replica_id with each of ``applies`` in turn."""
    with strategy.scope():
        var = keras.Variable([1.0])
        opt = keras.optimizers.SGD(1.0)
        opt.build([var])

    def replica_fn(apply):
        r = tf.cast(
            tf.distribute.get_replica_context().replica_id_in_sync_group,
            tf.float32)
        apply(opt, [tf.fill([1], 1.0 + r)], [var])

    seen = []
    for apply in applies:
        tf.function(lambda: strategy.run(replica_fn, args=(apply,)))()
        seen.append([float(c[0]) for c in _locals(strategy, var.value)])
    return opt, seen


def _keras_apply(opt, grads, variables):
    opt.apply(grads, variables)


def test_keras_sums_gradients_in_all_reduce_sum_gradients(mirrored):
    # Keras 3.15.1: TFOptimizer._backend_update_step -> _all_reduce_sum_gradients.
    assert hasattr(keras.optimizers.SGD(), "_all_reduce_sum_gradients")
    _, [copies] = _per_replica_step(mirrored, _keras_apply)
    assert copies == [-2.0, -2.0]  # 1 - (1 + 2)


def test_apply_reduced_gradients_skips_the_inner_all_reduce(mirrored):
    # Each replica applies its own (deliberately different) gradient: proof
    # that no all-reduce ran. If Keras moves its all-reduce out of
    # `_all_reduce_sum_gradients`, the copies are summed again and agree.
    opt, [shim, after] = _per_replica_step(
        mirrored, _internals.apply_reduced_gradients, _keras_apply)
    assert shim == [0.0, -1.0]
    # Outside the call the same optimizer sums again: both copies drop by 3.
    assert after == [-3.0, -4.0]
    assert int(opt.iterations.numpy()) == 2
    assert getattr(opt, _internals._SKIP_DEPTH) == 0


def test_apply_reduced_gradients_resets_its_depth_on_error():
    opt = keras.optimizers.SGD(1.0)
    var = keras.Variable([1.0])
    opt.build([var])
    with pytest.raises(ValueError):
        _internals.apply_reduced_gradients(opt, [None], [var])
    assert getattr(opt, _internals._SKIP_DEPTH) == 0


# ---------------------------------------------------------- reduces_with_nccl


def test_cpu_mirrored_strategy_does_not_use_nccl(mirrored):
    from tensorflow.python.distribute import cross_device_ops as cdo

    ops = mirrored.extended._cross_device_ops
    assert isinstance(ops, cdo.CollectiveAllReduce)
    assert ops._options.implementation.name == "RING"
    assert not _internals.reduces_with_nccl(mirrored)


def test_nccl_implementations_are_recognised():
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cdo

    def fake(ops, devices):
        extended = types.SimpleNamespace(_cross_device_ops=ops,
                                         _devices=devices)
        return types.SimpleNamespace(extended=extended)

    kinds = collective_util.CommunicationImplementation

    def collective(kind):
        ops = object.__new__(cdo.CollectiveAllReduce)
        ops._options = collective_util.Options(implementation=kind)
        return ops

    gpus = ("/job:localhost/replica:0/task:0/device:GPU:0",
            "/job:localhost/replica:0/task:0/device:GPU:1")
    cpus = ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert _internals.reduces_with_nccl(fake(cdo.NcclAllReduce(), gpus))
    assert _internals.reduces_with_nccl(fake(collective(kinds.NCCL), gpus))
    assert _internals.reduces_with_nccl(fake(collective(kinds.AUTO), gpus))
    assert not _internals.reduces_with_nccl(fake(collective(kinds.AUTO), cpus))
    assert not _internals.reduces_with_nccl(fake(collective(kinds.RING), gpus))
    assert not _internals.reduces_with_nccl(
        fake(cdo.ReductionToOneDevice(), gpus))
