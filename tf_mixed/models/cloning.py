"""Re-creating layers and models in another dtype, for `convert` and `probe`.

Two things both need and Keras does not give:

* `recreate`: a new layer from ``layer.get_config()`` with another dtype. A
  ``Lambda`` is re-created from the function object it holds
  (``layer.function``), never by deserialising its code: Keras refuses a
  Python lambda in safe mode and cannot locate an unregistered ``def``
  (measured on Keras 3.15.1), though the function is right there in memory.
* `flat_clone`: a functional copy of a Sequential or functional model in
  which every nested model is inlined, so the output of every leaf layer,
  inner ones included, is a tensor of one graph (the probe taps them all).
  Sequential models need no ``model.input`` (which Keras leaves undefined
  for a Sequential that was never called as a functional model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras

from tf_mixed._internal import shims as _internals

__all__ = ["FlatClone", "flat_clone", "model_input", "recreate"]


def recreate(layer: keras.layers.Layer, dtype=None, name: str | None = None) -> keras.layers.Layer:
    """A new, unbuilt layer configured like ``layer``.

    Args:
        layer: Any Keras layer (not a model).
        dtype: A dtype policy (name or `keras.DTypePolicy`) for the new
            layer; None keeps the layer's own.
        name: A new name; None keeps the layer's.

    Returns:
        The new layer; weights are not copied.
    """
    config = layer.get_config()
    if dtype is not None and "dtype" in config:
        config["dtype"] = dtype
    if name is not None:
        config["name"] = name
    if isinstance(layer, keras.layers.Lambda):
        # The constructor takes the live objects; from_config would
        # deserialise the function's code (refused or unlocatable).
        config.update(function=layer.function, arguments=dict(layer.arguments),
                      mask=layer.mask,
                      output_shape=_internals.lambda_output_shape(layer))
        return type(layer)(**config)
    return type(layer).from_config(config)


def model_input(model: keras.Model):
    """The input structure a Sequential or functional model is called with.

    ``model.input`` for a functional model (a tensor, list or dict); the one
    input tensor of a built Sequential model, whose ``model.input`` Keras
    leaves undefined unless it was called as a functional model.
    """
    if isinstance(model, keras.Sequential):
        return model.inputs[0]
    return model.input


def new_input(tensor, name=None):
    """A new ``keras.Input`` shaped and typed like ``tensor``."""
    return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype,
                       sparse=getattr(tensor, "sparse", False), name=name)


@dataclasses.dataclass(frozen=True)
class FlatClone:
    """A flattened clone (see `flat_clone`).

    Attributes:
        model: The functional clone, nested models inlined.
        layers: ``(qualified name, original layer, clone layer)`` per leaf
            layer, in the order they were first called; qualified names
            join the enclosing models' names with "/" (``encoder/dense``),
            as `tf_mixed._internal.facts.walk_layers` does.
    """

    model: keras.Model
    layers: tuple[tuple[str, keras.layers.Layer, keras.layers.Layer], ...]


def flat_clone(model: keras.Model, dtype_for: Callable) -> FlatClone:
    """A functional copy of ``model`` with nested models inlined, same weights.

    Args:
        model: A built Sequential or functional model.
        dtype_for: ``dtype_for(layer) -> policy or None`` for each leaf layer
            (None: keep the layer's own policy).

    Returns:
        A `FlatClone`. Clone layers are renamed only where names collide
        across nested models (Keras needs unique names in one model).
    """
    clones: dict[int, keras.layers.Layer] = {}
    pairs: list[tuple[str, keras.layers.Layer, keras.layers.Layer]] = []
    taken: set[str] = set()

    def clone_of(layer, prefix):
        if id(layer) not in clones:
            name = None
            if layer.name in taken:
                name = _unique(prefix.replace("/", "_") + layer.name, taken)
            clone = recreate(layer, dtype_for(layer), name)
            taken.add(clone.name)
            clones[id(layer)] = clone
            pairs.append((prefix + layer.name, layer, clone))
        return clones[id(layer)]

    def run(container, inputs, prefix):
        if isinstance(container, keras.Sequential):
            outputs = inputs
            for layer in container.layers:
                outputs = call(layer, prefix, outputs)
            return outputs

        def call_fn(operation, *args, **kwargs):
            return call(operation, prefix, *args, **kwargs)

        return _internals.run_through_graph(container, inputs, call_fn)

    def call(layer, prefix, *args, **kwargs):
        if isinstance(layer, keras.Model):
            return run(layer, args[0], f"{prefix}{layer.name}/")
        return clone_of(layer, prefix)(*args, **kwargs)

    inputs = keras.tree.map_structure(
        lambda t: new_input(t, name=_input_name(t)), model_input(model))
    taken.update(_input_name(t) for t in keras.tree.flatten(inputs))
    outputs = run(model, inputs, "")
    clone = keras.Model(inputs, outputs, name=model.name)
    for _, layer, new in pairs:
        if layer.weights:
            _copy_weights(layer, new)
    return FlatClone(clone, tuple(pairs))


def _copy_weights(source, target) -> None:
    """By name when the names are unique (a float8 layer cloned unquantized
    keeps only its kernel and bias; rebuilt float8 creates them in another
    order), else by order."""
    by_name = {w.name: w for w in source.weights}
    names = [w.name for w in target.weights]
    if len(by_name) == len(source.weights) and set(names) <= set(by_name):
        for weight in target.weights:
            weight.assign(by_name[weight.name])
    else:
        target.set_weights(source.get_weights())


def _input_name(tensor):
    history = _internals.keras_history(tensor)
    return history.operation.name if history is not None else None


def _unique(name: str, taken: set[str]) -> str:
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}_{i}", i + 1
    return candidate
