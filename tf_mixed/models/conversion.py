"""Rebuild a model that was built under float32 so it computes in mixed precision.

The common mistake: ``tf_mixed.enable()`` called after the model was built.
Keras fixes each layer's policy when the layer is created, so the model keeps
computing in float32. `convert` returns an equivalent model under the mixed
policy with the same weights:

    model = build_model()           # float32, by mistake
    tf_mixed.enable()
    model = tf_mixed.convert(model)  # now mixed, same weights

What it does:

* every layer is re-created from its config with the new dtype policy, and
  its weights (trainable and not, e.g. BatchNormalization statistics) are
  copied over; variables stay float32 under a mixed policy, so the copy is
  exact;
* an output produced by a layer with a squashing activation (softmax,
  sigmoid, log_softmax: ``tf_mixed._internal.facts.SQUASHING_ACTIVATIONS``, the same
  table `tf_mixed.audit` reports from) gets a float32 head: that layer
  becomes linear (renamed ``<name>_logits``) and a
  ``tf_mixed.layers.OutputActivation`` named like the original layer is
  appended, so output names, and losses keyed by them, still match; an
  output ``Activation``/``Softmax`` layer, and any other layer producing a
  model output (a regression head, say), is kept in float32 instead, so
  every output is float32;
* a compiled model is compiled again with the same loss, metrics and
  optimizer *configuration*; under ``mixed_float16`` the optimizer is wrapped
  with ``tf_mixed.wrap_optimizer``. The optimizer's *state* (iterations,
  moments) cannot be carried to new variables; a `ConversionNote` warning
  says so, and the notes are kept in ``new_model.conversion_notes``.

Which layers stay float32: a model built under float32 has no record of which
layers were made float32 on purpose (every layer says "float32"), so all are
converted except input layers, layers whose policy is not a float policy,
tf_mixed's float32 heads, the layers named in ``keep_float32``, and layers
that would round token ids on their way in: a layer that is or holds an
``Embedding`` and takes its ids as floats straight from a model input stays
float32 when the target dtype cannot represent its largest id exactly
(bfloat16: above 256; float16: above 2048), so the ids stay exact. A layer
kept in float32 keeps the layers its constructor creates in float32 too.

Sequential and functional models only: a subclassed model's layers are
created in Python code convert cannot re-run, so it raises a TypeError that
says to call ``tf_mixed.enable()`` before building the model.
"""

from __future__ import annotations

import warnings

import keras

from tf_mixed.models import cloning as _cloning
from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import FLOAT32_HEADS
from tf_mixed._internal.facts import FLOAT_POLICIES
from tf_mixed._internal.facts import HALF_DTYPES
from tf_mixed._internal.facts import SQUASHING_ACTIVATIONS
from tf_mixed._internal.facts import activation_name
from tf_mixed._internal.facts import check_model_kind
from tf_mixed._internal.facts import is_input_layer
from tf_mixed._internal.facts import rounded_ids
from tf_mixed._internal.facts import walk_layers
from tf_mixed.policy import keep_float32 as keep_float32_rules
from tf_mixed._internal import tf_keras_check
from tf_mixed._internal import validate as _validate
from tf_mixed.models import padding

__all__ = ["ConversionNote", "convert"]



class ConversionNote(UserWarning):
    """Something `convert` could not carry over (such as optimizer state)."""


def _resolve_policy(policy) -> str:
    from tf_mixed.policy import global_policy as policy_module

    if policy is None:
        name = keras.config.dtype_policy().name
        if name == "float32":
            raise ValueError(
                "convert() with policy=None converts to the global policy, "
                "which is 'float32': nothing to convert. Call "
                "tf_mixed.enable() first, or pass policy='mixed_float16' or "
                "policy='mixed_bfloat16'. Received: policy=None")
        return name
    if isinstance(policy, keras.DTypePolicy):
        policy = policy.name
    name = policy_module.canonical_name(policy)
    if name == "auto":
        from tf_mixed.policy import hardware

        name, reason = policy_module.resolve_auto(hardware.detect())
        if name == "float32":
            raise ValueError(
                f"policy='auto' chose float32 on this host ({reason}): nothing "
                "to convert. Pass policy='mixed_float16' or "
                "policy='mixed_bfloat16' to convert anyway.")
    return name


def _producer(tensor):
    history = _internals.keras_history(tensor)
    return history.operation if history is not None else None


def _unique(name: str, taken: set[str]) -> str:
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}_{i}", i + 1
    taken.add(candidate)
    return candidate


def convert(model: keras.Model, policy: str | None = None, *,
            keep_float32: keep_float32_rules.Spec = (),
            pad_to: int | None = None) -> keras.Model:
    """Returns a copy of a float32-built model that computes under a mixed policy.

    Args:
      model: a built Sequential or functional `keras.Model`. It is not
        modified: weights, policy and compiled state stay as they are.
      policy: the target policy: "mixed_float16", "mixed_bfloat16",
        "float32", an alias such as "fp16", "auto", or a `keras.DTypePolicy`.
        None (default) uses the global policy, which must then be mixed
        (call ``tf_mixed.enable()`` first).
      keep_float32: layers to leave in float32: names, layer classes,
        predicates ``layer -> bool``, or a list of these (the argument
        ``tf_mixed.enable`` takes; see `tf_mixed.policy.keep_float32`).
      pad_to: widen hidden Dense layers whose ``units`` is not a multiple
        of this (8 for float16 Tensor Cores, 16 for bfloat16 on AMX) to the
        next multiple, with zero weights that leave every output unchanged
        (see `tf_mixed.models.padding` for which layers qualify). None: no padding.

    Returns:
      A new model with the same weights, float32 output heads where the
      outputs were softmax/sigmoid/log_softmax, compiled like the original
      if it was compiled (fresh optimizer state).
      ``new_model.conversion_notes`` is a tuple of notes, each also issued
      as a `ConversionNote` warning.

    Raises:
      TypeError: `model` is not a Keras model, or is a subclassed model.
      ValueError: `policy` is unknown, or None while the global policy is
        float32; `keep_float32` names a layer the model lacks (the message
        lists close matches); the model is not built; `pad_to` is not a
        positive integer.

    Example:

        model = build_model()      # built before enable(): float32
        tf_mixed.enable("mixed_float16")
        model = tf_mixed.convert(model)
    """
    tf_keras_check.check_objects("tf_mixed.convert", model=model)
    check_model_kind(
        model, "convert()",
        why_traced="its layers are created in Python code that convert "
        "cannot re-run",
        fix="Call tf_mixed.enable() before building the model (before its "
        "constructor runs), so its layers are created under the mixed policy.")
    if pad_to is not None:
        pad_to = _validate.number(
            pad_to, "pad_to", integer=True, rule=lambda n: n >= 1, owner="convert()",
            valid="None or a positive integer, such as 8 (float16) or 16 (bfloat16)")
    target = _resolve_policy(policy)
    keep = keep_float32_rules.parse(keep_float32)
    widths = padding.plan(model, pad_to) if pad_to else {}
    names = {layer.name for layer in model.layers}
    keep.check_names({layer.name for _, layer in walk_layers(model)}, model.name)

    half = keras.DTypePolicy(target).compute_dtype in HALF_DTYPES
    # Output layers whose squashing activation moves into a float32 head.
    split: dict[str, tuple[str, str]] = {}  # clone name -> (head name, activation)
    rename: dict[str, str] = {}  # original name -> clone name
    keep_outputs: set[str] = set()  # output Activation/Softmax layers
    taken = set(names)
    notes = []
    if half:
        for tensor in keras.tree.flatten(model.outputs):
            layer = _producer(tensor)
            if layer is None or is_input_layer(layer):
                continue
            if isinstance(layer, keras.Model):
                notes.append(
                    f"Output '{getattr(tensor, 'name', '?')}' comes from the "
                    f"nested model '{layer.name}', which convert() converts "
                    "as a whole: check its output dtype with "
                    "tf_mixed.audit() and add tf_mixed.layers.Float32Output() "
                    "if it is half precision.")
                continue
            activation = activation_name(layer)
            if (activation in SQUASHING_ACTIVATIONS
                    and type(layer).__name__ not in ("Activation", "Softmax")):
                if layer.name not in rename:
                    new_name = _unique(f"{layer.name}_logits", taken)
                    rename[layer.name] = new_name
                    split[new_name] = (layer.name, activation)
            else:
                # A small output layer (regression head, output Activation):
                # keep it float32 so the output is float32 under its name.
                keep_outputs.add(layer.name)

    # keep_float32 naming a nested model keeps every layer inside it.
    kept_inside = {id(inner) for _, outer in walk_layers(model)
                   if isinstance(outer, keras.Model) and keep.matches(outer)
                   for _, inner in walk_layers(outer)}

    # Layers that would round token ids fed as floats stay float32 (with the
    # Embeddings inside them): see tf_mixed._internal.facts.rounded_ids.
    ids_receivers = {id(layer) for _, layer in walk_layers(model)
                     if half and _receives_ids(layer, target)}

    def clone_layer(layer):
        cls = type(layer).__name__
        policy_name = getattr(layer.dtype_policy, "name", None)
        to_float32 = policy_name in FLOAT_POLICIES and (
            keep.matches(layer) or id(layer) in kept_inside or layer.name in keep_outputs
            or id(layer) in ids_receivers)
        stays = (is_input_layer(layer) or cls in FLOAT32_HEADS
                 or policy_name not in FLOAT_POLICIES or to_float32)
        dtype = "float32" if to_float32 else (None if stays else target)
        if layer.name in rename or layer.name in widths:
            config = layer.get_config()
            if layer.name in rename:
                config.update(name=rename[layer.name], activation="linear")
            if layer.name in widths:
                config["units"] = widths[layer.name]
            if dtype is not None and "dtype" in config:
                config["dtype"] = dtype
            return layer.__class__.from_config(config)
        # Lambda layers are re-created from their in-memory function.
        new = _cloning.recreate(layer, dtype)
        if to_float32:  # and the layers it creates in its constructor
            for inner in _internals.sublayers(new)[1:]:
                if keras.backend.standardize_dtype(inner.compute_dtype) in HALF_DTYPES:
                    inner.dtype_policy = "float32"
        return new

    def call_layer(layer, *args, **kwargs):
        outputs = layer(*args, **kwargs)
        if layer.name in split:
            head_name, activation = split[layer.name]
            from tf_mixed.layers import OutputActivation

            outputs = OutputActivation(activation, name=head_name)(outputs)
        return outputs

    # New inputs named like the original input layers (clone_model would
    # name them after the symbolic tensors), so inputs fed as a dict keyed
    # by input name still work.
    def new_input(t):
        return keras.Input(batch_shape=t.shape, dtype=t.dtype,
                           sparse=getattr(t, "sparse", False),
                           name=getattr(_producer(t), "name", None))

    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy(target)  # the clone's own policy
    try:
        if isinstance(model, keras.Sequential):
            # Cloned layer by layer rather than with clone_model, which
            # compiles the clone when the original is compiled (and raises
            # for objects that do not deserialise); _recompile compiles once.
            layers = [keras.models.clone_model(layer, clone_function=clone_layer,
                                               recursive=True)
                      if isinstance(layer, keras.Model) else clone_layer(layer)
                      for layer in model.layers]
            if split:
                from tf_mixed.layers import OutputActivation

                (head_name, activation), = split.values()
                layers.append(OutputActivation(activation, name=head_name))
            new = keras.Sequential([new_input(model.inputs[0])] + layers,
                                   name=model.name, trainable=model.trainable)
        else:
            # clone_model compiles the clone when the model it is given is
            # compiled, so it is given an uncompiled functional view of the
            # same graph (same layers, no new calls): the user's model is
            # not touched. A subclass of Functional comes back as Functional.
            view = keras.Model(model.input, model.output, name=model.name)
            new = keras.models.clone_model(
                view, input_tensors=keras.tree.map_structure(new_input, model.input),
                clone_function=clone_layer, call_function=call_layer,
                recursive=True)
    finally:
        keras.config.set_dtype_policy(saved)

    _copy_weights(model, new, rename)
    notes += _recompile(model, new, target)
    if widths:
        notes.append("convert() padded " + ", ".join(
            f"'{name}' to units={units}" for name, units in widths.items())
            + " with zero weights; the outputs are unchanged.")
    new.conversion_notes = tuple(notes)
    for note in notes:
        warnings.warn(note, ConversionNote, stacklevel=2)
    return new


def _receives_ids(layer, target) -> bool:
    """Whether `layer`, computing in `target`, would round the float token ids
    a model input feeds it (`tf_mixed._internal.facts.rounded_ids`)."""
    if isinstance(layer, keras.Model) or is_input_layer(layer):
        return False
    compute = keras.DTypePolicy(target).compute_dtype
    return any(rounded_ids(layer, tensor, compute) for tensor in _internals.call_inputs(layer))


def _copy_weights(model, new, rename):
    clones = dict(walk_layers(new))
    for name, layer in walk_layers(model):
        if isinstance(layer, keras.Model) or not layer.weights:
            continue
        clone = clones.get(rename.get(name, name))  # only top-level renames
        if clone is None:
            raise RuntimeError(
                f"convert(): no layer '{name}' in the converted model to copy "
                "weights into; please report this with the model summary.")
        padding.copy_padded(layer.get_weights(), clone)


def _recompile(model, new, target) -> list[str]:
    if not model.compiled:
        return []
    notes = []
    try:
        config = keras.saving.deserialize_keras_object(model.get_compile_config())
        optimizer = config.get("optimizer")
        if optimizer is not None and target == "mixed_float16":
            from tf_mixed.scaling.optimizer import wrap_optimizer

            config["optimizer"] = wrap_optimizer(optimizer, force=True)
        new.compile(**config)
    except Exception as error:  # custom objects that do not deserialize
        return [
            f"convert() could not carry the compiled state of model "
            f"'{model.name}' ({type(error).__name__}: {error}). Call "
            "compile() on the converted model."
        ]
    old_optimizer = getattr(model, "optimizer", None)
    if old_optimizer is not None and getattr(old_optimizer, "built", False):
        notes.append(
            f"convert() compiled the converted model with a fresh "
            f"{type(new.optimizer).__name__} built from the original's "
            "configuration; the original optimizer's state (iterations, "
            "moments) is not carried over, so training restarts the "
            "optimizer (and any learning-rate schedule) from step 0.")
    return notes
