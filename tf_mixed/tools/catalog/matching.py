"""A model's layer matched to the nearest configuration the catalog measured, or none close."""

# A class's rows differ in the values that move its numerics (`MATCH_KEYS`):
# a normalization's ``epsilon``, a Dense layer's ``units`` and the length of
# its sums (``input_dim``), an Activation's function, Dot's ``normalize``,
# Attention's score, a KerasHub transformer block's width, inner size,
# activation, ``layer_norm_epsilon`` and ``normalize_first``, an Embedding's
# vocabulary (its own ``input_dim`` argument) and how it is called (``call``:
# "float ids", "int ids" or "reverse", ReversibleEmbedding's logits). A layer is
# judged by the row of its class and policy whose values are nearest its own:
# numbers by how many decades apart they are, anything else equal or not. A
# row is *close* when every value it states is within `CLOSE_DECADES` of the
# layer's and every other one is equal; a size (`SIZE_KEYS`) smaller than
# the measured one is close at any distance (fewer terms in a sum: less
# rounding, later overflow). When no row is close, the layer has no row to be
# judged by and the check says so (`tf_mixed.tools.catalog.model_check`'s
# ``catalog_unmatched``).
#
# A row is its class's: a ``keras`` row is matched by `keras.layers`' class of
# its name, a ``keras_hub`` row by `keras_hub.layers`' (`row_class`), never by
# another class of the same name (KerasHub's Gemma has its own
# RMSNormalization, which computes in float32 inside: not Keras's).
#
# Rows measured under a condition no layer configuration shows (a ``mask``,
# a large-mean ``distribution``) are not candidates: what they measured is
# the data, not the layer. Among rows equally near, the registry's first
# wins (a class's common configuration comes first: BatchNormalization's
# batch statistics before its inference).

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, Sequence

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import activation_name
from tf_mixed.tools.catalog.results import Row

__all__ = ["CLOSE_DECADES", "CONDITIONS", "MATCH_KEYS", "SIZE_KEYS", "Match", "describe",
           "nearest", "row_class"]

MATCH_KEYS = ("epsilon", "units", "input_dim", "activation", "normalize", "use_scale",
              "score_mode", "layer_norm_epsilon", "intermediate_dim", "normalize_first",
              "call")
"""The configuration values a layer is matched on (when its class's rows state them)."""

SIZE_KEYS = ("units", "input_dim", "intermediate_dim")
"""Sizes: a layer smaller than a measured configuration is covered by it."""

CONDITIONS = ("mask", "distribution")
"""Row values that are conditions on the data, not the layer's configuration."""

CLOSE_DECADES = 1.5
"""A number within this many decades (a factor of ~32) of the measured one is close."""


class Match(NamedTuple):
    """The row a layer is judged by.

    Attributes:
        row: the nearest row of the layer's class and policy.
        close: whether every value the row states is close to the layer's.
        differences: ``"epsilon 1e-12 (measured 1e-06)"`` for each value
            that is not close (empty when ``close``).
    """

    row: Row
    close: bool
    differences: tuple[str, ...]


def row_class(row: Row) -> type | None:
    """The class a row measured: `keras.layers`' class of its name for a
    ``keras`` row, `keras_hub.layers`' for a ``keras_hub`` row (None when
    KerasHub is not imported: no layer of a model is then KerasHub's), None
    for a user's row.
    """
    if row.source == "keras":
        import keras

        return getattr(keras.layers, row.layer, None)
    if row.source == "keras_hub":
        hub = sys.modules.get("keras_hub")
        return None if hub is None else getattr(hub.layers, row.layer, None)
    return None


def describe(layer, keys: Sequence[str] = MATCH_KEYS) -> dict[str, Any]:
    """The layer's values for ``keys`` (a value it does not have is left out).

    Args:
        layer: a Keras layer.
        keys: names among `MATCH_KEYS`.

    Returns:
        ``{key: value}``: constructor arguments from ``get_config()``,
        ``activation`` by its function's name, ``input_dim`` the layer's own
        ``input_dim`` argument where it has one (an Embedding's vocabulary),
        else the last axis of its first input; ``call`` (an embedding's
        rows state it) how its first call feeds it: "reverse" (called with
        ``reverse=True``), else "int ids" or "float ids" by its input's dtype.
    """
    return described(layer, keys, activation_name(layer), _internals.call_inputs(layer),
                     _internals.first_call_arguments(layer))


def described(layer, keys: Sequence[str], activation: str | None, inputs: Sequence[Any],
              first_call: tuple[tuple, dict]) -> dict[str, Any]:
    """`describe`, told the layer's activation name, symbolic call inputs and
    first call's ``(args, kwargs)`` (as a model's survey found them:
    `tf_mixed.policy.precision_map.Survey`'s ``calls`` and ``first_call``)."""
    try:
        config = layer.get_config()
    except Exception:  # noqa: BLE001 - a layer without a config: matched on what it shows
        config = {}
    found: dict[str, Any] = {}
    value: Any = None
    for key in keys:
        if key == "activation":
            value = activation
        elif key == "input_dim":
            value = config.get("input_dim") or _input_dim(layer, inputs)
        elif key == "call":
            value = _call_kind(layer, inputs, first_call)
        else:
            value = config.get(key)
        if value is not None:
            found[key] = value
    return found


def _input_dim(layer, inputs: Sequence[Any]) -> int | None:
    for tensor in inputs:
        shape = getattr(tensor, "shape", None)
        if shape and shape[-1] is not None:
            return int(shape[-1])
    kernel = getattr(layer, "kernel", None)
    shape = getattr(kernel, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) == 2 else None


def _call_kind(layer, inputs: Sequence[Any], first_call: tuple[tuple, dict]) -> str | None:
    """How an embedding's first call (``(args, kwargs)``) feeds it (None: not
    an embedding, or never called symbolically)."""
    import keras

    if not isinstance(layer, keras.layers.Embedding):
        return None
    args, kwargs = first_call
    if kwargs.get("reverse", args[1] if len(args) > 1 else False) is True:
        return "reverse"
    dtype = getattr(inputs[0], "dtype", None) if inputs else None
    if dtype is None:
        return None
    return "int ids" if "int" in keras.backend.standardize_dtype(dtype) else "float ids"


def _gap(mine, measured) -> float:
    """How far apart two values are: decades for positive numbers, else 0 or inf."""
    numbers = all(type(v) in (int, float) for v in (mine, measured))  # a bool is no size
    if numbers and mine > 0 and measured > 0:
        return abs(math.log10(float(mine) / float(measured)))
    return 0.0 if mine == measured else math.inf


def _text(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def nearest(rows: Sequence[Row], layer) -> Match | None:
    """The row of ``rows`` (one class, one policy) nearest ``layer``'s configuration.

    Args:
        rows: candidate rows, in the registry's order.
        layer: the model's layer.

    Returns:
        A `Match`, or None when ``rows`` is empty.
    """
    return nearest_described(rows, layer, activation_name(layer), _internals.call_inputs(layer),
                             _internals.first_call_arguments(layer))


def nearest_described(rows: Sequence[Row], layer, activation: str | None,
                      inputs: Sequence[Any], first_call: tuple[tuple, dict]) -> Match | None:
    """`nearest`, told the layer's activation name, call inputs and first
    call (`described`)."""
    if not rows:
        return None
    plain = [row for row in rows if not any(key in row.args for key in CONDITIONS)]
    candidates = plain or list(rows)
    keys = [key for key in MATCH_KEYS if any(key in row.args for row in candidates)]
    mine = described(layer, keys, activation, inputs, first_call)
    scored = []
    for index, row in enumerate(candidates):
        gaps = {key: _gap(mine[key], row.args[key]) for key in keys
                if key in row.args and key in mine}
        far = tuple(f"{key} {_text(mine[key])} (measured {_text(row.args[key])})"
                    for key, gap in gaps.items() if gap > CLOSE_DECADES
                    and not (key in SIZE_KEYS and mine[key] < row.args[key]))
        rank = (bool(far), sum(min(g, 1e3) for g in gaps.values()), index)
        scored.append((rank, Match(row, not far, far)))
    return min(scored, key=lambda item: item[0])[1]
