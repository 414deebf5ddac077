"""Says at once when tf-keras, not Keras 3, is what the user's code would drive."""

# tf_mixed sets Keras 3's dtype policy and wraps Keras 3 optimizers. With
# ``TF_USE_LEGACY_KERAS=1`` and the ``tf-keras`` package installed, ``tf.keras`` is tf-keras 2.x,
# whose layers and optimizers never read Keras 3's policy: an ``enable("auto")`` that returned
# "mixed_bfloat16" would leave mixed precision silently off. So every public entry point checks
# first and raises, naming what it detected and the two working choices (Keras 3 with tf_mixed,
# or tf-keras's own ``tf.keras.mixed_precision``): `check` for those that set global state (under
# the variable), `check_objects` for those given a model, optimizer, loss or layer inputs (a
# tf-keras object, whatever the variable says). tf-keras is never imported here and is not a
# dependency of tf_mixed.

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any

ENV = "TF_USE_LEGACY_KERAS"
# The values TensorFlow's lazy ``tf.keras`` loader accepts
# (tensorflow/python/util/lazy_loader.py, KerasLazyLoader._initialize); any
# other value, or tf_keras not installed, leaves tf.keras as Keras 3.
_LEGACY_VALUES = ("true", "True", "1")
_PACKAGE = "tf_keras"

__all__ = ["TfKerasError", "check", "check_objects", "is_tf_keras_object", "legacy_keras"]


class TfKerasError(RuntimeError):
    """A tf_mixed entry point met tf-keras (Keras 2) instead of Keras 3."""


def _tf_keras_installed() -> bool:
    return importlib.util.find_spec(_PACKAGE) is not None


def _tf_keras_version() -> str:
    try:
        return importlib.metadata.version("tf-keras")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def legacy_keras() -> str:
    """What makes ``tf.keras`` tf-keras in this process, or "" if it is Keras 3.

    Returns:
        For example ``"TF_USE_LEGACY_KERAS=1 with tf-keras 2.21.0 installed"``.
    """
    value = os.environ.get(ENV)
    if value not in _LEGACY_VALUES or not _tf_keras_installed():
        return ""
    return f"{ENV}={value} with tf-keras {_tf_keras_version()} installed"


def is_tf_keras_object(obj: Any) -> bool:
    """Whether `obj` is an instance of a tf-keras class (layer, model, optimizer...)."""
    return any(
        (getattr(cls, "__module__", "") or "").split(".")[0] == _PACKAGE
        for cls in type(obj).__mro__
    )


def check(entry: str, **objects: Any) -> None:
    """Raises if `entry` would act on Keras 3 while the user works in tf-keras.

    For entry points that act on global state and take no model or
    optimizer to look at (`tf_mixed.enable`, `tf_mixed.policy_scope`): the
    Keras 3 policy they set is invisible to a ``tf.keras`` model.

    Args:
        entry: The public name being called, e.g. ``"tf_mixed.enable"``.
        **objects: The call's model/optimizer/layer arguments by name; any
            tf-keras instance among them is named in the error.

    Raises:
        TfKerasError: If ``tf.keras`` is tf-keras in this process, or one of
            `objects` is a tf-keras object.
    """
    legacy = legacy_keras()
    _raise_if(entry, [f"tf.keras is tf-keras here ({legacy})"] if legacy else [], objects)


def check_objects(entry: str, **objects: Any) -> None:
    """Raises if one of `objects` is a tf-keras object (the variable is not read).

    For entry points given the user's model, optimizer, loss or inputs: the
    object, not the variable, says which Keras it is (a Keras 3 model built
    with ``import keras`` works whatever ``TF_USE_LEGACY_KERAS`` says).

    Args:
        entry: The public name being called.
        **objects: The arguments to look at, by name.

    Raises:
        TfKerasError: If one of `objects` is a tf-keras object.
    """
    _raise_if(entry, [], objects)


def _raise_if(entry: str, found: list[str], objects: dict[str, Any]) -> None:
    found = [
        f"{name}={type(obj).__module__}.{type(obj).__name__} (a tf-keras object)"
        for name, obj in objects.items() if is_tf_keras_object(obj)
    ] + found
    if not found:
        return
    raise TfKerasError(
        f"{entry}: detected tf-keras (Keras 2): {'; '.join(found)}. tf_mixed works on "
        "Keras 3: it sets Keras 3's dtype policy and wraps Keras 3 optimizers, which "
        "tf-keras layers and optimizers never read, so mixed precision would be "
        "silently off. Choose one: Keras 3 with tf_mixed (unset "
        f"{ENV} and build the model with `import keras`), or tf-keras's own mixed "
        "precision without tf_mixed "
        "(tf.keras.mixed_precision.set_global_policy('mixed_bfloat16'), or "
        "'mixed_float16' with tf.keras.mixed_precision.LossScaleOptimizer)."
    )
