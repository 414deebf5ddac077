"""Float32Loss's config in the shape Keras's own loss wrapper loads, without tf_mixed."""

# A ``.keras`` file names a Float32Loss as Keras's ``LossFunctionWrapper``
# (the loss ``compile`` makes of a loss function; `KERAS_NAME`, a module
# Keras alone imports from a config) with ``dtype="float32"``, and its config
# holds at the top exactly what that wrapper takes: the name, the reduction,
# the dtype, the loss function and the keyword arguments it is called with.
# For a wrapped built-in loss object (``SparseCategoricalCrossentropy(
# from_logits=True)``, every built-in class is such a wrapper that does not
# override ``call``) those are its function and arguments; for a loss name or
# a function, the function. The wrapped loss as tf_mixed saved it before rides
# as one section (`SECTION`) in the function's entry, a place Keras's
# deserializer never reads.
#
# Keras's wrapper casts ``y_true`` and ``y_pred`` to its dtype, matches their
# ranks and calls the function with the arguments, then reduces as the
# reduction says: for a wrapped loss object exactly what Float32Loss does (it
# calls that object's ``call`` after the same cast). For a wrapped function
# Float32Loss calls it without matching the ranks first: the same wherever
# ``y_true`` and ``y_pred`` have the same rank (some of Keras's functions match
# them themselves; others raise or broadcast a rank-1 ``y_true`` against a
# ``(batch, 1)`` ``y_pred`` under Float32Loss, where Keras's wrapper, as
# ``compile`` for a loss name, matches them first).
#
# A wrapped loss Keras's wrapper cannot express (a Loss subclass with its own
# ``call``, a callable object) is written as tf_mixed's own Float32Loss entry
# in the function's place: Keras alone raises its "Could not locate class
# 'Float32Loss'" error naming tf_mixed, instead of loading another loss.

from __future__ import annotations

from typing import Any, Callable

import keras

from tf_mixed._internal import shims

__all__ = ["KERAS_NAME", "SECTION", "is_portable", "keras_name_loader", "own_config",
           "portable_config", "restore_arguments"]

# The public name a file gives a Float32Loss (Keras's loss function wrapper's).
_WRAPPER: Any = shims.loss_function_wrapper()
KERAS_NAME = f"{_WRAPPER.__module__}.{_WRAPPER.__name__}"

# The key of the wrapped loss, as tf_mixed saves it, in the function's entry.
SECTION = "tf_mixed_float32_loss"

# The keys of a portable config that are not the function's arguments.
_OWN_KEYS = ("name", "reduction", "dtype", "fn")


def _function_and_arguments(loss: Any) -> tuple[Callable, dict] | None:
    """The function and arguments Keras's wrapper calls for ``loss``, or None if it cannot."""
    if isinstance(loss, keras.losses.Loss):
        if isinstance(loss, _WRAPPER) and getattr(type(loss), "call", None) is _WRAPPER.call:
            return shims.loss_function_parts(loss)
        return None
    if callable(loss) and not isinstance(loss, type) and hasattr(loss, "__name__"):
        return loss, {}
    return None


def portable_config(name: str, reduction: str | None, loss: Any, flat: dict) -> dict:
    """The config Keras's loss function wrapper and `tf_mixed.Float32Loss` both load.

    Args:
        name: The Float32Loss's name.
        reduction: Its reduction.
        loss: The loss it wraps (a Keras loss object or a function).
        flat: Its config as tf_mixed wrote it before (``name``, ``reduction``,
            ``loss``): what rides in `SECTION`, and, when Keras's wrapper
            cannot express ``loss``, the whole entry in the function's place.

    Returns:
        ``{"name", "reduction", "dtype": "float32", "fn", **arguments}``: the
        function's entry carries `SECTION` (``{"loss": flat["loss"]}``).
    """
    parts = _function_and_arguments(loss)
    arguments = {}
    if parts is None:
        # tf_mixed's own entry, under its registered name: Keras alone cannot
        # locate it and says so.
        fn_entry = {"module": "tf_mixed.layers", "class_name": "Float32Loss",
                    "config": dict(flat), "registered_name": "tf_mixed>Float32Loss"}
    else:
        fn_entry = dict(keras.saving.serialize_keras_object(parts[0]))
        arguments = keras.saving.serialize_keras_object(parts[1])
    fn_entry[SECTION] = {"loss": flat["loss"]}
    return {"name": name, "reduction": reduction, "dtype": "float32", "fn": fn_entry,
            **arguments}


def is_portable(config: Any) -> bool:
    """Whether ``config`` is `portable_config` output (a Float32Loss's)."""
    fn = config.get("fn") if isinstance(config, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get(SECTION), dict)


def restore_arguments(loss: Any, config: dict) -> Any:
    """``loss`` calling its function with the arguments `portable_config` wrote.

    Some built-in losses' configs drop an argument (Keras 3.15.1: ``Huber``'s
    ``delta``, ``CosineSimilarity``'s and ``SparseCategoricalCrossentropy``'s
    ``axis``); the arguments at the top of a portable config are the ones the
    saved loss called its function with, so a loss rebuilt with tf_mixed
    computes what Keras alone's does.

    Args:
        loss: The wrapped loss, rebuilt from `SECTION`.
        config: The Float32Loss's config, either layout.

    Returns:
        ``loss`` (its arguments set when ``config`` is portable and Keras's
        wrapper expresses ``loss``).
    """
    if not is_portable(config) or not isinstance(loss, keras.losses.Loss):
        return loss
    if _function_and_arguments(loss) is not None:
        arguments = {key: value for key, value in config.items() if key not in _OWN_KEYS}
        shims.set_loss_function_arguments(
            loss, keras.saving.deserialize_keras_object(arguments))
    return loss


def own_config(config: dict) -> dict:
    """Float32Loss's constructor arguments from either layout it wrote.

    Args:
        config: `portable_config` output, or the flat config tf_mixed wrote
            before it (``name``, ``reduction``, ``loss``).

    Returns:
        A new dict: ``name``, ``reduction`` and ``loss`` (still serialized);
        a flat config comes back as it is (a shallow copy).
    """
    if not is_portable(config):
        return dict(config)
    return {"name": config.get("name"), "reduction": config.get("reduction"),
            "loss": config["fn"][SECTION]["loss"]}


def keras_name_loader(own_class: type) -> type:
    """What Keras's deserializer gets for `KERAS_NAME` while tf_mixed is imported.

    Its ``from_config`` builds ``own_class`` (Float32Loss) from a
    `portable_config`, and Keras's own wrapper from any other config, as
    Keras alone would.

    Args:
        own_class: ``tf_mixed.Float32Loss``.

    Returns:
        A class with one classmethod, ``from_config(config)``.
    """

    class KerasLossFunctionWrapperName:
        """Keras's loss function wrapper's name, read with tf_mixed imported."""

        @classmethod
        def from_config(cls, config):
            """Float32Loss for its own config, Keras's wrapper for Keras's."""
            if is_portable(config):
                return own_class.from_config(config)
            return _WRAPPER.from_config(config)

    return KerasLossFunctionWrapperName
