"""The catalog's picture: one panel per policy, layers by magnitude, coloured by error."""

# How to read it (docs/catalog.md shows one): each row a layer configuration,
# each column an input magnitude (max |input|, log scale). Colour is the worse
# of the forward and gradient error in units of the tolerance: blue within it
# (safe), white at it, red beyond; black cells overflow (inf/NaN); grey cells
# are points where float32 itself is not finite (no verdict); a hatched row
# does not run under that policy. The safe range is outlined.

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # results imports this module to draw
    from tf_mixed.tools.catalog.results import Catalog, Row

__all__ = ["render"]

_SPAN = 3.0  # colours cover tolerance / 10**3 .. tolerance * 10**3


def _cell(row: "Row", i: int, limit: float) -> float:
    """log10(error / tolerance), clipped; nan for a cell drawn apart."""
    forward, gradient = row.forward[i], row.gradient[i]
    if forward is None or row.status[i] in ("overflow", "float32_nonfinite", ""):
        return math.nan
    worst = forward if gradient is None or math.isnan(gradient) else max(forward, gradient)
    if not math.isfinite(worst):
        return _SPAN
    return max(-_SPAN, min(_SPAN, math.log10(max(worst, 1e-30) / limit)))


def render(catalog: "Catalog", path: str | None = None) -> bytes:
    """Draws `catalog` and returns the PNG bytes (also written to ``path``).

    Raises:
        ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    policies = catalog.policies
    keys = list(dict.fromkeys(row.key for row in catalog.rows))
    by_key = {(row.key, row.policy): row for row in catalog.rows}
    grid = [math.log10(m) for m in catalog.magnitudes]
    step = (grid[-1] - grid[0]) / max(1, len(grid) - 1)
    height = max(3.0, 0.14 * len(keys) + 1.6)
    fig, axes = plt.subplots(1, len(policies), figsize=(5.2 * len(policies) + 2.6, height),
                             sharey=True, squeeze=False, layout="constrained")
    image = None
    extent = (grid[0] - step / 2, grid[-1] + step / 2, len(keys) - 0.5, -0.5)
    for ax, policy in zip(axes[0], policies):
        limit = catalog.tolerance[policy]
        values = np.full((len(keys), len(grid)), np.nan)
        special = np.zeros((len(keys), len(grid)))  # 1 overflow, 2 float32 not finite, 3 no run
        for r, key in enumerate(keys):
            row = by_key.get((key, policy))
            if row is None or row.failure:
                special[r, :] = 3
                continue
            for i in range(len(grid)):
                values[r, i] = _cell(row, i, limit)
                special[r, i] = {"overflow": 1, "float32_nonfinite": 2}.get(row.status[i], 0)
        image = ax.imshow(values, aspect="auto", cmap="RdBu_r", vmin=-_SPAN, vmax=_SPAN,
                          extent=extent, interpolation="nearest")
        masked = np.ma.masked_where(special == 0, special)
        ax.imshow(masked, aspect="auto", extent=extent, interpolation="nearest",
                  cmap=ListedColormap(["black", "#b0b0b0", "#e8e0c8"]), vmin=1, vmax=3)
        for r, key in enumerate(keys):
            row = by_key.get((key, policy))
            if row is not None and row.safe.low is not None and row.safe.high is not None:
                lo, hi = math.log10(row.safe.low), math.log10(row.safe.high)
                ax.plot([lo - step / 2, hi + step / 2], [r + 0.45, r + 0.45], color="#1a7f37",
                        linewidth=1.2)
        ax.set_title(f"{policy} (tolerance {limit:.3g})", fontsize=10)
        ax.set_xlabel("log10 max |input|")
        ax.set_xticks(range(math.ceil(grid[0]), math.floor(grid[-1]) + 1, 2))
    axes[0][0].set_yticks(range(len(keys)))
    axes[0][0].set_yticklabels(keys, fontsize=6)
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes[0]), fraction=0.03, pad=0.01, shrink=0.3)
        bar.set_label("log10(error / tolerance): blue safe, red not; "
                      "black overflow, grey float32 not finite", fontsize=7)
    fig.suptitle("tf_mixed numerics catalog: error against float32 by input magnitude "
                 "(green line: the safe range)", fontsize=11)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    data = buffer.getvalue()
    if path is not None:
        with open(path, "wb") as handle:
            handle.write(data)
    return data
