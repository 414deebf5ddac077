"""A model's layers looked up in the catalog: which layer, its safe range, the fix."""

# `tf_mixed.audit` (its ``magnitudes=`` argument) and `LossScaleMonitor`'s
# fit-start check call `check_model`. Each half-precision layer is looked up
# in the stored catalog (`tf_mixed.tools.catalog.results.stored`) under the
# layer's own half policy, by the row of its class nearest its configuration
# (`tf_mixed.tools.catalog.matching`: epsilon, units, the length of its sums,
# an Activation's function, ...):
#
# * the row does not run under the policy here (a kernel this host's device
#   kind lacks, such as 3D pooling in float16 on a CPU) and this host has no
#   GPU: "catalog_no_kernel" (error): fit would fail at its first step;
# * no row is close to the layer's configuration: "catalog_unmatched" (info),
#   the nearest row, what differs, and how to measure the layer's own;
# * a magnitude known for the layer (max |input|: from `input_magnitudes`, a
#   batch run through the model, `magnitudes_from_probe`, a `tf_mixed.probe`
#   report, or the monitor's first batch, `tf_mixed.callbacks.first_batch`)
#   outside the row's safe range: "catalog_range" (warning), the layer, the
#   magnitude, the range and the fix;
# * no magnitude known: "catalog_narrow" (info) for a row safe over less than
#   `NARROW` (10**-3 .. 10**3), so the user knows which layers to watch.

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import (
    HALF_DTYPES,
    half_policy,
    is_input_layer,
    walk_layers,
)
from tf_mixed.policy import precision_map
from tf_mixed.tools.catalog import matching
from tf_mixed.tools.catalog.results import Catalog, Row, stored

__all__ = ["NARROW", "CatalogNote", "Covered", "bounded_layers", "check_model", "coverage",
           "input_magnitudes",
           "input_tap", "magnitudes_from_probe", "match_for", "row_for", "surveyed_magnitudes",
           "surveyed_match", "surveyed_tap"]

NARROW = (1e-3, 1e3)
"""A safe range that does not cover this is reported without magnitudes."""


@dataclasses.dataclass(frozen=True)
class CatalogNote:
    """A layer the catalog has something to say about.

    Attributes:
        severity: "error", "warning" or "info".
        code: "catalog_range", "catalog_narrow", "catalog_unmatched" or
            "catalog_no_kernel".
        layer: the layer's name (``outer/inner`` inside a nested model).
        message: what the catalog says about it.
        fix: what to do.
    """

    severity: str
    code: str
    layer: str
    message: str
    fix: str


@functools.lru_cache(maxsize=1)
def _stored() -> Catalog:
    return stored()


def match_for(catalog: Catalog, layer, policy: str) -> matching.Match | None:
    """The catalog row nearest a layer's configuration (None: the class is not in the catalog).

    Args:
        catalog: the catalog.
        layer: a Keras layer.
        policy: the half policy it computes under.

    Returns:
        A `tf_mixed.tools.catalog.matching.Match` (its ``close`` says whether
        the row is near enough to judge the layer by).
    """
    return matching.nearest(_class_rows(catalog, type(layer), policy), layer)


def surveyed_match(catalog: Catalog, found, layer, policy: str) -> matching.Match | None:
    """`match_for` of a layer of a surveyed model (its activation and call
    inputs read from the survey, `tf_mixed.policy.precision_map.Survey`)."""
    rows = _class_rows(catalog, type(layer), policy)
    return matching.nearest_described(rows, layer, found.fact(layer).activation,
                                      found.calls.get(id(layer), ()), found.first_call(layer))


def _class_rows(catalog: Catalog, cls: type, policy: str) -> list[Row]:
    """The catalog's rows of a layer class under one policy: the rows that
    measured that very class (`tf_mixed.tools.catalog.matching.row_class`;
    another class of the same name has none, users' rows are left out)."""
    return [row for row in catalog.rows
            if row.policy == policy and matching.row_class(row) is cls]


def row_for(catalog: Catalog, layer, policy: str) -> Row | None:
    """The catalog row a layer is judged by: its class's nearest, if close (else None)."""
    found = match_for(catalog, layer, policy)
    return found.row if found is not None and found.close else None


def check_model(model, magnitudes: Mapping[str, float] | None = None,
                catalog: Catalog | None = None, *, has_gpu: bool | None = None
                ) -> list[CatalogNote]:
    """Compares each half-precision layer of `model` with the catalog.

    Args:
        model: a `keras.Model`.
        magnitudes: max |input| per layer name (`input_magnitudes`,
            `magnitudes_from_probe`); None when unknown.
        catalog: the catalog to judge by (default: the stored one).
        has_gpu: whether this host has a GPU (None: detect).

    Returns:
        `CatalogNote` values, in the model's layer order.
    """

    catalog = catalog if catalog is not None else _stored()
    if has_gpu is None:
        from tf_mixed.policy import hardware

        has_gpu = hardware.detect().has_gpu
    notes = []
    for name, layer, dtype, policy in _half_layers(model):
        found = match_for(catalog, layer, policy)
        if found is None:
            continue
        row = found.row
        fix = (f"keep it in float32: tf_mixed.enable(keep_float32=[{name!r}]) before building, "
               f"or tf_mixed.convert(model, keep_float32=[{name!r}])")
        where = f"catalog row {row.key}, {policy}"
        if row.failure:  # a missing kernel is the class's, whatever its configuration
            if not has_gpu:
                notes.append(CatalogNote(
                    "error", "catalog_no_kernel", name,
                    f"Layer '{name}' ({row.layer}) does not run under {policy} on this "
                    f"host's device kind ({where}: {row.failure}).", fix))
            continue
        if not found.close:
            notes.append(_unmatched(name, layer, found))
            continue
        magnitude = None if magnitudes is None else magnitudes.get(name)
        if magnitude is not None:
            # All-zero inputs (max |x| = 0) lose nothing in half precision: a
            # layer upstream that zeroed them is that layer's finding.
            if magnitude > 0 and not row.safe.contains(magnitude):
                notes.append(CatalogNote(
                    "warning", "catalog_range", name,
                    f"Layer '{name}' ({row.layer}) computes in {dtype} and its inputs reach "
                    f"max |x| = {magnitude:.3g}, outside the range where it matches float32 "
                    f"within tolerance: {row.safe.text()} ({where}; {row.reason()}).", fix))
            continue
        if magnitudes is None and not _covers(row, *NARROW):
            notes.append(CatalogNote(
                "info", "catalog_narrow", name,
                f"Layer '{name}' ({row.layer}) matches float32 under {policy} only for "
                f"inputs with max |x| in {row.safe.text()} ({where}; {row.reason()}).",
                "check its input magnitudes: tf_mixed.audit(model, magnitudes="
                "tf_mixed.tools.catalog.input_magnitudes(model, x)); if they leave that "
                f"range, {fix}"))
    return notes


@dataclasses.dataclass(frozen=True)
class Covered:
    """How the catalog covers one half-precision layer of a model.

    Attributes:
        layer: the layer's name (``outer/inner`` inside a nested model).
        cls: its class, ``module.Class``.
        policy: the half policy it computes under.
        status: "matched" (a row close to its configuration judges it),
            "unmatched" (its class has rows, none close: ``catalog_unmatched``)
            or "no_rows" (the catalog measured no configuration of its class).
        row: the nearest row's key ("" with "no_rows").
        differences: what is not close ("unmatched" only).
    """

    layer: str
    cls: str
    policy: str
    status: str
    row: str = ""
    differences: tuple[str, ...] = ()


def coverage(model, catalog: Catalog | None = None) -> list[Covered]:
    """Which half-precision layers of ``model`` the catalog judges, and by which row.

    The layers `check_model` looks up (every layer but nested models and
    inputs, a KerasHub block as one layer), each as `check_model` matches it
    (`match_for`).

    Args:
        model: a `keras.Model`.
        catalog: the catalog (default: the stored one).

    Returns:
        `Covered` values in the model's layer order.
    """

    catalog = catalog if catalog is not None else _stored()
    found = []
    for name, layer, _, policy in _half_layers(model):
        cls = f"{type(layer).__module__}.{type(layer).__qualname__}"
        match = match_for(catalog, layer, policy)
        if match is None:
            found.append(Covered(name, cls, policy, "no_rows"))
        else:
            found.append(Covered(name, cls, policy, "matched" if match.close else "unmatched",
                                 match.row.key, match.differences))
    return found


def _half_layers(model):
    """``(name, layer, compute dtype, half policy)`` of each layer the catalog
    judges: every half-precision layer but nested models and inputs."""
    import keras

    for name, layer in walk_layers(model):
        if isinstance(layer, keras.Model) or is_input_layer(layer):
            continue
        dtype = keras.backend.standardize_dtype(layer.compute_dtype)
        policy = half_policy(dtype) if dtype in HALF_DTYPES else None
        if policy is not None:
            yield name, layer, dtype, policy


def _unmatched(name: str, layer, found: matching.Match) -> CatalogNote:
    row = found.row
    config, shape = _case_arguments(layer)
    return CatalogNote(
        "info", "catalog_unmatched", name,
        f"Layer '{name}' ({row.layer}) is not close to any configuration the catalog "
        f"measured under {row.policy}: the nearest, {row.key}, differs in "
        f"{'; '.join(found.differences)}. Its safe range is not known.",
        "measure it: tf_mixed.catalog([tf_mixed.tools.catalog.user_case("
        f"{row.layer!r}, config={config!r}" + (f", inputs=[{shape}]" if shape else "")
        + ")]), then compare its range with the magnitudes its inputs reach.")


def _case_arguments(layer) -> tuple[dict[str, Any], tuple[int, ...] | None]:
    """The ``config`` and input shape of a `user_case` measuring ``layer``'s
    configuration: its matched values and the constructor arguments it
    cannot be built without (a KerasHub block's ``num_heads``); its first
    input's shape less the batch axis, an unknown length as 8."""
    import inspect

    described = matching.describe(layer)
    dim = described.pop("input_dim", None)
    described.pop("call", None)  # how it is called, not a constructor argument
    try:
        own = layer.get_config()
    except Exception:  # noqa: BLE001 - a layer without a config: its matched values only
        own = {}
    try:
        parameters = list(inspect.signature(type(layer).__init__).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    required = [p.name for p in parameters if p.name != "self" and p.default is p.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    config = {**{key: own[key] for key in required if key in own}, **described}
    inputs = _internals.call_inputs(layer)
    shape = getattr(inputs[0], "shape", None) if inputs else None
    if shape is not None and len(shape) >= 2:
        return config, tuple(8 if d is None else int(d) for d in shape[1:])
    return config, (int(dim),) if dim and "input_dim" not in own else None


def _covers(row: Row, low: float, high: float) -> bool:
    return row.safe.contains(low) and row.safe.contains(high)


def bounded_layers(model, catalog: Catalog | None = None) -> list[str]:
    """Top-level half-precision layers a magnitude can put outside their safe range.

    Args:
        model: a `keras.Model`.
        catalog: the catalog to judge by (default: the stored one).

    Returns:
        The names of the layers whose close catalog row runs and is safe over
        less than the whole grid (a layer safe everywhere needs no magnitude).
    """
    import keras

    catalog = catalog if catalog is not None else _stored()
    names = []
    for layer in model.layers:
        policy = half_policy(keras.backend.standardize_dtype(layer.compute_dtype))
        if isinstance(layer, keras.Model) or policy is None:
            continue
        found = match_for(catalog, layer, policy)
        if found is None or not found.close or found.row.failure:
            continue
        safe = found.row.safe
        if safe.low is None or safe.below or safe.above:
            names.append(layer.name)
    return names


def input_tap(model, names=None) -> tuple[list[str], Any]:
    """A functional model returning the float inputs of the model's top-level layers.

    Args:
        model: a built Sequential or functional `keras.Model`.
        names: tap only these layers (None: every top-level layer).

    Returns:
        ``(owners, tap)``: the layer name of each of the tap's outputs (a
        layer with several inputs appears once per input), and a
        ``keras.Model`` on the model's own inputs (None when there is nothing
        to tap: layers inside nested models and layers without a symbolic
        call are left out).
    """
    return surveyed_tap(precision_map.survey(model), names)


def surveyed_tap(found, names=None) -> tuple[list[str], Any]:
    """`input_tap` of a surveyed model (`tf_mixed.policy.precision_map.survey`:
    its top layers and their call inputs; nothing walked again)."""
    import keras

    owners, tensors = [], []
    for layer in found.top:
        if isinstance(layer, keras.Model):
            continue
        if names is not None and layer.name not in names:
            continue
        for tensor in found.calls.get(id(layer), ()):
            if keras.backend.is_float_dtype(getattr(tensor, "dtype", "int32")):
                owners.append(layer.name)
                tensors.append(tensor)
    model = found.model
    if not tensors or not getattr(model, "inputs", None):
        return [], None
    try:  # the structure the model is called with (a dict of inputs stays a dict)
        inputs = model.input
    except (AttributeError, ValueError):  # a Sequential model: its one input
        inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    return owners, keras.Model(inputs, tensors)


def input_magnitudes(model, x) -> dict[str, float]:
    """Max |input| of each top-level layer of a Sequential/functional model on a batch.

    Args:
        model: a built Sequential or functional `keras.Model`.
        x: one batch the model takes.

    Returns:
        ``{layer name: max |input|}`` (inf where an input is not finite);
        layers inside nested models and layers without a symbolic call are left out.
    """
    return surveyed_magnitudes(precision_map.survey(model), x)


def surveyed_magnitudes(found, x) -> dict[str, float]:
    """`input_magnitudes` of a surveyed model (`surveyed_tap`)."""
    import keras
    import numpy as np

    owners, tap = surveyed_tap(found)
    if tap is None:
        return {}
    values = tap(x, training=False)
    magnitudes: dict[str, float] = {}
    for name, value in zip(owners, keras.tree.flatten(values)):
        array = np.abs(keras.ops.convert_to_numpy(keras.ops.cast(value, "float32")))
        peak = float(np.nan_to_num(array, nan=np.inf).max()) if array.size else 0.0
        magnitudes[name] = max(magnitudes.get(name, 0.0), peak)
    return magnitudes


def magnitudes_from_probe(model, report) -> dict[str, float]:
    """Max |input| per top-level layer, from a `tf_mixed.probe` report.

    The probe reports each layer's float32 max |output|; a layer's input
    magnitude is the largest of its producers' (layers fed by a model input
    directly are left out: the probe does not report inputs).
    """
    outputs = {stats.name: stats.float32_max_abs for stats in report.layers}
    found = {}
    for layer in model.layers:
        producers = []
        for tensor in _internals.call_inputs(layer):
            history = _internals.keras_history(tensor)
            name = getattr(getattr(history, "operation", None), "name", None)
            if name in outputs:
                producers.append(outputs[name])
        if producers:
            found[layer.name] = max(producers)
    return {name: value for name, value in found.items() if not math.isnan(value)}
