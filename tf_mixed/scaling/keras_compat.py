"""The Keras 3 and tf-keras method names that make ``tf_mixed.LossScaleOptimizer`` a drop-in."""

# Keras 3's (``apply_gradients``, ``check_finite``, ``stateless_apply``) and
# tf-keras's (``get_scaled_loss``, ``get_unscaled_gradients``,
# ``dynamic_counter``, ``loss_scale``), as a mixin that uses only the wrapper's
# public methods, state variables and step state (its misuse ledger). Files
# and configs live with the class (`tf_mixed.scaling.optimizer`,
# `tf_mixed.scaling.formats`).

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_mixed.scaling import allreduce, misuse

__all__ = ["KerasCompat"]


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
        if unscaled is None and self.step_state.ledger.tf_keras_unscaled:
            unscaled = True
        self.apply([g for g, _ in pairs], [v for _, v in pairs], unscaled=unscaled)
        return self.iterations

    # tf-keras (Keras 2) names.
    def get_scaled_loss(self: Any, loss):
        """tf-keras's name for ``scale_loss``, with tf-keras's reach.

        As tf-keras, any floating tensor is scaled, elementwise (a
        per-example loss too; ``scale_loss`` asks for a scalar), and a
        callable loss is wrapped. A half-precision loss comes back in
        float32 (tf-keras: in its own dtype, where 2**15 times a large loss
        overflows).
        """
        if callable(loss):
            return lambda: self._scale_tensor(loss(), scalar=False)
        return self._scale_tensor(loss, scalar=False)

    def get_unscaled_gradients(self: Any, grads):
        """tf-keras's name for ``unscale_gradients``, with tf-keras's meaning.

        The next ``apply_gradients`` without ``unscaled=`` takes its
        gradients as already unscaled (tf-keras's ``apply_gradients`` did),
        clipped or not; ``apply`` still asks for ``unscaled=``.
        """
        unscaled = self.unscale_gradients(grads)
        misuse.note_unscaled(self.step_state.ledger, tf_keras=True)
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

    @property
    def loss_scale(self: Any):
        """The scale variable (``dynamic_scale``); before ``build``, a tensor
        holding ``initial_scale``.

        tf-keras returns a tensor; this stays the variable on purpose (listed
        in docs/fit.md): it reads as a float32 scalar tensor wherever tf-keras's
        did (``tf.convert_to_tensor``, arithmetic, ``float()``, ``.numpy()``),
        and a loop can also ``assign`` it.
        """
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
