"""A custom loop that forgot the loss-scale wrapper while the model computes in float16."""

# `tf_mixed.training.apply_scaled_gradients` and `make_train_step` take any
# Keras optimizer. With one that does not scale the loss (a plain Keras
# optimizer, or the pass-through `wrap_optimizer` returns under a float32
# global policy) while float16 computes in the model, nothing is scaled:
# small gradients flush to zero in float16, an overflow's inf reaches the
# weights, and ``applied`` is True every step. Keras's own ``compile`` wraps
# such an optimizer for a ``mixed_float16`` model; a loop has no ``compile``,
# so the helpers say it, once per optimizer (`MixedPrecisionWarning`).
#
# Where the float16 is seen: ``make_train_step`` reads the model's layers
# (their compute dtypes, whoever set them: ``enable``, Keras's
# ``set_dtype_policy``, a ``dtype=`` argument, a ``DTypePolicyMap``).
# ``apply_scaled_gradients`` has no model: inside a ``tf.function`` it reads
# the traced forward pass (any float16 tensor in it); eagerly no graph is
# kept, so it goes by the global policy and the variables' dtypes.

from __future__ import annotations

import warnings

import keras
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import walk_layers
from tf_mixed._internal.warning import MixedPrecisionWarning
from tf_mixed.scaling import misuse
from tf_mixed.scaling.optimizer import LossScaleOptimizer

__all__ = ["check", "float16_in_model", "float16_in_step", "scales_loss", "untold"]

_SAID = "unscaled_loop"


def _said(optimizer) -> set:
    """What was said about ``optimizer``: its wrapper's misuse ledger, or (any
    other Keras optimizer) a set kept on the optimizer itself (each is told once)."""
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer.step_state.ledger.said
    return _internals.rider(optimizer, "said", set)


def scales_loss(optimizer) -> bool:
    """Whether ``optimizer.scale_loss`` multiplies the loss by something other than 1.

    tf_mixed's wrapper unless it is the pass-through (a fixed scale of 1);
    Keras's ``LossScaleOptimizer`` always; any other Keras optimizer when it
    was given a ``loss_scale_factor`` other than 1 (Keras's static scaling).
    """
    if isinstance(optimizer, LossScaleOptimizer):
        return misuse.scales(optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return True
    factor = getattr(optimizer, "loss_scale_factor", None)
    return factor is not None and factor != 1


def untold(optimizer) -> bool:
    """Whether ``optimizer`` does not scale the loss and was not told yet."""
    return _SAID not in _said(optimizer) and not scales_loss(optimizer)


def float16_in_model(model) -> str | None:
    """Where ``model`` computes in float16 (a layer named), or None."""
    layers = [name for name, layer in walk_layers(model)
              if not isinstance(layer, keras.Model)
              and keras.backend.standardize_dtype(layer.compute_dtype) == "float16"]
    if not layers:
        return None
    return f"{len(layers)} layer(s) compute in float16, e.g. '{layers[0]}'"


def float16_in_step(variables) -> str | None:
    """Where the step being built computes in float16, or None.

    Traced: the first float16 tensor of the graph so far (the forward pass).
    Eagerly: a global ``mixed_float16`` policy, or float16 variables.
    """
    if not tf.executing_eagerly():
        graph = tf.compat.v1.get_default_graph()
        for op in graph.get_operations():
            if any(out.dtype == tf.float16 for out in op.outputs):
                return f"the traced step computes '{op.name}' ({op.type}) in float16"
        return None
    if keras.config.dtype_policy().compute_dtype == "float16":
        return f"the global dtype policy is '{keras.config.dtype_policy().name}'"
    if any(keras.backend.standardize_dtype(v.dtype) == "float16" for v in variables):
        return "it updates float16 variables"
    return None


def check(optimizer, helper: str, float16: str | None, variables=()) -> None:
    """Warns once per optimizer when float16 computes and ``optimizer`` does not scale.

    Args:
        optimizer: The loop's optimizer.
        helper: The helper's name, for the message (``apply_scaled_gradients``).
        float16: Where float16 was seen (`float16_in_model`, `float16_in_step`),
            or None.
        variables: The variables the step updates: float16 ones under tf_mixed's
            pass-through wrapper are said by the wrapper itself
            (`tf_mixed.scaling.misuse`), not twice.
    """
    if float16 is None or scales_loss(optimizer) or _SAID in _said(optimizer):
        return
    if isinstance(optimizer, LossScaleOptimizer) and any(
            keras.backend.standardize_dtype(v.dtype) == "float16" for v in variables):
        return
    _said(optimizer).add(_SAID)
    if isinstance(optimizer, LossScaleOptimizer):
        what = (f"tf_mixed's pass-through {type(optimizer).__name__} '{optimizer.name}' "
                "(a fixed scale of 1: wrap_optimizer() returns it under the global "
                f"policy '{keras.config.dtype_policy().name}')")
        fix = ("opt = tf_mixed.LossScaleOptimizer(opt.inner_optimizer) (or "
               "tf_mixed.wrap_optimizer(inner, force=True))")
    else:
        what = f"the optimizer {type(optimizer).__name__} '{optimizer.name}'"
        fix = ("opt = tf_mixed.LossScaleOptimizer(opt) (or "
               "tf_mixed.wrap_optimizer(opt, force=True)), created once before the loop")
    warnings.warn(
        f"tf_mixed.training.{helper}(): the model computes in float16 ({float16}), but "
        f"{what} does not scale the loss: small gradients flush to zero in float16, "
        "an overflow's inf/NaN reaches the weights, and no step is ever skipped "
        f"(applied is True every step). Fix: {fix}. (Said once per optimizer.)",
        MixedPrecisionWarning, stacklevel=4)
