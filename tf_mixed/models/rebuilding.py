"""A trained model rebuilt to compute in another dtype, with its trained weights.

`tf_mixed.export` serves a model in the precision asked for, not the one it
was trained in: a mixed-precision model converted to LiteRT as it is needs
TensorFlow's Flex ops (the builtin interpreter refuses it), so the model is
rebuilt under float32 first; a float32-trained model served in float16 is
rebuilt under float16. `rebuild` does this for Sequential and functional
models (nested ones included):

* every layer is re-created from its config with the target policy and its
  weights (trainable and not, e.g. BatchNormalization statistics) are
  copied, cast to the new variable dtype;
* layers that must stay float32 stay float32: in a model trained in half
  precision, a layer whose policy is float32 was made so on purpose
  (``keep_float32`` rules, an explicit ``dtype="float32"``); tf_mixed's
  float32 heads (``tf_mixed._internal.facts.FLOAT32_HEADS``) always; layers whose
  policy is not a float policy (integer, ...) keep theirs;
* a ``Lambda`` layer is re-created from its in-memory ``function``, which
  Keras's own ``Lambda.from_config`` refuses for a Python lambda;
* the compiled state (loss, optimizer, ``LossScaleOptimizer``) is not
  carried: the result is for inference.

A subclassed model's layers are created in Python code this module cannot
re-run; `rebuild` raises a TypeError naming the class.
"""

from __future__ import annotations

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import HALF_DTYPES
from tf_mixed._internal.facts import check_model_kind
from tf_mixed._internal.facts import is_input_layer
from tf_mixed._internal.facts import model_inputs_and_outputs
from tf_mixed._internal.facts import FLOAT32_HEADS
from tf_mixed._internal.facts import FLOAT_POLICIES
from tf_mixed._internal.facts import walk_layers

__all__ = ["compute_dtype", "is_graph_model", "rebuild"]


def is_graph_model(model) -> bool:
    """Whether `model` is a built Sequential or functional model."""
    return model_inputs_and_outputs(model)


def compute_dtype(model) -> str:
    """The half dtype any layer of `model` computes in, else "float32"."""
    dtypes = {getattr(layer.dtype_policy, "compute_dtype", None)
              for _, layer in walk_layers(model)}
    dtypes.add(getattr(model.dtype_policy, "compute_dtype", None))
    for half in HALF_DTYPES:
        if half in dtypes:
            return half
    return "float32"


def _target_policy(layer, target: str, trained_half: bool) -> str | None:
    """The policy name `layer` is rebuilt with, or None to keep its own."""
    name = getattr(layer.dtype_policy, "name", None)
    if is_input_layer(layer) or type(layer).__name__ in FLOAT32_HEADS:
        return None
    if name not in FLOAT_POLICIES:
        return None  # an integer or quantized policy: not a compute choice
    if target == "float32":
        return "float32"
    if name == "float32" and trained_half:
        return None  # float32 on purpose in a half-precision model
    # The pure policy named like the dtype: variables in half precision too
    # (half-size artifacts).
    return target


def rebuild(model: keras.Model, target: str | None) -> keras.Model:
    """Returns an inference copy of `model` computing in `target`.

    Args:
      model: a built Sequential or functional `keras.Model`; not modified.
      target: "float32", "float16" or "bfloat16"; None keeps every layer's
        own policy (a copy as trained, without the compiled state).

    Returns:
      A new, uncompiled model with the same structure, names and weights.

    Raises:
      TypeError: `model` is subclassed (the message names the class and
        what to do).
      ValueError: `model` is an unbuilt Sequential model.
    """
    check_model_kind(
        model, "export()",
        why_traced="its layers are created by Python code that tf_mixed cannot "
                   "re-run in another precision",
        fix="Use a Sequential or functional model, or export with "
            "precision='as_trained' to serve the model as it computes.")
    trained_half = compute_dtype(model) in HALF_DTYPES

    def clone_layer(layer):
        policy = (None if target is None
                  else _target_policy(layer, target, trained_half))
        if type(layer).__name__ == "Lambda":
            # Lambda.from_config refuses a Python lambda in safe mode; the
            # function is in memory, so it is passed on as it is.
            return keras.layers.Lambda(
                layer.function, output_shape=_internals.lambda_output_shape(layer),
                mask=layer.mask, arguments=layer.arguments, name=layer.name,
                dtype=policy or layer.dtype_policy, trainable=layer.trainable)
        config = layer.get_config()
        if policy is not None and "dtype" in config:
            config["dtype"] = policy
        return layer.__class__.from_config(config)

    def clone(inner):
        if isinstance(inner, keras.Sequential):
            layers = [clone(layer) if isinstance(layer, keras.Model) else clone_layer(layer)
                      for layer in inner.layers]
            first = inner.inputs[0]
            return keras.Sequential(
                [keras.Input(batch_shape=first.shape, dtype=first.dtype,
                             name=getattr(_producer(first), "name", None))] + layers,
                name=inner.name, trainable=inner.trainable)
        if isinstance(inner, keras.Model):
            # An uncompiled functional view of the same graph: clone_model
            # compiles its result when given a compiled model.
            view = keras.Model(inner.input, inner.output, name=inner.name)
            return keras.models.clone_model(
                view, input_tensors=keras.tree.map_structure(_new_input, inner.input),
                clone_function=lambda layer: (clone(layer) if isinstance(layer, keras.Model)
                                              else clone_layer(layer)))
        return clone_layer(inner)

    new = clone(model)
    _copy_weights(model, new)
    return new


def _producer(tensor):
    history = _internals.keras_history(tensor)
    return history.operation if history is not None else None


def _new_input(tensor):
    # Named like the original input layer, so inputs keyed by name still fit.
    return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype,
                       sparse=getattr(tensor, "sparse", False),
                       name=getattr(_producer(tensor), "name", None))


def _copy_weights(model, new) -> None:
    old_layers = [(n, layer) for n, layer in walk_layers(model)
                  if not isinstance(layer, keras.Model)]
    new_layers = {n: layer for n, layer in walk_layers(new)
                  if not isinstance(layer, keras.Model)}
    for name, layer in old_layers:
        if not layer.weights:
            continue
        clone = new_layers.get(name)
        if clone is None or len(clone.weights) != len(layer.weights):
            raise RuntimeError(
                f"tf_mixed could not match layer '{name}' of model "
                f"'{model.name}' in its rebuilt copy; please report this "
                "with the model summary.")
        for source, target in zip(layer.weights, clone.weights):
            target.assign(keras.ops.cast(source.value, target.dtype))
