"""The main job's third row, "per-layer plan": `tf_mixed.plan` applied and trained."""

# `make_plan` plans the float32 bench model on one training batch (timed on
# this host, cached per host and model like ``enable("auto")``'s measurement);
# the compare job plans once, before any policy trains (`tf_mixed.bench.run.plan_layers`).
# Where the plan equals a whole-model policy the job also runs (`same_as`: every
# layer in that policy's precision), the plan is not trained again: its row is that
# policy's, figures and verdict (`reused_row`), so one set of precisions never gets
# two verdicts. Otherwise `tf_mixed.bench.run` applies it (`Plan.apply`, i.e.
# `tf_mixed.convert`) and trains the result as any other policy. `plan_record` is
# what the result file keeps; `label` names the row; `notes` says what the plan chose, how
# long planning took, and, where the row falls short of the host's large
# matmul ratio, where the rest of its step goes, in numbers (the census of
# its step and the plan's own per-layer times).

from __future__ import annotations

import copy
import time
from typing import Any

import tf_mixed

PLAN = "plan"
"""The bench policy name of the row (``--policies=float32,auto,plan``)."""
LABEL = "per-layer plan"


def make_plan(model, train_set):
    """`tf_mixed.plan` of `model` (float32) on the first batch of `train_set`.

    Args:
        model: The bench model, built in float32.
        train_set: The batched training set (``(x, y)`` batches).

    Returns:
        The `tf_mixed.tools.planning.Plan`, with the seconds planning took in
        ``plan_seconds`` of its record (`plan_record`).
    """
    x, y = next(iter(train_set))
    start = time.perf_counter()
    plan = tf_mixed.plan(model, x.numpy(), y.numpy(), loss="sparse_categorical_crossentropy")
    _SECONDS[id(plan)] = time.perf_counter() - start
    return plan


_SECONDS: dict[int, float] = {}


def plan_record(plan) -> dict[str, Any]:
    """The plan as the result file keeps it (no per-round timings)."""
    record = plan.to_dict()
    record["plan_seconds"] = _SECONDS.pop(id(plan), None)
    return record


def same_as(record: dict[str, Any], policies) -> str | None:
    """The whole-model policy among ``policies`` that the plan equals, or None.

    The plan equals its carrying policy when no layer is kept in float32
    under it (float32 heads aside: every policy keeps them) and none is in
    float8: an all-float32 plan is float32, an all-bfloat16 plan mixed_bfloat16.

    Args:
        record: The plan's record (`plan_record`).
        policies: The policies of the run.
    """
    whole = record["policy"]
    if record["keep_float32"] or record.get("float8_layers") or whole not in policies:
        return None
    return whole


def reused_row(record: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The plan's row when it equals ``row``'s policy: ``row``'s figures, not trained again.

    Args:
        record: The plan's record (`plan_record`).
        row: The result of the whole-model policy the plan equals (`same_as`).

    Returns:
        A copy of ``row`` as the "plan" policy, with ``same_as`` naming ``row``'s
        policy and the plan's record and reason.
    """
    reused = copy.deepcopy(row)
    reused.update(policy=PLAN, same_as=row["policy"], layer_plan=record,
                  policy_reason=f"the plan is {row['policy']} ({record['summary']})")
    return reused


def label(result: dict[str, Any]) -> str:
    """The row's name in the table: the policy, "per-layer plan", or, for a plan
    equal to a whole-model policy, "per-layer plan: the plan is POLICY"."""
    if result["policy"] != PLAN:
        return result["policy"]
    same = result.get("same_as")
    return f"{LABEL}: the plan is {same}" if same else LABEL


def notes(report: dict[str, Any]) -> list[str]:
    """What the plan chose and where its step's time goes (one sentence a line)."""
    lines = []
    matmul = report.get("matmul") or {}
    for r in report["results"]:
        record = r.get("layer_plan")
        if not record:
            continue
        counts = dict[str, int]()
        for row in record["layers"]:
            if row["seconds"]:
                counts[row["choice"]] = counts.get(row["choice"], 0) + 1
        took = record.get("plan_seconds")
        layers = ", ".join(f"{n} {p}" for p, n in sorted(counts.items())) + " timed layers"
        timing = ((f"; planned in {took:.1f} s" if took is not None else "")
                  + ("; timings read from the cache" if record.get("cached") else ""))
        same = r.get("same_as")
        if same:
            lines.append(f"{LABEL}: the plan is {same} ({layers}){timing}. It was not trained "
                         f"again: its row is {same}'s, figures and verdict.")
            continue
        kept = (f" (kept float32: {', '.join(record['keep_float32'])})"
                if record["keep_float32"] else "")
        lines.append(f"{LABEL}: {record['policy']} with {layers}{kept}{timing}.")
        ratio = (r.get("ratio_to_float32") or {}).get("samples_per_sec")
        if not (ratio and matmul.get("ratio", 0) > 0 and ratio < matmul["ratio"]):
            continue
        census = r.get("census") or {}
        share = census.get("half_flop_share")
        casts = census.get("casts_per_step")
        cast_mb = (census.get("cast_bytes_per_step") or 0) / 2**20
        timed_ms = 1e3 * record["step_seconds"].get("plan", 0.0)
        step_ms = r.get("step_time_ms") or 0.0
        rest = max(step_ms - timed_ms, 0.0)
        parts = [f"{LABEL} gets {ratio:.2f}x of the host's {matmul['ratio']:.2f}x matmul ratio "
                 f"({100 * ratio / matmul['ratio']:.0f}%). Where the rest goes:"]
        if share is not None:
            parts.append(f"{100 * (1 - share):.0f}% of the step's matmul/conv FLOPs stay in "
                         "float32 (census);")
        if casts is not None:
            parts.append(f"{casts} casts a step moving {cast_mb:.1f} MB (census);")
        if step_ms > 0 and timed_ms >= step_ms:
            parts.append(f"the timed layers, each timed alone, sum to {timed_ms:.1f} ms, more "
                         f"than the {step_ms:.1f} ms step (each carries its own dispatch), so "
                         "they do not split this step further.")
        elif step_ms > 0:
            parts.append(f"the timed layers' forward+backward is {timed_ms:.1f} ms of the "
                         f"{step_ms:.1f} ms step, the other {rest:.1f} ms "
                         f"({100 * rest / step_ms:.0f}%) are layers without weights, the loss, "
                         "the optimizer update and dispatch, which half precision does not "
                         "speed up.")
        lines.append(" ".join(parts))
    return lines
