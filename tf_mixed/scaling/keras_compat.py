"""What makes ``tf_mixed.LossScaleOptimizer`` a drop-in for Keras's and tf-keras's."""

# * Keras 3's ``keras.optimizers.LossScaleOptimizer``: its ``.keras`` files
#   and checkpoints load (`KerasCompat.load_own_variables`), a built Keras
#   wrapper converts with its scale kept (`KerasCompat.from_keras`), and its
#   state reads as a `tf_mixed.scaling.scale_state.LossScaleState` (`read_keras_state`).
# * tf-keras (Keras 2), which the TensorFlow mixed-precision guide still
#   teaches: ``get_scaled_loss`` and ``get_unscaled_gradients``.
#
# `KerasCompat` is a mixin: ``LossScaleOptimizer`` inherits these methods, and
# they use only its public methods and its state variables.

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed.scaling import allreduce
from tf_mixed.scaling.compensated import compensation_config
from tf_mixed.scaling.scale_state import LossScaleState

__all__ = ["EXTRA_STATE", "KerasCompat", "checkpoint_children", "read_keras_state"]

# The state variables after Keras's own (`step_counter`, `dynamic_scale`), in
# checkpoint order. A file written by Keras's wrapper lacks exactly these.
EXTRA_STATE = ("overflow_streak", "skipped_steps", "last_step_skipped",
               "min_scale_skips")


class KerasCompat:
    """Keras 3 and tf-keras compatibility methods of ``LossScaleOptimizer``."""

    def apply_gradients(self: Any, grads_and_vars, *, unscaled: bool | None = None):
        """Applies ``(gradient, variable)`` pairs; see ``apply``.

        After ``get_unscaled_gradients`` (tf-keras's name), the gradients are
        taken as unscaled when ``unscaled`` is not given, as tf-keras's
        ``apply_gradients`` took them: the TensorFlow guide's loop runs
        unchanged. After ``unscale_gradients`` (Keras 3's name) ``apply``'s
        rule holds: say ``unscaled=``.

        Returns:
            The inner optimizer's ``iterations`` variable (tf.keras habit).
        """
        pairs = list(grads_and_vars)
        if unscaled is None and self._scratch.tf_keras_unscaled:
            unscaled = True
        self.apply([g for g, _ in pairs], [v for _, v in pairs], unscaled=unscaled)
        return self.iterations

    # tf-keras (Keras 2) names.
    def get_scaled_loss(self: Any, loss):
        """tf-keras's name for ``scale_loss`` (a callable loss is wrapped)."""
        if callable(loss):
            return lambda: self.scale_loss(loss())
        return self.scale_loss(loss)

    def get_unscaled_gradients(self: Any, grads):
        """tf-keras's name for ``unscale_gradients``, with tf-keras's meaning.

        The next ``apply_gradients`` without ``unscaled=`` takes its
        gradients as already unscaled (tf-keras's ``apply_gradients`` did),
        clipped or not; ``apply`` still asks for ``unscaled=``.
        """
        unscaled = self.unscale_gradients(grads)
        self._scratch.tf_keras_unscaled = True
        return unscaled

    @property
    def dynamic_growth_steps(self: Any):
        """Finite steps before the scale grows; None when ``dynamic=False`` (tf-keras)."""
        return self.config.growth_interval if self.config.dynamic else None

    @dynamic_growth_steps.setter
    def dynamic_growth_steps(self, value) -> None:
        # Keras's __init__ assigns it; the frozen config is the one source.
        pass

    @property
    def dynamic_counter(self: Any):
        """tf-keras's name for ``good_steps``; None when ``dynamic=False``."""
        return self.good_steps if self.config.dynamic else None

    def save_own_variables(self: Any, store) -> None:
        """Saves the wrapper's own state only (``.keras`` files).

        The inner optimizer's variables are saved once, by the inner
        optimizer itself (Keras walks it as a child); Keras's own wrapper
        stores them a second time here. Entry ``"0"`` holds every scalar
        state variable as one float64 vector (exact for counters below
        2**53; one HDF5 dataset instead of eight keeps the file within a few
        hundred bytes of the plain optimizer's); each other variable (the
        gradient-accumulation buffers) follows as its own entry, in order.
        """
        own = list(self._variables)
        store["0"] = np.array([np.float64(v.numpy()) for v in own if not v.shape],
                              dtype=np.float64)
        for i, variable in enumerate([v for v in own if v.shape], start=1):
            store[str(i)] = variable.numpy()

    def load_own_variables(self: Any, store) -> None:
        """Loads a ``.keras`` file's optimizer state, older layouts included.

        Three layouts load: this one (the wrapper's own variables only,
        `save_own_variables`; its entry ``"0"`` is a vector); tf_mixed's
        before it and Keras's wrapper (own variables followed by the inner
        optimizer's, which the inner optimizer loads again from its own
        entry; entry ``"0"`` is the wrapper's unused scalar iterations);
        Keras's wrapper lacks the counters of `EXTRA_STATE`, which then
        start at 0.
        """
        own = list(self._variables)
        keys = list(store.keys())
        scalars = [v for v in own if not v.shape]
        arrays = [v for v in own if v.shape]
        if (self.built and "0" in keys and len(store["0"].shape) == 1
                and store["0"].shape[0] == len(scalars)
                and len(keys) == 1 + len(arrays)):
            for value, variable in zip(store["0"][...], scalars):
                variable.assign(np.asarray(value).astype(variable.dtype))
            for i, variable in enumerate(arrays, start=1):
                variable.assign(store[str(i)])
            return
        ours = self.variables
        if self.built and len(keys) == len(ours) - len(EXTRA_STATE):
            extra_start = len(own) - len(EXTRA_STATE)
            targets = ours[:extra_start] + ours[len(own):]
            for i, variable in enumerate(targets):
                variable.assign(store[str(i)])
            return
        super().load_own_variables(store)  # type: ignore[misc]

    @property
    def loss_scale(self: Any):
        """The scale variable (``dynamic_scale``); before ``build``, a tensor
        holding ``initial_scale`` (tf-keras's ``loss_scale``)."""
        if not self.built:
            return tf.constant(self.config.initial_scale, tf.float32)
        return self.dynamic_scale

    @property
    def good_steps(self: Any):
        """Consecutive finite steps (``step_counter``, Keras's name); 0 before ``build``."""
        if not self.built:
            return tf.constant(0, tf.int64)
        return self.step_counter


    def check_finite(self, grads):
        """Whether every gradient of *this replica* is finite (local check).

        ``apply`` does not use this: it checks the all-reduced gradients.

        Args:
            grads: A list of gradients (None entries are ignored).

        Returns:
            A scalar bool tensor.
        """
        return allreduce.all_finite(grads)


    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        """Not supported: tf_mixed targets the TensorFlow backend only.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            "tf_mixed.LossScaleOptimizer supports the TensorFlow backend "
            "only, which has no stateless_apply. Call `apply` instead."
        )


    def get_config(self):
        """Returns the constructor arguments (Keras's names first)."""
        knobs = self.config.to_dict()
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(
                self.inner_optimizer
            ),
            "initial_scale": knobs.pop("initial_scale"),
            "dynamic_growth_steps": knobs.pop("growth_interval"),
            **knobs,
            "communication_dtype": self.communication_dtype,
            "gradient_accumulation_steps": (
                None if self.accumulator is None else self.accumulator.steps),
            "compensation": compensation_config(self.inner_optimizer),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuilds the optimizer from ``get_config()`` output.

        Also reads a ``keras.optimizers.LossScaleOptimizer`` config.
        """
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)

    @classmethod
    def from_keras(cls, optimizer: keras.optimizers.LossScaleOptimizer,
                   **knobs: Any) -> Any:
        """A tf_mixed wrapper around a Keras wrapper's inner optimizer.

        Keeps its initial scale and growth steps (unless ``knobs`` override
        them) and, if it is built, its current scale and step counter, so
        training continues from where it stands.

        Args:
            optimizer: A ``keras.optimizers.LossScaleOptimizer``.
            **knobs: Other ``LossScaleOptimizer`` arguments.

        Returns:
            A new ``tf_mixed.LossScaleOptimizer`` (built if ``optimizer``
            was), sharing ``optimizer.inner_optimizer``.
        """
        knobs.setdefault("initial_scale", float(optimizer.initial_scale))
        if "growth_interval" not in knobs:
            knobs.setdefault("dynamic_growth_steps",
                             int(optimizer.dynamic_growth_steps))
        wrapper: Any = cls(optimizer.inner_optimizer, **knobs)  # type: ignore[call-arg]
        if optimizer.built:
            saved = read_keras_state(optimizer)
            wrapper.build(_internals.optimizer_trainable_variables(optimizer))
            wrapper.dynamic_scale.assign(saved.scale)
            wrapper.step_counter.assign(saved.good_steps)
        return wrapper


# The inner optimizer's children that Keras's wrapper (and tf_mixed's before
# issue 27) also kept at its top level, as its own unused copies (0 and 0.0).
_SHADOWED = ("_iterations", "_learning_rate")


def checkpoint_children(wrapper, default: dict) -> dict:
    """The checkpoint layout: the inner optimizer's, plus the scale state.

    A ``tf.train.Checkpoint`` of the plain inner optimizer restores into the
    wrapper and back (tf-keras's promise): the inner optimizer's children
    (iterations, learning rate, slots) sit where a plain optimizer keeps
    them; the wrapper adds its state variables by name and
    ``inner_optimizer``. A checkpoint in the older layout (Keras's wrapper,
    tf_mixed's before) holds unused top-level ``iterations`` (0) and
    ``learning_rate`` (0.0) beside the real ones under ``inner_optimizer/``:
    the top-level iterations and learning rate are aliases that yield to the
    ``inner_optimizer/`` values when the checkpoint holds them
    (`tf_mixed._internal.shims.checkpoint_alias`), so the real values win.

    Args:
        wrapper: A ``tf_mixed.LossScaleOptimizer``.
        default: Keras's children of the wrapper.

    Returns:
        The children, name to trackable.
    """
    inner = wrapper.inner_optimizer
    children = _internals.trackable_children(inner)
    aliases = wrapper._scratch.checkpoint_aliases
    for name in _SHADOWED:
        target = children.get(name)
        if not isinstance(target, (keras.Variable, tf.Variable)):
            continue
        # One alias object per variable: a save lists the children more
        # than once and needs the same object each time.
        if name not in aliases or aliases[name][0] is not target:
            aliases[name] = (target, _internals.checkpoint_alias(target))
        children[name] = aliases[name][1]
    children["inner_optimizer"] = inner
    for name in ("step_counter", "dynamic_scale") + EXTRA_STATE:
        if name in default:
            children[name] = default[name]
    return children


def read_keras_state(optimizer: keras.optimizers.LossScaleOptimizer) -> LossScaleState:
    """`LossScaleState` of a ``keras.optimizers.LossScaleOptimizer``.

    Keras keeps only the scale (``dynamic_scale``) and the consecutive
    finite steps (``step_counter``); the counters it does not keep are None.

    Args:
        optimizer: A Keras loss-scale optimizer, built or not.

    Returns:
        The state, in Python numbers.
    """
    if optimizer.built:
        scale = float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
        good = int(keras.ops.convert_to_numpy(optimizer.step_counter))
    else:
        scale, good = float(optimizer.initial_scale), 0
    return LossScaleState(scale=scale, good_steps=good, overflow_streak=None,
                          skipped_steps=None, last_step_skipped=None,
                          min_scale_skips=None)
