"""A model's precision per layer: one value, made by one decision."""

# `decide(model, target, ...)` walks the model once and says, for every layer,
# the Keras policy it computes in once the model is made `target`; the answer
# is a `PrecisionMap`, which converts losslessly to and from Keras's own
# per-layer value, `keras.dtype_policies.DTypePolicyMap` (layer path ->
# policy: `to_keras` / `from_keras`). `tf_mixed.convert`, `rebuild` (export),
# `tf_mixed.probe`, `tf_mixed.plan` (its `Plan` holds one), `Plan.apply` and
# ``enable(plan=...)`` all read the map this function makes, so what a plan's
# table or a probe shows for a layer is what applying builds.
#
# The rules, in the order they are applied (`RULES`); a layer is set by the
# first rule that keeps it in float32, and a later rule never moves a layer
# out of float32 that an earlier rule kept there:
#
#   1. "float32 head": (``outputs=True``) every layer that produces a model
#      output while the target computes in half precision: an output whose layer ends in a
#      squashing activation (softmax, sigmoid, log_softmax) keeps that layer
#      in `target` as logits and gets a float32 head appended (`heads`); any
#      other output layer (an ``Activation``, a regression ``Dense``) stays
#      float32;
#   2. "statistics": Keras's ``Normalization`` and ``Discretization``
#      (`facts.keeps_float32_statistics`), under a half target;
#   3. "token ids": a layer that would round float token ids straight from a
#      model input (`facts.rounded_ids`), under a half target;
#   4. "keep_float32": the layers a `keep_float32` spec matches (a matching
#      nested model keeps every layer inside it);
#   5. "plan": a `tf_mixed.plan`'s choice per layer (float32, the half
#      dtype, or float8: "float8_from_<policy>"), for the layers it names (a
#      nested model's choice holds for every layer inside it; a float8
#      choice for an output layer rule 1 keeps float32 runs its matrix
#      products in float8 from float32, "float8_from_float32", so its output
#      stays float32);
#   6. "healed": the layers healing moved to float32 compute.
#
# A layer no rule sets computes in `target` ("target"). tf_mixed's own
# float32 heads (`facts.FLOAT32_HEADS`) are float32 by design ("as is").
# Input layers, and
# layers whose policy is not a float policy (integer, quantized), keep their
# own and are not in the map. Names are `facts.walk_layers`'s (``outer/inner``
# inside nested models), as ``keep_float32`` and the plan's rows name layers.
#
# The walk itself is a value, `survey(model)` (layers and their names, the
# outputs and what makes them, who reads each layer, every operation's name
# and call inputs, each tensor's producer, the top layers and the inputs),
# and it is the one place that asks tf_mixed/_internal/facts.py and the
# shims about the model: each layer's `LayerFacts` (input layer, adapted
# statistics, activation, the half dtypes that would round its token ids)
# are recorded there, and `survey(model, owner, ...)` checks the model's
# kind in its caller's name. `decide` reads only the survey, and so do the
# stages after it (`convert`'s copy and its padding; `tf_mixed.plan`'s layer
# graph, catalog read, probe, step check, rows and map), instead of walking
# the model or asking about its layers again.
#
# A built model's precision moves in one way, `move(model, map)`: healing
# (`observed(model).healed(names)`: rule 6 applied to what the model computes
# in now), a restored checkpoint's healed set, and auto's check on the
# model's own step (tf_mixed/policy/model_check.py) all go through it.

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import (
    FLOAT32_HEADS,
    FLOAT_POLICIES,
    HALF_DTYPES,
    SQUASHING_ACTIVATIONS,
    activation_name,
    check_model_kind,
    half_policy,
    is_input_layer,
    keeps_float32_statistics,
    model_inputs_and_outputs,
    rounded_ids,
    walk_layers,
)
from tf_mixed.policy import keep_float32 as keep_float32_rules

__all__ = ["RULES", "LayerFacts", "PrecisionMap", "Survey", "built_as", "decide", "layer_names",
           "layer_path", "live_policy", "move", "observed", "survey", "validated_policy"]

FLOAT32 = "float32"
HEAD, STATISTICS, TOKEN_IDS, KEEP, PLAN, HEALED, TARGET, AS_IS = (
    "float32 head", "statistics", "token ids", "keep_float32", "plan", "healed", "target",
    "as is")
RULES = (HEAD, STATISTICS, TOKEN_IDS, KEEP, PLAN, HEALED)
"""The rules of `decide`, in the order they are applied."""
_REASONS = RULES + (TARGET, AS_IS)


def validated_policy(value: Any, where: str) -> str:
    """``value`` as a Keras float policy name (float8 allowed), or a clear error.

    Args:
        value: What a map, a plan or a file holds for one layer.
        where: Where it was read, for the message ("layer 'dense'").

    Returns:
        Keras's canonical policy name.

    Raises:
        ValueError: The value is not a policy name a layer can compute in.
    """
    if not isinstance(value, str):
        raise ValueError(
            f"The precision of {where} must be a Keras policy name such as "
            f"'float32' or 'mixed_bfloat16'. Received: {value!r} (of type "
            f"{type(value).__name__}).")
    try:
        policy = keras.dtype_policies.get(value)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"The precision of {where} is not a policy Keras knows ({error}). Valid: "
            f"{', '.join(FLOAT_POLICIES)}, or 'float8_from_' + one of them. "
            f"Received: {value!r}.") from None
    mode = getattr(policy, "quantization_mode", None)
    if policy.name.split("_from_")[-1] not in FLOAT_POLICIES or mode not in (None, "float8"):
        raise ValueError(
            f"The precision of {where} must be a float policy ({', '.join(FLOAT_POLICIES)}) "
            f"or 'float8_from_' + one of them. Received: {value!r}.")
    return policy.name


@dataclasses.dataclass(frozen=True)
class PrecisionMap:
    """The policy each layer of one model computes in (see `decide`).

    Attributes:
        target: The policy of layers no rule set (a Keras policy name).
        layers: Layer name -> Keras policy name, for every layer the decision
            covers (inputs and non-float policies are left out), in the
            model's order; names as `tf_mixed._internal.facts.walk_layers`.
        reasons: Layer name -> the rule that set it (`RULES`, "target", or
            "as is" when the layer keeps its own policy).
        heads: Output layer name -> the activation its float32 head applies
            ("" for a float32 cast), for outputs that get a head appended.
    """

    target: str
    layers: Mapping[str, str]
    reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)
    heads: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        target = validated_policy(self.target, "the map's target")
        object.__setattr__(self, "target", target)
        if not isinstance(self.layers, Mapping):
            raise ValueError(
                "A PrecisionMap's `layers` must map layer names to policy names. "
                f"Received: layers={self.layers!r} (of type {type(self.layers).__name__}).")
        layers = {}
        for name, value in self.layers.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"A PrecisionMap's layer names must be non-empty strings. "
                                 f"Received: {name!r}.")
            layers[name] = validated_policy(value, f"layer {name!r}")
        object.__setattr__(self, "layers", layers)
        for field in ("reasons", "heads"):
            value = getattr(self, field)
            if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise ValueError(f"A PrecisionMap's `{field}` must map layer names to "
                                 f"strings. Received: {field}={value!r}.")
        bad = {n: r for n, r in self.reasons.items() if r not in _REASONS}
        if bad:
            raise ValueError(f"A PrecisionMap's reasons must be among {list(_REASONS)}. "
                             f"Received: {bad}.")
        object.__setattr__(self, "reasons", dict(self.reasons))
        object.__setattr__(self, "heads", dict(self.heads))

    def policy(self, name: str) -> str | None:
        """The policy of layer ``name`` (None: the layer keeps its own)."""
        return self.layers.get(name)

    def compute_dtype(self, name: str) -> str | None:
        """The dtype layer ``name`` computes in ("float8" for float8), or None."""
        policy = self.layers.get(name)
        if policy is None:
            return None
        if policy.startswith("float8_from_"):
            return "float8"
        return keras.DTypePolicy(policy).compute_dtype

    def policy_for(self, model: "keras.Model | Survey") -> Callable[[Any], str | None]:
        """``policy_for(layer) -> policy or None`` for the layer objects of
        ``model`` (the map's names resolved once; a shared layer by the first
        place it appears), as `tf_mixed.models.cloning.clone` takes it.

        Raises:
            ValueError: The map names layers ``model`` does not have.
        """
        found = model if isinstance(model, Survey) else survey(model)
        model = found.model
        ids: dict[str, int] = {}
        for name, layer in found.layers:  # a shared layer walks under each of its names
            ids.setdefault(name, id(layer))
        unknown = sorted(set(self.layers) - set(ids))
        if unknown:
            raise ValueError(
                f"The precision map names layers model '{model.name}' does not have: "
                f"{unknown}. Apply a plan to the model it was made for. Its layers: "
                f"{sorted(ids)}.")
        chosen: dict[int, str] = {}
        for name, layer_id in ids.items():  # walk order: the first name the map holds
            if name in self.layers:
                chosen.setdefault(layer_id, self.layers[name])
        return lambda layer: chosen.get(id(layer))

    def float32_names(self) -> tuple[str, ...]:
        """Layers kept float32 under a half target (``keep_float32=`` names),
        tf_mixed's own heads aside; () under a float32 target."""
        if keras.DTypePolicy(self.target).compute_dtype not in HALF_DTYPES:
            return ()
        return tuple(n for n, p in self.layers.items()
                     if p == FLOAT32 and self.reasons.get(n) != AS_IS)

    def float8_names(self) -> tuple[str, ...]:
        """Layers that compute in float8."""
        return tuple(n for n, p in self.layers.items() if p.startswith("float8_from_"))

    def healed(self, names: Iterable[str]) -> "PrecisionMap":
        """This map with rule 6 applied: ``names`` compute in float32 ("healed").

        Rule 6 is the last of `RULES` and only keeps layers in float32, so
        applying it to a decided (or `observed`) map gives what `decide`
        gives with the same ``healed``.

        Raises:
            ValueError: A name the map does not hold (the valid ones listed).
        """
        names = list(names)
        unknown = [n for n in names if n not in self.layers]
        if unknown:
            raise ValueError(
                f"Healed layer names must be layers of the map. Received: {unknown}. "
                f"The map's layers: {list(self.layers)}.")
        layers, reasons = dict(self.layers), dict(self.reasons)
        for name in names:  # an earlier rule's float32 keeps its reason
            if layers[name] != FLOAT32 or reasons.get(name) in (AS_IS, TARGET, None):
                layers[name], reasons[name] = FLOAT32, HEALED
        return dataclasses.replace(self, layers=layers, reasons=reasons)

    def to_keras(self) -> keras.dtype_policies.DTypePolicyMap:
        """This map as Keras's `DTypePolicyMap` (default policy: `target`)."""
        return keras.dtype_policies.DTypePolicyMap(
            default_policy=self.target,
            policy_map={k: keras.dtype_policies.get(v) for k, v in self.layers.items()})

    @classmethod
    def from_keras(cls, policy_map: keras.dtype_policies.DTypePolicyMap) -> "PrecisionMap":
        """The map a `DTypePolicyMap` holds (its default policy is the target).

        Raises:
            ValueError: ``policy_map`` is not a `DTypePolicyMap`, or holds a
                policy a layer cannot compute in here.
        """
        if not isinstance(policy_map, keras.dtype_policies.DTypePolicyMap):
            raise ValueError(
                "PrecisionMap.from_keras needs a keras.dtype_policies.DTypePolicyMap. "
                f"Received: {policy_map!r} (of type {type(policy_map).__name__}).")
        return cls(policy_map.default_policy.name,
                   {k: getattr(v, "name", v) for k, v in policy_map.items()})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (`from_dict` reads it back)."""
        return {"target": self.target, "layers": dict(self.layers),
                "reasons": dict(self.reasons), "heads": dict(self.heads)}

    @classmethod
    def from_dict(cls, record: Any) -> "PrecisionMap":
        """The map `to_dict` wrote, checked.

        Raises:
            ValueError: ``record`` is not such a dict, or holds a value that
                is not a valid policy name (named with its layer).
        """
        if not isinstance(record, Mapping) or "target" not in record or "layers" not in record:
            raise ValueError(
                "A precision map must be a dict with 'target' and 'layers' (what "
                f"PrecisionMap.to_dict writes). Received: {record!r}.")
        return cls(record["target"], record["layers"], record.get("reasons", {}),
                   record.get("heads", {}))


@dataclasses.dataclass(frozen=True)
class LayerFacts:
    """What `decide` and the plan's stages need to know about one layer,
    asked once, by `survey` (from `tf_mixed._internal.facts`).

    Attributes:
        input: The layer is an ``InputLayer`` (no compute: never in a map).
        statistics: It computes with adapted statistics (``Normalization``,
            ``Discretization``: `facts.keeps_float32_statistics`).
        activation: The name of the activation it applies last (None: none
            named; `facts.activation_name`).
        rounds_ids: The half dtypes in which it would round the float token
            ids a model input feeds it (`facts.rounded_ids`): "float16",
            "bfloat16", both or neither.
    """

    input: bool = False
    statistics: bool = False
    activation: str | None = None
    rounds_ids: frozenset = frozenset()


@dataclasses.dataclass(frozen=True, eq=False)
class Survey:
    """What one walk of a model finds: `decide` reads it, and so do the
    stages that build the map (`tf_mixed.convert`'s copy, its padding) and
    every stage of `tf_mixed.plan` after its survey, instead of walking the
    model or asking `tf_mixed._internal.facts` about its layers again.

    Attributes:
        model: The model walked.
        layers: ``(name, layer)`` pairs as `tf_mixed._internal.facts.walk_layers`
            yields them (a shared layer under each of its names).
        names: ``id(layer) -> name``, the first place each layer appears.
        outputs: ``(tensor, producer)`` per model output, flat; the producer
            is the layer or Keras op that makes it (None: an input).
        output_layers: The producers of the outputs, once each, inputs left out.
        consumers: ``id(layer) -> [layers of the model that read its outputs]``
            (the model's own layers, not those inside nested models).
        operations: The name of every operation of the model and of the
            models nested in it (a copy's new names avoid them).
        top: The model's own layers, input layers left out, in its order.
        inputs: ``id`` of every input layer met: the model's inputs' and
            those of the walk (nested models' own).
        facts: ``id(layer) -> LayerFacts`` for every layer walked (`fact`
            reads it; a Keras op making an output has none).
        calls: ``id(operation) -> (its symbolic call inputs, flat)`` for every
            layer walked and every operation of the model's graph (its Keras
            ops too; `tf_mixed._internal.shims.call_inputs`).
        made_by: ``id(tensor) -> the layer or Keras op that makes it`` (None:
            no history) for every tensor of ``calls`` and the model's inputs
            and outputs (`tf_mixed._internal.shims.keras_history`).
        output_names: The name of each output, flat, in order, as a loss dict
            is keyed (``model.output_names``; a Sequential model's: the
            producers' names), read by `tf_mixed.probe`'s and the plan's loss.
        half_policy: The mixed policy of the half dtype the model computes in:
            its first half-precision leaf layer's, else its own policy's;
            None for a model computing in float32 throughout (`tf_mixed.probe`
            probes in it, and probes every float32 layer of such a mixed
            model in float32).
        arguments: ``id(operation) -> (args, kwargs)`` of its first symbolic
            call, KerasTensors in place of tensors, for every operation of
            ``calls``
            (`tf_mixed._internal.shims.first_call_arguments`; `first_call`
            reads it): the plan's layer timing calls a copy of each layer as
            the model calls it.
    """

    model: Any
    layers: tuple
    names: Mapping[int, str]
    outputs: tuple
    output_layers: tuple
    consumers: Mapping[int, list]
    operations: frozenset
    top: tuple = ()
    inputs: frozenset = frozenset()
    facts: Mapping[int, LayerFacts] = dataclasses.field(default_factory=dict)
    calls: Mapping[int, tuple] = dataclasses.field(default_factory=dict)
    made_by: Mapping[int, Any] = dataclasses.field(default_factory=dict)
    output_names: tuple = ()
    half_policy: str | None = None
    arguments: Mapping[int, tuple] = dataclasses.field(default_factory=dict)

    def fact(self, layer) -> LayerFacts:
        """The `LayerFacts` of one layer (or output op) of the model."""
        return self.facts.get(id(layer), _NO_FACTS)

    def first_call(self, layer) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a layer's first symbolic call (``((), {})``: none)."""
        return self.arguments.get(id(layer), ((), {}))


_NO_FACTS = LayerFacts()


def survey(model: keras.Model, owner: str | None = None, *, why_traced: str = "",
           fix: str = "") -> Survey:
    """One walk of a built Sequential or functional model (`Survey`).

    Args:
        model: The model.
        owner: The public function surveying it ("tf_mixed.plan()"): the
            model's kind is checked first, in its name
            (`tf_mixed._internal.facts.check_model_kind`). None: the caller
            checked it.
        why_traced: Why that function cannot take a subclassed model (a clause).
        fix: What to do instead (a sentence).

    Returns:
        The `Survey`.

    Raises:
        TypeError: (``owner`` given) ``model`` is not a Keras model, or is
            subclassed.
        ValueError: (``owner`` given) a Sequential model that is not built.
    """
    if owner is not None:
        check_model_kind(model, owner, why_traced=why_traced, fix=fix)
    # A subclassed model has no graph: its layers are walked, its ends are none.
    graph = model_inputs_and_outputs(model)
    model_outputs = keras.tree.flatten(model.outputs) if graph else []
    model_inputs = keras.tree.flatten(model.inputs) if graph else []
    walked = tuple(walk_layers(model))
    # Every layer asked once, here: what tf_mixed's facts say of it, then
    # what Keras's graph holds (its call inputs, each tensor's producer).
    facts = {id(layer): LayerFacts(
        is_input_layer(layer), keeps_float32_statistics(layer), activation_name(layer),
        frozenset(dtype for dtype in HALF_DTYPES if not isinstance(layer, keras.Model) and any(
            rounded_ids(layer, tensor, dtype) for tensor in _internals.call_inputs(layer))))
        for _, layer in walked}
    # Every operation's calls (a functional model's Keras ops too): the
    # inputs of each, and the arguments of the first, as it was made.
    operations_walked = (*(layer for _, layer in walked), *getattr(model, "operations", ()))
    calls = {id(op): tuple(_internals.call_inputs(op)) for op in operations_walked}
    arguments = {id(op): _internals.first_call_arguments(op) for op in operations_walked}
    tensors = [*(t for ts in calls.values() for t in ts), *model_outputs, *model_inputs]
    histories = {id(t): _internals.keras_history(t) for t in tensors}
    made_by = {key: getattr(history, "operation", None) for key, history in histories.items()}
    outputs = tuple((t, made_by[id(t)]) for t in model_outputs)
    inputs = {id(layer) for _, layer in walked if facts[id(layer)].input}
    inputs.update(id(made_by[id(t)]) for t in model_inputs)
    consumers: dict[int, list] = {}
    for layer in model.layers:
        for tensor in calls[id(layer)]:
            producer = made_by[id(tensor)]
            if producer is not None:
                consumers.setdefault(id(producer), []).append(layer)
    output_layers = {id(layer): layer for _, layer in outputs
                     if layer is not None and id(layer) not in inputs}
    names: dict[int, str] = {}
    operations: set[str] = set()
    # A Sequential model lists its layers only (a subclassed one has no operations).
    for owner_model in [model] + [layer for _, layer in walked if isinstance(layer, keras.Model)]:
        operations.update(op.name for op in (
            owner_model.layers if isinstance(owner_model, keras.Sequential)
            else getattr(owner_model, "operations", owner_model.layers)))
    for name, layer in walked:
        names.setdefault(id(layer), name)
    top = tuple(layer for layer in model.layers if id(layer) not in inputs)
    # What the probe asks of a model: its outputs' names (Keras's, else the
    # producers'), and the half dtype it computes in (the first leaf
    # layer's, else its own policy's) as a mixed policy.
    output_names = getattr(model, "output_names", None) or [
        maker.name if maker is not None else str(i)
        for i, (_, maker) in enumerate(outputs)]
    dtypes = [layer.compute_dtype for _, layer in walked
              if not isinstance(layer, keras.Model) and id(layer) not in inputs]
    dtypes.append(getattr(model.dtype_policy, "compute_dtype", "float32"))
    halves = [half_policy(keras.backend.standardize_dtype(d)) for d in dtypes]
    return Survey(model, walked, names, outputs, tuple(output_layers.values()), consumers,
                  frozenset(operations), top, frozenset(inputs), facts, calls, made_by,
                  tuple(output_names),
                  next((half for half in halves if half), None), arguments)


def layer_names(model: keras.Model) -> dict[int, str]:
    """``id(layer) -> name`` as a map names it, for every layer of ``model``."""
    names: dict[int, str] = {}
    for name, layer in walk_layers(model):
        names.setdefault(id(layer), name)
    return names


def decide(model: keras.Model, target: str, *,
           keep_float32: keep_float32_rules.Spec | keep_float32_rules.KeepFloat32 = (),
           plan: Mapping[str, str] | None = None, healed: Iterable[str] = (),
           outputs: bool = True, check_names: bool = True,
           found: Survey | None = None) -> PrecisionMap:
    """The precision of every layer of ``model`` made ``target``: the rules in order.

    Reads the model's `survey` only (one walk, every layer's `LayerFacts`
    asked there); see the module's comment for the rules and their order
    (`RULES`).

    Args:
        model: A built Sequential or functional model; not modified.
        target: The policy the model is made: "float32", "mixed_float16",
            "mixed_bfloat16", "float16" or "bfloat16".
        keep_float32: A ``keep_float32`` spec (names, classes, predicates;
            `tf_mixed.policy.keep_float32.parse`) or a parsed one.
        plan: Layer name -> policy name chosen by `tf_mixed.plan` (layers it
            does not name compute in ``target``).
        healed: Names of the layers healing moved to float32.
        outputs: Apply rule 1 to the model's output layers (`convert`,
            `probe`); False keeps only tf_mixed's own heads (`rebuild`).
        check_names: Refuse ``keep_float32`` names the model lacks (False
            for the rules `enable` made for every model, as `probe` reads them).
        found: The model's `survey`, when the caller made it (it reads the
            same walk after the decision); None: walked here.

    Returns:
        The `PrecisionMap` (`PrecisionMap.policy_for` reads it per layer
        object, for the caller that re-creates the layers).

    Raises:
        ValueError: ``keep_float32`` names a layer the model lacks (close
            matches listed); a plan value is not a valid policy.
    """
    target = validated_policy(target, "the target")
    keep = (keep_float32 if isinstance(keep_float32, keep_float32_rules.KeepFloat32)
            else keep_float32_rules.parse(keep_float32))
    compute = keras.DTypePolicy(target.split("_from_")[-1]).compute_dtype
    half = compute in HALF_DTYPES
    plan = {n: validated_policy(p, f"layer {n!r} in the plan") for n, p in (plan or {}).items()}
    healed = frozenset(healed)
    heads: dict[int, str] = {}
    kept_outputs: set[int] = set()
    found = found if found is not None else survey(model)
    if half and outputs:
        for layer in found.output_layers:
            activation = found.fact(layer).activation
            if isinstance(layer, keras.Model):
                continue  # converted as a whole: convert notes it
            if not isinstance(layer, keras.layers.Layer):
                heads[id(layer)] = ""  # a Keras op: a float32 cast under its name
            elif (activation in SQUASHING_ACTIVATIONS
                    and type(layer).__name__ not in ("Activation", "Softmax")):
                heads[id(layer)] = activation or ""
            else:
                kept_outputs.add(id(layer))

    layers: dict[str, str] = {}
    reasons: dict[str, str] = {}
    head_names: dict[str, str] = {}
    kept_models: list[str] = []  # nested models keep_float32 matched: "outer/"
    planned_models: list[str] = []  # nested models the plan names: "outer/"
    known: set[str] = set()
    for name, layer in found.layers:
        known.add(layer.name)
        fact = found.fact(layer)
        if id(layer) in heads:
            head_names[name] = heads[id(layer)]
        if fact.input:
            continue
        own = getattr(layer.dtype_policy, "name", None)
        if own not in FLOAT_POLICIES:
            continue
        if type(layer).__name__ in FLOAT32_HEADS:
            rule = AS_IS  # tf_mixed's own head: float32 by design
        elif id(layer) in kept_outputs:
            rule = HEAD
        elif half and fact.statistics:
            rule = STATISTICS
        elif half and compute in fact.rounds_ids:
            rule = TOKEN_IDS
        elif (keep.matches_surveyed(layer, is_input=fact.input)
              or any(name.startswith(m) for m in kept_models)):
            rule = KEEP
            if isinstance(layer, keras.Model):
                kept_models.append(name + "/")
        elif name in plan or any(name.startswith(m) for m in planned_models):
            rule = PLAN
            if name not in plan:  # inside a planned nested model: the model's choice
                plan[name] = next(plan[m[:-1]] for m in planned_models if name.startswith(m))
            if isinstance(layer, keras.Model):
                planned_models.append(name + "/")
        elif name in healed:
            rule = HEALED
        else:
            rule = TARGET
        if rule == HEAD and plan.get(name, "").startswith("float8_from_"):
            rule = PLAN  # float8 matrix products from float32: the output stays float32
            plan[name] = "float8_from_float32"
        if rule == PLAN:
            policy = plan[name]
            if policy != FLOAT32 and name in healed:
                policy, rule = FLOAT32, HEALED
        else:
            policy = target if rule == TARGET else FLOAT32 if rule != AS_IS else own
        layers[name], reasons[name] = policy, rule
    if check_names:
        keep.check_names(known, found.model.name)
    return PrecisionMap(target, layers, reasons, head_names)


# ------------------------------------------------------------ a built model


_BUILT_AS = "_tf_mixed_built_as"  # on a layer `move` moved: its policy before


def layer_path(layer) -> str:
    """``layer``'s Keras path (a `DTypePolicyMap` key), or its name."""
    return getattr(layer, "path", None) or layer.name


def live_policy(layer) -> str:
    """The name of the policy ``layer`` computes in now (a map read by its path)."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        path = layer_path(layer)
        policy = policy[path] if path in policy else policy.default_policy
    return policy.name


def observed(model: keras.Model) -> PrecisionMap:
    """The map a built ``model`` computes in now (every rule "as is").

    Its target is the policy most of its layers compute in. Healing reads
    it and applies rule 6 (`PrecisionMap.healed`); `move` applies the result.
    """
    layers: dict[str, str] = {}
    for name, layer in walk_layers(model):
        if is_input_layer(layer) or name in layers:
            continue
        policy = live_policy(layer)
        if policy in FLOAT_POLICIES:
            layers[name] = policy
    counts: dict[str, int] = {}
    for policy in layers.values():
        counts[policy] = counts.get(policy, 0) + 1
    target = max(counts, key=lambda p: counts[p]) if counts else live_policy(model)
    if target not in FLOAT_POLICIES:
        target = FLOAT32
    return PrecisionMap(target, layers, {n: AS_IS for n in layers})


def _by_path(model, precision: PrecisionMap) -> dict[str, str]:
    """A map's changes to a built model, by Keras path: each layer a rule sets
    (not "as is") to another policy, with the layers inside it that computed
    as it did (to float32: every one; a sublayer float32 on purpose stays so)."""
    paths: dict[str, str] = {}
    for name, layer in walk_layers(model):
        wanted = precision.policy(name)
        if wanted is None or precision.reasons.get(name) == AS_IS or isinstance(
                layer, keras.Model):
            continue
        if wanted.startswith("float8_from_"):
            raise ValueError(
                f"A built layer cannot be moved to float8 in place. Received: layer "
                f"{name!r} -> {wanted!r}. Quantize the model (tf_mixed.plan's Plan.apply).")
        own = live_policy(layer)
        for sub in _internals.sublayers(layer):
            current = live_policy(sub)
            if current != wanted and (wanted == FLOAT32 or sub is layer or current == own):
                paths[layer_path(sub)] = wanted
    return paths


def move(model, precision: PrecisionMap | Mapping[str, str]) -> list:
    """Moves a built model's layers to the policies a map gives, in place.

    The one way tf_mixed moves a built model's precision (healing, a
    restored checkpoint's healed set, auto's check on the model's own step).
    Keras 3.15's ``Layer.dtype_policy`` setter works on a built layer: under a
    mixed policy the variables are float32 already, so only the compute
    dtype changes; the retrace is the caller's.

    Args:
        model: A built Keras model (or layer).
        precision: A `PrecisionMap` (layer names as `decide` names them; a
            layer it sets to another policy moves with the layers inside
            it, as its constructor made them), or Keras layer path -> policy
            name (each path as given; `DTypePolicyMap` keys). Layers not
            named keep theirs.

    Returns:
        The layers whose policy changed, in the model's order.

    Raises:
        ValueError: A layer keeps its variables in a half dtype (a pure
            half policy) and would move to another variable dtype: moving
            compute would not move its weights (nothing moves then); a
            `PrecisionMap` sets a layer to float8 (quantize instead).
    """
    if isinstance(precision, PrecisionMap):
        paths = _by_path(model, precision)
    else:
        paths = {path: getattr(p, "name", p) for path, p in precision.items()}
    planned = []
    for layer in _internals.sublayers(model):
        wanted = paths.get(layer_path(layer))
        if wanted is None or live_policy(layer) == wanted:
            continue
        policy = keras.DTypePolicy(wanted)
        held = layer.dtype_policy.variable_dtype
        if held in HALF_DTYPES and held != policy.variable_dtype:
            raise ValueError(
                f"Layer '{layer.name}' keeps its variables in {held} (policy "
                f"'{layer.dtype_policy.name}'); moving it to '{wanted}' moves compute only. "
                "Received a pure half-precision layer: train under a mixed policy "
                "(tf_mixed.enable('mixed_float16')) to move it.")
        planned.append((layer, policy))
    for layer, policy in planned:
        if not hasattr(layer, _BUILT_AS):  # the policy its graph was made with
            object.__setattr__(layer, _BUILT_AS, live_policy(layer))
        layer.dtype_policy = policy
    return [layer for layer, _ in planned]


def built_as(model) -> dict[str, str]:
    """The layers of ``model`` that `move` moved in place, by Keras path: the
    policy each computed in before its first move (what the symbolic tensors
    of a functional model's graph were made with; `tf_mixed.audit` reads a
    moved layer's output dtype from its policy instead).

    Args:
        model: A Keras model (or layer).

    Returns:
        Path -> policy name; empty for a model never moved.
    """
    return {layer_path(layer): getattr(layer, _BUILT_AS)
            for layer in _internals.sublayers(model) if hasattr(layer, _BUILT_AS)}
