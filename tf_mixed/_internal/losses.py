"""A loss argument as Keras's ``compile`` takes it, made one scalar function."""

# `tf_mixed.probe` and `tf_mixed.training.make_train_step` take ``loss`` the way
# ``model.compile`` does: a Keras loss name, a `keras.losses.Loss`, a callable
# ``loss(y_true, y_pred)``, or, for a model with several outputs, a list (one
# per output) or a dict keyed by output name. `resolve` turns any of these into
# ``fn(y_true, y_pred) -> float32 scalar``: the mean of each output's loss,
# summed over outputs (Keras's compiled loss with unit loss weights).
# `resolve_named` does it for a model whose output names the caller knows
# already (`tf_mixed.probe` and `tf_mixed.plan` read them from their survey of
# the model), with None meaning the compiled loss.

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import keras
import tensorflow as tf

__all__ = ["output_names", "resolve", "resolve_named"]

_HINT = ("a Keras loss name such as 'mean_squared_error', a keras.losses.Loss, a "
         "callable loss(y_true, y_pred), or for several outputs a list of these (one "
         "per output) or a dict keyed by output name")


def output_names(model: keras.Model) -> list[str] | None:
    """The names of a model's outputs, in order; None when unknown (a subclassed model)."""
    from tf_mixed._internal import shims as _internals
    from tf_mixed._internal.facts import model_outputs

    names = getattr(model, "output_names", None)
    if names:
        return list(names)
    outputs = model_outputs(model)
    if not outputs:
        return None
    histories = [_internals.keras_history(t) for t in outputs]
    return [h.operation.name if h is not None else str(i) for i, h in enumerate(histories)]


def _single(loss, caller: str) -> Callable:
    if isinstance(loss, (str, dict)):
        try:
            return keras.losses.get(loss)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"{caller}: unknown loss {loss!r} ({error}). Pass {_HINT}. "
                f"Received: loss={loss!r}") from None
    if not callable(loss):
        raise TypeError(f"{caller}: loss must be {_HINT}. Received: loss={loss!r} "
                        f"(of type {type(loss).__name__})")
    return loss


def _mean(value) -> tf.Tensor:
    return tf.reduce_mean(tf.cast(value, "float32"))


def resolve(loss, model: keras.Model, caller: str = "probe()") -> Callable:
    """``fn(y_true, y_pred) -> float32 scalar`` for a ``compile``-style loss.

    Args:
        loss: See the module docstring. A compiled model's ``model.loss``
            (Keras's tracked list or dict) works as given.
        model: The model whose outputs the loss is for.
        caller: Named in error messages.

    Returns:
        The scalar loss function. With one output, ``y_pred`` is the output
        tensor; with several, the list of outputs and ``y_true`` a list (or a
        dict keyed by output name).

    Raises:
        ValueError: an unknown loss name; a list whose length or a dict whose
            keys do not match the model's outputs; one loss for several outputs.
        TypeError: an element is not a loss.
    """
    return _resolved(loss, output_names(model), model.name, caller)


def resolve_named(loss, names: Sequence[str], model: keras.Model,
                  caller: str) -> Callable:
    """`resolve` for a Sequential or functional model whose output names the
    caller has (a survey's), None meaning the model's compiled loss.

    Args:
        loss: As `resolve` takes it; None: ``model.loss`` of a compiled model.
        names: The model's output names, in order
            (`tf_mixed.policy.precision_map.Survey.output_names`).
        model: The model (its compiled loss; its name in messages).
        caller: Named in error messages.

    Returns:
        The scalar loss function, as `resolve`'s.

    Raises:
        ValueError: `loss` is None and the model is not compiled with a
            loss; as `resolve`.
        TypeError: as `resolve`.
    """
    if loss is None:
        loss = getattr(model, "loss", None) if getattr(model, "compiled", False) else None
        if loss is None:
            raise ValueError(
                f"{caller} needs a loss to differentiate. Pass loss=..., such as "
                "loss='sparse_categorical_crossentropy', or compile the model "
                "with one. Received: loss=None")
    return _resolved(loss, list(names), model.name, caller)


def _resolved(loss, names: list[str] | None, model_name: str, caller: str) -> Callable:
    """The resolution itself, given the output names (None: a subclassed model)."""
    if names is None:  # a subclassed model: its outputs are known only when called
        if isinstance(loss, Mapping) and not _is_config(loss):
            raise ValueError(
                f"{caller}: a loss dict needs output names, which the subclassed model "
                f"'{model_name}' does not have. Pass a list with one loss per output. "
                f"Received: loss={dict(loss)!r}")
        if isinstance(loss, (list, tuple)):
            per_output = list[Callable | None](_single(each, caller) for each in loss)
            names = [str(i) for i in range(len(per_output))]
        else:
            fn = _single(loss, caller)
            return lambda y_true, y_pred: _mean(fn(y_true, y_pred))
    elif isinstance(loss, Mapping) and not _is_config(loss):
        unknown = sorted(set(loss) - set(names))
        if unknown:
            raise ValueError(
                f"{caller}: the loss dict names outputs model '{model_name}' does not have: "
                f"{unknown}. Its outputs are {names}. Received: loss={dict(loss)!r}")
        per_output = [(_single(loss[n], caller) if n in loss else None) for n in names]
    elif isinstance(loss, (list, tuple)):
        if len(loss) != len(names):
            raise ValueError(
                f"{caller}: {len(loss)} losses for the {len(names)} output(s) of model "
                f"'{model_name}' ({names}); pass one loss per output. "
                f"Received: loss={list(loss)!r}")
        per_output = [_single(each, caller) for each in loss]
    else:
        fn = _single(loss, caller)
        if len(names) == 1:
            return lambda y_true, y_pred: _mean(fn(y_true, y_pred))
        if isinstance(loss, str):
            raise ValueError(
                f"{caller}: one loss name for the {len(names)} outputs of model "
                f"'{model_name}' ({names}); pass a list with one loss per output, "
                f"such as loss={[loss] * len(names)!r}. Received: loss={loss!r}")
        return lambda y_true, y_pred: _mean(fn(y_true, y_pred))  # handles the structure

    def summed(y_true, y_pred):
        preds = keras.tree.flatten(y_pred)
        trues = ([y_true[n] for n in names] if isinstance(y_true, Mapping)
                 else list(y_true))
        if len(trues) != len(preds):
            raise ValueError(
                f"{caller}: y has {len(trues)} target(s) for the {len(preds)} outputs of "
                f"model '{model_name}' ({names}); pass one target per output.")
        total = tf.constant(0.0)
        for each, true, pred in zip(per_output, trues, preds):
            if each is not None:
                total += _mean(each(true, pred))
        return total

    return summed


def _is_config(loss) -> bool:
    """A serialised Keras loss (``{"class_name": ..., "config": ...}``), not a dict of losses."""
    return "class_name" in loss and "config" in loss
