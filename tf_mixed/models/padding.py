"""Which Dense layers `tf_mixed.convert(..., pad_to=N)` widens, and how weights follow."""

# A Dense layer whose ``units`` is not a multiple of the hardware's tile
# (`tf_mixed._internal.facts.TILE_MULTIPLES`) leaves the last tile of every matrix
# product partly empty. Widening it to the next multiple keeps the model's
# function exactly when the extra units are read by nothing: their kernel
# columns and biases are zero and the rows the next Dense layers read them
# with are zero, so every output is unchanged (whatever the activation makes
# of the zeros, it is multiplied by zero rows).
#
# So a layer is padded only when that holds by construction: a ``Dense`` in
# the model itself (not in a nested model), that produces no model output,
# whose every consumer is a ``Dense`` layer of the same model. Others are
# left as they are; `tf_mixed.census` still reports them.

from __future__ import annotations

import numpy as np

from tf_mixed.models import cloning
from tf_mixed.policy import precision_map

__all__ = ["copy_padded", "copy_weights", "plan"]


def plan(found: precision_map.Survey, multiple: int) -> dict[str, int]:
    """The Dense layers of a model to widen, with their new ``units``.

    Args:
      found: the model's `tf_mixed.policy.precision_map.survey` (a
        Sequential or functional model, walked once).
      multiple: the tile multiple, such as 8 or 16.

    Returns:
      ``{layer name: padded units}`` for each layer that can be padded
      without changing the model's outputs (see the module docstring).
    """
    outputs = {id(layer) for layer in found.output_layers}
    padded = {}
    for layer in found.model.layers:
        if type(layer).__name__ != "Dense" or id(layer) in outputs:
            continue
        readers = found.consumers.get(id(layer), [])
        if not readers or any(type(r).__name__ != "Dense" for r in readers):
            continue
        units = layer.units
        if units % multiple:
            padded[layer.name] = -(-units // multiple) * multiple
    return padded


def copy_padded(source_weights: list, target_layer) -> None:
    """Sets a (possibly widened) layer's weights from the original's, zero-padded.

    Args:
      source_weights: the original layer's ``get_weights()``.
      target_layer: the rebuilt layer; each of its weights is at least as
        large as the original's in every dimension.
    """
    values = []
    for old, variable in zip(source_weights, target_layer.weights):
        new = np.zeros(tuple(variable.shape), dtype=old.dtype)
        new[tuple(slice(0, n) for n in old.shape)] = old
        values.append(new)
    target_layer.set_weights(values)


def copy_weights(layer, twin) -> None:
    """Copies ``layer``'s weights into its copy ``twin`` in a padded model.

    A layer `plan` widened, or one reading a widened layer, gets them
    zero-padded (`copy_padded`); any other as
    `tf_mixed.models.cloning.copy_weights` copies them (by path, cast).

    Args:
      layer: the original layer.
      twin: its copy, as `tf_mixed.models.cloning.clone` built it.
    """
    if [tuple(w.shape) for w in layer.weights] != [tuple(w.shape) for w in twin.weights]:
        copy_padded(layer.get_weights(), twin)  # widened, or reads a widened one
    else:
        cloning.copy_weights(layer, twin)
