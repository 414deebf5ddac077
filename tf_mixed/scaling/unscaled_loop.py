"""A custom loop that forgot the loss-scale wrapper while the model computes in float16."""

# `tf_mixed.training.apply_scaled_gradients` and `make_train_step` take any
# Keras optimizer. With one that does not scale the loss (a plain Keras
# optimizer, or the pass-through `wrap_optimizer` returns under a float32
# global policy) while float16 computes in the model, nothing is scaled:
# small gradients flush to zero in float16, an overflow's inf reaches the
# weights, and ``applied`` is True every step. Keras's own ``compile`` wraps
# such an optimizer for a ``mixed_float16`` model; a loop has no ``compile``,
# so the helpers say it, once per optimizer (`MixedPrecisionWarning`).
# tf_mixed's pass-through wrapper says it too from its own step
# (`check_own_step`): ``model.fit``'s, where Keras's ``compile`` sees a
# ``LossScaleOptimizer`` already and does not wrap it again (a KerasHub model
# given ``dtype="mixed_float16"`` would have been scaled by Keras's own
# wrapper), or a loop's ``opt.apply``.
#
# Where the float16 is seen: ``make_train_step`` reads the model's layers
# (their compute dtypes, whoever set them: ``enable``, Keras's
# ``set_dtype_policy``, a ``dtype=`` argument, a ``DTypePolicyMap``).
# ``apply_scaled_gradients`` has no model: inside a ``tf.function`` it reads
# the traced forward pass (any float16 tensor in it); eagerly no graph is
# kept, so it goes by the global policy and the variables' dtypes, and else
# by the layers that own the variables (`float16_owners`): a Keras variable
# does not name its layer, so they are found among the live objects, one
# pass over ``gc.get_objects()`` (~0.1 s in a process holding a ResNet-50),
# once per optimizer.

from __future__ import annotations

import gc
import warnings
import weakref

import keras
import tensorflow as tf

from tf_mixed._internal.facts import walk_layers
from tf_mixed._internal.warning import MixedPrecisionWarning
from tf_mixed.scaling import misuse
from tf_mixed.scaling.optimizer import LossScaleOptimizer

__all__ = ["check", "check_own_step", "float16_in_model", "float16_in_step", "float16_owners",
           "note_told", "scales_loss", "untold"]

# Optimizers already told (each is told once).
_TOLD: "weakref.WeakSet" = weakref.WeakSet()
# Optimizers whose variables' owners were looked for eagerly (once each).
_LOOKED: "weakref.WeakSet" = weakref.WeakSet()


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
    return optimizer not in _TOLD and not scales_loss(optimizer)


def float16_in_model(model) -> str | None:
    """Where ``model`` computes in float16 (a layer named), or None."""
    layers = [name for name, layer in walk_layers(model)
              if not isinstance(layer, keras.Model)
              and keras.backend.standardize_dtype(layer.compute_dtype) == "float16"]
    if not layers:
        return None
    return f"{len(layers)} layer(s) compute in float16, e.g. '{layers[0]}'"


def float16_owners(variables) -> str | None:
    """Where layers that own ``variables`` compute in float16 (a layer named), or None.

    Looks through the live objects (``gc.get_objects()``) for the Keras layers,
    other than models, that compute in float16 and hold one of ``variables``.
    """
    wanted = {id(v) for v in variables}
    layers = [obj.name for obj in gc.get_objects()
              if issubclass(type(obj), keras.layers.Layer)
              and not issubclass(type(obj), keras.Model)
              and keras.backend.standardize_dtype(obj.compute_dtype) == "float16"
              and any(id(v) in wanted for v in obj.trainable_weights)]
    if not layers:
        return None
    return (f"{len(layers)} layer(s) owning its variables compute in float16, "
            f"e.g. '{sorted(layers)[0]}'")


def float16_in_step(variables, optimizer=None) -> str | None:
    """Where the step being built computes in float16, or None.

    Traced: the first float16 tensor of the graph so far (the forward pass).
    Eagerly: a global ``mixed_float16`` policy, float16 variables, or else,
    the first time for ``optimizer``, the layers that own the variables
    (`float16_owners`).
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
    if optimizer is None or optimizer in _LOOKED:
        return None
    _LOOKED.add(optimizer)
    return float16_owners(variables)


def note_told(optimizer, model) -> None:
    """Counts ``optimizer`` as told when ``model`` computes in float16 and it does not scale.

    For `tf_mixed.LossScaleMonitor`, whose set-up check at the start of ``fit``
    says the same thing in its own words: the step does not say it again.
    """
    if untold(optimizer) and float16_in_model(model) is not None:
        _TOLD.add(optimizer)


def check_own_step(optimizer, variables) -> None:
    """Warns once when tf_mixed's pass-through wrapper steps a model that computes in float16.

    Called by the wrapper's ``apply`` (`tf_mixed.scaling.misuse.check_step`):
    ``model.fit``'s step, or a loop's ``opt.apply``.
    """
    if untold(optimizer):
        check(optimizer, None, float16_in_step(variables, optimizer), variables)


def check(optimizer, helper: str | None, float16: str | None, variables=()) -> None:
    """Warns once per optimizer when float16 computes and ``optimizer`` does not scale.

    Args:
        optimizer: The loop's optimizer.
        helper: The helper's name, for the message (``apply_scaled_gradients``),
            or None for the optimizer's own step (`check_own_step`).
        float16: Where float16 was seen (`float16_in_model`, `float16_in_step`),
            or None.
        variables: The variables the step updates: float16 ones under tf_mixed's
            pass-through wrapper are said by the wrapper itself
            (`tf_mixed.scaling.misuse`), not twice.
    """
    if float16 is None or scales_loss(optimizer) or optimizer in _TOLD:
        return
    if isinstance(optimizer, LossScaleOptimizer) and any(
            keras.backend.standardize_dtype(v.dtype) == "float16" for v in variables):
        return
    _TOLD.add(optimizer)
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
    where = (f"tf_mixed.training.{helper}()" if helper else
             f"{type(optimizer).__name__}.apply() (the step of model.fit or of a loop)")
    warnings.warn(
        f"{where}: the model computes in float16 ({float16}), but "
        f"{what} does not scale the loss: small gradients flush to zero in float16, "
        "an overflow's inf/NaN reaches the weights, and no step is ever skipped "
        f"(applied is True every step). Fix: {fix}. (Said once per optimizer.)",
        MixedPrecisionWarning, stacklevel=4)
