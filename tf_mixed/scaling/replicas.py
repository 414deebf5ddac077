"""Every replica's copy of a value, read on the host.

Under a ``tf.distribute`` strategy a variable or a per-replica result holds
one copy per replica of this worker; a check that must see a poisoned copy
(NaN in replica 1's moving statistics) reads them all, never only the first.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = ["all_copies_finite", "local_copies"]


def local_copies(value: Any) -> list[np.ndarray]:
    """Every replica's copy of ``value`` on this worker, as numpy arrays.

    Args:
        value: A Keras or TF variable, a ``tf.distribute.DistributedValues``
            (a per-replica result or a mirrored variable), or a tensor.

    Returns:
        One numpy array per local replica (one for a plain value).
    """
    if isinstance(value, keras.Variable):
        value = value.value
    if isinstance(value, tf.distribute.DistributedValues):
        parts = list(value.values)
    else:
        parts = [value]
    return [np.asarray(p.numpy()) for p in parts]


def all_copies_finite(value: Any) -> bool:
    """Whether every local replica's copy of ``value`` is free of NaN/inf.

    Args:
        value: As for `local_copies`.

    Returns:
        True when every element of every copy is finite.
    """
    return all(np.isfinite(copy).all() for copy in local_copies(value))
