"""The healed set as a precision map: moving a model to it, and its checkpoint form."""

# Healing (`tf_mixed.scaling.healing`) decides which layers move; this module
# moves them, as rule 6 of `tf_mixed.policy.precision_map` ("healed": float32
# compute), and is the one way every restore of a healed set moves them
# (`apply_restored`): a ``tf.train.Checkpoint`` of the optimizer and a
# ``.weights.h5``/``.keras`` load of it alike, with healing attached or not
# (`tf_mixed.scaling.attribution.AttributionSlot`). A step traced before a
# move computes the old precision: `moves` counts them, so a step built by
# `tf_mixed.training.make_train_step` traces itself again.

from __future__ import annotations

import dataclasses
import json
import re
from typing import NamedTuple

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import is_input_layer, walk_layers
from tf_mixed.policy import precision_map

__all__ = ["Resolution", "apply_restored", "attributed_layers", "from_tensors", "heal",
           "healed_map", "moves", "resolve", "retrace_keras_functions", "to_tensors",
           "warn_unmatched"]

FLOAT32 = "float32"


def healed_map(model, names) -> precision_map.PrecisionMap:
    """The map ``model`` computes in with ``names`` healed (rule 6 of
    `tf_mixed.policy.precision_map.RULES` applied to what it computes in now)."""
    return precision_map.observed(model).healed(names)


def heal(model, names) -> tuple:
    """Moves the named layers of a built model to float32 compute, through the map.

    Args:
        model: A built model.
        names: Layer names as `tf_mixed.scaling.attributed_layers` gives them.

    Returns:
        The names among ``names`` whose layer (or a sublayer) moved now.

    Raises:
        ValueError: A name the model's map does not hold (the valid ones listed).
    """
    change = healed_map(model, names)
    moved = {id(layer) for layer in precision_map.move(model, change)}
    if moved:
        _internals.rider(model, "healing_moves", _Moves).count += 1
    return tuple(n for n, layer in _named(model, names)
                 if any(id(sub) in moved for sub in _internals.sublayers(layer)))


@dataclasses.dataclass
class _Moves:
    """How many times `heal` moved a model's layers (kept on the model)."""

    count: int = 0


def moves(model) -> int:
    """How many times healing moved ``model``'s layers so far.

    A step function traced before a move computes the moved layers in their
    old precision: `tf_mixed.training.make_train_step` compares this count
    at each call and traces its step again when it changed.
    """
    return _internals.rider(model, "healing_moves", _Moves).count


def apply_restored(model, names, order=None) -> tuple:
    """Moves the layers a restored healed set names, at once: every restore ends here.

    A ``tf.train.Checkpoint`` of the optimizer (its ``healed_map`` child) and a
    ``.weights.h5``/``.keras`` load of it both apply the healed set through
    this one function, whatever trains the model next. Keras's traced
    functions (``fit``, ``evaluate``, ``predict``) are traced again; a
    `tf_mixed.training.make_train_step` step traces itself again at its next
    call (`moves`); a step function of the caller's own, traced before, must
    be created again: the warning says so. Saved names are matched to the
    model's as `resolve` says (a layer Keras renamed at this load matched).

    Args:
        model: The built model the optimizer trains.
        names: The healed layer names the restored state holds.
        order: Every attributed layer's name when the state was saved, in
            the model's order, when the state holds it (a ``.keras`` or
            ``.weights.h5`` entry), else None.

    Returns:
        The model's names whose layer (or a sublayer) moved now. A name
        ``model`` lacks, or one two of its layers could be, moves nothing
        (a warning names it and its candidates): the restore goes on.
    """
    from absl import logging

    resolution = resolve(model, names, order)
    warn_unmatched(model, resolution)
    known = list(resolution.names.values())
    moved = heal(model, known) if known else ()
    if not moved:
        return ()
    if any(getattr(model, attribute, None) is not None
           for attribute in ("train_function", "test_function", "predict_function")):
        retrace_keras_functions(model)
    logging.warning(
        "tf_mixed healing: the restored optimizer state moved layers %s to float32 "
        "compute (healed before it was saved). fit and make_train_step retrace; a step "
        "function of your own traced before the restore must be created again.",
        list(moved))
    return moved


class Resolution(NamedTuple):
    """How `resolve` matched saved layer names to a model's.

    Attributes:
        names: ``{saved name: the model's name}`` for each name matched.
        lacking: Saved names no layer of the model can be.
        ambiguous: ``{saved name: [the model's candidates]}`` for names two or
            more layers could be (none of them moves).
    """

    names: dict
    lacking: list
    ambiguous: dict


_UNIQUING = re.compile(r"_\d+$")


def _stem(path: str) -> str:
    """``path`` with Keras's ``_N`` uniquing suffix taken off each part."""
    return "/".join(_UNIQUING.sub("", part) for part in path.split("/"))


def resolve(model, saved, order=None) -> Resolution:
    """Matches saved layer names (a healed set, the attribution's counters) to ``model``'s.

    Keras names a layer made without a name from a process-wide counter
    (``keras.src.utils.naming.uniquify``): a block a model creates in its
    ``__init__`` is ``block`` at the first load of a ``.keras`` file and
    ``block_1`` at the next one in the same process (the file's config does
    not hold the names of layers a constructor makes). So a saved name is
    matched:

    1. to the model's layer of that very name;
    2. else, when ``order`` (every attributed layer's name at the save, in
       order) has as many names as the model attributes and each differs
       from the model's at its position only by ``_N`` suffixes, to the layer
       at its position;
    3. else to the one layer, not matched by name, whose path differs from it
       only by ``_N`` suffixes (part by part). Two candidates, or a candidate
       two saved names want: no match (`Resolution.ambiguous`); never a guess.

    Args:
        model: A built model.
        saved: The saved names (qualified as `tf_mixed.scaling.attributed_layers`).
        order: The saved attributed names in order, or None.

    Returns:
        A `Resolution`.
    """
    live = [name for name, _ in walk_layers(model)]
    saved = list(dict.fromkeys(saved))
    present = set(live)
    names = {name: name for name in saved if name in present}
    rest = [name for name in saved if name not in names]
    if rest and order is not None:
        attributed = [name for name, _ in attributed_layers(model)]
        order = list(order)
        if len(order) == len(attributed) and all(
                _stem(a) == _stem(b) for a, b in zip(order, attributed)):
            for name in [n for n in rest if n in order]:
                names[name] = attributed[order.index(name)]
            rest = [name for name in rest if name not in names]
    taken = set(names.values())
    candidates = {name: [n for n in dict.fromkeys(live)
                         if n not in taken and _stem(n) == _stem(name)] for name in rest}
    wanted: dict = {}
    for found in candidates.values():
        for name in found:
            wanted[name] = wanted.get(name, 0) + 1
    lacking, ambiguous = [], {}
    for name, found in candidates.items():
        if len(found) == 1 and wanted[found[0]] == 1:
            names[name] = found[0]
        elif found:
            ambiguous[name] = found
        else:
            lacking.append(name)
    return Resolution({name: names[name] for name in saved if name in names},
                      lacking, ambiguous)


def warn_unmatched(model, resolution: Resolution) -> None:
    """The warning for saved names `resolve` matched to no layer of ``model``."""
    from absl import logging

    if resolution.lacking:
        logging.warning(
            "tf_mixed healing: the restored optimizer state names healed layers model "
            "'%s' lacks: %s; they are not moved. Its layers: %s.", model.name,
            resolution.lacking, [name for name, _ in walk_layers(model)])
    for name, found in resolution.ambiguous.items():
        logging.warning(
            "tf_mixed healing: the restored optimizer state names healed layer %r, which "
            "model '%s' could hold under any of %s (Keras's _N renaming); it is not "
            "moved. Move the right one with tf_mixed.training.heal_layers(model, [name], "
            "optimizer).", name, model.name, found)


def retrace_keras_functions(model) -> None:
    """Forces Keras to trace the model's train, test and predict functions again.

    Keras keeps each traced function until forced: without the last two,
    validation in a ``fit`` and a later evaluate/predict would run moved
    layers in their old precision. ``fit`` reads ``model.train_function`` at
    every step, so the next step runs the new trace.
    """
    model.make_train_function(force=True)
    model.make_test_function(force=True)
    model.make_predict_function(force=True)


def to_tensors(names) -> dict:
    """A checkpoint's copy of a healed set: ``{"healed_map": the map as JSON}``."""
    import tensorflow as tf

    change = {n: FLOAT32 for n in names}
    record = precision_map.PrecisionMap(
        FLOAT32, change, {n: precision_map.HEALED for n in change}).to_dict()
    return {"healed_map": tf.constant(json.dumps(record))}


def from_tensors(tensors: dict) -> list:
    """The layer names a checkpoint's healed map (`to_tensors`) holds."""
    text = keras.ops.convert_to_numpy(tensors["healed_map"]).item()
    record = precision_map.PrecisionMap.from_dict(json.loads(
        text.decode() if isinstance(text, bytes) else text))
    return list(record.layers)


def attributed_layers(model) -> list:
    """The ``(name, layer)`` pairs attribution can name, in the model's order.

    Nested models are entered; any other layer counts as one block with the
    layers inside it (a ``MultiHeadAttention`` with its projections); input
    layers and layers shared by several places are listed once.
    """
    seen: set = set()
    out = []
    for name, layer in walk_layers(model):
        if isinstance(layer, keras.Model) or is_input_layer(layer):
            continue
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        out.append((name, layer))
    return out


def _named(model, names) -> list:
    """``(name, layer)`` for ``names``, in the model's order."""
    wanted = set(names)
    found, seen = [], set()
    for name, layer in walk_layers(model):
        if name in wanted and name not in seen:
            seen.add(name)
            found.append((name, layer))
    return found
