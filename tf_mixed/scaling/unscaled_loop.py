"""A custom loop that forgot the loss-scale wrapper while the model computes in float16."""

# `tf_mixed.training.apply_scaled_gradients` and `make_train_step` take any
# Keras optimizer. With one that does not scale the loss (a plain Keras
# optimizer, or the pass-through `wrap_optimizer` returns under a float32
# global policy) while float16 computes in the model, nothing is scaled:
# small gradients flush to zero in float16, an overflow's inf reaches the
# weights, and ``applied`` is True every step. Keras's own ``compile`` wraps
# such an optimizer for a ``mixed_float16`` model; a loop has no ``compile``,
# so the helpers say it, once per optimizer (`MixedPrecisionWarning`). Where
# the float16 is seen, and the warning: `tf_mixed.scaling.float16_seen`,
# which tf_mixed's pass-through wrapper also calls from its own step
# (`tf_mixed.scaling.misuse`): ``model.fit``'s, where Keras's ``compile``
# sees a ``LossScaleOptimizer`` already and does not wrap it again (a KerasHub
# model given ``dtype="mixed_float16"`` would have been scaled by Keras's
# own wrapper), or a loop's ``opt.apply``.

from __future__ import annotations

import keras

from tf_mixed.scaling import float16_seen, misuse
from tf_mixed.scaling.float16_seen import float16_in_model, float16_in_step
from tf_mixed.scaling.optimizer import LossScaleOptimizer

__all__ = ["check", "float16_in_model", "float16_in_step", "note_told", "scales_loss",
           "untold"]


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
    return not float16_seen.told(optimizer) and not scales_loss(optimizer)


def note_told(optimizer, model) -> None:
    """Counts ``optimizer`` as told when ``model`` computes in float16 and it does not scale.

    For `tf_mixed.LossScaleMonitor`, whose set-up check at the start of ``fit``
    says the same thing in its own words: the step does not say it again.
    """
    if untold(optimizer) and float16_in_model(model) is not None:
        float16_seen.tell(optimizer, None, None, pass_through=False)


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
    if float16 is None or not untold(optimizer):
        return
    ours = isinstance(optimizer, LossScaleOptimizer)
    if ours and any(keras.backend.standardize_dtype(v.dtype) == "float16" for v in variables):
        return
    float16_seen.tell(optimizer, f"tf_mixed.training.{helper}()", float16, pass_through=ours)
