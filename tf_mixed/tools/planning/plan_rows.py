"""The plan's rows, one per top layer: what the stages found, then what applying builds."""

# `tf_mixed.plan`'s stages each read the model's one survey
# (`tf_mixed.policy.precision_map.survey`). This module turns their findings
# into the plan's table: `candidates` makes the rows of the per-layer choice
# (and of the two whole-model precisions, for the step check to time,
# `tf_mixed.tools.planning.step_check.check`). The rows the step check keeps
# become the plan's map and table in `tf_mixed.tools.planning.plan_table.decided`.

from __future__ import annotations

from typing import Mapping

from tf_mixed._internal.facts import FLOAT32_HEADS
from tf_mixed.policy import precision_map
from tf_mixed.tools.planning import choosing
from tf_mixed.tools.planning.layer_timing import Measurement
from tf_mixed.tools.planning.plan_table import LayerChoice

__all__ = ["candidates"]

PLAN = "plan"
"""The candidate that is the per-layer choice (the others are named by their precision)."""
FLOAT32 = "float32"


def candidates(found: precision_map.Survey, measurement: Measurement, choice: choosing.Choice,
               errors: Mapping[str, float | None], blocked: Mapping[str, str],
               followers: Mapping[str, str], half_dtype: str, *,
               whole_models: bool) -> dict[str, list[LayerChoice]]:
    """The rows of the per-layer choice, and of the whole models to time it against.

    Args:
        found: The planned model's survey.
        measurement: The layers' timings.
        choice: `choosing.choose`'s choice.
        errors: Timed layer -> its error in the half dtype (None: unknown).
        blocked: Timed layer -> why it stays float32 (numerically unsafe).
        followers: Untimed layer -> the timed layer whose precision it
            follows (`tf_mixed.tools.planning.layer_timing.surveyed_graph`).
        half_dtype: "float16" or "bfloat16".
        whole_models: Add the whole-model candidates ("float32" and
            ``half_dtype``: the unsafe layers float32) when the choice differs
            from both (the step check then times all three).

    Returns:
        Candidate name ("float32", ``half_dtype``, "plan") -> its rows, in
        the model's order.
    """
    names = [timing.name for timing in measurement.layers]
    wholes = {FLOAT32: {n: FLOAT32 for n in names},
              half_dtype: {n: FLOAT32 if n in blocked else half_dtype for n in names}}
    variants = {PLAN: dict(choice.precisions)}
    if whole_models and variants[PLAN] not in wholes.values():
        variants = {**wholes, **variants}
    timings = {t.name: t for t in measurement.layers}
    found_rows: dict[str, list[LayerChoice]] = {}
    for name, assign in variants.items():
        rows = []
        for layer in found.top:
            cls, timing = type(layer).__name__, timings.get(layer.name)
            if timing is not None:
                seconds, cast = choice.medians[layer.name]
                rows.append(LayerChoice(
                    layer.name, timing.class_name, dict(seconds), cast, errors.get(layer.name),
                    assign[layer.name], choice.whys[layer.name]))
                continue
            if cls in FLOAT32_HEADS:
                rows.append(LayerChoice(layer.name, cls, {}, 0.0, None, FLOAT32,
                                        "tf_mixed's float32 head: float32 under any policy"))
                continue
            # Untimed: it follows its timed producer, else (fed by the model's
            # inputs) its candidate's whole model: the choice's start for the plan.
            whole = choice.start if name == PLAN else name
            source = followers.get(layer.name, "")
            followed = assign.get(source, whole) if source else whole
            kind = "normalization" if layer.weights else "no weights"
            rows.append(LayerChoice(
                layer.name, cls, {}, 0.0, None, FLOAT32 if followed == FLOAT32 else half_dtype,
                f"{kind}: follows {source}" if source
                else f"{kind}, fed by the model's inputs: the whole-model {whole}"))
        found_rows[name] = rows
    return found_rows

