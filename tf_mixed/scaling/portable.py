"""The optimizer's config in the shape Keras's own wrapper loads, where tf_mixed is not imported."""

# A ``.keras`` file names the optimizer as Keras's own
# ``keras.optimizers.LossScaleOptimizer`` (module, class name, no registered
# name: `tf_mixed._internal.shims.serialize_as_keras_class`), and its config
# holds at the top exactly what Keras's wrapper's ``from_config`` takes: the
# name, the inner optimizer, ``initial_scale`` (the scale reached, once built:
# the scale is carried) and ``dynamic_growth_steps``. Every constructor
# argument of tf_mixed's wrapper rides as one section (`SECTION`) beside the
# inner optimizer's serialized entry, a place Keras's deserializer never reads.
#
# So a process without tf_mixed loads the file with Keras's wrapper around the
# restored inner optimizer; a process with tf_mixed resolves Keras's name to
# `keras_name_loader`'s class, which rebuilds tf_mixed's wrapper from the
# section (and Keras's wrapper from a config without one, as Keras would).
# Arguments Keras's wrapper cannot honour without training differently
# (`REFUSED`: accumulation, compensated bfloat16 updates) are also written at
# the top, where Keras's wrapper refuses them by name instead of loading a
# wrapper that would train another way. The rest Keras's wrapper drops with
# training still correct; docs/serving.md lists each.

from __future__ import annotations

from typing import Any

import keras

__all__ = ["FIXED_SCALE_GROWTH_STEPS", "KERAS_NAME", "REFUSED", "SECTION", "constructor_args",
           "is_portable", "keras_name_loader", "portable_config"]

# The public name a file gives the optimizer (Keras's own wrapper's).
KERAS_NAME = "keras.optimizers.LossScaleOptimizer"

# The key of tf_mixed's constructor arguments in the inner optimizer's entry.
SECTION = "tf_mixed_loss_scale"

# tf_mixed's arguments that Keras's wrapper must refuse rather than drop: set,
# they are also written at the top of the config (Keras's ``__init__`` raises
# a ValueError naming them). Accumulation changes the update each batch makes;
# without compensation bfloat16 weights lose the small updates.
REFUSED = ("gradient_accumulation_steps", "compensation")

# Keras's ``dynamic_growth_steps`` for a fixed scale (``dynamic=False``, also
# the pass-through under bfloat16/float32): Keras's wrapper never grows it
# (2**31 - 1 steps; an int32 counter holds it).
FIXED_SCALE_GROWTH_STEPS = 2**31 - 1


def portable_config(name: str, inner: dict, own: dict, scale_now: float | None) -> dict:
    """The config Keras's wrapper and tf_mixed's wrapper both load.

    Args:
        name: The optimizer's name.
        inner: The inner optimizer, serialized (``keras.saving.serialize_keras_object``).
        own: Every constructor argument of tf_mixed's wrapper but the inner
            optimizer and the name (``initial_scale``, ``dynamic_growth_steps``,
            the other knobs, ``communication_dtype``,
            ``gradient_accumulation_steps``, ``compensation``).
        scale_now: The current loss scale of a built optimizer, else None
            (``initial_scale`` is written then).

    Returns:
        ``{"name", "inner_optimizer", "initial_scale", "dynamic_growth_steps"}``
        (Keras's wrapper's arguments; ``own`` as `SECTION` in the inner entry),
        plus each argument of `REFUSED` that is set.
    """
    config = {
        "name": name,
        "inner_optimizer": {**inner, SECTION: dict(own)},
        "initial_scale": own["initial_scale"] if scale_now is None else scale_now,
        "dynamic_growth_steps": (own["dynamic_growth_steps"] if own["dynamic"]
                                 else FIXED_SCALE_GROWTH_STEPS),
    }
    config.update({key: own[key] for key in REFUSED if own.get(key) is not None})
    return config


def constructor_args(config: dict) -> dict:
    """tf_mixed's constructor arguments from a config, any layout it wrote or Keras's.

    Args:
        config: `portable_config` output, the flat config tf_mixed wrote
            before it (every argument at the top), or Keras's wrapper's.

    Returns:
        A new dict: ``inner_optimizer`` (its entry without `SECTION`), then
        the arguments. A config without `SECTION` comes back as it is (a
        shallow copy).
    """
    config = dict(config)
    if not is_portable(config):
        return config
    inner = dict(config["inner_optimizer"])
    own = inner.pop(SECTION)
    return {"name": config.get("name"), "inner_optimizer": inner, **own}


def is_portable(config: Any) -> bool:
    """Whether ``config`` is `portable_config` output (tf_mixed's wrapper's)."""
    inner = config.get("inner_optimizer") if isinstance(config, dict) else None
    return isinstance(inner, dict) and isinstance(inner.get(SECTION), dict)


def keras_name_loader(own_class: type) -> type:
    """What Keras's deserializer gets for `KERAS_NAME` while tf_mixed is imported.

    Its ``from_config`` builds ``own_class`` (tf_mixed's wrapper) from a
    `portable_config`, and Keras's own wrapper from any other config, as
    Keras alone would.

    Args:
        own_class: ``tf_mixed.LossScaleOptimizer`` (or a subclass).

    Returns:
        A class with one classmethod, ``from_config(config, custom_objects=None)``.
    """

    class KerasLossScaleOptimizerName:
        """Keras's wrapper's public name, read with tf_mixed imported."""

        @classmethod
        def from_config(cls, config, custom_objects=None):
            """tf_mixed's wrapper for its own config, Keras's for Keras's."""
            if is_portable(config):
                return own_class.from_config(config, custom_objects=custom_objects)
            return keras.optimizers.LossScaleOptimizer.from_config(
                config, custom_objects=custom_objects)

    return KerasLossScaleOptimizerName
