"""bench.png: throughput bars, loss curves and loss scale per policy.

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
    scaled = [r for r in results if r.get("loss_scale")]
    columns = 3 if scaled else 2
    fig, axes = plt.subplots(1, columns, figsize=(5 * columns, 4))
    colors = {r["policy"]: f"C{i}" for i, r in enumerate(results)}

    ax = axes[0]
    names = [r["policy"] for r in results]
    bars = ax.bar(names, [r["samples_per_sec"] for r in results], color=[colors[n] for n in names])
    for bar, r in zip(bars, results):
        ratio = r.get("ratio_to_float32")
        label = f"{r['samples_per_sec']:,.0f}" + (f"\n{ratio['samples_per_sec']:.2f}x" if ratio else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("samples/s (median step)")
    ax.set_title("Throughput")
    ax.margins(y=0.2)

    ax = axes[1]
    for r in results:
        epochs = range(1, len(r["history"]["train_loss"]) + 1)
        for key, style, what in (("train_loss", "-o", "train"), ("val_loss", "--s", "val")):
            values = [math.nan if v is None else v for v in r["history"][key]]  # None: diverged
            ax.plot(epochs, values, style, color=colors[r["policy"]], label=f"{r['policy']} {what}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    losses = [v for r in results for k in ("train_loss", "val_loss") for v in r["history"][k] if v]
    if losses and min(losses) > 0 and max(losses) / min(losses) > 20:
        ax.set_yscale("log")
    ax.set_title("Loss")
    ax.legend(fontsize=7)

    if scaled:
        ax = axes[2]
        for r in scaled:
            trajectory = r["loss_scale"]["trajectory"] + [[r["total_steps"], r["loss_scale"]["final"]]]
            steps, scales = zip(*trajectory)
            ax.step(steps, scales, where="post", color=colors[r["policy"]], label=r["policy"])
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step")
        ax.set_title("Loss scale")
        ax.legend(fontsize=7)

    fig.suptitle(f"{report['model']['name']} on {report['dataset']['name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _plot_overhead(plt, report: dict[str, Any], path: str) -> bool:
    fig, ax = plt.subplots(figsize=(5, 4))
    rows = report["results"]
    names = [r["path"] for r in rows]
    ax.bar(names, [r["step_time_ms"] for r in rows], color=["C0", "C1"][: len(rows)])
    ax.set_ylabel("median step time (ms)")
    ax.set_title(f"tf_mixed / Keras = {report['overhead_ratio']:.3f}x")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
