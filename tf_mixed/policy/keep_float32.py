"""``keep_float32``: which layers stay in float32 in a mixed-precision model."""

# One spec, parsed in one place and used by `tf_mixed.enable` (layers created
# afterwards) and `tf_mixed.convert` (an existing model). A spec is any of,
# or a list of:
#
#     "l2_norm"                       a layer name
#     keras.layers.UnitNormalization  a layer class (subclasses match too)
#     lambda layer: ...               a predicate, True to keep the layer float32
#
# The result is Keras's own per-layer policy: a kept layer has
# ``layer.dtype_policy.name == "float32"``, which it saves and loads with.
#
# How `enable` reaches layers created later: Keras gives a layer the global
# policy in ``Layer.__init__`` when its ``dtype`` argument is None, and has no
# per-layer hook there (a global ``DTypePolicyMap`` misses layers without a
# ``build`` method and never sees classes; see
# `tf_mixed._internal.shims.add_layer_init_hook`). So `activate` installs a hook at
# the end of ``Layer.__init__`` that sets the float32 policy on a matching
# layer. It acts only on layers created with ``dtype=None`` (a layer given an
# explicit dtype, or re-created from a config as in loading and cloning, keeps
# what it was given) and only while the global policy is the half-precision
# one `enable` set. Names and classes are matched there. A predicate would see
# the layer half-constructed there (attributes a subclass sets after
# ``super().__init__``, such as ``units``, do not exist yet), so predicates
# wait for the layer's first call (`tf_mixed._internal.shims.add_layer_call_hook`):
# the layer is built then, as Keras would build it for that call
# (`tf_mixed._internal.shims.build_for_call`), the predicate sees it complete
# and built (``lambda layer: layer.units > 512``, ``layer.count_params()``
# work), and a matching layer, with every layer inside it, computes in
# float32 from that first call on (its weights are float32 under a mixed
# policy either way). `convert` calls predicates on the model's built layers.
# A predicate that raises is reported with the layer's name and class.
#
# Keras's adaptable preprocessing layers that compute with their statistics
# (``Normalization``, ``Discretization``:
# `tf_mixed._internal.facts.keeps_float32_statistics`) created with
# ``dtype=None`` under `enable`'s half policy are kept in float32 without a
# rule, as `convert` keeps them.
#
# Each of these defaults (statistics, token ids, float32 heads, and the
# normalizations left in half precision) cites the numerics-catalog rows that
# justify it: `tf_mixed._internal.facts.CATALOG_EVIDENCE` (docs/catalog.md),
# kept in step with the installed Keras by tests/policy/test_keep_float32_catalog.py.
#
# A name or class that matches a model (a nested model's name, say) keeps
# every layer inside it in float32, in `enable` and in `convert`; predicates
# are called on layers only, never on a model. Under `enable` those
# layers exist before the model does, so a second hook
# (`tf_mixed._internal.shims.add_container_hook`) sets them once the model is
# built (a functional model) or as they are added (a Sequential).

from __future__ import annotations

import dataclasses
import difflib
from typing import Callable, Iterable, Union

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import (
    HALF_DTYPES,
    is_input_layer,
    keeps_float32_statistics,
    rounded_ids,
    walk_layers,
)
from tf_mixed.policy import state as policy_state

__all__ = ["KeepFloat32", "Spec", "activate", "active", "argument", "parse"]

Spec = Union[str, type, Callable[[keras.layers.Layer], bool], Iterable, None]

_EXAMPLE = "keep_float32=['l2_norm', keras.layers.UnitNormalization, lambda layer: ...]"


@dataclasses.dataclass(frozen=True)
class KeepFloat32:
    """A parsed ``keep_float32`` spec.

    Attributes:
        names: Layer names (``layer.name``) to keep in float32.
        classes: Layer classes; instances of them (or subclasses) match.
        predicates: Callables ``layer -> bool``.
    """

    names: tuple[str, ...] = ()
    classes: tuple[type, ...] = ()
    predicates: tuple[Callable, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.names or self.classes or self.predicates)

    def matches(self, layer: keras.layers.Layer) -> bool:
        """Whether `layer` is to compute in float32.

        Predicates are called on layers, not on models (a model is matched
        by its name or class), so ``lambda layer: layer.units > 512`` need
        not guard against the model itself.
        """
        return self.matches_surveyed(layer, is_input=is_input_layer(layer))

    def matches_surveyed(self, layer: keras.layers.Layer, *, is_input: bool) -> bool:
        """`matches`, told whether `layer` is an ``InputLayer`` (as a
        model's survey found it, `tf_mixed.policy.precision_map.LayerFacts`).

        Args:
            layer: A layer of the model.
            is_input: Whether it is an input layer (never matched).

        Returns:
            Whether `layer` is to compute in float32.
        """
        if is_input:
            return False  # an input's dtype is the data's, not a compute dtype
        if layer.name in self.names or isinstance(layer, self.classes):
            return True
        if isinstance(layer, keras.Model):
            return False
        return any(_call(p, layer) for p in self.predicates)

    def matches_by_name_or_class(self, layer: keras.layers.Layer) -> bool:
        """Whether a name or class of the rules matches `layer` (predicates aside)."""
        if is_input_layer(layer):
            return False  # an input's dtype is the data's, not a compute dtype
        return layer.name in self.names or isinstance(layer, self.classes)

    def unknown_names(self, model: keras.Model) -> str:
        """A sentence on names that match no layer of `model` ("" if none)."""
        from tf_mixed._internal.facts import walk_layers

        try:
            self.check_names((layer.name for _, layer in walk_layers(model)), model.name)
        except ValueError as error:
            return str(error)
        return ""

    def check_names(self, known: Iterable[str], model_name: str) -> None:
        """Raises if a name is not among `known`, listing close matches.

        Args:
            known: The layer names of the model.
            model_name: The model's name, for the message.

        Raises:
            ValueError: A name matches no layer.
        """
        known = sorted(set(known))
        unknown = [n for n in self.names if n not in known]
        if not unknown:
            return
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hints.append(f"{name!r} (did you mean {', '.join(map(repr, close))}?)"
                         if close else repr(name))
        raise ValueError(
            f"keep_float32 names layers that model '{model_name}' does not "
            f"have: {'; '.join(hints)}. Its layers are: {known}. Received: "
            f"keep_float32={list(self.names)}")


def _call(predicate: Callable, layer: keras.layers.Layer) -> bool:
    try:
        return bool(predicate(layer))
    except Exception as error:
        raise ValueError(
            f"A keep_float32 predicate raised {type(error).__name__}: {error}, on "
            f"layer '{layer.name}' (class {type(layer).__name__}). It is called on "
            "every layer of the model, complete and built: guard attributes only "
            "some layers have, e.g. lambda layer: isinstance(layer, "
            "keras.layers.Dense) and layer.units > 512, or match by name or class. "
            f"Received: keep_float32 predicate {predicate!r}") from error


def parse(spec: Spec) -> KeepFloat32:
    """Parses a ``keep_float32`` argument.

    Args:
        spec: A layer name, a layer class, a predicate ``layer -> bool``, a
            list (or other iterable) of these, or None / ``()`` for none.

    Returns:
        A `KeepFloat32`.

    Raises:
        TypeError: An element is none of the accepted kinds.
        ValueError: A name is empty.
    """
    if spec is None:
        return KeepFloat32()
    single = isinstance(spec, (str, type)) or (
        callable(spec) and not isinstance(spec, (list, tuple, set, frozenset)))
    items = [spec] if single else _as_list(spec)
    names, classes, predicates = [], [], []
    for item in items:
        if isinstance(item, str):
            if not item.strip():
                raise ValueError(
                    "keep_float32 layer names must be non-empty strings, such "
                    f"as 'l2_norm'. Received: keep_float32={spec!r}")
            names.append(item)
        elif isinstance(item, type):
            if not issubclass(item, keras.layers.Layer):
                raise TypeError(_type_message(spec, item))
            classes.append(item)
        elif callable(item):
            predicates.append(item)
        else:
            raise TypeError(_type_message(spec, item))
    return KeepFloat32(tuple(dict.fromkeys(names)), tuple(classes), tuple(predicates))


def _as_list(spec) -> list:
    try:
        return list(spec)
    except TypeError:
        raise TypeError(_type_message(spec, spec)) from None


def _type_message(spec, item) -> str:
    return (
        "keep_float32 must be a layer name, a keras.layers.Layer subclass, a "
        "predicate taking a layer and returning a bool, or a list of these, "
        f"such as {_EXAMPLE}. Received: keep_float32={spec!r} with element "
        f"{item!r} (of type {type(item).__name__})")


def argument(names: Iterable[str]) -> str:
    """The ``keep_float32=[...]`` text that keeps `names` in float32."""
    return "keep_float32=[" + ", ".join(repr(n) for n in names) + "]"


def activate(spec: Spec | KeepFloat32) -> KeepFloat32:
    """Keeps matching layers created from now on in float32 (for `enable`).

    Call it right after `enable` set the global policy (validate `spec` with
    `parse` before changing anything). The rules apply while this thread's
    global policy is that very policy object and computes in half precision;
    they stop when it changes (`disable`, a later `enable`, `policy_scope`,
    ``keras.backend.clear_session()``, ``keras.config.set_dtype_policy``, or
    `convert`'s temporary policy). Under a float32 policy keeping a layer
    float32 would change nothing, so nothing is done there.

    Args:
        spec: See `parse` (a parsed `KeepFloat32` is taken as is); None or
            ``()`` turns this thread's rules off.

    Returns:
        The parsed rules.

    Raises:
        TypeError, ValueError: As `parse`, before anything changes.
    """
    rules = spec if isinstance(spec, KeepFloat32) else parse(spec)
    # Per thread (`tf_mixed.policy.state`), as Keras keeps the dtype policy
    # per thread: an `enable` in another thread neither clears these rules
    # nor inherits them.
    policy = keras.config.dtype_policy()
    policy_state.set_keep_rules(rules, policy, _on_layer_init, _on_container,
                                install=policy.compute_dtype in HALF_DTYPES)
    return rules


def active() -> KeepFloat32:
    """The rules that apply to a layer created now in this thread (or none)."""
    rules, bound = policy_state.keep_rules()
    policy = keras.config.dtype_policy()
    if (not rules or policy is not bound
            or policy.compute_dtype not in HALF_DTYPES):
        return KeepFloat32()
    return rules


def _on_container(model) -> None:
    """A kept nested model keeps every layer inside it (created before it)."""
    rules = active()
    if not rules or not rules.matches(model):
        return
    for _, layer in walk_layers(model):
        dtype = keras.backend.standardize_dtype(layer.compute_dtype)
        if not is_input_layer(layer) and dtype in HALF_DTYPES:
            layer.dtype_policy = "float32"


def _enabled_rules() -> KeepFloat32 | None:
    """This thread's rules (possibly none) while the half policy `enable` set
    is in effect; None otherwise."""
    rules, bound = policy_state.keep_rules()
    policy = keras.config.dtype_policy()
    if bound is None or policy is not bound or policy.compute_dtype not in HALF_DTYPES:
        return None
    return rules or KeepFloat32()


def _on_layer_init(layer, dtype) -> None:
    if dtype is not None:
        return  # explicit dtype, a parent's policy, or a config being loaded
    rules = _enabled_rules()
    if rules is None or is_input_layer(layer):
        return
    if rules.matches_by_name_or_class(layer) or keeps_float32_statistics(layer):
        layer.dtype_policy = "float32"  # adapted statistics: see keeps_float32_statistics
    if not isinstance(layer, keras.Model):
        # The rest waits for the first call (a model's predicates run once
        # it knows its layers: _on_container).
        policy_state.defer_predicates(layer, rules, _on_first_call)


def _on_first_call(layer, args, kwargs) -> None:
    """At `layer`'s first call, before Keras casts its inputs: what keeps it float32.

    A layer kept by name or class, a layer a predicate matches (seen
    complete and built), and a layer that would round token ids on their
    way in (`tf_mixed._internal.facts.rounded_ids`: float ids from a model
    input into a layer that is or holds an Embedding) compute in float32,
    with every layer inside them.
    """
    rules = policy_state.take_deferred(layer)
    if rules is None:
        return
    keep = rules.matches_by_name_or_class(layer)
    if not keep and keras.backend.standardize_dtype(layer.compute_dtype) in HALF_DTYPES:
        if rules.predicates:
            _internals.build_for_call(layer, args, kwargs)
            keep = any(_call(p, layer) for p in rules.predicates)
        first = args[0] if args else next(iter(kwargs.values()), None)
        keep = keep or any(rounded_ids(layer, t) for t in keras.tree.flatten(first))
    if keep:
        for inner in _internals.sublayers(layer):
            dtype = keras.backend.standardize_dtype(inner.compute_dtype)
            if not is_input_layer(inner) and dtype in HALF_DTYPES:
                inner.dtype_policy = "float32"
