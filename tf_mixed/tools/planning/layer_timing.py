"""Times each layer of a model, forward and backward, in each precision, on this host."""

# The impure half of `tf_mixed.plan` (the choice, `choosing.py`, is pure). What
# is timed, per layer that holds weights (a nested model is one group: it
# stays in one precision):
#
# * a fresh copy of the layer (`tf_mixed.models.cloning.recreate`; weights do
#   not change the time), built in each precision, called as the model calls
#   it (its first call's arguments) on that call's real inputs, captured from
#   the model on the first batch; the step is forward with ``training=True``
#   and the gradient of the summed output with respect to the layer's
#   weights and its floating-point inputs. The inputs arrive already in the
#   precision's compute dtype, so the step holds no cast;
# * the casts at the layer's input: its floating-point inputs cast to the
#   half dtype, and the gradient cast back, forward and backward. A plan pays
#   this where a layer's precision differs from its producer's.
#
# Layers without weights (activations, pooling, Add, Flatten, Keras ops) and
# normalization layers (BatchNormalization, LayerNormalization,
# GroupNormalization: Keras computes their statistics in float32 under a
# mixed policy) are not timed: they take the precision of the timed layer
# that feeds them (`Measurement.followers`), so they never add a cast of
# their own. Halving the layers to trace keeps a ResNet's plan short.
#
# Timing is in interleaved rounds (`tf_mixed._internal.measuring.grouped_rounds`),
# as `enable("auto")` times its probe (`tf_mixed.policy.autotune`'s
# `first_call` and `time_steps` are used): in each round every layer runs in
# every precision and its cast back to back, so load from other processes
# hits the candidates of a layer alike, and both the layers and each layer's
# candidates run in `measuring.rotated` order, each leading in turn (in a
# fixed order the first would pay the round's warm-up alone); a round's
# figure is the fastest of ``steps_per_round`` steps (preemption only
# lengthens a step). A float16 step is traced with Grappler's remapping off,
# as `enable("mixed_float16")` runs it on a CPU.

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping, Sequence

import keras

from tf_mixed._internal import measuring, progress
from tf_mixed._internal.facts import COMPUTE_DTYPES
from tf_mixed.models import cloning
from tf_mixed.policy import autotune, precision_map

# The source of a layer fed by a model input.
_NO_SOURCE: tuple[str, ...] = ("",)

__all__ = ["LayerTiming", "Measurement", "PRECISION_POLICIES", "layer_graph", "surveyed_graph",
           "surveyed_timer", "time_layers"]

# A precision of the plan -> the Keras policy a layer computes under. float8
# is Keras's float8 quantization on top of the half policy (see `time_layers`).
PRECISION_POLICIES = {dtype: policy for policy, dtype in COMPUTE_DTYPES.items()}
FLOAT8 = "float8"


@dataclasses.dataclass(frozen=True)
class LayerTiming:
    """One timed layer (or nested model, timed as one group).

    Attributes:
        name: The layer's name in the model.
        class_name: Its class.
        producers: The timed layers whose outputs reach its inputs (through
            layers without weights); "" for a model input.
        seconds: Precision -> seconds of one forward+backward step, one
            figure per interleaved round.
        cast_seconds: Seconds to cast its floating-point inputs to the half
            dtype and their gradient back, one figure per round (0.0 each
            round for a layer whose inputs are integers).
        float8_ready: Whether the layer can take float8 (a Dense or
            EinsumDense whose dimensions are multiples of 16).
    """

    name: str
    class_name: str
    producers: tuple[str, ...]
    seconds: Mapping[str, tuple[float, ...]]
    cast_seconds: tuple[float, ...]
    float8_ready: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "class_name": self.class_name,
                "producers": list(self.producers),
                "seconds": {k: list(v) for k, v in self.seconds.items()},
                "cast_seconds": list(self.cast_seconds), "float8_ready": self.float8_ready}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LayerTiming":
        return cls(str(data["name"]), str(data["class_name"]),
                   tuple(str(p) for p in data["producers"]),
                   {str(k): tuple(float(s) for s in v) for k, v in data["seconds"].items()},
                   tuple(float(s) for s in data["cast_seconds"]), bool(data["float8_ready"]))


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Every timed layer of a model, and which layers follow which.

    A plain record: `tf_mixed.plan` takes one as ``measurement=`` (tests pass
    their own timings; a cached one is read back with `from_dict`).

    Attributes:
        precisions: The precisions timed, "float32" first.
        layers: The timed layers, in the model's order.
        followers: Each layer without weights -> the timed layer whose
            precision it takes ("" when only model inputs feed it).
    """

    precisions: tuple[str, ...]
    layers: tuple[LayerTiming, ...]
    followers: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """The fewest rounds any layer's figure holds."""
        return min((len(v) for t in self.layers for v in t.seconds.values()), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"precisions": list(self.precisions),
                "layers": [t.to_dict() for t in self.layers],
                "followers": dict(self.followers)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurement":
        return cls(tuple(str(p) for p in data["precisions"]),
                   tuple(LayerTiming.from_dict(t) for t in data["layers"]),
                   {str(k): str(v) for k, v in data["followers"].items()})


def layer_graph(model: keras.Model) -> tuple[list, dict[str, tuple[str, ...]], dict[str, str]]:
    """Which layers of `model` are timed, what feeds them, and who follows whom.

    `surveyed_graph` of its survey (`tf_mixed.policy.precision_map.survey`).

    Args:
        model: A built Sequential or functional model.

    Returns:
        As `surveyed_graph`.
    """
    return surveyed_graph(precision_map.survey(model))


def surveyed_graph(surveyed: precision_map.Survey,
                   ) -> tuple[list, dict[str, tuple[str, ...]], dict[str, str]]:
    """`layer_graph` of a model surveyed once (`tf_mixed.plan` reads its own survey).

    Args:
        surveyed: The model's `tf_mixed.policy.precision_map.survey`.

    Returns:
        ``(timed, producers, followers)``: the layers timed (those holding
        weights, normalization aside, and nested models) in the model's
        order; for each, the names of the timed layers feeding it ("" for a
        model input); for each other layer, the first timed layer feeding it
        ("" if none).
    """
    top = list(surveyed.top)
    timed = [layer for layer in top if isinstance(layer, keras.Model)
             or (layer.weights and not isinstance(layer, _FOLLOWING))]
    timed_ids = {id(layer) for layer in timed}
    memo: dict[int, tuple[str, ...]] = {}

    def sources(operation) -> tuple[str, ...]:
        """The timed layers (or "") whose outputs reach `operation`'s inputs."""
        key = id(operation)
        if key in memo:
            return memo[key]
        memo[key] = ()  # a cycle cannot occur in a graph; guards recursion anyway
        found: list[str] = []
        for tensor in surveyed.calls.get(id(operation), ()):
            producer = surveyed.made_by.get(id(tensor))
            if producer is None or id(producer) in surveyed.inputs:
                names = _NO_SOURCE
            elif id(producer) in timed_ids:
                names = (producer.name,)
            else:
                names = sources(producer)
            found.extend(n for n in names if n not in found)
        memo[key] = tuple(found) or ("",)
        return memo[key]

    producers = {layer.name: sources(layer) for layer in timed}
    followers = {}
    for layer in top:
        if id(layer) not in timed_ids:
            first = next((n for n in sources(layer) if n), "")
            followers[layer.name] = first
    return timed, producers, followers


# Layers with weights that still follow their producer's precision (see the module).
_FOLLOWING = (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
              keras.layers.GroupNormalization)


def _float8_ready(layer) -> bool:
    if not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        return False
    kernel = getattr(layer, "kernel", None)
    shape = tuple(getattr(kernel, "shape", ()) or ())
    return bool(shape) and all(int(d) % 16 == 0 for d in shape)


def _is_float(value) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and keras.backend.is_float_dtype(
        keras.backend.standardize_dtype(dtype))


class _Call:
    """One layer's first call (its survey's `first_call`), with the real values of its arguments."""

    def __init__(self, arguments: tuple[tuple, dict], values: Mapping[int, Any]):
        args, kwargs = arguments
        structure = (list(args), dict(kwargs))
        self.flat = keras.tree.flatten(structure)
        self.structure = structure
        # Symbolic tensors are replaced by their captured values; other
        # arguments (bools, None) stay as they are and are closed over.
        self.tensor_positions = [i for i, v in enumerate(self.flat)
                                 if isinstance(v, keras.KerasTensor)]
        self.values = [values[id(self.flat[i])] for i in self.tensor_positions]

    def inputs(self, dtype: str) -> list:
        import tensorflow as tf

        return [tf.cast(v, dtype) if _is_float(v) else v for v in self.values]

    def symbolic(self, dtype: str) -> list:
        """Symbolic stand-ins for the values (shape and dtype only)."""
        return [keras.KerasTensor(tuple(v.shape), dtype=dtype if _is_float(v) else v.dtype)
                for v in self.values]

    def call(self, twin, tensors, training: bool = True):
        flat = list(self.flat)
        for position, tensor in zip(self.tensor_positions, tensors):
            flat[position] = tensor
        args, kwargs = keras.tree.pack_sequence_as(self.structure, flat)
        kwargs = dict(kwargs)
        kwargs["training"] = training
        return twin(*args, **kwargs)


def _twin(layer, precision: str, half_policy: str):
    policy = PRECISION_POLICIES.get(precision, half_policy)
    if isinstance(layer, keras.Model):
        return cloning.clone(layer, lambda _: policy).model
    return cloning.recreate(layer, dtype=policy)


def _layer_step(call: _Call, twin):
    import tensorflow as tf

    @tf.function
    def step(*tensors):
        floats = [t for t in tensors if _is_float(t)]
        with tf.GradientTape() as tape:
            tape.watch(floats)
            outputs = call.call(twin, list(tensors))
            loss = tf.add_n([tf.reduce_sum(tf.cast(o, "float32"))
                             for o in keras.tree.flatten(outputs) if _is_float(o)]
                            or [tf.constant(0.0)])
        grads = tape.gradient(loss, list(twin.trainable_variables) + floats)
        # One scalar depending on every gradient: fetching it waits for all.
        picked = [tf.cast(tf.reshape(g, [-1])[0], "float32") for g in grads
                  if g is not None and not isinstance(g, tf.IndexedSlices)]
        picked += [tf.cast(g.values[0, 0], "float32") for g in grads
                   if isinstance(g, tf.IndexedSlices)]
        return tf.add_n(picked) if picked else loss

    return step


def _cast_step(half_dtype: str):
    import tensorflow as tf

    @tf.function
    def step(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(list(tensors))
            halves = [tf.cast(t, half_dtype) for t in tensors]
        grads = tape.gradient(halves, list(tensors),
                              output_gradients=[tf.ones_like(h) for h in halves])
        return tf.add_n([tf.reshape(g, [-1])[0] for g in grads])

    return step


def capture_inputs(model: keras.Model, timed: Sequence, x) -> dict[int, Any]:
    """The real value of every symbolic argument of each timed layer's first call.

    `capture_surveyed` of the model's survey.

    Args:
        model: The model.
        timed: Its timed layers (`layer_graph`).
        x: One batch of the model's inputs.

    Returns:
        As `capture_surveyed`.
    """
    return capture_surveyed(precision_map.survey(model), timed, x)


def capture_surveyed(found: precision_map.Survey, timed: Sequence, x) -> dict[int, Any]:
    """`capture_inputs` of a surveyed model (each layer's first call read from the survey).

    Args:
        found: The model's `tf_mixed.policy.precision_map.survey`.
        timed: Its timed layers (`surveyed_graph`).
        x: One batch of the model's inputs.

    Returns:
        ``id(KerasTensor) -> tensor``, run with ``training=False`` (the
        model's state is not touched; only the shapes matter for timing).
    """
    model = found.model
    needed: dict[int, Any] = {}
    for layer in timed:
        for value in keras.tree.flatten(found.first_call(layer)):
            if isinstance(value, keras.KerasTensor):
                needed.setdefault(id(value), value)
    tensors = list(needed.values())
    if not tensors:
        return {}
    # The inputs in the structure x has (a list for a one-input model makes
    # Keras warn); a Sequential model has one input and no `.input` of its own.
    given = model.inputs[0] if isinstance(model, keras.Sequential) else model.input
    capture = keras.Model(given, tensors)
    values = capture(x, training=False)
    values = values if isinstance(values, (list, tuple)) else [values]
    return {id(t): v for t, v in zip(tensors, values)}


def time_layers(
    model: keras.Model,
    x,
    precisions: Sequence[str],
    half_policy: str,
    *,
    rounds: int = 5,
    min_rounds: int = 3,
    budget_s: float | None = None,
    steps_per_round: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Times every weighted layer of `model` in each precision (see the module).

    Args:
        model: A built Sequential or functional model; not modified.
        x: One batch of its inputs.
        precisions: "float32" and the half dtype ("bfloat16" or "float16"),
            and "float8" (Dense/EinsumDense layers that can take it only).
        half_policy: The mixed policy of the half dtype (float8 layers are
            quantized on top of it).
        rounds: The most interleaved rounds.
        min_rounds: Rounds that always run, whatever `budget_s`.
        budget_s: No new round starts after this many seconds of rounds
            (None: all `rounds`).
        steps_per_round: Steps of which a round keeps the fastest.
        clock: Seconds, for the budget.

    Returns:
        A `Measurement`.
    """
    return time_surveyed(precision_map.survey(model), x, precisions, half_policy,
                         rounds=rounds, min_rounds=min_rounds, budget_s=budget_s,
                         steps_per_round=steps_per_round, clock=clock)


def time_surveyed(found: precision_map.Survey, x, precisions: Sequence[str], half_policy: str,
                  *, rounds: int = 5, min_rounds: int = 3, budget_s: float | None = None,
                  steps_per_round: int = 2,
                  clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """`time_layers` of a surveyed model: its layer graph is read from the
    survey (`tf_mixed.policy.precision_map.survey`, the plan's one walk), not
    walked again.

    Args:
        found: The model's survey.
        x, precisions, half_policy, rounds, min_rounds, budget_s,
            steps_per_round, clock: As `time_layers` takes them.

    Returns:
        A `Measurement`.
    """
    import tensorflow as tf

    # Each layer and precision is its own tf.function, traced once: TF's
    # "triggered tf.function retracing" warning would blame that on the user.
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel("ERROR")
    try:
        return _time_layers(found, x, precisions, half_policy, rounds, min_rounds, budget_s,
                            steps_per_round, clock)
    finally:
        tf_logger.setLevel(level)


def surveyed_timer(found: precision_map.Survey, rounds: int = 5,
                   budget_s: float | None = None) -> Callable[..., Measurement]:
    """`tf_mixed.plan`'s default timer: `time_surveyed` on the plan's survey.

    Args:
        found: The planned model's survey (``found.model`` is the model timed).
        rounds: The most interleaved rounds (``min(3, rounds)`` always run).
        budget_s: No new round starts after this many seconds (None: all).

    Returns:
        ``timer(model, x, precisions, half_policy) -> Measurement``, the
        plan's ``timer=`` signature.
    """
    def timer(model, x, precisions, half_policy) -> Measurement:
        return time_surveyed(found, x, precisions, half_policy, rounds=rounds,
                             min_rounds=min(3, rounds), budget_s=budget_s)

    return timer


def _time_layers(found, x, precisions, half_policy, rounds, min_rounds, budget_s,
                 steps_per_round, clock) -> Measurement:
    timed, producers, followers = surveyed_graph(found)
    values = capture_surveyed(found, timed, x)
    ready = {layer.name: _float8_ready(layer) for layer in timed}
    groups: dict[str, dict[str, Callable[[], float]]] = {}
    for index, layer in enumerate(timed):
        progress.update(f"plan: tracing {layer.name} ({index + 1}/{len(timed)})")
        groups[layer.name] = _candidates(found.first_call(layer), values, layer, precisions,
                                         half_policy, ready[layer.name], steps_per_round)
    figures = _timed_rounds(groups, rounds, min_rounds, budget_s, clock)
    layers = tuple(
        LayerTiming(
            layer.name, type(layer).__name__, producers[layer.name],
            {p: tuple(figures[layer.name][p]) for p in precisions if p in figures[layer.name]},
            _cast_seconds(figures[layer.name]), ready[layer.name])
        for layer in timed)
    return Measurement(tuple(precisions), layers, followers)


def _candidates(arguments: tuple[tuple, dict], values: Mapping[int, Any], layer,
                precisions: Sequence[str], half_policy: str, ready: bool,
                steps_per_round: int) -> dict[str, Callable[[], float]]:
    """A layer's candidates, each step traced once: precision (or `_CAST`) ->
    a function timing ``steps_per_round`` steps (`autotune.time_steps`).

    Args:
        arguments: The layer's first call (``found.first_call(layer)``).
        values: The captured values of the symbolic tensors (`capture_surveyed`).
        layer, precisions, half_policy: As `time_layers` takes them.
        ready: Whether the layer can take float8 (`_float8_ready`).
        steps_per_round: Steps of which a round keeps the fastest.
    """
    call = _Call(arguments, values)
    half_dtype = keras.dtype_policies.get(half_policy).compute_dtype
    steps: dict[str, tuple[Any, list]] = {}
    for precision in precisions:
        if precision == FLOAT8 and not ready:
            continue
        twin = _twin(layer, precision, half_policy)
        dtype = (half_dtype if precision == FLOAT8
                 else keras.dtype_policies.get(PRECISION_POLICIES[precision]).compute_dtype)
        inputs = call.inputs(dtype)
        call.call(twin, call.symbolic(dtype), training=False)  # builds it, computes nothing
        if precision == FLOAT8:
            twin.quantize("float8")
        steps[precision] = (_layer_step(call, twin), inputs)
    floats = [v for v in call.values if _is_float(v)]
    if floats:
        steps[_CAST] = (_cast_step(half_dtype), floats)
    for name, (step, inputs) in steps.items():  # each traced once, before any timing
        autotune.first_call(step, inputs, remapping_off=name == "float16")
    return {name: functools.partial(autotune.time_steps, step, inputs, steps_per_round)
            for name, (step, inputs) in steps.items()}


# A layer's cast step among its candidates (not a precision's name).
_CAST = "cast"


def _timed_rounds(groups: Mapping[str, Mapping[str, Callable[[], float]]], rounds: int,
                  min_rounds: int, budget_s: float | None,
                  clock: Callable[[], float]) -> dict[str, dict[str, list[float]]]:
    """Each layer's candidates timed in `measuring.grouped_rounds` (see the module)."""
    if not groups:  # a model without a timed layer: nothing to time
        return {}
    total = max(rounds, 1)
    return measuring.grouped_rounds(
        groups, total, budget_s=budget_s, min_rounds=min_rounds, clock=clock,
        on_round=lambda r: progress.update(
            f"plan: round {r + 1}/{total} over {len(groups)} layers"))


def _cast_seconds(figures: Mapping[str, Sequence[float]]) -> tuple[float, ...]:
    """A layer's cast figures; 0.0 each round for a layer whose inputs are integers."""
    if _CAST in figures:
        return tuple(figures[_CAST])
    return (0.0,) * min((len(v) for v in figures.values()), default=0)
