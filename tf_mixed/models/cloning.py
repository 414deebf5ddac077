"""The one way tf_mixed re-creates a model in another dtype, with its weights."""

# `convert`, `probe`, `export` (and through them `doctor`) all need a copy of
# a model whose layers compute in another dtype and hold the same weights.
# `clone` makes it with Keras's own graph cloning,
# ``keras.models.clone_model(view, clone_function=...)``, which walks every
# operation of a functional graph: layers, nested models, shared layers
# (cloned once, called twice), and the Keras ops applied to tensors that are
# not layers (``x + y``, ``x * 2.0``, ``x[:, ::-1]``,
# ``keras.ops.concatenate``, the built-in preprocessing of
# ``keras.applications`` models). What tf_mixed adds:
#
# * each Layer is re-created by `recreate` with the policy the caller asks
#   for, constructed (and, in a functional graph, called) while that policy is
#   Keras's global one, so sublayers a custom layer creates itself follow it;
#   any other Operation is re-created from its config unchanged;
# * a ``Lambda`` is re-created from the function object it holds
#   (``layer.function``): Keras refuses a Python lambda in safe mode and
#   cannot locate an unregistered ``def``;
# * a custom layer whose constructor takes no ``name``/``dtype``/``trainable``
#   (no ``**kwargs``, as the keras-io examples write ``Patches`` or
#   ``TokenAndPositionEmbedding``) is constructed from the arguments the layer
#   in memory was constructed with (as Keras records them) and those of its
#   config, then given the name, policy and trainable flag of that layer; one
#   that cannot be rebuilt so (a constructor argument that is not a str,
#   number, bool or None, and missing from its config) is refused with one
#   sentence naming the class and the ``**kwargs`` it needs;
# * the weights (trainable and not) are copied by variable path, relative to
#   the layer (by position where a custom layer's inner names differ), and
#   cast to the clone's variable dtype;
# * ``inline_nested=True`` (for `probe`) inlines nested models, so the output
#   of every leaf layer, inner ones included, is a tensor of one graph; the
#   clone records each layer's outputs as it calls it (`Clone.outputs`), so
#   a caller taps them without asking Keras's graph again;
# * ``random_draws=False`` (for `probe`) makes every random layer of the
#   copy run as in inference, so two copies cannot draw different values.
#
# The compiled state is not carried (`convert` compiles again). Subclassed
# models have no graph to walk; callers refuse them before calling `clone`.

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import FLOAT_POLICIES
from tf_mixed.models import carry as _carry

__all__ = ["Clone", "CopyRefused", "clone", "copy_weights", "model_input", "recreate"]

PolicyFor = Callable[[keras.layers.Layer], Any]


@dataclasses.dataclass(frozen=True)
class Clone:
    """A model re-created by `clone`.

    Attributes:
        model: The new model: Sequential for a Sequential model (unless
            ``inline_nested``), else functional. Not compiled.
        layers: ``(qualified name, original layer, clone layer)`` per leaf
            layer (Keras ops that are not layers excluded), in the order they
            were cloned; qualified names join the enclosing models' names
            with "/" (``encoder/dense``), as
            `tf_mixed._internal.facts.walk_layers` does.
        outputs: Per entry of `layers`, the clone layer's symbolic outputs
            in the new model's graph (every call, flat), for the layers the
            clone calls itself: all with ``inline_nested``; in a functional
            graph otherwise (a Sequential model's own layers, which Keras
            calls, have ()).
    """

    model: keras.Model
    layers: tuple[tuple[str, keras.layers.Layer, keras.layers.Layer], ...]
    outputs: tuple[tuple[Any, ...], ...] = ()


def clone(model: keras.Model, policy_for: PolicyFor, *,
          inline_nested: bool = False,
          changes: Callable[[keras.layers.Layer], dict] | None = None,
          after_call: Callable[[keras.layers.Layer, Any], Any] | None = None,
          copy: Callable[[keras.layers.Layer, keras.layers.Layer], None] | None = None,
          random_draws: bool = True) -> Clone:
    """A copy of a Sequential or functional ``model`` in other dtypes, same weights.

    Args:
        model: A built Sequential or functional model; not modified.
        policy_for: ``policy_for(layer) -> policy or None`` for each leaf
            layer (None: the layer keeps its own policy).
        inline_nested: Inline nested models into one functional graph, and
            rename clone layers whose names collide across them.
        changes: ``changes(operation) -> dict`` of config entries to change
            in the clone of a layer or Keras op (``{"units": 24}``); None
            changes nothing.
        after_call: ``after_call(original_operation, outputs) -> outputs``,
            run on each layer's or op's outputs in a functional graph (to
            append a head).
        copy: ``copy(original_layer, clone_layer)`` copies one layer's
            weights; None: `copy_weights`.
        random_draws: False: every random layer of the copy (one holding a
            `keras.random.SeedGenerator`, also inside another layer: the
            dropout of a MultiHeadAttention) runs as in inference whatever
            ``training`` its caller passes (Dropout passes its input
            through, noise adds nothing), so two copies cannot draw
            different values. The model's own layers are not changed.

    Returns:
        A `Clone`.

    Raises:
        TypeError: A custom layer cannot be re-created (the message names
            the class and what to add).
    """
    builder = _Builder(policy_for, changes or (lambda layer: {}), after_call, inline_nested)
    new = builder.model(model)
    for _, layer, twin in builder.pairs:
        if layer.weights:
            (copy or copy_weights)(layer, twin)
        _carry.carry_state(layer, twin)  # what keras.saving carries besides variables
        if not random_draws:
            _draw_nothing(twin)
    return Clone(new, tuple(builder.pairs),
                 tuple(tuple(builder.outputs.get(id(twin), ())) for _, _, twin in builder.pairs))


def recreate(layer: keras.layers.Layer, dtype: Any = None,
             changes: dict | None = None) -> keras.layers.Layer:
    """A new, unbuilt layer configured like ``layer``; weights are not copied.

    Args:
        layer: Any Keras layer (not a model).
        dtype: A dtype policy (name or `keras.DTypePolicy`); None keeps the
            layer's own.
        changes: Config entries to change (``name``, ``units``, ...).

    Returns:
        The new layer, constructed while its policy is the global one.

    Raises:
        TypeError: ``layer`` is a custom layer whose config cannot rebuild it.
    """
    policy = layer.dtype_policy if dtype is None else keras.dtype_policies.get(dtype)
    changes = dict(changes or {})
    kept = _internals.constructor_arguments(layer)  # what Keras kept of the constructor's
    with _global_policy(policy):
        if isinstance(layer, keras.layers.Lambda):
            # The constructor takes the live objects; from_config would
            # deserialise the function's code (refused or unlocatable).
            return type(layer)(
                layer.function, output_shape=kept["output_shape"],
                mask=layer.mask, arguments=dict(layer.arguments),
                name=changes.get("name", layer.name), dtype=policy, trainable=layer.trainable)
        try:
            config = layer.get_config()
        except NotImplementedError:
            raise _refusal(layer, "has no config") from None
        config.update(changes)
        if _takes_keras_arguments(type(layer)):
            if dtype is not None and "dtype" in config:
                # Serialised, as get_config gives it: a policy object would make
                # Keras drop the new layer's auto-config (get_config would then
                # raise, and the layer could not be cloned again).
                config["dtype"] = keras.dtype_policies.serialize(policy)
            return type(layer).from_config(config)
        # A constructor without **kwargs (name, dtype, trainable): called
        # with the arguments the layer in memory was constructed with (as
        # Keras recorded them), those its config holds, and the changes;
        # then given what Keras would have passed.
        params = inspect.signature(type(layer).__init__).parameters
        arguments = dict(kept)
        arguments.update({k: v for k, v in config.items() if k in params})
        arguments = {k: v for k, v in arguments.items() if k in params}
        try:
            if _own_from_config(type(layer)):
                # Its own from_config knows what its config holds beyond the
                # constructor's arguments (Discretization after adapt: both
                # num_bins and bin_boundaries, which __init__ refuses).
                new = type(layer).from_config(arguments)
            else:
                new = type(layer)(**arguments)
        except TypeError:
            raise _refusal(layer, "does not rebuild from its config") from None
        new.name = config.get("name", layer.name)
        new.dtype_policy = policy
        new.trainable = layer.trainable
        return new


def copy_weights(source: keras.layers.Layer, target: keras.layers.Layer) -> None:
    """Copies ``source``'s weights into ``target``'s, matched by variable path.

    Paths are taken relative to each layer (``kernel``, ``embedding/embeddings``)
    and values cast to the target variable's dtype. A target variable the
    source lacks by path (a custom layer's inner layers get fresh names) is
    matched by position when both layers hold as many variables, shaped alike.

    Raises:
        RuntimeError: The weights cannot be matched (names the layer).
    """
    by_path = {_relative_path(source, w): w for w in source.weights}
    targets = target.weights
    if (len(by_path) == len(source.weights)
            and all(_relative_path(target, w) in by_path for w in targets)):
        pairs = [(by_path[_relative_path(target, w)], w) for w in targets]
    elif [tuple(w.shape) for w in source.weights] == [tuple(w.shape) for w in targets]:
        pairs = list(zip(source.weights, targets))
    else:
        raise RuntimeError(
            f"tf_mixed could not match the weights of layer '{source.name}' "
            f"({type(source).__name__}) in its copy; please report this with the "
            "model summary.")
    for value, variable in pairs:
        variable.assign(keras.ops.cast(value.value, variable.dtype))


def model_input(model: keras.Model):
    """The input structure a Sequential or functional model is called with.

    ``model.input`` for a functional model (a tensor, list or dict); the one
    input tensor of a built Sequential model, whose ``model.input`` Keras
    leaves undefined unless it was called as a functional model.
    """
    if isinstance(model, keras.Sequential):
        return model.inputs[0]
    return model.input


# ------------------------------------------------------------------ internals


class _Builder:
    """One cloning pass: the clone of each original, once (shared layers)."""

    def __init__(self, policy_for, changes, after_call, inline_nested):
        self.policy_for = policy_for
        self.changes = changes
        self.after_call = after_call
        self.inline_nested = inline_nested
        self.clones: dict[int, Any] = {}
        self.pairs: list[tuple[str, keras.layers.Layer, keras.layers.Layer]] = []
        self.taken: set[str] = set()
        self.originals: dict[int, keras.layers.Layer] = {}  # id(clone) -> original
        self.outputs: dict[int, list] = {}  # id(clone layer) -> its outputs, every call

    def model(self, model):
        if self.inline_nested:
            inputs = keras.tree.map_structure(_new_input, model_input(model))
            self.taken.update(t.name for t in keras.tree.flatten(inputs))
            return keras.Model(inputs, self._inline(model, inputs, ""), name=model.name)
        return self._model(model, "")

    def _model(self, model, prefix):
        """A nested-as-nested clone of a Sequential or functional model."""
        if isinstance(model, keras.Sequential):
            # As keras's _clone_sequential_model, without compiling the clone.
            layers = [self._operation(layer, prefix) for layer in model.layers]
            return keras.Sequential([_new_input(model.inputs[0])] + layers,
                                    name=model.name, trainable=model.trainable)
        # clone_model compiles its result when given a compiled model: it is
        # given an uncompiled view of the same graph (no layer is called).
        view = keras.Model(model.input, model.output, name=model.name)
        return keras.models.clone_model(
            view, input_tensors=keras.tree.map_structure(_new_input, model.input),
            clone_function=lambda op: self._operation(op, prefix),
            call_function=self._call)

    def _inline(self, model, inputs, prefix):
        """Runs ``model``'s graph on ``inputs`` with cloned operations."""
        if isinstance(model, keras.Sequential):
            outputs = inputs
            for layer in model.layers:
                outputs = self._inline_call(layer, prefix, outputs)
            return outputs
        return _internals.run_through_graph(
            model, inputs,
            lambda op, *args, **kwargs: self._inline_call(op, prefix, *args, **kwargs))

    def _inline_call(self, op, prefix, *args, **kwargs):
        if isinstance(op, keras.Model):
            return self._inline(op, args[0], f"{prefix}{op.name}/")
        return self._call(self._operation(op, prefix), *args, **kwargs)

    def _operation(self, op, prefix):
        if id(op) in self.clones:
            return self.clones[id(op)]
        if isinstance(op, keras.Model):
            new = self._model(op, f"{prefix}{op.name}/")
        elif isinstance(op, keras.layers.Layer):
            changes = dict(self.changes(op))
            if self.inline_nested and op.name in self.taken:
                changes.setdefault("name", _unique(prefix.replace("/", "_") + op.name, self.taken))
            new = _refused_in_one_sentence(recreate, op, op, self.policy_for(op), changes)
            self.pairs.append((prefix + op.name, op, new))
        else:  # a Keras op applied to tensors (GetItem, Add, Concatenate...)
            config = op.get_config()
            config.update(self.changes(op))
            new = type(op).from_config(config)
        self.taken.add(new.name)
        self.clones[id(op)] = new
        self.originals[id(new)] = op
        return new

    def _call(self, new, *args, **kwargs):
        policy = new.dtype_policy if isinstance(new, keras.layers.Layer) else None
        with _global_policy(policy):
            outputs = _refused_in_one_sentence(new, self.originals[id(new)], *args, **kwargs)
        if isinstance(new, keras.layers.Layer):
            self.outputs.setdefault(id(new), []).extend(
                t for t in keras.tree.flatten(outputs) if isinstance(t, keras.KerasTensor))
        if self.after_call is not None:
            outputs = self.after_call(self.originals[id(new)], outputs)
        return outputs


def _draw_nothing(layer) -> None:
    """Makes ``layer`` and every random layer inside it run as in inference."""
    for sub in _internals.sublayers(layer):
        takes_training = "training" in inspect.signature(sub.call).parameters
        if takes_training and any(isinstance(value, keras.random.SeedGenerator)
                                  for value in vars(sub).values()):
            sub.call = _inference_call(sub.call)


def _inference_call(call):
    @functools.wraps(call)
    def inference_call(*args, **kwargs):
        kwargs["training"] = False
        return call(*args, **kwargs)
    return inference_call


@contextlib.contextmanager
def _global_policy(policy) -> Iterator[None]:
    """Keras's global policy is ``policy`` (a float policy) inside the block,
    so layers created meanwhile with ``dtype=None`` (sublayers) take it."""
    name = getattr(policy, "name", None)
    if name not in FLOAT_POLICIES:
        yield
        return
    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(saved)


def _own_from_config(cls) -> bool:
    return cls.from_config.__func__ is not keras.layers.Layer.from_config.__func__


def _takes_keras_arguments(cls) -> bool:
    params = inspect.signature(cls.__init__).parameters
    return (any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            or {"name", "dtype", "trainable"} <= set(params))


class CopyRefused(TypeError):
    """A layer tf_mixed cannot copy, said in one sentence naming it and why."""


def _refused_in_one_sentence(fn, layer, *args, **kwargs):
    """``fn(*args, **kwargs)``; a failure to re-create or call the copy of
    ``layer`` becomes one TypeError sentence naming the layer and the reason.

    A library layer whose ``get_config`` does not round-trip (KerasHub 0.32's
    Llama decoder and ViT patching layers) fails inside
    Keras with a traceback about its config; the user can change nothing in
    that class, so the sentence says what to do instead.
    """
    try:
        return fn(*args, **kwargs)
    except CopyRefused:
        raise
    except Exception as error:
        cls = type(layer)
        text = " ".join(str(error).split()).rpartition("Exception encountered: ")[2]
        reason = text.split(". ")[0].rstrip(".")[:120]
        raise CopyRefused(
            f"tf_mixed cannot copy layer '{layer.name}' ({cls.__module__.split('.')[0]} "
            f"class {cls.__name__}) because it does not rebuild from its get_config() "
            f"({type(error).__name__}: {reason}): build the model after tf_mixed.enable() "
            "instead of converting or probing a copy, and export it with "
            "precision='as_trained', which needs no copy.") from None


def _refusal(layer, why: str) -> TypeError:
    cls = type(layer).__name__
    return CopyRefused(
        f"tf_mixed cannot re-create layer '{layer.name}' in another dtype because class "
        f"{cls} {why}: give {cls}.__init__ a **kwargs argument passed on to "
        f"super().__init__(**kwargs), and {cls} a get_config() that returns every "
        "other argument of its constructor.")


def _relative_path(layer, variable) -> str:
    path = variable.path
    prefix = f"{layer.path}/" if layer.path else ""
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


def _new_input(tensor):
    """A new ``keras.Input`` like ``tensor``, named like its input layer, so
    inputs fed as a dict keyed by input name still fit."""
    history = _internals.keras_history(tensor)
    return keras.Input(batch_shape=tensor.shape, dtype=tensor.dtype,
                       sparse=getattr(tensor, "sparse", False),
                       name=history.operation.name if history is not None else None)


def _unique(name: str, taken: set[str]) -> str:
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}_{i}", i + 1
    return candidate
