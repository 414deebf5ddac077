"""Rolling back the state a skipped step's forward pass wrote."""

# The forward pass of a training step writes non-trainable state before the
# optimizer sees the gradients: BatchNormalization's moving mean and variance
# take an overflowing batch's inf/NaN. `ForwardState` keeps a backup copy of
# such variables, refreshed after every applied step and copied back after
# every skipped one, inside the same global skip verdict and on every replica's
# own copy, so a skipped step leaves the model bit-identical.
#
# ``tf_mixed.LossScaleOptimizer.track_forward_state`` hands a model to its
# `ForwardState`; `tf_mixed.LossScaleMonitor` does it for ``fit``.
#
# The backups must hold the state the next step starts from. A step refreshes
# them itself; anything that writes the variables between steps (a
# ``BackupAndRestore`` restore in any callback order, a resumed ``fit``, a
# user's assignment) must be followed by `ForwardState.refresh`: the monitor
# calls it before the first step of every epoch, and
# ``tf_mixed.scaling.refresh_forward_state(optimizer)`` is the public door
# for custom loops. A model tracked before it was built (its variables are created by its
# first call) cannot be rolled back: the first step that would skip it raises,
# naming the model, instead of leaving its new statistics unprotected.

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_mixed._internal import validate as _validate

__all__ = ["ForwardState", "forward_variables"]


class ForwardState:
    """The tracked forward-state variables and their backups.

    Not a ``tf.Module`` or Trackable: the backups are scratch copies that
    belong in no checkpoint (saving them would change the optimizer's
    checkpoint layout, which stays Keras's).
    """

    def __init__(self) -> None:
        self.variables: tuple = ()
        self.backups: tuple = ()
        self.source: Any = None  # the layer tracked, to see it grow
        # Written by the forward pass and not rolled back, on purpose
        # (track(..., roll_back=False)): `tf_mixed.scaling.misuse` accepts them.
        self.declined: tuple = ()

    def track(self, model_or_variables: Any, *, roll_back: bool = True) -> int:
        """Tracks these variables, replacing any tracked before.

        A skipped step whose forward pass wrote state that was never handed
        over here raises (`tf_mixed.scaling.misuse.forward_state_guard`);
        ``roll_back=False`` declares the variables written and left as the
        skipped batch wrote them, on purpose: nothing is rolled back, and
        nothing refused.

        Call it under the strategy's scope (the backups are created with the
        variables' own synchronisation and aggregation).

        Args:
            model_or_variables: A Keras layer or model (its non-trainable
                floating-point weights are tracked; metric variables are not
                weights and are not tracked), or a list of variables.

        Returns:
            The number of variables tracked.

        Raises:
            TypeError: if the argument is neither a layer nor variables.
            ValueError: under several replicas, for a variable whose
                aggregation is not NONE (it could not be written inside the
                skip decision).
        """
        _validate.boolean(roll_back, "roll_back",
                          owner="LossScaleOptimizer.track_forward_state()")
        variables = forward_variables(model_or_variables)
        self.declined = () if roll_back else tuple(variables)
        if not roll_back:
            variables = []
        strategy = tf.distribute.get_strategy()
        backups = []
        for variable in variables:
            inner = (variable.value if isinstance(variable, keras.Variable)
                     else variable)
            _check_restorable(variable, inner, strategy)
            backups.append(tf.Variable(
                tf.zeros(variable.shape, variable.dtype), trainable=False,
                synchronization=inner.synchronization,
                aggregation=inner.aggregation,
            ))
        self.variables = tuple(variables)
        self.backups = tuple(backups)
        self.source = (model_or_variables if roll_back and isinstance(
            model_or_variables, keras.layers.Layer) else None)
        self.refresh()
        return len(variables or self.declined)

    def refresh(self) -> None:
        """Copies the tracked variables into the backups now, on every replica.

        Call it (eagerly, between steps) after anything outside a step wrote
        the tracked variables; call it under no ``tf.function``.
        """
        if not self.backups:
            return
        strategy = tf.distribute.get_strategy()
        if strategy.num_replicas_in_sync > 1:
            strategy.run(tf.function(self._refresh))
        else:
            self._refresh()

    def roll_back(self, finite: tf.Tensor) -> None:
        """Refreshes the backups after an applied step, restores after a skip.

        Args:
            finite: The global verdict of the step (a scalar bool tensor,
                the same on every replica).

        Raises:
            ValueError: if the tracked layer has forward variables now that
                it did not have when tracked (it was tracked before its first
                call built it).
        """
        if self.source is not None:
            now = forward_variables(self.source)
            if len(now) != len(self.variables):
                raise ValueError(
                    f"track_forward_state() was given '{self.source.name}' when it had "
                    f"{len(self.variables)} forward-state variable(s); it has "
                    f"{len(now)} now (its first call built it), and those could not "
                    "be rolled back after a skipped step. Build the model first "
                    "(keras.Input, model.build(shape), or one call), then call "
                    "track_forward_state(model) again; "
                    "tf_mixed.training.make_train_step does this for you.")
        if not self.backups:
            return
        tf.cond(finite, self._refresh, self._restore)

    def _refresh(self) -> None:
        for variable, backup in zip(self.variables, self.backups):
            backup.assign(tf.convert_to_tensor(variable))

    def _restore(self) -> None:
        for variable, backup in zip(self.variables, self.backups):
            variable.assign(backup.read_value())


def forward_variables(model_or_variables: Any) -> list:
    """The floating-point variables `ForwardState.track` would track.

    Args:
        model_or_variables: A Keras layer or model, or a list of variables.

    Returns:
        A list of variables: the layer's non-trainable float weights, or the
        floating-point variables of the list.

    Raises:
        TypeError: if the argument is neither a layer nor a list or tuple.
    """
    if isinstance(model_or_variables, keras.layers.Layer):
        candidates = model_or_variables.non_trainable_weights
    elif isinstance(model_or_variables, (list, tuple)):
        candidates = list(model_or_variables)
    else:
        raise TypeError(
            "track_forward_state() needs a Keras layer/model or a list of "
            f"variables. Received: {model_or_variables!r:.80} (of type "
            f"{type(model_or_variables).__name__}).")
    return [v for v in candidates
            if tf.as_dtype(keras.backend.standardize_dtype(v.dtype)).is_floating]


def _check_restorable(variable, inner, strategy) -> None:
    """Refuses a variable the rollback could not write on the merge_call path.

    The backup is copied back inside a ``tf.cond`` in the replica context. A
    mirrored variable with an aggregation other than NONE writes through
    ``merge_call``, which cannot run in a cond branch there (the trace of the
    step would fail). BatchNormalization's statistics use NONE.
    """
    if strategy.num_replicas_in_sync <= 1:
        return
    if (inner.synchronization == tf.VariableSynchronization.ON_READ
            or inner.aggregation == tf.VariableAggregation.NONE):
        return
    raise ValueError(
        "track_forward_state() cannot roll back variable "
        f"'{getattr(variable, 'path', variable.name)}' under "
        f"{type(strategy).__name__}: its aggregation is "
        f"{inner.aggregation.name}, so writing it needs a merge_call that "
        "cannot run inside the skip decision. Create it with "
        "aggregation='none' (as BatchNormalization does), or pass "
        "track_forward_state() a list of variables without it.")

