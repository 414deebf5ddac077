"""bench.png: throughput with its rounds, speed-up against the host's matmul, accuracy,
memory and loss scale per policy (the compare suite); the overhead and GPU suites' bars.

matplotlib is optional (the ``plot`` extra): without it `plot` prints one
line saying so and returns False.
"""

from __future__ import annotations

import math
from typing import Any


def plot(report: dict[str, Any], path: str) -> bool:
    """Draws the report's figures into ``path``.

    Args:
        report: A bench report (see `tf_mixed.bench.report`).
        path: Where to write the PNG.

    Returns:
        Whether the file was written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("bench.png skipped: matplotlib is not installed (pip install 'tf-mixed[plot]').")
        return False

    results = report["results"]
    if report["suite"] == "overhead":
        return _plot_overhead(plt, report, path)
    if report["suite"] == "gpu":
        return _plot_gpu(plt, report, path)
    scaled = [r for r in results if r.get("loss_scale")]
    fig, axes = plt.subplots(2, 3 if scaled else 2, figsize=(15 if scaled else 11, 8.5))
    axes = axes.ravel()
    colors = {r["policy"]: f"C{i}" for i, r in enumerate(results)}
    names = tick_labels(results)
    x = range(len(results))

    # 1. Throughput: the median of the rounds, every round as a dot, min-max as a bar.
    ax = axes[0]
    medians = [r["samples_per_sec"] for r in results]
    ax.bar(x, medians, color=[colors[r["policy"]] for r in results], alpha=0.6)
    for i, r in enumerate(results):
        rounds = [p["samples_per_sec"] for p in r.get("rounds") or []]
        ax.plot([i] * len(rounds), rounds, "k.", markersize=4, alpha=0.6)
        spread = r.get("samples_per_sec_spread")
        if spread:
            ax.errorbar(i, r["samples_per_sec"], yerr=[[r["samples_per_sec"] - spread["min"]],
                                                       [spread["max"] - r["samples_per_sec"]]],
                        color="k", capsize=6)
        ax.annotate(f"{r['samples_per_sec']:,.0f}", (i, r["samples_per_sec"]), xytext=(8, 0),
                    textcoords="offset points", fontsize=9, va="center")
    ax.set_xticks(list(x), names, fontsize=9)
    ax.set_ylabel("samples/s (median of rounds; dots: rounds)")
    ax.set_title("Throughput, every round")

    # 2. Ratio to float32 per round pair, with the host's matmul ratio as the reference.
    ax = axes[1]
    others = [r for r in results if r.get("ratio_to_float32") and r["policy"] != "float32"]
    for i, r in enumerate(others):
        pairs = r["ratio_to_float32"]["round_pairs"]
        ax.plot([i] * len(pairs), pairs, ".", color=colors[r["policy"]], alpha=0.6)
        interval = r["ratio_to_float32"].get("interval")
        if interval:  # the median's interval, drawn whether or not it answers
            ax.plot([i + 0.12] * 2, interval, "-", color=colors[r["policy"]], linewidth=1.5)
        if not r["ratio_to_float32"].get("trusted", True):  # the pairs, but no ratio
            ax.annotate("no ratio:\ninterval\nholds 1", (i + 0.1, max(pairs)), fontsize=9,
                        va="top", color="red")
            continue
        ax.plot([i - 0.25, i + 0.25], [r["ratio_to_float32"]["samples_per_sec"]] * 2, "-",
                color=colors[r["policy"]], linewidth=3)
        ax.annotate(f"{r['ratio_to_float32']['samples_per_sec']:.2f}x",
                    (i + 0.27, r["ratio_to_float32"]["samples_per_sec"]), fontsize=9, va="center")
    ax.axhline(1.0, color="gray", linewidth=1)
    matmul = report.get("matmul")
    if matmul:
        ax.axhline(matmul["ratio"], color="k", linestyle="--", linewidth=1.2,
                   label=f"host matmul {matmul['size']}^3 {matmul['dtype']}: "
                         f"{matmul['ratio']:.2f}x")
        ax.legend(fontsize=9, loc="lower right")
    ax.set_xticks(range(len(others)), tick_labels(others), fontsize=9)
    ax.set_xlim(-0.6, max(len(others), 1) - 0.4)
    ax.set_ylabel("speed / float32 (dots: round pairs; bar: 90% interval)")
    ax.set_title("Speed-up, round pairs and the host's reference")

    # 3. Validation accuracy per epoch.
    ax = axes[2]
    for r in results:
        values = [math.nan if v is None else 100 * v for v in r["history"]["val_accuracy"]]
        compared = r.get("accuracy_compared", True)
        label = r["policy"] + ("" if compared else " (timed only: not compared)")
        ax.plot(range(1, len(values) + 1), values, "-o" if compared else ":x",
                color=colors[r["policy"]], label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy %")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title("Accuracy per epoch")
    ax.legend(fontsize=9)

    # 4. Memory: activations (estimate), weights + state (exact), process peak.
    ax = axes[3]
    kinds = (("activations", "activations (audit estimate)"),
             ("state", "weights+grads+optimizer (exact)"),
             ("peak", "gpu peak (measured)" if (results[0].get("activation_bytes") or {}).get(
                 "gpu_peak_bytes") is not None else "process peak RSS"))
    width = 0.8 / len(kinds)
    for k, (kind, label) in enumerate(kinds):
        values = [_memory_mb(r, kind) for r in results]
        bars = ax.bar([i + (k - 1) * width for i in x], values, width, label=label,
                      color=f"C{k + 3}")
        for bar, value in zip(bars, values):
            ax.annotate(f"{value:,.1f}", (bar.get_x() + bar.get_width() / 2, value),
                        ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    tallest = max([_memory_mb(r, k) for r in results for k, _ in kinds] + [1.0])
    ax.set_ylim(top=tallest * 30)  # room for the legend above the bars
    ax.set_xticks(list(x), names, fontsize=9)
    ax.set_ylabel("MB (log scale)")
    ax.set_title("Memory")
    ax.legend(fontsize=8, loc="upper center", ncol=2)

    if scaled:
        ax = axes[4]
        for r in scaled:
            trajectory = r["loss_scale"]["trajectory"] + [
                [r["total_steps"], r["loss_scale"]["final"]]]
            steps, scales = zip(*trajectory)
            ax.step(steps, scales, where="post", color=colors[r["policy"]], label=r["policy"])
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step")
        ax.set_title("Loss scale")
        ax.legend(fontsize=9)
        axes[5].axis("off")

    host = report.get("host") or {}
    device = ", ".join(g["name"] for g in host.get("gpus") or []) or host.get("cpu_model", "")
    fig.suptitle("\n".join([
        f"tf_mixed bench: {report['model']['name']} on {report['dataset']['name']}"
        + (f" ({device})" if device else ""), *headline(results)]), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def headline(results: list[dict[str, Any]]) -> list[str]:
    """The verdict of each mixed policy, as the notes say it (``verdict``, set by
    `tf_mixed.bench.report.add_ratios`)."""
    return [f"{r['policy']}: {r['verdict']}" for r in results
            if r["policy"] != "float32" and r.get("verdict")]


def tick_labels(results: list[dict[str, Any]]) -> list[str]:
    """Policy names, a cut run's (``cut``, set by `report.add_ratios`) marked as in the table,
    a plan equal to a whole-model policy (``same_as``) followed by that policy."""
    return [r["policy"] + (f"\n(= {r['same_as']})" if r.get("same_as") else "")
            + ("\n(cut)" if r.get("cut") else "") for r in results]


def _memory_mb(result: dict[str, Any], kind: str) -> float:
    memory = result.get("activation_bytes") or {}
    if kind == "activations":
        return (memory.get("activations") or 0) / 2**20
    if kind == "state":
        return sum(memory.get(k) or 0 for k in ("weights", "gradients", "optimizer_state")) / 2**20
    return float(result.get("peak_memory_mb") or 0.0)


def _plot_gpu(plt, report: dict[str, Any], path: str) -> bool:
    rows = [r for r in report["results"] if r.get("samples_per_sec")]
    fig, ax = plt.subplots(figsize=(8, 5))
    names = [r["name"] for r in rows]
    bars = ax.bar(names, [r["samples_per_sec"] for r in rows],
                  color=[f"C{i}" for i in range(len(rows))])
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['samples_per_sec']:,.0f}\n{r.get('ratio', 1.0):.2f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("samples/s (median step)")
    ax.set_title(f"{report['model']['name']} on {report.get('device', 'GPU')}")
    ax.margins(y=0.2)
    plt.setp(ax.get_xticklabels(), rotation=15, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _plot_overhead(plt, report: dict[str, Any], path: str) -> bool:
    fig, ax = plt.subplots(figsize=(5, 4))
    rows = report["results"]
    names = [r["path"] for r in rows]
    ax.bar(names, [r["step_time_ms"] for r in rows], color=["C0", "C1", "C7"][: len(rows)])
    ax.set_ylabel("median step time (ms)")
    low, high = report.get("overhead_interval") or (None, None)
    interval = "" if low is None else f" ({low:.3f}-{high:.3f})"
    ax.set_title(f"tf_mixed / Keras = {report['overhead_ratio']:.3f}x{interval}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
