"""What a restore hands an optimizer with no healing attached, held until a model takes it."""

# A ``tf.train.Checkpoint`` of a ``tf_mixed.LossScaleOptimizer`` holds, under
# its child ``layer_attribution``, the healed set and the attribution's
# counters (docs/healing.md). While no attribution is attached, `Waiting` is
# that child: a read puts the counters in variables of any shape (how many
# layers they count is known only once a model is), a save writes back what
# a read put there, and `tf_mixed.scaling.attribution.LayerAttribution.attach`
# adopts them. `note_model_call` (a layer call hook) tells an optimizer which
# model it trains: a healed set restored with no model in sight moves that
# model's layers at its next call, before any of them computes.

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

__all__ = ["COUNTERS", "Waiting", "note_model_call"]

COUNTERS = ("counts", "log", "log_size", "healed")
"""The attribution state's variables, as a checkpoint names them."""


def _filled(variable) -> bool:
    return int(tf.size(variable)) > 0


class Waiting(tf.Module):
    """The ``layer_attribution`` checkpoint child of an optimizer with nothing attached.

    Args:
        healed_map: The checkpoint child that saves and restores the healed
            set (`tf_mixed.scaling.healed_set.to_tensors`).
    """

    def __init__(self, healed_map):
        super().__init__(name="layer_attribution")
        self.healed_map = healed_map

    def list_counters(self, reading: bool) -> None:
        """Lists the counters' variables as children: for a read (``reading``),
        empty ones it fills; for a save, only those a read filled."""
        for name in COUNTERS:
            variable = getattr(self, name, None)
            if reading and variable is None:
                with tf.init_scope():
                    setattr(self, name, tf.Variable(
                        np.zeros(0, np.int64), shape=tf.TensorShape(None),
                        trainable=False, name=name))
            elif not reading and variable is not None and not _filled(variable):
                delattr(self, name)

    def counters(self) -> dict | None:
        """``{name: array}`` of the counters a read filled (`COUNTERS`), or None."""
        held = {name: getattr(self, name, None) for name in COUNTERS}
        filled = {name: variable for name, variable in held.items()
                  if variable is not None and _filled(variable)}
        if len(filled) < len(COUNTERS):
            return None
        return {name: variable.numpy() for name, variable in filled.items()}

    def forget_counters(self) -> None:
        """Drops the counters (adopted by an attribution: it saves them now)."""
        for name in COUNTERS:
            if getattr(self, name, None) is not None:
                delattr(self, name)


def note_model_call(layer, args, kwargs) -> None:
    """A layer call hook: a model called with a ``tf_mixed.LossScaleOptimizer``
    compiled in is the model that optimizer trains
    (`tf_mixed.scaling.attribution.AttributionSlot.claim`). Cheap for every
    other layer: one ``isinstance``."""
    if not isinstance(layer, keras.Model):
        return
    state = getattr(getattr(layer, "optimizer", None), "step_state", None)
    slot = getattr(state, "attribution", None)
    if slot is not None:
        slot.claim(layer)
