"""The value `tf_mixed.probe` returns: per-layer and per-variable numerics, and advice."""

# `ProbeReport` is frozen plain data: ``str(report)`` is the table a user
# reads, ``report.to_dict()`` the same for JSON, ``report.plot(path)`` a PNG
# of each layer's headroom on a log2 axis (matplotlib is imported only there).
# The dtype limits used everywhere come from one table, `DTYPE_LIMITS`.

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any

from tf_mixed._internal.facts import COMPUTE_DTYPES, dtype_limits

__all__ = ["DTYPE_LIMITS", "LayerStats", "ProbeReport", "VariableStats"]

# dtype -> (largest finite, smallest normal, smallest subnormal), from ml_dtypes.
DTYPE_LIMITS = {
    name: dtype_limits(name)[:3] for name in ("float16", "bfloat16", "float32")
}


def log2_or_none(value: float) -> float | None:
    """log2 of a positive finite value; None for 0, inf or NaN."""
    if not (value > 0 and math.isfinite(value)):
        return None
    return math.log2(value)


@dataclasses.dataclass(frozen=True)
class LayerStats:
    """Forward (and output-gradient) numerics of one layer.

    Attributes:
      name: layer name, as `tf_mixed.audit` names it.
      class_name: the layer's class.
      compute_dtype: the dtype it computes in, in the half-precision run.
      output_dtype: the dtype of its output there.
      max_abs: max |output| in the half run (inf if any output is inf).
      float32_max_abs: max |output| in the float32 run of the same weights.
      headroom_log2: log2(largest finite of `output_dtype` / float32_max_abs):
        how many doublings the output can take before it overflows;
        negative means it overflows. None when the output is all zero.
      nonfinite: fraction of outputs that are inf or NaN in the half run.
      flushed: fraction that are 0 in the half run but not in float32.
      subnormal: fraction that are subnormal in `output_dtype`.
      rel_error: ||half - float32|| / ||float32|| over the outputs (2-norms;
        inf when the half run is non-finite, NaN when float32 is all zero).
      grad_nonfinite: fraction of d(scaled loss)/d(output) entries that are
        inf/NaN in the half run at the current loss scale, measured or
        predicted from float32 (see `ProbeReport.half_gradients`); None
        when the loss does not depend on the output.
      float32_grad_max_abs: max |d(loss)/d(output)| of the unscaled loss in
        the float32 run (None as above).
    """

    name: str
    class_name: str
    compute_dtype: str
    output_dtype: str
    max_abs: float
    float32_max_abs: float
    headroom_log2: float | None
    nonfinite: float
    flushed: float
    subnormal: float
    rel_error: float
    grad_nonfinite: float | None
    float32_grad_max_abs: float | None


@dataclasses.dataclass(frozen=True)
class VariableStats:
    """Backward numerics of one trainable variable (float32 run, unscaled loss).

    Attributes:
      name: ``layer/variable``.
      layer: the owning layer's name.
      compute_dtype: the owning layer's compute dtype in the half run (its
        gradient passes through that dtype before it is cast to float32).
      size: number of entries.
      max_abs, median_abs: of |gradient|.
      zero_at_current, subnormal_at_current: fractions of entries, non-zero
        in float32, that float16 rounds to zero / holds as subnormal once the
        gradient is multiplied by the current loss scale.
      zero_at_recommended, subnormal_at_recommended: the same at the
        recommended scale.
    """

    name: str
    layer: str
    compute_dtype: str
    size: int
    max_abs: float
    median_abs: float
    zero_at_current: float
    subnormal_at_current: float
    zero_at_recommended: float
    subnormal_at_recommended: float


@dataclasses.dataclass(frozen=True)
class ProbeReport:
    """What `tf_mixed.probe` measured.

    Attributes:
      model_name: the probed model's name.
      policy: the half-precision policy probed, e.g. "mixed_float16".
      batches: number of batches measured.
      examples: number of examples in them.
      layers: per-layer stats, in execution order.
      variables: per-trainable-variable stats.
      current_scale: the loss scale the half run used ("current").
      recommended_scale: the largest power of two at which no gradient
        computed in half precision (weights of half layers, outputs of
        half layers) times the scale exceeds float16's largest finite value;
        1.0 for a bfloat16 policy (float32's range: no loss scale).
      underflow_at_recommended: gradient entries of half layers' variables,
        non-zero in float32, that still round to zero in float16 there.
      gradient_entries: all entries of those variables.
      first_nonfinite: the first layer whose output (forward, in execution
        order) or output gradient (backward: the layer nearest the loss)
        is inf/NaN in the half run; None if none.
      first_nonfinite_in: "forward", "backward" or None.
      advice: one sentence: what is wrong first and what to do.
      half_gradients: "measured" (a half-precision backward pass) or
        "predicted" (float32 output gradients times the current scale
        against the output dtype's largest finite value).
      float8: for a model with float8 layers, one
        `tf_mixed.float8.reading.TensorState` per float8 layer and tensor
        (scale, amax, saturated and flushed fractions on the first batch,
        with the model's current scales); () otherwise.
      out_of_range: one sentence per layer of the half run that computes
        with a value its half dtype cannot hold (an adapted Normalization's
        variance above 65504 in float16: `tf_mixed._internal.facts.out_of_range`);
        the first one leads the advice.
    """

    model_name: str
    policy: str
    batches: int
    examples: int
    layers: tuple[LayerStats, ...]
    variables: tuple[VariableStats, ...]
    current_scale: float
    recommended_scale: float
    underflow_at_recommended: int
    gradient_entries: int
    first_nonfinite: str | None
    first_nonfinite_in: str | None
    advice: str
    half_gradients: str = "measured"
    float8: tuple = ()
    out_of_range: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (non-finite floats become strings)."""
        return _jsonable(dataclasses.asdict(self))

    def __str__(self) -> str:
        lines = [
            f"Probe of model '{self.model_name}' under {self.policy} against "
            f"float32, same weights, {self.batches} batch(es), "
            f"{self.examples} examples.",
            "",
            "Forward, per layer (headroom: doublings before the output "
            "overflows its dtype; err: relative error against float32; "
            f"grad!: non-finite output gradients at the current scale, "
            f"{self.half_gradients}):",
        ]
        header: tuple[str, ...] = ("layer", "class", "dtype", "max|out|", "headroom", "inf/nan",
                  "flushed", "subnorm", "err", "grad!")
        rows: list[tuple[str, ...]] = [(l.name, l.class_name, l.compute_dtype, _num(l.max_abs),
                 "-" if l.headroom_log2 is None else f"2^{l.headroom_log2:.1f}",
                 _pct(l.nonfinite), _pct(l.flushed), _pct(l.subnormal),
                 _num(l.rel_error), "-" if l.grad_nonfinite is None
                 else _pct(l.grad_nonfinite)) for l in self.layers]
        lines += _table(header, rows, left=3)
        lines += ["", "Backward, per trainable variable (float32 gradients of the "
                      f"unscaled loss; zero/subnormal: entries float16 loses at "
                      f"scale {_scale(self.current_scale)} / "
                      f"{_scale(self.recommended_scale)}):"]
        # The owning layer's compute dtype, not the variable's (float32 under a mixed policy).
        header = ("variable", "computes", "max|g|", "median|g|", "zero now",
                  "subn now", "zero rec", "subn rec")
        rows = [(v.name, v.compute_dtype, _num(v.max_abs), _num(v.median_abs),
                 _pct(v.zero_at_current), _pct(v.subnormal_at_current),
                 _pct(v.zero_at_recommended), _pct(v.subnormal_at_recommended))
                for v in self.variables]
        lines += _table(header, rows, left=2)
        if self.float8:
            lines += ["", ("Float8, per layer and tensor (current scales, "
                           "first batch; saturated: clipped to the format's "
                           "max; flushed: non-zero values quantized to 0):")]
            header = ("layer", "tensor", "format", "scale", "amax", "saturated",
                      "flushed")
            rows = [(t.layer, t.tensor, t.format.replace("float8_", ""),
                     _num(t.scale), _num(t.amax),
                     "-" if t.saturated is None else _pct(t.saturated),
                     "-" if t.flushed is None else _pct(t.flushed))
                    for t in self.float8]
            lines += _table(header, rows, left=3)
        if COMPUTE_DTYPES.get(self.policy) == "float16":
            scaling = (
                f"Loss scale: current {_scale(self.current_scale)}, recommended "
                f"initial {_scale(self.recommended_scale)} (largest power of two "
                "at which no scaled gradient overflows float16); there "
                f"{self.underflow_at_recommended:,} of {self.gradient_entries:,} "
                "gradient entries still underflow to zero.")
        else:
            scaling = (f"Loss scale: none needed ({self.policy} has float32's "
                       "range; the zero/subnormal columns say what float16 would "
                       "lose at the same scale).")
        lines += ["", scaling, self.advice]
        return "\n".join(lines)

    def plot(self, path: str | None = None) -> bytes:
        """Draws each layer's max |output| on a log2 axis with the dtype limits.

        Args:
          path: where to write the PNG; None to only return it.

        Returns:
          The PNG bytes.

        Raises:
          ImportError: matplotlib is not installed (the ``plot`` extra).
        """
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        names = [l.name for l in self.layers]
        ref = [log2_or_none(l.float32_max_abs) for l in self.layers]
        half = [log2_or_none(l.max_abs) for l in self.layers]
        layout = plot_layout(len(names), self.policy, [v for v in ref + half if v is not None])
        xs = range(len(names))
        fig, ax = plt.subplots(figsize=(layout["width_in"], 4.5))
        ax.bar(xs, [r if r is not None else 0 for r in ref], color="#8fb3d9",
               label="max |output|, float32 run")
        ax.scatter([x for x, h in zip(xs, half) if h is not None],
                   [h for h in half if h is not None], color="#1f4e79", s=14, zorder=3,
                   label=f"max |output|, {self.policy} run")
        bad = [x for x, l in zip(xs, self.layers) if l.nonfinite > 0]
        if bad:
            ax.scatter(bad, [layout["ylim"][1] - 1] * len(bad),
                       marker="x", color="#c00000", zorder=4, label="inf/NaN output")
        for value, label, style in layout["lines"]:
            ax.axhline(value, color="#c00000", linestyle=style, linewidth=1, label=label)
        every = layout["label_every"]
        ax.set_xticks(list(xs)[::every])
        ax.set_xticklabels(names[::every], rotation=90, fontsize=6 if every > 1 else 7)
        ax.set_ylim(*layout["ylim"])
        ax.set_ylabel("log2 max |output|")
        ax.set_title(f"{self.model_name}: headroom per layer ({self.policy})"
                     + (f"; every {every}th layer named" if every > 1 else "")
                     + layout["note"], fontsize=9)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        plt.close(fig)
        data = buffer.getvalue()
        if path is not None:
            with open(path, "wb") as f:
                f.write(data)
        return data


MAX_WIDTH_IN = 14.0
"""probe.png is at most this wide (inches, at 110 dpi: 1,540 px), however many layers."""

MAX_LABELS = 60
"""At most this many layer names under the x axis (every k-th layer beyond it)."""


def plot_layout(layers: int, policy: str, values: list[float]) -> dict[str, Any]:
    """How probe.png is laid out for ``layers`` layers of ``policy`` (pure).

    Args:
        layers: How many layers the plot shows.
        policy: The probed policy; its half dtype's limits are drawn.
        values: The log2 max |output| values plotted.

    Returns:
        ``width_in`` (capped at `MAX_WIDTH_IN`), ``label_every`` (name every
        k-th layer, at most `MAX_LABELS` names), ``ylim`` (the data with room,
        the half dtype's limits where they are near it), ``lines`` ((value,
        label, style) per limit drawn) and ``note`` (a limit off the chart).
    """
    dtype = "bfloat16" if "bfloat16" in policy else "float16"
    top = math.log2(DTYPE_LIMITS[dtype][0])
    low = min(values, default=0.0)
    high = max(values, default=0.0)
    # Room for the inf/NaN marks above the data; the limit shown when within reach.
    upper = max(high + 4.0, 8.0)
    lines, note = [], ""
    if top <= upper + 16.0:  # float16's 2^16: always near enough to draw
        upper = max(upper, top + 2.0)
        lines.append((top, f"{dtype} largest finite (2^{top:.1f})", "--"))
    else:  # bfloat16's 2^128 would squeeze the data into a line
        note = f"; {dtype}'s largest finite, 2^{top:.0f}, is far above the chart"
    lower = min(low - 2.0, 0.0)
    if dtype == "float16":
        lower = min(lower, -16.0)
        lines.append((-14.0, "float16 smallest normal (2^-14)", ":"))
    return {"width_in": min(MAX_WIDTH_IN, max(6.0, 0.28 * layers + 2)),
            "label_every": max(1, math.ceil(layers / MAX_LABELS)),
            "ylim": (lower, upper), "lines": lines, "note": note}


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return "0" if value == 0 else f"{value:.3g}"


def _pct(value: float) -> str:
    if value == 0:
        return "0"
    return f"{100 * value:.3g}%"


def _scale(value: float) -> str:
    exponent = math.log2(value) if value > 0 else None
    if exponent is not None and exponent.is_integer():
        return f"2^{int(exponent)}"
    return f"{value:g}"


def _table(header, rows, left: int = 1) -> list[str]:
    table = [tuple(header)] + [tuple(r) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    out = []
    for i, row in enumerate(table):
        # Names left, numbers right.
        cells = [c.ljust(w) if k < left else c.rjust(w)
                 for k, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return out
