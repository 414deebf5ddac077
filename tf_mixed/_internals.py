"""Every access to private or patched Keras/TensorFlow behaviour, one function each.

Each function says what it reaches, why, and for which version it was
written; `tests/test_internals.py` fails when Keras or TensorFlow changes
under one of them.
"""

from __future__ import annotations

import functools
from typing import Callable

import keras

# Hooks called at the end of every `keras.layers.Layer.__init__`.
_layer_init_hooks: list[Callable] = []


def add_layer_init_hook(hook: Callable[[keras.layers.Layer, object], None]) -> None:
    """Calls ``hook(layer, dtype_argument)`` at the end of every ``Layer.__init__``.

    What it reaches: it replaces ``keras.layers.Layer.__init__`` (Keras 3.15.1)
    with a wrapper that runs the original, then each hook. Every layer class
    reaches it through ``super().__init__(...)``, after the layer's name and
    dtype policy are set and before the subclass creates sub-layers or
    weights (e.g. MultiHeadAttention passes its own policy to its sub-layers
    after ``super().__init__``).

    Why: Keras picks a layer's dtype policy in ``Layer.__init__`` from the
    ``dtype`` argument or, when it is None, the global policy, and offers no
    per-layer hook there. A global ``DTypePolicyMap`` was tried first and
    does not do the job (measured, Keras 3.15.1): it is keyed by
    ``layer.path``, which is None for layers without a ``build`` method (they
    are built at init), it is consulted only after the first call's inputs
    were already cast to the default dtype (the symbolic output of a
    functional model says float16 while eager calls compute float32), a
    layer in a Sequential has the path ``sequential/NAME`` so an exact name
    key misses it, and it never sees a layer's class.

    The wrapper keeps ``inspect.getfullargspec`` equal to the original's
    (``self, **kwargs``) and ``inspect.signature`` follows ``__wrapped__``, so
    Keras's automatic ``get_config`` (``Operation.__new__``) is unchanged.
    Installing twice adds the hook once.

    Args:
        hook: Called as ``hook(layer, dtype)``, ``dtype`` being the ``dtype``
            argument the layer was created with (None: follow the global
            policy).
    """
    if hook in _layer_init_hooks:
        return
    _layer_init_hooks.append(hook)
    layer_class = keras.layers.Layer
    if getattr(layer_class.__init__, "_tf_mixed_hooked", False):
        return
    original = layer_class.__init__

    @functools.wraps(original)
    def __init__(self, **kwargs):
        original(self, **kwargs)
        for each in tuple(_layer_init_hooks):
            each(self, kwargs.get("dtype"))

    __init__._tf_mixed_hooked = True
    layer_class.__init__ = __init__
