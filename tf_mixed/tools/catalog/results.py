"""The catalog as a value: one row per layer configuration and policy, its table and its file."""

# ``str(catalog)`` is the table a user looks a layer up in; ``to_dict()`` /
# `from_dict` / `load` are results.json; `stored` is the catalog measured for
# the supported Keras version, shipped with the package (`STORED_FILE`,
# package-data in pyproject.toml) and checked by CI's slow tier.

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
from typing import Any

from tf_mixed.tools.catalog.reading import SafeRange

__all__ = ["Catalog", "Row", "STORED_FILE", "load", "stored"]

FORMAT = 1
STORED_FILE = os.path.join(os.path.dirname(__file__), "stored", "keras_layers.json")


@dataclasses.dataclass(frozen=True)
class Row:
    """One layer configuration under one half policy.

    Attributes:
        layer: the class name ("Dense"; qualified outside ``keras.layers``).
        config: the configuration's label ("units=4096").
        policy: "mixed_float16" or "mixed_bfloat16".
        source: "keras", "keras_hub" or "user".
        forward: relative error of the output per magnitude (None: not run).
        gradient: relative error of the gradients per magnitude (None: none).
        status: `tf_mixed.tools.catalog.reading.STATUSES` per magnitude.
        safe: the safe input range.
        failure: why the layer cannot run under the policy here ("" if it can).
        no_gradient: why its gradients were not measured ("" if they were).
        covers: other classes this row measures (a cell inside ``RNN``).
        args: the configuration's values a model's layer is matched against
            (`tf_mixed.tools.catalog.Case`'s ``args``).
    """

    layer: str
    config: str
    policy: str
    source: str
    forward: tuple[float | None, ...]
    gradient: tuple[float | None, ...]
    status: tuple[str, ...]
    safe: SafeRange
    failure: str = ""
    no_gradient: str = ""
    covers: tuple[str, ...] = ()
    args: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def key(self) -> str:
        """``Layer[config]``."""
        return f"{self.layer}[{self.config}]"

    def reason(self) -> str:
        """Why the range ends where it does, in words."""
        if self.failure:
            return f"does not run: {self.failure}"
        if self.safe.low is None:
            worst = sorted({s for s in self.status if s != "ok"})
            return "unsafe at every magnitude (" + ", ".join(worst) + ")"
        parts = []
        if self.safe.below:
            parts.append(f"{_words(self.safe.below)} below")
        if self.safe.above:
            parts.append(f"{_words(self.safe.above)} above")
        return "; ".join(parts) or "safe over the whole grid"


def _words(code: str) -> str:
    return {"resolution": "loses resolution", "underflow": "underflows",
            "overflow": "overflows", "float32_nonfinite": "float32 itself not finite"}[code]


@dataclasses.dataclass(frozen=True)
class Catalog:
    """Every measured row and how it was measured.

    Attributes:
        rows: one `Row` per configuration and policy.
        magnitudes: the grid (``max |input|`` per point).
        tolerance: per policy, the largest relative error of a safe point.
        versions: keras, tensorflow, tf_mixed (and keras_hub when measured).
        host: the CPU model and its half-precision flags.
        seconds: how long the measurement took.
        left_out: float-computing classes not measured, with why.
        no_float_compute: classes without floating-point arithmetic a policy
            changes, with why (not counted in the coverage).
    """

    rows: tuple[Row, ...]
    magnitudes: tuple[float, ...]
    tolerance: dict[str, float]
    versions: dict[str, str]
    host: str = ""
    seconds: float = 0.0
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    no_float_compute: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def policies(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(row.policy for row in self.rows))

    @property
    def classes(self) -> tuple[str, ...]:
        """Every class a row measures, in order of first appearance."""
        names: dict[str, None] = {}
        for row in self.rows:
            names[row.layer] = None
            names.update(dict.fromkeys(row.covers))
        return tuple(names)

    def points_around(self, magnitude: float | None) -> tuple[int, ...] | None:
        """The indices of the grid points at and around a max |input| (None: off the grid)."""
        grid = self.magnitudes
        if magnitude is None or not grid[0] <= magnitude <= grid[-1]:
            return None
        high = bisect.bisect_left(grid, magnitude)
        return (high,) if grid[high] == magnitude else (high - 1, high)

    def coverage(self, source: str = "keras") -> tuple[int, int]:
        """``(classes measured, classes measured + left out)`` of one source."""
        measured = {c for row in self.rows if row.source == source
                    for c in (row.layer, *row.covers)}
        left = set(self.left_out) if source == "keras" else set()
        return len(measured), len(measured | left)

    def find(self, layer: str, policy: str | None = None,
             config: str | None = None) -> list[Row]:
        """The rows of a class (and policy, and configuration label)."""
        return [row for row in self.rows
                if (row.layer == layer or layer in row.covers)
                and (policy is None or row.policy == policy)
                and (config is None or row.config == config)]

    def to_dict(self) -> dict[str, Any]:
        """The catalog as JSON-ready data (results.json)."""
        return {
            "format": FORMAT,
            "versions": dict(self.versions),
            "host": self.host,
            "seconds": round(self.seconds, 1),
            "magnitudes": list(self.magnitudes),
            "tolerance": dict(self.tolerance),
            "left_out": dict(self.left_out),
            "no_float_compute": dict(self.no_float_compute),
            "rows": [_row_dict(row) for row in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def __str__(self) -> str:
        """The table: per configuration, the safe range per policy and why it ends."""
        lines = [
            "Safe input range (max |input|) per layer and policy: relative error of output "
            "and gradients against float32 within "
            + ", ".join(f"{t:.3g} ({p})" for p, t in self.tolerance.items())
            + f"; grid {self.magnitudes[0]:.0e} .. {self.magnitudes[-1]:.0e}.",
        ]
        keys = list(dict.fromkeys(row.key for row in self.rows))
        by_key = {(row.key, row.policy): row for row in self.rows}
        header = ["layer"] + list(self.policies)
        table = [header]
        notes = []
        for key in keys:
            cells = [key]
            for policy in self.policies:
                row = by_key.get((key, policy))
                if row is None:
                    cells.append("-")
                elif row.failure:
                    cells.append("does not run")
                    notes.append(f"{key} under {policy}: {row.failure}")
                else:
                    cells.append(row.safe.text() + _ends(row.safe))
            table.append(cells)
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        for i, cells in enumerate(table):
            lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("Ends: u underflows, r loses resolution, o overflows, f float32 not "
                     "finite either (left of the range: below it; right: above it).")
        measured, total = self.coverage()
        if total and self.no_float_compute:  # a catalog of the whole of keras.layers
            lines.append(f"keras.layers: {measured} of {total} float-computing classes measured "
                         f"({len(self.left_out)} left out: see docs/catalog.md).")
        lines += [f"Note: {note}" for note in notes]
        return "\n".join(lines)

    def plot(self, path: str | None = None) -> bytes:
        """The picture (layers by magnitude, coloured by error) as PNG bytes.

        Args:
            path: also write the PNG there.

        Returns:
            The PNG bytes.

        Raises:
            ImportError: matplotlib is not installed (the ``plot`` extra).
        """
        from tf_mixed.tools.catalog import picture

        return picture.render(self, path)


_END = {"underflow": "u", "resolution": "r", "overflow": "o", "float32_nonfinite": "f", "": ""}


def _ends(safe: SafeRange) -> str:
    if safe.low is None:
        return ""
    marks = _END[safe.below] + "|" + _END[safe.above]
    return "" if marks == "|" else f" ({marks})"


def _number(value: float | None):
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    return float(f"{value:.3g}")


def _from_number(value) -> float | None:
    if value is None:
        return None
    return float(value)  # "nan" and "inf" parse as floats


def _row_dict(row: Row) -> dict[str, Any]:
    return {
        "layer": row.layer, "config": row.config, "policy": row.policy, "source": row.source,
        "safe": {"low": row.safe.low, "high": row.safe.high, "below": row.safe.below,
                 "above": row.safe.above},
        "forward": [_number(v) for v in row.forward],
        "gradient": [_number(v) for v in row.gradient],
        "status": list(row.status),
        "failure": row.failure, "no_gradient": row.no_gradient, "covers": list(row.covers),
        "args": json.loads(json.dumps(row.args, default=str)),
    }


def from_dict(data: dict[str, Any]) -> Catalog:
    """A `Catalog` from `Catalog.to_dict`'s data.

    Raises:
        ValueError: the data is not a catalog of this format.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT or "rows" not in data:
        raise ValueError(
            f"not a tf_mixed catalog of format {FORMAT} (results.json of `python -m tf_mixed "
            f"catalog`). Received: {str(data)[:80]!r}")
    rows = []
    for r in data["rows"]:
        safe = r["safe"]
        rows.append(Row(
            layer=r["layer"], config=r["config"], policy=r["policy"], source=r["source"],
            forward=tuple(_from_number(v) for v in r["forward"]),
            gradient=tuple(_from_number(v) for v in r["gradient"]),
            status=tuple(r["status"]),
            safe=SafeRange(safe["low"], safe["high"], safe["below"], safe["above"]),
            failure=r.get("failure", ""), no_gradient=r.get("no_gradient", ""),
            covers=tuple(r.get("covers", ())), args=dict(r.get("args", {}))))
    return Catalog(rows=tuple(rows), magnitudes=tuple(data["magnitudes"]),
                   tolerance=dict(data["tolerance"]), versions=dict(data["versions"]),
                   host=data.get("host", ""), seconds=float(data.get("seconds", 0.0)),
                   left_out=dict(data.get("left_out", {})),
                   no_float_compute=dict(data.get("no_float_compute", {})))


def load(path: str | os.PathLike) -> Catalog:
    """Reads a catalog's results.json.

    Raises:
        ValueError: the file is missing, not JSON, or not a catalog.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"no catalog file at {os.fspath(path)!r}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{os.fspath(path)!r} is not JSON ({error})") from None
    return from_dict(data)


def stored() -> Catalog:
    """The catalog shipped with tf_mixed, measured for the supported Keras version."""
    return load(STORED_FILE)


