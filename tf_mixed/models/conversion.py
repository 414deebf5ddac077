"""Rebuild a model that was built under float32 so it computes in mixed precision."""

# The common mistake: ``tf_mixed.enable()`` called after the model was built.
# Keras fixes each layer's policy when the layer is created, so the model keeps
# computing in float32. `convert` returns an equivalent model under the mixed
# policy with the same weights:
#
#     model = build_model()           # float32, by mistake
#     tf_mixed.enable()
#     model = tf_mixed.convert(model)  # now mixed, same weights
#
# What it does:
#
# * every layer is re-created from its config with the new dtype policy, and
#   its weights (trainable and not, e.g. BatchNormalization statistics) are
#   copied over, with what Keras's own saving carries besides (adapted
#   Normalization statistics, lookup vocabularies: `tf_mixed.models.carry`);
#   variables stay float32 under a mixed policy, so the copy is exact;
# * an output produced by a layer with a squashing activation (softmax,
#   sigmoid, log_softmax: ``tf_mixed._internal.facts.SQUASHING_ACTIVATIONS``, the same
#   table `tf_mixed.audit` reports from) gets a float32 head: that layer
#   becomes linear (renamed ``<name>_logits``) and a
#   ``tf_mixed.OutputActivation`` named like the original layer is
#   appended, so output names, and losses keyed by them, still match; an
#   output ``Activation``/``Softmax`` layer, and any other layer producing a
#   model output (a regression head, say), is kept in float32 instead, so
#   every output is float32;
# * a compiled model is compiled again with the same loss, metrics and
#   optimizer *configuration*; under ``mixed_float16`` the optimizer is wrapped
#   with ``tf_mixed.wrap_optimizer``. The optimizer's *state* (iterations,
#   moments) cannot be carried to new variables; a `ConversionNote` warning
#   says so, and the notes are kept in ``new_model.conversion_notes``.
#
# Which layers stay float32 is one decision, `tf_mixed.policy.precision_map.decide`
# (one walk of the model, its rules in one stated order: float32 heads,
# statistics layers, token ids, ``keep_float32``, a plan, the healed set).
# A model built under float32 has no record of which layers were made float32
# on purpose (every layer says "float32"), so all are converted except input
# layers, layers whose policy is not a float policy, tf_mixed's float32
# heads, output layers, the layers named in ``keep_float32``, Keras's
# ``Normalization`` and ``Discretization`` (they compute with statistics
# adapted to data, which can exceed the half dtype's range or round across a
# bin boundary: `tf_mixed._internal.facts.keeps_float32_statistics`), and layers
# that would round token ids on their way in: a layer that is or holds an
# ``Embedding`` and takes its ids as floats straight from a model input stays
# float32 when the target dtype cannot represent its largest id exactly
# (bfloat16: above 256; float16: above 2048), so the ids stay exact. A layer
# kept in float32 keeps the layers its constructor creates in float32 too.
# `convert` decides the map and builds it (`apply`, which `Plan.apply` calls
# with the map its plan holds).
#
# `rebuild` is the same copy for serving (`tf_mixed.export`): a trained
# model in the precision asked for, its float32-on-purpose layers kept, no
# compiled state.
#
# Both re-create the model with `tf_mixed.models.cloning.clone` (Keras's own
# graph cloning: Keras ops on tensors, nested models, shared layers, Lambda
# layers and custom layers included) and copy every weight by variable path.
#
# Sequential and functional models only: a subclassed model's layers are
# created in Python code convert cannot re-run, so it raises a TypeError that
# says to call ``tf_mixed.enable()`` before building the model.

from __future__ import annotations

import warnings

import keras

from tf_mixed._internal import tf_keras_check
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import (
    HALF_DTYPES,
    check_model_kind,
    model_inputs_and_outputs,
    walk_layers,
)
from tf_mixed.models import cloning as _cloning
from tf_mixed.models import padding
from tf_mixed.policy import keep_float32 as keep_float32_rules
from tf_mixed.policy import precision_map

__all__ = ["ConversionNote", "compute_dtype", "convert", "is_graph_model", "rebuild"]



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
      as a `ConversionNote` warning. With ``policy="auto"`` the copy's
      policy counts as auto's: its own training step is checked against
      float32 when it trains (`LossScaleMonitor` in ``fit``,
      `tf_mixed.training.make_train_step`), which moves it to float32
      where that is faster (docs/policies.md).

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
    found = precision_map.survey(model)  # the one walk: the decision and the copy read it
    precision = precision_map.decide(model, target, keep_float32=keep_float32, found=found)
    new = _apply(found, precision, pad_to)
    if isinstance(policy, str) and policy.strip().lower() == "auto":
        # Auto chose for the host: the model's own step is checked when it
        # trains, and may move it to float32 (tf_mixed.policy.model_check).
        from tf_mixed.policy import model_check

        model_check.mark_auto(new)
    return new


def apply(model: keras.Model, precision: precision_map.PrecisionMap, *,
          pad_to: int | None = None) -> keras.Model:
    """`convert`'s copy of ``model`` built from a decided `PrecisionMap`.

    `Plan.apply` calls it with the map its plan holds, so the plan's table
    and the model it builds are the one value.

    Args:
        model: The model the map was decided for (or one with the same layer
            names); not modified.
        precision: The map (`tf_mixed.policy.precision_map.decide`).
        pad_to: As `convert`.

    Returns:
        As `convert`.

    Raises:
        ValueError: The map names layers the model does not have.
    """
    check_model_kind(model, "apply()", why_traced="its layers are created in Python code "
                     "tf_mixed cannot re-run", fix="Plan and apply a Sequential or "
                     "functional model.")
    found = precision_map.survey(model)
    precision.policy_for(found)  # refuses a map naming layers the model lacks
    return _apply(found, precision, pad_to)


def apply_surveyed(found: precision_map.Survey, precision: precision_map.PrecisionMap,
                   pad_to: int | None = None) -> keras.Model:
    """`convert`'s copy, uncompiled, from a model's survey and the map decided on it.

    `tf_mixed.plan`'s step check times it with the plan's one survey: the
    layers, heads, weights and padding (``pad_to``) are the ones `convert`
    builds; the compiled state is not carried and no `ConversionNote` is
    raised, the padding's included (the user converted nothing: the check
    compiles nothing either).

    Args:
        found: The model's `tf_mixed.policy.precision_map.survey`.
        precision: The map `decide` made on it.
        pad_to: As `convert` (validated by the caller).

    Returns:
        The new, uncompiled model.
    """
    return _copy(found, precision, pad_to)[0]


def _apply(found: precision_map.Survey, precision, pad_to):
    """`convert`'s whole work after the survey: the copy, compiled as the
    model was, its notes kept on it and raised as `ConversionNote`s."""
    new, notes, widths = _copy(found, precision, pad_to)
    notes += _recompile(found.model, new, precision.target)
    if widths:
        notes.append("convert() padded " + ", ".join(
            f"'{name}' to units={units}" for name, units in widths.items())
            + " with zero weights; the outputs are unchanged.")
    new.conversion_notes = tuple(notes)
    for note in notes:
        warnings.warn(note, ConversionNote, stacklevel=3)
    return new


def _copy(found: precision_map.Survey, precision, pad_to):
    """The copy (not compiled), its notes so far, and the widths padded."""
    model, target = found.model, precision.target
    names = found.names
    taken = set(found.operations)
    notes = []
    # Output layers whose squashing activation moves into a float32 head, and
    # Keras ops producing an output, followed by a float32 cast under their
    # name: id(original) -> (clone name, head name, activation or None).
    heads: dict[int, tuple[str, str, str | None]] = {}
    half = keras.DTypePolicy(target).compute_dtype in HALF_DTYPES
    for tensor, layer in found.outputs:
        if layer is None or id(layer) in heads:  # (an input as output: no head, no note)
            continue
        if isinstance(layer, keras.Model) and half:
            notes.append(
                f"Output '{getattr(tensor, 'name', '?')}' comes from the "
                f"nested model '{layer.name}', which convert() converts "
                "as a whole: check its output dtype with "
                "tf_mixed.audit() and add tf_mixed.Float32Output() "
                "if it is half precision.")
        name = names.get(id(layer), layer.name)
        if name in precision.heads:
            activation = precision.heads[name] or None
            suffix = "_logits" if activation else "_half"
            heads[id(layer)] = (_unique(f"{layer.name}{suffix}", taken), layer.name,
                                activation)

    def policy_for(layer):
        # A float8 layer is made in its half policy; Plan.apply quantizes it.
        policy = precision.policy(names.get(id(layer), ""))
        return None if policy is None else policy.split("_from_")[-1]

    def changes(layer):
        config: dict = {}
        if id(layer) in heads:
            config["name"] = heads[id(layer)][0]
            if heads[id(layer)][2] is not None:
                config["activation"] = "linear"
        if layer.name in widths:
            config["units"] = widths[layer.name]
        return config

    from tf_mixed.layers import Float32Output, OutputActivation

    def head(layer):
        _, head_name, activation = heads[id(layer)]
        if activation is None:
            return Float32Output(name=head_name)
        return OutputActivation(activation, name=head_name)

    def after_call(layer, outputs):
        return head(layer)(outputs) if id(layer) in heads else outputs

    # The Dense layers to widen, and their weights followed zero-padded.
    widths = padding.plan(found, pad_to) if pad_to else {}
    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy(target)  # the clone's own policy
    try:
        new = _cloning.clone(model, policy_for, changes=changes, after_call=after_call,
                             copy=padding.copy_weights if widths else None).model
        if heads and isinstance(model, keras.Sequential):
            new.add(head(model.layers[-1]))
    finally:
        keras.config.set_dtype_policy(saved)
    return new, notes, widths


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


# ------------------------------------------------------------------ rebuild


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


def rebuild(model: keras.Model, target: str | None) -> keras.Model:
    """Returns an inference copy of `model` computing in `target`, for serving.

    Every layer's precision is `tf_mixed.policy.precision_map.decide`'s for
    `target` (without the output rule: the trained model's outputs are as
    trained), with one ``keep_float32`` rule: in a model trained in half
    precision, a layer whose policy is float32 was made so on purpose
    (``keep_float32``, an explicit ``dtype="float32"``, healing) and stays
    float32. tf_mixed's float32 heads, Keras's ``Normalization`` /
    ``Discretization`` and layers that would round token ids stay float32
    as `convert` keeps them; layers whose policy is not a float policy keep
    theirs. A half
    `target` gives the pure policy named like the dtype (half-size
    variables); weights are cast to it.

    Args:
      model: a built Sequential or functional `keras.Model`; not modified.
      target: "float32", "float16" or "bfloat16"; None keeps every layer's
        own policy (a copy as trained, without the compiled state).

    Returns:
      A new, uncompiled model with the same structure, names and weights.

    Raises:
      TypeError: `model` is subclassed (the message names the class and
        what to do), or holds a custom layer that cannot be re-created.
      ValueError: `model` is an unbuilt Sequential model.
    """
    check_model_kind(
        model, "export()",
        why_traced="its layers are created by Python code that tf_mixed cannot "
                   "re-run in another precision",
        fix="Use a Sequential or functional model, or export with "
            "precision='as_trained' to serve the model as it computes.")
    if target is None:
        return _cloning.clone(model, lambda layer: None).model
    trained_half = compute_dtype(model) in HALF_DTYPES

    def on_purpose(layer) -> bool:
        """float32 on purpose: a float32 layer of a model trained in half precision."""
        return trained_half and getattr(layer.dtype_policy, "name", None) == "float32"

    precision = precision_map.decide(model, target, keep_float32=on_purpose, outputs=False)
    return _cloning.clone(model, precision.policy_for(model)).model
