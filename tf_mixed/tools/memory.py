"""What a model's training state costs, in bytes per parameter."""

# `memory_report` reads it from the real objects: the model's trainable
# weights (and so their gradients, which Keras computes in the weights'
# dtype), and every variable of a built optimizer, split into the optimizer's
# own state (Adam's moments, SGD's momentum, counters), the compensation
# buffers of bfloat16 weights (`tf_mixed.scaling.compensated`) and the gradient
# accumulation buffers. Activations are not in it: they depend on the batch;
# `tf_mixed.audit` estimates them, and ``python -m tf_mixed bench
# --suite=memory`` measures the peak memory of a whole training step.
#
# Per parameter, with Adam (4 + 4 + 8 bytes under float32):
#
# =========================================  =======  =========  =====  ======
# policy                                     weights  gradients  state  extra
# =========================================  =======  =========  =====  ======
# float32, mixed_float16, mixed_bfloat16     4        4          8
# bfloat16, Kahan, float32 state             2        2          8      2
# bfloat16, Kahan, bfloat16 state            2        2          4      2
# bfloat16, stochastic rounding, bf16 state  2        2          4
# =========================================  =======  =========  =====  ======
#
# (gradient accumulation adds a float32 buffer: 4 more bytes per parameter).

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from tf_mixed.scaling import compensated
from tf_mixed.scaling.optimizer import LossScaleOptimizer

__all__ = ["MemoryReport", "memory_report"]


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes of a model's training state (from `memory_report`).

    Attributes:
        parameters: Trainable parameters (elements).
        weights: Bytes of the trainable weights.
        gradients: Bytes of one set of gradients (the weights' dtypes).
        optimizer_state: Bytes of the optimizer's own variables (slots,
            counters, learning rate), without the two below.
        compensation: Bytes of Kahan buffers (`tf_mixed.scaling.compensated`).
        accumulation: Bytes of gradient accumulation buffers.
    """

    parameters: int
    weights: int
    gradients: int
    optimizer_state: int
    compensation: int
    accumulation: int

    @property
    def total(self) -> int:
        """All bytes above."""
        return (self.weights + self.gradients + self.optimizer_state
                + self.compensation + self.accumulation)

    def per_parameter(self) -> dict[str, float]:
        """Every field in bytes per parameter (``total`` included)."""
        n = max(self.parameters, 1)
        fields = ("weights", "gradients", "optimizer_state", "compensation",
                  "accumulation", "total")
        return {f: getattr(self, f) / n for f in fields}

    def __str__(self) -> str:
        per = self.per_parameter()
        return (f"{self.parameters:,} parameters, bytes per parameter: "
                + ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in per.items()))


def memory_report(model, optimizer) -> MemoryReport:
    """Bytes per parameter of weights, gradients and optimizer state.

    Example:

    >>> optimizer.build(model.trainable_variables)
    >>> print(tf_mixed.tools.memory_report(model, optimizer))
    ... bytes per parameter: weights 2, gradients 2, optimizer state 8, ...

    Args:
        model: A Keras model or layer (its trainable weights count), or a
            list of variables.
        optimizer: A built Keras optimizer, or a tf_mixed/Keras loss-scale
            wrapper around one (the wrapper's own scalars count as state).

    Returns:
        A `MemoryReport`.

    Raises:
        TypeError: if ``model`` is neither a layer nor a list of variables,
            or ``optimizer`` is not a Keras optimizer.
        ValueError: if ``optimizer`` is not built yet, or ``model`` has no
            trainable weights (an unbuilt Sequential model).
    """
    if isinstance(model, keras.layers.Layer):
        variables = list(model.trainable_weights)
    elif isinstance(model, (list, tuple)):
        variables = list(model)
    else:
        raise TypeError(
            "memory_report() needs a Keras model (or layer) or a list of "
            f"variables. Received: model={model!r:.80} (of type "
            f"{type(model).__name__}).")
    if not variables:
        raise ValueError(
            "memory_report() found no trainable weights in the model. Build "
            "it first (call it on a batch, or give keras.Input to a "
            "Sequential model).")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "memory_report() needs a Keras optimizer. Received: "
            f"optimizer={optimizer!r:.80} (of type {type(optimizer).__name__}).")
    if not optimizer.built:
        raise ValueError(
            "memory_report() needs a built optimizer: its state exists only "
            "then. Call optimizer.build(model.trainable_variables) first (under "
            "the strategy's scope, if any), or run one training step.")
    weights = sum(_bytes(v) for v in variables)
    extra = {"compensation": 0, "accumulation": 0}
    kinds = _buffer_kinds(optimizer)
    state = 0
    for variable in optimizer.variables:
        kind = kinds.get(id(variable))
        if kind is None:
            state += _bytes(variable)
        else:
            extra[kind] += _bytes(variable)
    return MemoryReport(
        parameters=sum(_elements(v) for v in variables),
        weights=weights, gradients=weights, optimizer_state=state, **extra)


def _buffer_kinds(optimizer) -> dict[int, str]:
    """id(variable) -> "compensation" / "accumulation" for known buffers."""
    kinds = {}
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    for buffer in compensated.compensation_buffers(inner):
        kinds[id(buffer)] = "compensation"
    if isinstance(optimizer, LossScaleOptimizer) and optimizer.accumulator is not None:
        for buffer in optimizer.accumulator.buffers:
            kinds[id(buffer)] = "accumulation"
    return kinds


def _elements(variable) -> int:
    size = 1
    for dim in variable.shape:
        size *= int(dim)
    return size


def _bytes(variable) -> int:
    return _elements(variable) * tf.as_dtype(
        keras.backend.standardize_dtype(variable.dtype)).size
