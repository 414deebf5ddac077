"""Facts about mixed precision that several modules need, each kept once.

`auditing` (what is wrong), `conversion` (how to fix it) and the set-up checks
of `callbacks` read the same tables here, so the advice one gives is what the
other does.
"""

from __future__ import annotations

from typing import Iterator

import keras

# The reduced-precision float dtypes a layer can compute in.
HALF_DTYPES = ("float16", "bfloat16")

# The multiple a matrix dimension needs to fill the hardware's tiles, per
# half dtype: float16 Tensor Cores take multiples of 8; Intel AMX tiles (and
# float8 Tensor Cores) take multiples of 16 bfloat16 elements. `audit` checks
# layer attributes against 8; `census` checks traced shapes against these.
TILE_MULTIPLES = {"float16": 8, "bfloat16": 16}

# Class names of tf_mixed's float32 heads (tf_mixed.layers): float32 by
# design, so they are neither converted nor reported as explicit float32.
FLOAT32_HEADS = ("OutputActivation", "Float32Output")

# Activations that squash logits into probabilities (or their log). Computed
# in half precision as a model output they saturate and hide the logits from
# Keras's exact cross-entropy, so they belong in a float32 head.
SQUASHING_ACTIVATIONS = ("softmax", "sigmoid", "log_softmax")

# Dtype policies whose layers compute in a float type: the ones `convert`
# may switch to a mixed policy, and `probe` may compare against float32.
FLOAT_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16")


def activation_name(layer) -> str | None:
    """The name of the activation a layer applies last, or None.

    Args:
      layer: a Keras layer.

    Returns:
      "softmax" for a ``Softmax`` layer; the function name of its
      ``activation`` attribute (Dense, Conv, Activation, ...); None when the
      layer has no named activation.
    """
    if type(layer).__name__ == "Softmax":
        return "softmax"
    name = getattr(getattr(layer, "activation", None), "__name__", None)
    return name if isinstance(name, str) else None


def walk_layers(model, prefix: str = "") -> Iterator[tuple[str, keras.Layer]]:
    """Every layer of a model, depth first, entering nested models.

    Semantics, which every caller relies on:

    * pre-order: a nested model is yielded itself, then its own layers;
    * names are qualified by the enclosing models, ``outer/inner`` (the
      top-level layers keep their plain name);
    * only models are entered (``keras.Model``); other layers that hold
      layers (wrappers such as ``Bidirectional``) are yielded as one layer;
    * a layer shared by several models is yielded once per place it appears.

    Callers that want leaf layers only filter out ``keras.Model``.

    Args:
      model: a `keras.Model`.
      prefix: prepended to every name (used for the recursion).

    Yields:
      (qualified name, layer) pairs.
    """
    for layer in model.layers:
        name = prefix + layer.name
        yield name, layer
        if isinstance(layer, keras.Model):
            yield from walk_layers(layer, name + "/")


def layer_outputs(layer) -> list:
    """Symbolic outputs of every call of `layer` in a graph ([] if none).

    Args:
      layer: a layer of a Sequential/functional model.

    Returns:
      A list of KerasTensors (anything without shape and dtype dropped).
    """
    from tf_mixed import _internals

    outputs = _internals.call_outputs(layer)
    if not outputs:
        try:
            outputs = keras.tree.flatten(layer.output)
        except (AttributeError, ValueError, RuntimeError):
            outputs = []
    return [t for t in outputs if hasattr(t, "shape") and hasattr(t, "dtype")]


def model_outputs(model) -> list:
    """The symbolic outputs of a Sequential/functional model, flat.

    Args:
      model: a `keras.Model`.

    Returns:
      A list of KerasTensors; [] for a subclassed or unbuilt model.
    """
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return []
    return list(keras.tree.flatten(outputs)) if outputs else []
