"""Every private Keras/TensorFlow access of tf_mixed, one small function each.

When Keras or TensorFlow changes under one of these, its test in
tests/test_internals.py fails and names the function to fix. Checked against
TensorFlow 2.21.0 and Keras 3.15.1.
"""

from __future__ import annotations

import tensorflow as tf

# Keras's LossScaleOptimizer.build runs under this decorator so the state
# variables it assigns to attributes are not tracked a second time (they
# already live in `_variables`). There is no public equivalent.
# Reaches: keras.src.utils.tracking.no_automatic_dependency_tracking.
from keras.src.utils.tracking import no_automatic_dependency_tracking

__all__ = [
    "in_xla_context",
    "no_automatic_dependency_tracking",
    "optimizer_trainable_variables",
    "strategy_supports_no_merge_call",
]


def in_xla_context(graph) -> bool:
    """Whether ``graph`` (or a graph it is nested in) is being XLA-compiled.

    Reaches ``tensorflow.python.ops.control_flow_util
    .GraphOrParentsInXlaContext``, which TF's own strategies use to refuse
    XLA; there is no public test. Used to give a clear error for
    ``jit_compile=True`` under a strategy (design fact 5). Returns False if
    the module moved (the clear error is then lost, not the training).
    """
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TF layout we do not know
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


def strategy_supports_no_merge_call() -> bool:
    """Whether the current strategy updates variables without ``merge_call``.

    Reaches ``tf.__internal__.distribute.strategy_supports_no_merge_call``,
    the same test Keras's optimizers use to pick their update path; ours
    must pick the same one to nest the inner optimizer's update correctly.
    """
    return bool(tf.__internal__.distribute.strategy_supports_no_merge_call())


def optimizer_trainable_variables(optimizer) -> list:
    """The variables a built Keras optimizer was built for.

    Reaches ``Optimizer._trainable_variables`` (Keras 3 keeps no public list);
    used when ``apply`` is called without variables, as Keras allows.
    """
    return list(optimizer._trainable_variables)
