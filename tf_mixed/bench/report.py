"""The bench's outputs: ratios to float32, the Markdown table, the result files."""

# results.json holds, at the top level: ``suite``, ``created_utc``, ``command``,
# ``flags`` (the `BenchConfig`), ``host`` (hostname, CPU, GPUs, TF/Keras/NumPy
# versions), ``policies``, ``policy_note``, ``model``, ``dataset`` and
# ``results``: one dict per policy as `tf_mixed.bench.run.run_policy` returns it
# (its ``census``: ``half_flop_share``, ``casts_per_step``, ...; ``rounds``: every
# timing round's samples/s, ``samples_per_sec`` their median and
# ``samples_per_sec_spread`` their quartiles; ``activation_bytes``: weights,
# state and activations apart from the process peak; ``plan``: full or timed
# only, and why), plus ``ratio_to_float32`` (the throughput ratio as the median
# of the per-round-pair ratios with its spread, step time, activation and
# peak-memory ratios, accuracy difference in points, None when the accuracy was
# not compared; absent when float32 was not run). The compare suite also has
# ``matmul_ratio`` (the host's large-matmul half/float32 speed ratio, measured
# in the same run; details under ``matmul``), ``load_average``,
# ``wall_time_s`` and ``notes`` (the sentences printed under the table). A mixed run's
# ``serving`` holds the sizes and parity of its trained model's LiteRT files
# (`tf_mixed.bench.serving`; None for float32 runs and multi-worker runs).
#
# `write_outputs` writes every file into a temporary directory inside the
# output directory and moves them into place only when all are written, so a
# failed run leaves no file behind that looks complete.

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import socket
import tempfile
from typing import Any

from tf_mixed._internal import measuring
from tf_mixed.bench import plan_row, serving

RESULT_FILES = ("results.json", "results.md", "bench.png")


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Adds ``ratio_to_float32`` to each result, in place, when float32 ran.

    The throughput ratio is the median of the per-round-pair ratios (round i
    over float32's round i) where both have rounds, else the ratio of the
    medians; ``interval`` its seeded bootstrap interval (``confidence``,
    `tf_mixed._internal.measuring.estimate`), ``trusted`` whether that
    interval answers "faster here, and by about how much"
    (`measuring.Estimate.answers`), ``widened_by`` what made the interval
    wide (`widening`), ``samples_per_sec_spread`` the pairs' spread. Each
    result also gets ``cut`` (`is_cut`) and ``verdict`` (`verdict`), which
    the notes, the printed table and bench.png all show.
    """
    base = next((r for r in results if r["policy"] == "float32"), None)
    for result in results:
        if base is None:
            result["ratio_to_float32"] = None
            continue
        pairs = measuring.pair_ratios(
            [r["samples_per_sec"] for r in base.get("rounds") or []],
            [r["samples_per_sec"] for r in result.get("rounds") or []])
        pairs = pairs or [result["samples_per_sec"] / base["samples_per_sec"]]
        pair_spread = measuring.spread(pairs)
        estimate = measuring.estimate(pairs)
        accuracies = (result["final_val_accuracy"], base["final_val_accuracy"])
        ours, theirs = ((result.get("activation_bytes") or {}).get("activations"),
                        (base.get("activation_bytes") or {}).get("activations"))
        loads = [v for v in (base.get("round_loads") or []) + (result.get("round_loads") or [])
                 if v is not None]
        result["ratio_to_float32"] = {
            "samples_per_sec": estimate.median,
            "interval": [estimate.low, estimate.high],
            "confidence": estimate.confidence,
            "samples_per_sec_spread": pair_spread,
            # Whether the interval answers "faster here, and by about how much";
            # where it does not, the table, the notes and bench.png print no ratio.
            "trusted": estimate.answers(),
            "widened_by": widening(pairs, loads),
            "round_pairs": pairs,
            "step_time": 1.0 / pair_spread["median"],
            "peak_memory": result["peak_memory_mb"] / base["peak_memory_mb"],
            "activations": ours / theirs if ours and theirs else None,
            "val_accuracy_diff_points": None if None in accuracies
            else 100.0 * (accuracies[0] - accuracies[1]),
        }
    for result in results:  # what bench.png says of each policy, as the notes do
        result["cut"] = is_cut(result)
        result["verdict"] = verdict(result)


def widening(pairs: list[float], loads: list[float]) -> str:
    """What widened a ratio's interval, in words ("" when nothing stands out).

    Args:
        pairs: The round-pair ratios.
        loads: The load averages read at the end of the rounds of both sides.

    Returns:
        Fewer pairs than a verdict needs, pairs far from the rest (beyond 1.5
        interquartile ranges of the quartiles and more than `measuring.NARROW`
        from the median) and the load's range during the rounds (when it moved
        by 1 or more), joined by "; ".
    """
    parts = []
    if len(pairs) < measuring.MIN_PAIRS:
        parts.append(f"only {len(pairs)} round pair(s), fewer than {measuring.MIN_PAIRS}")
    elif len(pairs) >= 4:
        q1, median, q3 = measuring.quartiles(pairs)
        fence = 1.5 * (q3 - q1)
        far = sorted(p for p in pairs if (p < q1 - fence or p > q3 + fence)
                     and abs(p / median - 1.0) > measuring.NARROW)
        if far:
            parts.append(f"{len(far)} of {len(pairs)} pairs far from the rest ("
                         + ", ".join(f"{p:.2f}x" for p in far) + ")")
    if loads and max(loads) - min(loads) >= 1.0:
        parts.append(f"the load average moved {min(loads):.1f}-{max(loads):.1f} during the rounds")
    return "; ".join(parts)


def interval_text(ratios: dict[str, Any]) -> str:
    """``90% interval 1.85-2.10x`` (a result without one: its round pairs' min-max)."""
    pairs = ratios.get("round_pairs") or [ratios["samples_per_sec"]]
    low, high = ratios.get("interval") or (min(pairs), max(pairs))
    confidence = ratios.get("confidence", measuring.CONFIDENCE)
    return f"{100 * confidence:.0f}% interval {low:.2f}-{high:.2f}x"


def _ratio(result: dict, key: str, digits: int = 2) -> str:
    ratios = result.get("ratio_to_float32")
    if ratios and untrusted(result):
        return "no ratio"
    return "n/a" if not ratios else f"{ratios[key]:.{digits}f}x"


def untrusted(result: dict[str, Any]) -> bool:
    """Whether a policy's ratio to float32 is no verdict: its interval does not
    answer "faster here, and by about how much" (too few round pairs, or it
    holds 1 and is wide); float32's own row, and a run without float32, never are."""
    ratios = result.get("ratio_to_float32") or {}
    return result["policy"] != "float32" and not ratios.get("trusted", True)


def is_cut(result: dict[str, Any]) -> bool:
    """Whether the time budget stopped a policy before its full run (timed only)."""
    plan = result.get("plan") or {}
    return plan.get("full") is False or result.get("accuracy_compared") is False


def cut_label(result: dict[str, Any]) -> str:
    """Where a cut run stopped, e.g. ``cut at step 65/500``."""
    steps, total = result.get("steps_run"), result.get("total_steps")
    return "cut" if steps is None else f"cut at step {steps}/{total}"


def verdict(result: dict[str, Any]) -> str:
    """One policy's headline: ``2.00x float32``, ``no ratio (...)`` or ``the baseline``.

    Shared by the notes and bench.png, so the picture says what the table says.
    """
    ratios = result.get("ratio_to_float32")
    if result["policy"] == "float32":
        label = "the baseline"
    elif not ratios:
        label = "no float32 run to compare with"
    elif untrusted(result):
        pairs = len(ratios.get("round_pairs") or [ratios["samples_per_sec"]])
        label = (f"no ratio (only {pairs} round pair(s); re-run with more rounds)"
                 if pairs < measuring.MIN_PAIRS else
                 f"no ratio ({interval_text(ratios)} holds 1: not known to be faster or slower "
                 "here; re-run when idle)")
    else:
        label = (f"{ratios['samples_per_sec']:.2f}x float32 ({interval_text(ratios)}"
                 f"{_direction(ratios)})")
    return label + (f"; {cut_label(result)}, timed only" if is_cut(result) else "")


def _direction(ratios: dict[str, Any]) -> str:
    """``: no faster here`` for an interval that holds 1 (narrow), else ""."""
    low, high = ratios.get("interval") or (0.0, 0.0)
    return ": about the same speed here" if low <= 1.0 <= high else ""


def _num(value: float | None, spec: str) -> str:
    return "nan" if value is None else format(value, spec)


def _range(summary: dict | None, spec: str, suffix: str = "") -> str:
    if not summary:
        return "n/a"
    return f"{summary['min']:{spec}}{suffix}-{summary['max']:{spec}}{suffix}"


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.1f}"


def _memory_cells(result: dict[str, Any]) -> str:
    """Activations (estimate), its ratio, weights + gradients + optimizer state (exact)."""
    memory = result.get("activation_bytes") or {}
    ratio = (result.get("ratio_to_float32") or {}).get("activations")
    state = sum(memory.get(k) or 0 for k in ("weights", "gradients", "optimizer_state"))
    return (f"{_mb(memory.get('activations'))} | {'n/a' if ratio is None else f'{ratio:.2f}x'} "
            f"| {_mb(state) if memory else 'n/a'}")

def _census_cells(result: dict[str, Any]) -> str:
    """The half-FLOP share and casts per step (`tf_mixed.census`), or n/a."""
    census = result.get("census") or {}
    share = census.get("half_flop_share")
    casts = census.get("casts_per_step")
    return (f"{'n/a' if share is None else f'{100 * share:.0f}%'} "
            f"| {'n/a' if casts is None else casts}")


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per policy: median figures with their spread, memory, accuracy.

    samples/s is the median over the policy's rounds, with the rounds'
    min-max; "vs float32" the median of the per-round-pair ratios, with its
    bootstrap interval, or "no ratio" (and the interval) where the interval
    does not answer "faster here, and by about how much" (`untrusted`). A
    policy the time budget cut is marked "(cut)", its losses replaced by the
    step it stopped at (they are not comparable with float32's full run).
    Activations MB is `tf_mixed.audit`'s estimate, state MB the exact weights
    + gradients + optimizer state, peak MB the process's.
    """
    header = (
        "| policy | samples/s | rounds min-max | vs float32 | 90% interval | half FLOPs "
        "| casts/step | step ms | activations MB | vs float32 | state MB | peak MB "
        "| train loss | val loss | val acc % | acc diff (pts) | skipped | final loss scale |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in results:
        ratios = r.get("ratio_to_float32")
        diff = ratios.get("val_accuracy_diff_points") if ratios else None
        diff_cell = "n/a" if diff is None else f"{diff:+.2f}"
        accuracy = ("not compared" if r["final_val_accuracy"] is None
                    else f"{100 * r['final_val_accuracy']:.2f}")
        scale = r["loss_scale"]["final"] if r.get("loss_scale") else None
        emulated = (r.get("float8") or {}).get("speed") == "emulated"
        pair_cell = "n/a"
        if ratios and r["policy"] != "float32":
            count = len(ratios.get("round_pairs") or [ratios["samples_per_sec"]])
            pair_cell = (f"{count} pair(s)" if count < measuring.MIN_PAIRS
                         else interval_text(ratios).split(" ", 2)[2])
        cut = is_cut(r)
        speed = (f"emulated | emulated | emulated | emulated | {_census_cells(r)} | emulated"
                 if emulated else
                 f"{r['samples_per_sec']:,.1f} | {_range(r.get('samples_per_sec_spread'), ',.0f')} "
                 f"| {_ratio(r, 'samples_per_sec')} | {pair_cell} "
                 f"| {_census_cells(r)} | {r['step_time_ms']:.1f}")
        # A cut run's losses are from fewer steps than float32's: not shown
        # beside them as if comparable (results.json keeps them).
        losses = (f"{cut_label(r)} | {cut_label(r)}" if cut else
                  f"{_num(r['final_train_loss'], '.4f')} | {_num(r['final_val_loss'], '.4f')}")
        lines.append(
            f"| {plan_row.label(r)}{' (cut)' if cut else ''} | {speed} | {_memory_cells(r)} "
            f"| {r['peak_memory_mb']:,.0f} "
            f"| {losses} "
            f"| {accuracy} | {diff_cell} | {r['skipped_steps']} "
            f"| {'-' if scale is None else f'{scale:g}'} |"
        )
    return "\n".join(lines)


def caption(report: dict[str, Any]) -> str:
    """The line above the table: the model, its data and the host's matmul reference."""
    model = report["model"]
    matmul = report.get("matmul")
    reference = ("" if not matmul else
                 f"; host matmul {matmul['size']}^3 {matmul['dtype']}/float32 "
                 f"{matmul['ratio']:.2f}x (measured in this run)")
    return (f"Model {model['name']} ({model['params'] / 1e6:.2f} M parameters) on "
            f"{report['dataset']['name']}{reference}.")


def notes(report: dict[str, Any]) -> list[str]:
    """The sentences under the table: trust in each ratio, what the plan cut, memory, matmul.

    Args:
        report: The compare report (``results`` with ratios, ``matmul``,
            ``load_average``, ``host``).

    Returns:
        One sentence per line.
    """
    lines = []
    load = report.get("load_average") or [0.0]
    cores = (report.get("host") or {}).get("cpu_count") or 1
    for r in report["results"]:
        ratios = r.get("ratio_to_float32")
        if r["policy"] == "float32" or not ratios or r.get("same_as"):
            continue  # a plan equal to a policy: that policy's notes are its own
        pairs = ratios["samples_per_sec_spread"]
        loads = [v for v in (r.get("round_loads") or []) if v is not None]
        load_text = (f"the load average was {min(loads):.1f}-{max(loads):.1f} during its rounds"
                     if loads else f"the load average was {load[0]:.1f} at the end")
        widened = ratios.get("widened_by") or ""
        busy = max(loads or load) > cores
        if not untrusted(r):
            lines.append(
                f"{plan_row.label(r)} / float32 = {verdict(r).split('; ')[0]}: the median of "
                f"{pairs['n']} round pairs (min-max {pairs['min']:.2f}x-{pairs['max']:.2f}x); "
                f"{load_text} on {cores} cores"
                + (f"; what widened the interval: {widened}" if widened else "")
                + ("; taken on a busy host (load above its cores): the interval answers for "
                   "that load, and an idle host's ratio can differ (re-run idle for it)"
                   if busy else "") + ".")
        else:
            why = (f"only {pairs['n']} round pair(s), fewer than {measuring.MIN_PAIRS}"
                   if pairs["n"] < measuring.MIN_PAIRS else
                   f"its {interval_text(ratios)} over {pairs['n']} round pairs (median "
                   f"{pairs['median']:.2f}x) holds 1, so it is not known to be faster or "
                   "slower here")
            extra = (r.get("plan") or {}).get("extra_rounds")
            lines.append(
                f"{plan_row.label(r)} / float32: NO RATIO: {why}"
                + (f" after {extra} extra round(s)" if extra else "")
                + f"; {load_text} on {cores} cores"
                + (f"; what widened the interval: {widened}" if widened else "")
                + ". Re-run when the host is idle (or with more and shorter rounds, e.g. "
                "--round_steps=10 --epochs=8 --time_budget=0).")
        plan = r.get("plan") or {}
        if plan and not plan.get("full", True):
            lines.append(f"Cut to keep the time budget: {plan['reason']}.")
        if is_cut(r):
            lines.append(f"{plan_row.label(r)}: {cut_label(r)}, so its losses are not compared "
                         "with float32's (results.json keeps them).")
    lines.extend(plan_row.notes(report))
    lines.extend(f"{r['policy']} (trains in {r['compute_dtype']}; its first steps, the "
                 f"check's rounds, are in its figures): {r['model_check']['message']}"
                 for r in report["results"] if r.get("model_check"))
    matmul = report.get("matmul")
    if matmul:
        for r in report["results"]:
            ratio = (r.get("ratio_to_float32") or {}).get("samples_per_sec")
            if (r["policy"] != "float32" and ratio and matmul["ratio"] > 0 and not untrusted(r)
                    and not r.get("same_as")):  # a plan equal to a policy: said once
                lines.append(
                    f"Reference: a {matmul['size']}x{matmul['size']} matmul runs "
                    f"{matmul['ratio']:.2f}x faster in {matmul['dtype']} than in float32 on this "
                    f"host; {plan_row.label(r)} gets {ratio:.2f}x on this model "
                    f"({100 * ratio / matmul['ratio']:.0f}% of it).")
    first = report["results"][0].get("activation_bytes") or {}
    if first:
        gpu = first.get("gpu_peak_bytes") is not None
        lines.append(
            "Memory: activations MB is tf_mixed.audit's estimate of one batch's layer outputs "
            "(what mixed precision halves); state MB is exact (weights, gradients and optimizer "
            "state, tf_mixed.tools.memory_report); peak MB is "
            + ("the GPU allocator's measured peak." if gpu else
               "the whole process's peak resident memory, mostly TensorFlow's runtime, so it "
               "hardly moves with the policy."))
    return lines


def results_markdown(report: dict[str, Any]) -> str:
    """The whole results.md: what was run, the note on policies, the table."""
    flags = report["flags"]
    first = report["results"][0]
    memory = {
        "process_peak_rss": "peak resident memory of the training process (VmHWM)",
        "gpu_peak_allocated": "peak GPU memory allocated by TensorFlow",
    }[first["memory_kind"]]
    host = report["host"]
    device = ", ".join(g["name"] for g in host["gpus"]) or (
        f"CPU ({host['cpu_model']}, {host['cpu_count']} cores)")
    return "\n".join([
        f"# tf_mixed bench: {report['model']['name']} on {report['dataset']['name']}",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Host: {device}; TensorFlow {host['tensorflow']}, Keras {host['keras']}, "
        f"tf_mixed {host['tf_mixed']}.",
        f"Loop `{flags['loop']}`, strategy `{flags['strategy']}` ({first['replicas']} replica(s)), "
        f"global batch {first['global_batch_size']}, {first['epochs']} epoch(s) x "
        f"{first['steps_per_epoch']} steps, {first['warmup_steps']} warm-up steps excluded, "
        f"{first['timed_steps']} timed; samples/s is the batch size over the median step time.",
        f"Peak MB: {memory}.",
        "Half FLOPs: share of the step's matmul/conv FLOPs computed in float16/bfloat16; "
        "casts/step: float casts in one step (both from `tf_mixed.census` of the trained "
        "model's fit step; `python -m tf_mixed doctor` explains them).",
        "",
        report["policy_note"],
        "",
        caption(report),
        "",
        markdown_table(report["results"]),
        "",
        serving.markdown_table(report["results"]),
        "",
        *_float8_notes(report["results"]),
        *report.get("notes", []),
        "",
    ])


def _float8_notes(results: list[dict[str, Any]]) -> list[str]:
    """What the float8 run quantized, and why its speed is or is not a figure."""
    lines = []
    for r in results:
        plan = r.get("float8")
        if not plan:
            continue
        chosen = [c["layer"] for c in plan["choices"] if c["float8"]]
        lines.append(
            f"{r['policy']}: {len(chosen)} of {len(plan['choices'])} Dense layers in float8 "
            f"({', '.join(chosen) or 'none'}), margin {plan['scaling']['margin']}, "
            f"amax {plan['scaling']['amax_compute_algo']} "
            f"over {plan['amax_history_length']} steps, "
            f"on {r['compute_dtype']} compute.")
        if plan["speed"] == "emulated":
            lines.append(
                "Its speed is not reported: without a GPU float8 is quantize-dequantize "
                "emulation (no float8 GEMM runs), so only its accuracy is a result.")
        lines.append("")
    return lines


def print_written(markdown: str, paths: list[str]) -> None:
    """Prints a suite's table and the files it wrote."""
    print()
    print(markdown)
    print("Wrote " + ", ".join(paths))


def _finite_check(report: dict[str, Any]) -> None:
    """Refuses to write figures that are not real measurements."""
    keys = ("samples_per_sec", "step_time_ms", "peak_memory_mb")
    for r in report["results"]:
        for key in (k for k in keys if k in r):
            value = r[key]
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise RuntimeError(f"{r.get('policy', r.get('path'))}: {key}={value!r} "
                                   "is not a finite number")


def _try_plot(plot, report, path) -> bool:
    """A broken matplotlib set-up costs the picture, not the measurements."""
    try:
        return plot(report, path)
    except Exception as error:  # noqa: BLE001 - any plotting failure
        print(f"bench.png skipped: plotting failed ({type(error).__name__}: {error}).")
        return False


def write_outputs(report: dict[str, Any], output_dir: str, *, plot: bool = True) -> list[str]:
    """Writes results.json, results.md and (with matplotlib) bench.png atomically.

    Args:
        report: The full report dict.
        output_dir: An existing, writable directory.
        plot: Whether to try to draw bench.png.

    Returns:
        The paths written.
    """
    from tf_mixed.bench import plot as plot_module

    _finite_check(report)
    staging = tempfile.mkdtemp(prefix=".tf_mixed_bench.", dir=output_dir)
    try:
        names = []
        with open(os.path.join(staging, "results.md"), "w") as f:
            f.write(results_markdown(report) if report["suite"] == "compare"
                    else report["markdown"])
        names.append("results.md")
        if plot and _try_plot(plot_module.plot, report, os.path.join(staging, "bench.png")):
            names.append("bench.png")
        with open(os.path.join(staging, "results.json"), "w") as f:
            json.dump(report, f, indent=2, allow_nan=False)
            f.write("\n")
        names.append("results.json")
        # results.json last: its presence marks a complete set. A stale
        # bench.png from an earlier run would not match, so it goes.
        if "bench.png" not in names and os.path.exists(os.path.join(output_dir, "bench.png")):
            os.remove(os.path.join(output_dir, "bench.png"))
        for name in names:
            os.replace(os.path.join(staging, name), os.path.join(output_dir, name))
        return [os.path.join(output_dir, n) for n in names]
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def suite_header(suite: str, config, command: str) -> dict[str, Any]:
    """The fields every suite's results.json starts with.

    ``suite``, ``created_utc``, ``command``, ``flags`` (the `BenchConfig`),
    ``host`` and ``load_average`` (1, 5 and 15 minutes, at the end of the run).
    """
    import datetime

    return {
        "suite": suite,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"),
        "command": command,
        "flags": config.to_json(),
        "host": host_info(),
        "load_average": measuring.load_averages(),
    }


def host_info() -> dict[str, Any]:
    """Host, TF and Keras versions for results.json."""
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_mixed
    from tf_mixed.policy import hardware

    info = hardware.detect()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": info.cpu_model,
        "cpu_count": os.cpu_count(),
        "amx_bf16_usable": info.amx_bf16_usable,
        "gpus": [
            {"name": g.name, "compute_capability": list(g.compute_capability or ())}
            for g in info.gpus
        ],
        "tpu": info.tpu,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "tf_mixed": tf_mixed.__version__,
    }
