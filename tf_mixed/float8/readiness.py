"""How ready a model is for float8: which layers can use it and which should not."""

# One table of rules, read by `tf_mixed.audit` (its float8 findings) and by
# `tf_mixed.float8.quantize` (which layers it keeps out by default), so the
# advice the audit gives is what quantize does.
#
# Float8 here is Keras's (``model.quantize("float8")``): only ``Dense`` and
# ``EinsumDense`` have a float8 path (quantize-dequantize of the inputs and
# kernel in e4m3 and of the output gradient in e5m2, around the same matrix
# product). The rules:
#
# * ``eligible``: the layer's class is exactly Dense or EinsumDense (Keras
#   refuses subclasses), at any depth: layers that hold layers (a
#   transformer block's attention projections and feed-forward layers, as
#   in KerasHub's models) are entered, as ``model.quantize("float8")`` enters
#   them, and their Dense/EinsumDense named ``outer/inner``.
# * ``first`` / ``last``: the first and the last eligible layer in the
#   model's order are kept in higher precision, as Transformer Engine and
#   the FP8 training papers advise: the first sees the raw data (widest
#   range, no normalisation before it), the last produces the logits the loss
#   and the output activation read.
# * ``not_multiple_of_16``: float8 GEMMs (cuBLASLt, which XLA calls) need the
#   contracted and output dimensions to be multiples of 16; otherwise XLA
#   falls back to an emulated product and float8 costs time instead of saving
#   it.

from __future__ import annotations

import math
from typing import Any, NamedTuple

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import layer_outputs, walk_layers

__all__ = ["FLOAT8_CLASSES", "REASONS", "LayerCheck", "check_layers",
           "findings", "flop_share", "is_float8"]

# Layer classes with a Keras float8 path (exact classes, not subclasses).
FLOAT8_CLASSES = ("Dense", "EinsumDense")
# cuBLASLt float8 GEMMs need every matrix dimension a multiple of this.
FLOAT8_GEMM_MULTIPLE = 16

# Why a layer is kept out of float8 by default: (code, sentence).
REASONS = {
    "first": "the first float8-capable layer: it sees the raw data, whose "
             "range is the widest in the model",
    "last": "the last float8-capable layer: it produces the outputs the loss "
            "reads",
    "not_multiple_of_16": "a matrix dimension is not a multiple of 16, so no "
                          "float8 GEMM can run it",
}


class LayerCheck(NamedTuple):
    """The float8 rules applied to one layer.

    Attributes:
        name: Qualified name (``outer/inner`` in a nested model).
        layer: The layer.
        eligible: Whether Keras has a float8 path for its class.
        keep: The codes of `REASONS` that keep it out by default.
        dims: The matrix dimensions checked (contracted size, output size).
    """

    name: str
    layer: Any
    eligible: bool
    keep: tuple[str, ...]
    dims: tuple[int, ...]


def _dims(layer) -> tuple[int, ...]:
    """(contracted size, output size) of the layer's matrix product."""
    kernel = getattr(layer, "kernel", None)
    if kernel is None:
        return ()
    shape = [int(d) for d in kernel.shape]
    if type(layer).__name__ == "Dense":
        return tuple(shape)
    # EinsumDense: the kernel's first dimension is contracted in every
    # common equation ("ab,bc->ac", "abc,cde->abde"); the rest are outputs.
    return (shape[0], math.prod(shape[1:]) if len(shape) > 1 else 1)


def is_float8(layer) -> bool:
    """Whether ``layer`` was quantized to float8 (its dtype policy says so)."""
    policy = getattr(layer, "dtype_policy", None)
    return getattr(policy, "quantization_mode", None) == "float8"


def check_layers(model) -> list[LayerCheck]:
    """The float8 rules for every leaf layer of ``model``, in model order.

    Args:
        model: A built Keras model.

    Returns:
        One `LayerCheck` per leaf layer (a shared layer once).
    """
    seen, leaves = set(), []
    for name, layer in walk_layers(model):
        if isinstance(layer, keras.Model) or id(layer) in seen:
            continue
        seen.add(id(layer))
        leaves.append((name, layer))
        if type(layer).__name__ in FLOAT8_CLASSES:
            continue
        # A layer that holds layers (a transformer block: its attention's
        # EinsumDense projections, its feed-forward Dense layers), entered as
        # Keras's own model.quantize("float8") enters it.
        for inner in _internals.sublayers(layer)[1:]:
            if type(inner).__name__ in FLOAT8_CLASSES and id(inner) not in seen:
                seen.add(id(inner))
                leaves.append((f"{name}/{inner.name}", inner))
    eligible = [i for i, (_, layer) in enumerate(leaves)
                if type(layer).__name__ in FLOAT8_CLASSES]
    checks = []
    for i, (name, layer) in enumerate(leaves):
        if i not in eligible:
            checks.append(LayerCheck(name, layer, False, (), ()))
            continue
        dims = _dims(layer)
        keep = []
        if i == eligible[0]:
            keep.append("first")
        if i == eligible[-1]:
            keep.append("last")
        if any(d % FLOAT8_GEMM_MULTIPLE for d in dims):
            keep.append("not_multiple_of_16")
        checks.append(LayerCheck(name, layer, True, tuple(keep), dims))
    return checks


def _flops(layer) -> int:
    """Multiply-adds x 2 per example of a layer's matrix product (0 if none)."""
    outputs = layer_outputs(layer)
    kernel = getattr(layer, "kernel", None)
    if not outputs or kernel is None:
        return 0
    out_elements = math.prod(d or 1 for d in list(outputs[0].shape)[1:])
    shape = [int(d) for d in kernel.shape]
    name = type(layer).__name__
    if name == "Dense":
        return 2 * out_elements * shape[0]
    if name == "EinsumDense":
        return 2 * out_elements * shape[0]
    if name.startswith(("Conv", "DepthwiseConv")):
        # Each output element takes the kernel's window over the inputs.
        return 2 * out_elements * math.prod(shape[:-1])
    return 0


def flop_share(model) -> float | None:
    """The share of the model's matrix-product FLOPs in float8-capable layers.

    Counts Dense, EinsumDense and convolutions (per example, from the
    symbolic output shapes). None for a model without a graph.
    """
    total = capable = 0
    for check in check_layers(model):
        flops = _flops(check.layer)
        total += flops
        if check.eligible:
            capable += flops
    if total == 0:
        return None
    return capable / total


def _finding(severity, code, layer, *, message, fix):
    return (severity, code, layer, message, fix)


def findings(model) -> list[tuple[str, str, str | None, str, str]]:
    """The float8 readiness findings as (severity, code, layer, message, fix).

    `tf_mixed.audit` turns them into its `Finding` records.
    """
    out = []
    checks = check_layers(model)
    share = flop_share(model)
    capable = [c for c in checks if c.eligible]
    if share is not None:
        out.append(_finding(
            "info", "float8_flop_share", None,
            message=(f"{share:.0%} of the model's matrix-product FLOPs are in "
                     f"Dense/EinsumDense layers ({len(capable)} layers), the "
                     "only ones Keras runs in float8; float8 can speed up "
                     "only those."),
            fix=("nothing to do if the share is high; float8 gains little "
                 "when convolutions or other layers dominate.")))
    elif not capable:
        out.append(_finding(
            "info", "float8_flop_share", None,
            message=("the model has no Dense/EinsumDense layer, the only "
                     "ones Keras runs in float8."),
            fix="float8 does not apply to this model."))
    for check in capable:
        severity = "warning" if is_float8(check.layer) else "info"
        if "not_multiple_of_16" in check.keep:
            rounded = tuple(-(-d // 16) * 16 for d in check.dims)
            out.append(_finding(
                severity, "float8_not_multiple_of_16", check.name,
                message=(f"{type(check.layer).__name__} matrix dimensions "
                         f"{check.dims} are not all multiples of 16: a float8 "
                         "GEMM cannot run it, so float8 would be emulated "
                         "there."),
                fix=(f"use dimensions {rounded}, or keep it out of float8 "
                     "(tf_mixed.float8.quantize does by default).")))
        for code in ("first", "last"):
            if code in check.keep:
                out.append(_finding(
                    severity, "float8_keep_higher_precision", check.name,
                    message=(f"{REASONS[code]}; it should stay in higher "
                             "precision" + (" but is float8." if severity == "warning"
                                            else ".")),
                    fix=("leave it out of float8 (tf_mixed.float8.quantize "
                         "does by default).")))
    return out
