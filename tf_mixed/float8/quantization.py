"""Float8 training that every replica agrees on, saturation-safe and visible."""

#     plan = tf_mixed.float8.quantize(model)      # rides model.quantize("float8")
#     print(plan)                                  # which layers, and why
#     model.compile(optimizer=tf_mixed.wrap_optimizer("adam"), loss=...)
#     model.fit(ds, callbacks=[tf_mixed.float8.Float8Monitor()])
#     tf_mixed.float8.state(model)                 # scales, amaxes, saturation
#
# Keras 3 trains Dense and EinsumDense in float8 after
# ``model.quantize("float8")``: inputs and kernel are quantized-dequantized to
# e4m3 and the output gradient to e5m2, each with a scale taken from a history
# of recent absolute maxima (delayed scaling). tf_mixed adds what Keras lacks:
#
# * the choice of layers (`quantize`): the first and last float8-capable
#   layers and those whose dimensions no float8 GEMM can run are kept out by
#   default, and the returned `Float8Plan` says why for each layer; a margin
#   and an amax algorithm as in Transformer Engine;
# * agreement (`tf_mixed.scaling.float8_sync`, run by `tf_mixed.LossScaleOptimizer`):
#   the amaxes are MAX-reduced across replicas and workers before they are
#   written, so every copy holds the scales and histories one device would
#   hold on the global batch; a non-finite amax never enters a history; under
#   loss scaling the output-gradient history stays in unscaled units;
# * visibility: `state` (scale, amax, saturated and flushed fractions per
#   layer and tensor), `Float8Monitor` (floats into ``logs``, stop on
#   sustained saturation), `lowering_report` (did XLA emit float8 GEMMs?).
#
# Agreement needs the tf_mixed optimizer wrapper (``tf_mixed.wrap_optimizer``,
# a pass-through under float32/bfloat16); a plain Keras optimizer under a
# strategy keeps Keras's per-replica scales, and `Float8Monitor` refuses it.

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import check_model_kind
from tf_mixed.float8 import readiness
from tf_mixed.float8.lowering import LoweringReport, lowering_report
from tf_mixed.float8.monitor import Float8Monitor, Float8Saturation
from tf_mixed.float8.reading import Float8State, TensorState, state
from tf_mixed.policy import keep_float32 as keep_rules
from tf_mixed.scaling.float8_sync import ALGORITHMS, Float8Scaling, set_scaling
from tf_mixed.scaling.optimizer import float8_sync_of

__all__ = [
    "ALGORITHMS",
    "Float8Choice",
    "Float8Monitor",
    "Float8Plan",
    "Float8Saturation",
    "Float8Scaling",
    "Float8State",
    "LoweringReport",
    "TensorState",
    "lowering_report",
    "quantize",
    "state",
]

DEFAULT_AMAX_HISTORY_LENGTH = 1024  # Keras's and Transformer Engine's


@dataclasses.dataclass(frozen=True)
class Float8Choice:
    """What `quantize` did with one layer.

    Attributes:
        layer: Qualified layer name (``outer/inner`` in a nested model).
        class_name: The layer's class.
        float8: Whether the layer computes in float8 afterwards.
        reason: Why, in one sentence.
    """

    layer: str
    class_name: str
    float8: bool
    reason: str


@dataclasses.dataclass(frozen=True)
class Float8Plan:
    """The layers `quantize` put in float8 and those it kept out, with reasons.

    Attributes:
        model_name: The model's name.
        choices: One `Float8Choice` per Dense/EinsumDense layer.
        scaling: The `Float8Scaling` (margin, amax algorithm) of the float8
            layers.
        amax_history_length: Length of their amax histories.
    """

    model_name: str
    choices: tuple[Float8Choice, ...]
    scaling: Float8Scaling
    amax_history_length: int

    @property
    def quantized(self) -> list[str]:
        """Names of the layers that compute in float8."""
        return [c.layer for c in self.choices if c.float8]

    @property
    def kept(self) -> list[str]:
        """Names of the float8-capable layers kept in higher precision."""
        return [c.layer for c in self.choices if not c.float8]

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data."""
        return {"model": self.model_name,
                "scaling": dataclasses.asdict(self.scaling),
                "amax_history_length": self.amax_history_length,
                "choices": [dataclasses.asdict(c) for c in self.choices]}

    def __str__(self) -> str:
        head = (f"Float8 plan for model '{self.model_name}': "
                f"{len(self.quantized)} of {len(self.choices)} Dense/"
                f"EinsumDense layers in float8 (margin {self.scaling.margin}, "
                f"amax {self.scaling.amax_compute_algo} over "
                f"{self.amax_history_length} steps).")
        lines = [head]
        width = max([len(c.layer) for c in self.choices] + [5])
        for c in self.choices:
            lines.append(f"  {c.layer.ljust(width)}  "
                         f"{'float8' if c.float8 else 'kept  '}  {c.reason}")
        return "\n".join(lines)


def quantize(model: keras.Model, *, margin: int = 0,
             amax_history_length: int = DEFAULT_AMAX_HISTORY_LENGTH,
             amax_compute_algo: str = "max",
             keep_float32: Any = "auto", optimizer: Any = None) -> Float8Plan:
    """Puts a model's Dense/EinsumDense layers in float8, safely chosen.

    Rides on Keras's float8 quantization (each chosen layer gets Keras's
    ``QuantizedFloat8DTypePolicy``, as ``model.quantize("float8")`` gives
    it, with ``amax_history_length``). Layers already in float8 (a model
    quantized before, or loaded from a file) keep their variables and take
    this call's ``margin`` and ``amax_compute_algo`` from the next step on,
    also when an optimizer already trains the model (``model.optimizer``, or
    ``optimizer`` in a custom loop): the tf_mixed optimizer reads them from
    variables when the step runs. These two are not saved in ``.keras``
    files, so call `quantize` again after loading.

    Call it on a built model, before ``compile`` (or compile again after),
    and train with ``tf_mixed.wrap_optimizer(...)`` so every replica and
    worker writes the same scales.

    Args:
        model: A built ``keras.Model`` (any kind; nested models are entered).
        margin: The scale keeps ``2**margin`` of headroom above the amax
            (an integer >= 0; 0 as Keras).
        amax_history_length: How many steps of amax each scale looks back
            over (>= 1; 1024 as Keras and Transformer Engine).
        amax_compute_algo: ``"max"`` over the history (Keras) or
            ``"most_recent"``.
        keep_float32: Which Dense/EinsumDense layers stay out of float8.
            ``"auto"`` (default): the first and the last of them, and those
            with a dimension not a multiple of 16 (see
            `tf_mixed.float8.readiness`). Otherwise a ``keep_float32`` spec
            as for `tf_mixed.enable` (names, classes, predicates, or ``[]``
            for none), which replaces the automatic rule. Kept layers keep
            the model's own policy (e.g. bfloat16), not necessarily float32.
        optimizer: The optimizer that trains the model when it is not
            ``model.optimizer`` (a custom loop); None for ``model.optimizer``.

    Returns:
        A `Float8Plan` saying, per layer, float8 or kept, and why.

    Raises:
        TypeError: ``model`` is not a Keras model, or ``keep_float32`` is
            not a valid spec.
        ValueError: the model (or a chosen layer) is not built, an argument
            is out of range, ``keep_float32`` names an unknown layer, or a
            layer already in float8 has a different history length.
    """
    check_model_kind(model, "tf_mixed.float8.quantize()", traced=False)
    amax_history_length = _validate.number(
        amax_history_length, "amax_history_length", integer=True,
        rule=lambda n: n >= 1, owner="tf_mixed.float8.quantize()",
        valid="an integer >= 1, such as 1024 or 16")
    scaling = Float8Scaling(margin=margin, amax_compute_algo=amax_compute_algo)
    automatic = isinstance(keep_float32, str) and keep_float32 == "auto"
    rules = None if automatic else keep_rules.parse(keep_float32)
    checks = readiness.check_layers(model)
    if rules is not None:
        rules.check_names([c.layer.name for c in checks], model.name)
    candidates = [c for c in checks if c.eligible]
    for check in candidates:
        _check_built(model, check)
        if readiness.is_float8(check.layer):
            length = int(check.layer.inputs_amax_history.shape[0])
            if length != amax_history_length:
                raise ValueError(
                    f"Layer '{check.name}' is already float8 with an amax "
                    f"history of {length} steps. Received: amax_history_length"
                    f"={amax_history_length}. Pass amax_history_length="
                    f"{length} (a history's length is fixed once created).")

    choices, chosen = [], []
    for check in candidates:
        float8, reason = _decide(check, rules)
        choices.append(Float8Choice(check.name, type(check.layer).__name__,
                                    float8, reason))
        if float8:
            chosen.append(check.layer)
    # Everything is validated: only now is the model changed.
    for layer in chosen:
        if not readiness.is_float8(layer):
            layer.dtype_policy = keras.dtype_policies.QuantizedFloat8DTypePolicy(
                "float8", source_name=layer.dtype_policy.name,
                amax_history_length=amax_history_length)
        set_scaling(layer, scaling)
    for trainer in {id(o): o for o in (optimizer, getattr(model, "optimizer", None))
                    if o is not None}.values():
        sync = float8_sync_of(trainer)
        if sync is not None:  # a built tf_mixed optimizer: the knobs it reads
            sync.refresh_scaling()
    if chosen and getattr(model, "compiled", False):
        # As model.quantize does: the compiled step functions are stale.
        model.train_function = model.test_function = None
        model.predict_function = None
    return Float8Plan(model.name, tuple(choices), scaling, amax_history_length)


def _decide(check, rules) -> tuple[bool, str]:
    if readiness.is_float8(check.layer):
        return True, "already float8 (its variables are kept)"
    if rules is None:
        if check.keep:
            return False, "kept: " + "; ".join(readiness.REASONS[k]
                                               for k in check.keep) + "."
        return True, ("float8: not the first or last float8-capable layer, "
                      "dimensions multiples of 16.")
    if rules.matches(check.layer):
        return False, "kept: matched by keep_float32."
    return True, "float8: not matched by keep_float32."


def _check_built(model, check) -> None:
    if not check.layer.built or getattr(check.layer, "kernel", None) is None:
        raise ValueError(
            f"Layer '{check.name}' of model '{model.name}' is not built, so "
            "it has no kernel to quantize. Build the model first: call it on "
            "a batch, or model.build(input_shape).")
