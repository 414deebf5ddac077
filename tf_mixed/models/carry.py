"""What Keras's own saving carries from a layer to its copy, beyond its variables."""

# ``keras.saving`` saves and loads each layer through the layer's own hooks,
# not through ``get_weights``/``set_weights``:
#
# * ``save_own_variables(store)`` / ``load_own_variables(store)``: Keras's
#   adaptable preprocessing layers (those with ``finalize_state``:
#   Normalization, Discretization, the lookups, TextVectorization) keep state
#   there that is not a plain variable copy; ``Normalization.load_own_variables``
#   calls ``finalize_state()``, which
#   rebuilds the ``mean``/``variance`` it computes with from ``adapt_mean`` and
#   ``adapt_variance`` (without it an adapted Normalization computes with mean
#   0 and variance 1); a lookup in ``tf_idf`` mode keeps its idf weights so;
# * ``save_assets(directory)`` / ``load_assets(directory)``: files, such as a
#   ``StringLookup``'s or ``IntegerLookup``'s adapted vocabulary (a lookup
#   table, not a variable: a copy without it fails "Table not initialized"),
#   and KerasHub's tokenizers' vocabularies.
#
# `carry_state` runs those hooks, on the layer and on every layer inside it,
# pair by pair, as ``keras.saving.load_model`` would: the copy then holds what
# a ``.keras`` file of the model would give it. All four are public methods of
# the layers that define them. Other layers' variables (Dense, Embedding:
# their hooks only add quantized forms) are copied by
# `tf_mixed.models.cloning.copy_weights`, which casts them and follows
# widened shapes.


from __future__ import annotations

import tempfile
from typing import Any

import keras

from tf_mixed._internal import shims as _internals

__all__ = ["carry_state"]


def carry_state(source: keras.layers.Layer, target: keras.layers.Layer) -> None:
    """Runs Keras's saving hooks from ``source`` into its copy ``target``.

    Pairs ``source`` and ``target`` with the layers inside each (in Keras's
    order); for each pair of the same class, a layer with ``finalize_state``
    (Keras's adaptable preprocessing layers) gets its own state
    through ``save_own_variables``/``load_own_variables``, and a layer with
    ``save_assets`` gets its assets through a temporary directory. The
    variables themselves are copied before (`tf_mixed.models.cloning.copy_weights`,
    which casts them to the copy's dtypes); values loaded here are cast by
    ``Variable.assign`` to the copy's variable dtype.

    Args:
        source: The layer in the user's model; read only.
        target: Its copy, built.
    """
    mine, theirs = _internals.sublayers(source), _internals.sublayers(target)
    if len(mine) != len(theirs):
        mine, theirs = [source], [target]
    for layer, twin in zip(mine, theirs):
        if type(layer) is not type(twin):
            continue
        if hasattr(layer, "finalize_state") and layer.built and twin.built:
            store = dict[str, Any]()
            layer.save_own_variables(store)
            twin.load_own_variables(store)
        if hasattr(layer, "save_assets") and hasattr(twin, "load_assets"):
            with tempfile.TemporaryDirectory(prefix="tf_mixed_assets_") as directory:
                layer.save_assets(directory)
                twin.load_assets(directory)
