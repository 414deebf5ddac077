"""Every access to private Keras/TensorFlow API, each in one small function.

Each function says what it reaches, why, and for which versions it was
written (TF 2.21, Keras 3.15.1); tests/test_internals.py has a test per
function that fails when Keras or TF changes under it.
"""

from __future__ import annotations

import threading

import tensorflow as tf

__all__ = ["apply_reduced_gradients", "reduces_with_nccl"]

# ------------------------------------------------------- reduced gradients

_SKIP_LOCK = threading.Lock()
_SKIP_DEPTH = "_tf_mixed_reduced_depth"


def apply_reduced_gradients(optimizer, grads, trainable_variables):
    """Runs ``optimizer.apply`` on gradients that are already all-reduced.

    Reaches: ``TFOptimizer._all_reduce_sum_gradients`` (Keras 3.15.1,
    keras/src/backend/tensorflow/optimizer.py), which ``_backend_update_step``
    calls in the replica context to SUM the gradients before
    ``_distributed_tf_update_step``. Keras 3 has no public switch for it (tf-keras
    had ``apply_gradients(..., experimental_aggregate_gradients=False)``).

    Why: tf_mixed reduces the gradients itself, once, in the communication
    dtype, and takes the skip verdict from the result; a second all-reduce
    inside the inner optimizer would sum the sums (doubling them) and cost a
    second collective.

    How: the instance's method is wrapped once by one that returns the pairs
    unchanged while a call of this function is in progress on that optimizer.
    A depth counter (not a thread-local) is used because under
    MirroredStrategy the replica threads that reach the inner update are not
    the threads that entered this function. Everything else in ``apply``
    (clipping, weight decay, EMA, constraints, ``iterations``) runs as usual.

    Args:
        optimizer: A Keras optimizer on the TensorFlow backend.
        grads: The already-reduced gradients, one per variable.
        trainable_variables: The variables to update.
    """
    _install_skippable_all_reduce(optimizer)
    with _SKIP_LOCK:
        setattr(optimizer, _SKIP_DEPTH, getattr(optimizer, _SKIP_DEPTH) + 1)
    try:
        optimizer.apply(grads, trainable_variables)
    finally:
        with _SKIP_LOCK:
            setattr(optimizer, _SKIP_DEPTH,
                    getattr(optimizer, _SKIP_DEPTH) - 1)


def _install_skippable_all_reduce(optimizer):
    with _SKIP_LOCK:
        if getattr(optimizer, _SKIP_DEPTH, None) is not None:
            return
        try:
            original = optimizer._all_reduce_sum_gradients
        except AttributeError as error:  # pragma: no cover - a Keras change
            raise RuntimeError(
                "tf_mixed needs Keras's TFOptimizer._all_reduce_sum_gradients "
                f"(Keras 3.15.1); {type(optimizer).__name__} has none in this "
                "Keras version. Please report it to tf_mixed."
            ) from error

        def all_reduce_unless_reduced(grads_and_vars):
            if getattr(optimizer, _SKIP_DEPTH) > 0:
                return list(grads_and_vars)
            return original(grads_and_vars)

        optimizer._all_reduce_sum_gradients = all_reduce_unless_reduced
        setattr(optimizer, _SKIP_DEPTH, 0)


# ------------------------------------------------------- which all-reduce


def reduces_with_nccl(strategy) -> bool:
    """Whether ``strategy``'s replica all-reduce runs through NCCL.

    Reaches: ``strategy.extended._cross_device_ops`` (MirroredStrategy and
    MultiWorkerMirroredStrategy, TF 2.21) and, for a ``CollectiveAllReduce``,
    its ``_options.implementation``; also ``_devices`` of the extended object.

    Why: TF's NCCL kernels cannot reduce bfloat16 (see tf_mixed.allreduce);
    there is no public way to ask a strategy which implementation it uses.
    ``AUTO`` picks NCCL when every device is a GPU.

    Args:
        strategy: A ``tf.distribute.Strategy``.

    Returns:
        True for ``NcclAllReduce``, or collectives with implementation NCCL,
        or AUTO on all-GPU devices; False otherwise (CPUs, RING, one device).
    """
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cdo

    extended = strategy.extended
    ops = getattr(extended, "_cross_device_ops", None)
    if isinstance(ops, cdo.NcclAllReduce):
        return True
    if isinstance(ops, cdo.CollectiveAllReduce):
        implementation = ops._options.implementation
        kinds = collective_util.CommunicationImplementation
        if implementation == kinds.NCCL:
            return True
        if implementation == kinds.AUTO:
            kinds_of_device = [
                (tf.DeviceSpec.from_string(d).device_type or "").upper()
                for d in getattr(extended, "_devices", ()) or ()
            ]
            return bool(kinds_of_device) and all(
                kind == "GPU" for kind in kinds_of_device)
    return False
