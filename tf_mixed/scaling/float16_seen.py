"""Where a training step computes in float16, and the one warning when nothing scales it."""

# Used by `tf_mixed.scaling.unscaled_loop` (the loop helpers) and by
# `tf_mixed.scaling.misuse` (the pass-through wrapper's own step: ``fit``'s,
# or a loop's ``opt.apply``); it imports neither, so both can call it.
#
# Where the float16 is seen: ``make_train_step`` reads the model's layers
# (their compute dtypes, whoever set them: ``enable``, Keras's
# ``set_dtype_policy``, a ``dtype=`` argument, a ``DTypePolicyMap``). A step
# without a model (``apply_scaled_gradients``, the wrapper's ``apply``):
# inside a ``tf.function`` it reads the traced graph (any float16 tensor in
# it); eagerly no graph is kept, so it goes by the global policy and the
# variables' dtypes, and else by the layers that own the variables
# (`float16_owners`): a Keras variable does not name its layer, so they are
# found among the live objects, one pass over ``gc.get_objects()`` (~0.1 s in
# a process holding a ResNet-50), once per optimizer.

from __future__ import annotations

import gc
import warnings

import keras
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import walk_layers
from tf_mixed._internal.warning import MixedPrecisionWarning

__all__ = ["float16_in_model", "float16_in_step", "float16_owners", "tell", "told"]

_TOLD = "float16_told"      # the optimizer was told (each is told once)
_LOOKED = "float16_looked"  # its variables' owners were looked for eagerly (once)


def _said(optimizer) -> set:
    """What was said or done about ``optimizer`` (kept with it, not in a registry).

    tf_mixed's wrapper: its step state's misuse ledger; any other Keras
    optimizer: a set kept on the optimizer itself (`tf_mixed._internal.shims.rider`).
    """
    state = getattr(optimizer, "step_state", None)
    return state.ledger.said if state is not None else _internals.rider(optimizer, "said", set)


def told(optimizer) -> bool:
    """Whether ``optimizer`` was told already (or counted as told, `tell`)."""
    return _TOLD in _said(optimizer)


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
    if optimizer is None or _LOOKED in _said(optimizer):
        return None
    _said(optimizer).add(_LOOKED)
    return float16_owners(variables)


def tell(optimizer, where: str | None, float16: str | None, pass_through: bool) -> None:
    """Warns once per optimizer that ``float16`` computes and nothing scales the loss.

    Args:
        optimizer: The step's optimizer, which does not scale the loss.
        where: Who says it (``"tf_mixed.training.apply_scaled_gradients()"``);
            None counts ``optimizer`` as told without a word (another check
            said it in its own words).
        float16: Where float16 was seen, for the message.
        pass_through: Whether ``optimizer`` is tf_mixed's pass-through wrapper
            (its own fix), else any other optimizer.
    """
    if _TOLD in _said(optimizer):
        return
    _said(optimizer).add(_TOLD)
    if where is None:
        return
    if pass_through:
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
        f"{where}: the model computes in float16 ({float16}), but "
        f"{what} does not scale the loss: small gradients flush to zero in float16, "
        "an overflow's inf/NaN reaches the weights, and no step is ever skipped "
        f"(applied is True every step). Fix: {fix}. (Said once per optimizer.)",
        MixedPrecisionWarning, stacklevel=5)
