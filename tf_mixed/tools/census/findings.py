"""What to change, from a census (`step_census.CensusReport`): one finding per cause."""

# Each finding names the layer, says what the census saw, and says what to do.
# Where `tf_mixed.audit` reports the same layer from its attributes, the
# finding links to it (``audit``: the audit finding's code) instead of
# repeating it: audit's table stays the one place for those facts.
#
# Codes (`CODES` holds each one's severity and whether `python -m tf_mixed
# doctor --measure` can apply the fix itself):
#
# * ``float32_island``: matmul/conv ops of a layer compute in float32 in a
#   half-precision model (an explicit float32 dtype, a keep_float32 rule, an
#   input arriving in float32, or XLA upcasting). A layer producing a model
#   output is left out: float32 there is usually deliberate, and audit's
#   ``explicit_float32`` lists it.
# * ``lambda_float32``: a Lambda computes in float32 (its matmuls, or casts
#   of its half-precision input up to float32).
# * ``float64_input``: the data arrives as float64 and is cast in the step.
# * ``tile_misfit``: a half-precision layer's output width misses the tiles
#   (`tf_mixed._internal.facts.TILE_MULTIPLES`); model outputs are left out (their
#   width is the task's). Automatic where ``tf_mixed.convert(..., pad_to=N)``
#   can pad it (`tf_mixed.models.padding`).
# * ``half_output_activation``: the model's output softmax/sigmoid computes in
#   half precision (a plain ``Dense(10, activation="softmax")`` head): not a
#   speed matter, but the step the census reads trains on saturated
#   probabilities; linked to audit's finding of the same code.

from __future__ import annotations

import dataclasses
from typing import Any

from tf_mixed._internal.facts import HALF_DTYPES, model_inputs_and_outputs
from tf_mixed.models import padding
from tf_mixed.policy import precision_map

__all__ = ["CODES", "Finding", "find"]

# code -> (severity, the doctor applies the fix itself)
CODES = {
    "float32_island": ("warning", False),
    "lambda_float32": ("warning", False),
    "float64_input": ("warning", True),
    "tile_misfit": ("warning", True),
    "half_output_activation": ("warning", False),
}
# Island reasons whose fix `tf_mixed.convert` applies (it rebuilds every
# layer that is not kept by a keep_float32 rule in the half policy).
_CONVERTIBLE = ("explicit_dtype",)
# Layer attributes that set a matmul/conv's output width.
_WIDTHS = ("units", "filters", "output_dim")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One cause of lost speed, with its fix.

    Attributes:
      severity: "warning" (every census finding costs time).
      code: a key of `CODES`.
      layer: the layer concerned (None: the whole step).
      message: what the census saw.
      fix: what to change.
      automatic: whether ``doctor --measure`` applies the fix itself.
      audit: the code of `tf_mixed.audit`'s finding on the same layer,
        when it has one (see it there; not repeated here).
    """

    severity: str
    code: str
    layer: str | None
    message: str
    fix: str
    automatic: bool = False
    audit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The finding as plain data."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        where = f"{self.layer}: " if self.layer else ""
        see = f" (tf_mixed.audit: {self.audit})" if self.audit else ""
        return f"[{self.severity}] {where}{self.message} Fix: {self.fix}{see}"


def _finding(code, layer, message, fix, audit=None, automatic=None) -> Finding:
    severity, default_automatic = CODES[code]
    return Finding(severity, code, layer, message, fix,
                   default_automatic if automatic is None else automatic, audit)


def _audit_codes(model) -> dict[tuple[str, str | None], str]:
    from tf_mixed.tools import auditing

    report = auditing.audit(model, check_global_policy=False)
    return {(f.code, f.layer): f.code for f in report.findings}


def _padded_by_convert(model, layer: str, multiple: int) -> bool:
    """Whether ``convert(model, pad_to=multiple)`` widens ``layer`` (a graph model only)."""
    return model_inputs_and_outputs(model) and layer in padding.plan(
        precision_map.survey(model), multiple)


def find(report, model) -> tuple[Finding, ...]:
    """The findings of a census.

    Args:
      report: a `tf_mixed.tools.census.step_census.CensusReport` (its findings are ignored).
      model: the model it was taken of.

    Returns:
      Findings, in the order: islands, Lambdas, float64 data, tiles, half output activations.
    """
    from tf_mixed._internal.facts import published_layers, walk_layers

    layers = dict(walk_layers(model))
    published = published_layers(model)
    audited = _audit_codes(model)
    found: list[Finding] = []
    lambdas: dict[str, list[str]] = {}
    for island in report.islands:
        if island.output and island.reason != "lambda":
            continue  # a float32 output layer is usually deliberate (audit lists it)
        flops = "" if island.flops is None else f", {island.flops:,} FLOPs per step"
        seen = (f"{island.ops} matmul/conv op(s) compute in {island.dtype}"
                f"{flops}: {island.why}.")
        if island.reason == "lambda":
            lambdas.setdefault(island.layer, []).append(seen)
            continue
        fix = {
            "explicit_dtype": f"drop dtype='float32' from '{island.layer}' if it is not "
                              "deliberate, or rebuild the model with tf_mixed.convert(model), "
                              "which converts it.",
            "keep_float32": f"run tf_mixed.probe(model, x, y): if '{island.layer}' stays finite "
                            "and close to float32 in half precision, drop its keep_float32 rule.",
            "float_input": f"cast the input of '{island.layer}' to its compute dtype "
                           "(keras.ops.cast(x, self.compute_dtype) in call), or leave Keras's "
                           "input casting on.",
            "xla_upcast": "XLA on this device computes half-precision matmuls in float32: "
                          "compile with jit_compile=False here, or train on a GPU.",
            "inside_layer": f"nothing, if the float32 math of '{island.layer}' is deliberate "
                            "(rotary positions and tied output logits usually are); otherwise "
                            "compute in self.compute_dtype in its call.",
        }[island.reason]
        found.append(_finding(
            "float32_island", island.layer, f"{island.class_name} is a float32 island: {seen}",
            fix, audited.get(("explicit_float32", island.layer)),
            automatic=island.reason in _CONVERTIBLE))
    for row in report.casts:
        layer = layers.get(row.layer)
        if (type(layer).__name__ == "Lambda" and row.target == "float32"
                and row.source in HALF_DTYPES):
            lambdas.setdefault(row.layer, []).append(
                f"{row.count} cast(s) of its {row.source} input up to float32 per step.")
    for name, parts in lambdas.items():
        found.append(_finding(
            "lambda_float32", name, f"Lambda computes in float32: {' '.join(parts)}",
            f"compute in the Lambda's input dtype (drop the cast to 'float32'; use "
            f"x.dtype for constants), or move the math into a layer, which Keras runs "
            f"in {report.policy}."))
    # A float64 constant (a NumPy scalar in a layer's code) is not data.
    wide = [row for row in report.casts if row.source == "float64" and row.count > row.constants]
    if wide:
        count = sum(row.count - row.constants for row in wide)
        places = ", ".join(sorted({row.layer for row in wide}))
        found.append(_finding(
            "float64_input", wide[0].layer,
            f"the data arrives as float64: {count} cast(s) from float64 per step ({places}), "
            "and twice the bytes of float32 cross into the step.",
            "cast the data to float32 (or the compute dtype) in the input pipeline, "
            "before batching: dataset.map(lambda x, y: (tf.cast(x, 'float32'), y)), or "
            "x.astype('float32') for arrays."))
    for misfit in report.misfits:
        if misfit.output or misfit.dimension != "n":
            continue
        layer = layers.get(misfit.layer)
        attribute = next((a for a in _WIDTHS if getattr(layer, a, None) == misfit.value), None)
        fix = (f"use {attribute}={misfit.padded}." if attribute else
               f"pad its output width {misfit.value} to {misfit.padded}.")
        origin = published.get(misfit.layer, "")
        if origin:  # the published design (and its pretrained weights) fix the width
            found.append(_finding(
                "tile_misfit", misfit.layer,
                f"{misfit.class_name} computes in {misfit.dtype} with output width "
                f"{misfit.value}, not a multiple of {misfit.multiple}: the last tile of "
                "every matmul runs partly empty.",
                f"nothing to resize: '{misfit.layer}' belongs to a {origin} architecture, "
                "whose widths its design and pretrained weights fix (pad only layers you "
                "added).", audited.get(("not_multiple_of_8", misfit.layer)), automatic=False))
            continue
        found.append(_finding(
            "tile_misfit", misfit.layer,
            f"{misfit.class_name} computes in {misfit.dtype} with output width "
            f"{misfit.value}, not a multiple of {misfit.multiple}: the last tile of "
            "every matmul runs partly empty.",
            fix, audited.get(("not_multiple_of_8", misfit.layer)),
            automatic=_padded_by_convert(model, misfit.layer, misfit.multiple)))
    for code, output_layer in audited:
        if code == "half_output_activation":  # README: keep the softmax in float32
            found.append(_finding(
                "half_output_activation", output_layer,
                f"the model's output activation computes in {report.policy}'s half dtype: "
                "its probabilities saturate, and the loss loses Keras's exact "
                "logits shortcut.",
                f"keep it in float32: give '{output_layer}' no activation and end the model with "
                "tf_mixed.OutputActivation('softmax') (or the layer's own activation), which "
                "computes in float32.", code))
    return tuple(found)
