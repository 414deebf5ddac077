"""The value `tf_mixed.plan` returns: a precision per layer, with the figures and why."""

# `Plan` is frozen plain data. ``str(plan)`` is the table (layer, time per
# precision, error, choice, why); `to_dict` the same for JSON. It holds the
# model's `tf_mixed.policy.precision_map.PrecisionMap` (``plan.precision``,
# made by `decide` from the choices, so a row shows what applying builds: a
# layer a rule keeps float32, a statistics layer say, says so). What applies it:
#
# * ``plan.apply(model)``: the map built (`tf_mixed.models.conversion.apply`),
#   then the float8 layers quantized; ``tf_mixed.convert(model, plan.policy,
#   keep_float32=plan.keep_float32)`` builds the same precisions;
# * ``tf_mixed.enable("auto", plan=plan)`` for models built afterwards;
# * ``tf_mixed.float8.quantize(model, keep_float32=plan.float8_keep_float32)``.

from __future__ import annotations

import dataclasses
import io
from typing import Any, Mapping, Sequence

from tf_mixed._internal.facts import COMPUTE_DTYPES, FLOAT32_HEADS
from tf_mixed.policy import precision_map
from tf_mixed.policy.precision_map import PrecisionMap, Survey
from tf_mixed.tools.planning.layer_timing import FLOAT8, Measurement

__all__ = ["LayerChoice", "Plan", "decided", "emulated_rows", "planned"]

def ms(seconds: float) -> str:
    """Milliseconds, three significant digits, never in exponent form."""
    value = seconds * 1e3
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


@dataclasses.dataclass(frozen=True)
class LayerChoice:
    """One row of the plan.

    Attributes:
        name: The layer's name in the model (a nested model is one row).
        class_name: Its class.
        seconds: Precision -> median seconds of its forward+backward step
            ({} for a layer without weights: it is not timed).
        cast_seconds: Median seconds of the casts at its input, were its
            precision to differ from its producer's.
        error: The probe's relative error of its output in the half dtype,
            or the numerics catalog's where the plan read it there (the
            plan's ``from_catalog``); None where neither has a row for it.
        choice: "float32", "bfloat16", "float16" or "float8".
        why: One sentence.
    """

    name: str
    class_name: str
    seconds: Mapping[str, float]
    cast_seconds: float
    error: float | None
    choice: str
    why: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """A precision for each layer of one model on this host (see `tf_mixed.plan`).

    Attributes:
        model_name: The planned model's name.
        policy: The policy that carries the plan: the half policy
            ("mixed_bfloat16", "mixed_float16") when any layer computes in
            half precision or float8, else "float32".
        half_dtype: The half dtype considered ("bfloat16" or "float16").
        precisions: The precisions timed ("float32" first).
        layers: One row per top-level layer, in the model's order.
        step_seconds: Median seconds of the timed layers' steps summed,
            casts included: "float32" everywhere, the half dtype everywhere
            (numerically unsafe layers float32), and "plan" (the plan
            returned: the whole model's figure where the step check chose
            one building another map).
        summary: One sentence: what was chosen and why.
        host: The host the timings come from.
        cached: Whether the timings came from the cache.
        cache_path: The cache file read or written ("" if none).
        measurement: The timings the choice was made from (None when
            nothing was timed: half precision emulated).
        precision: The precision of every layer applying builds (None for a
            plan made by hand without one: it is then read from the rows).
        from_catalog: Layer name -> the numerics catalog's row its error was
            read from, and at what magnitude, when the plan took every
            layer's error from the catalog instead of running the probe
            (`tf_mixed.tools.planning.catalog_errors`); {} when it probed.
    """

    model_name: str
    policy: str
    half_dtype: str
    precisions: tuple[str, ...]
    layers: tuple[LayerChoice, ...]
    step_seconds: Mapping[str, float]
    summary: str
    host: str = ""
    cached: bool = False
    cache_path: str = ""
    measurement: Measurement | None = None
    precision: PrecisionMap | None = None
    from_catalog: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def choices(self) -> dict[str, str]:
        """Layer name -> its precision."""
        return {row.name: row.choice for row in self.layers}

    @property
    def precision_map(self) -> PrecisionMap:
        """`precision`, or for a plan without one the map its rows say."""
        if self.precision is not None:
            return self.precision
        return rows_map(self.policy, self.layers)

    @property
    def keep_float32(self) -> tuple[str, ...]:
        """The top-level layers to keep in float32 under `policy`
        (``keep_float32=`` of `convert` and `enable`); () when `policy` is
        float32."""
        if self.policy == "float32":
            return ()
        kept = set(self.precision_map.float32_names())
        return tuple(row.name for row in self.layers
                     if row.name in kept and row.class_name not in FLOAT32_HEADS)

    @property
    def float8_layers(self) -> tuple[str, ...]:
        """The layers the plan puts in float8."""
        return tuple(row.name for row in self.layers if row.choice == FLOAT8)

    @property
    def float8_keep_float32(self) -> tuple[str, ...]:
        """``keep_float32=`` for `tf_mixed.float8.quantize`: every timed layer
        (Dense, EinsumDense, nested model, ...) the plan does not put in float8."""
        return tuple(row.name for row in self.layers if row.choice != FLOAT8 and row.seconds)

    def apply(self, model):
        """The model converted to this plan (`tf_mixed.convert`, then float8).

        Args:
            model: The model planned (or one with the same layer names).

        Returns:
            A new model (`tf_mixed.convert`'s), its float8 layers quantized
            with `tf_mixed.float8.quantize` when the plan has any.
        """
        from tf_mixed.float8.quantization import quantize
        from tf_mixed.models import conversion

        converted = conversion.apply(model, self.precision_map)
        if self.float8_layers:
            quantize(converted, keep_float32=list(self.float8_keep_float32))
        return converted

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data."""
        return {
            "model_name": self.model_name, "policy": self.policy, "half_dtype": self.half_dtype,
            "precisions": list(self.precisions), "summary": self.summary, "host": self.host,
            "cached": self.cached, "cache_path": self.cache_path,
            "step_seconds": dict(self.step_seconds),
            "keep_float32": list(self.keep_float32), "float8_layers": list(self.float8_layers),
            "layers": [dataclasses.asdict(row) for row in self.layers],
            "precision": self.precision_map.to_dict(),
            "from_catalog": dict(self.from_catalog),
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> "Plan":
        """The plan `to_dict` wrote (its timings' rounds, ``measurement``, are not kept).

        Args:
            record: What `to_dict` returned (extra keys are ignored; a record
                without "precision", from an earlier version, gets the map
                its rows say).

        Returns:
            A `Plan` equal to the one written, but for ``measurement`` (None).

        Raises:
            ValueError: ``record`` is not such a dict: a key is missing or a
                value has the wrong type or is not a valid precision (the
                message names the key, or the row and field).
        """
        return _checked_plan_record(cls, record)

    def __str__(self) -> str:
        out = io.StringIO()
        out.write(f"Plan for model '{self.model_name}'"
                  + (f" on {self.host}" if self.host else "") + f": {self.summary}\n")
        if self.step_seconds:
            parts = ", ".join(f"{k} {ms(v)} ms" for k, v in self.step_seconds.items())
            out.write(f"Timed layers' step (median, casts included): {parts}\n")
        header = ["layer", "class"] + [f"{p} ms" for p in self.precisions] + [
            "cast ms", "error", "choice", "why"]
        rows = [header]
        for row in self.layers:
            times = [ms(row.seconds[p]) if p in row.seconds else "-" for p in self.precisions]
            error = "-" if row.error is None else f"{row.error:.2g}"
            cast = ms(row.cast_seconds) if row.seconds else "-"
            rows.append([row.name, row.class_name, *times, cast, error, row.choice, row.why])
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        for r in rows:
            out.write("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] + "\n")
        if self.policy != "float32":
            out.write(f"Apply: tf_mixed.convert(model, {self.policy!r}, "
                      f"keep_float32={list(self.keep_float32)!r})")
            if self.float8_layers:
                out.write(f", then tf_mixed.float8.quantize(model, keep_float32="
                          f"{list(self.float8_keep_float32)!r})")
            out.write("\n")
        else:
            out.write("Apply: keep the model in float32 (no tf_mixed.enable).\n")
        return out.getvalue()


def choice_policy(choice: str, policy: str) -> str:
    """The Keras policy name of a row's choice under the plan's `policy`."""
    if choice == FLOAT8:
        return f"float8_from_{policy}"
    return "float32" if choice == "float32" else policy


def rows_map(policy: str, rows) -> PrecisionMap:
    """The precision map a plan's rows say (for a plan made without one)."""
    return PrecisionMap(policy, {row.name: choice_policy(row.choice, policy) for row in rows},
                        {row.name: "plan" for row in rows})


def emulated_rows(found: Survey, why: str) -> dict[str, list["LayerChoice"]]:
    """The one candidate of a host where the half dtype is emulated: every top layer float32.

    Args:
        found: The planned model's survey.
        why: Why the half dtype is emulated (each row's why).

    Returns:
        ``{"plan": rows}``, one float32 row per top layer, untimed.
    """
    return {"plan": [LayerChoice(layer.name, type(layer).__name__, {}, 0.0, None, "float32", why)
                     for layer in found.top]}


def planned(found: Survey, rows: Sequence["LayerChoice"], half_policy: str, *,
            emulated: bool = False) -> tuple[str, PrecisionMap]:
    """The policy that carries a candidate's rows, and the map they decide.

    The plan's one decision per candidate: `tf_mixed.policy.precision_map.decide`
    with the rows' choices as its plan (rule 5). The step check times the
    copy each map builds, and the winner's map is the plan's.

    Args:
        found: The planned model's survey.
        rows: The candidate's rows (`tf_mixed.tools.planning.plan_rows`).
        half_policy: "mixed_float16" or "mixed_bfloat16".
        emulated: The half dtype is emulated on this host: the model stays
            float32 and no layer is planned.

    Returns:
        ``(policy, map)``: the policy is ``half_policy``, or "float32" when
        no row computes in half precision.
    """
    final = half_policy if {row.choice for row in rows} - {"float32"} else "float32"
    choices = {} if emulated else {row.name: choice_policy(row.choice, final) for row in rows}
    return final, precision_map.decide(found.model, final, plan=choices, found=found)


def decided(rows: Sequence["LayerChoice"], final: str, precision: PrecisionMap,
            half_dtype: str, step_seconds: Mapping[str, float], *, emulated: str = ""
            ) -> tuple[list["LayerChoice"], str]:
    """The plan's rows as its map builds them, and its summary.

    A layer an earlier rule of the map keeps float32 (a float32 head,
    statistics, token ids) says so in its row (`precision_map.RULES`).

    Args:
        rows: The rows the step check kept.
        final: Their policy (`planned`).
        precision: Their map (`planned`).
        half_dtype: The half dtype considered.
        step_seconds: The choice's step seconds (`tf_mixed.tools.planning.choosing.Choice`).
        emulated: Why the half dtype is emulated on this host ("": it is
            not): the model stays float32, no layer planned.

    Returns:
        ``(rows, summary line)``.
    """
    decided = []
    for row in rows:
        rule = precision.reasons.get(row.name)
        if rule in (None, precision_map.PLAN, "as is") or row.choice == "float32":
            decided.append(row)
            continue
        decided.append(dataclasses.replace(
            row, choice=precision.compute_dtype(row.name) or row.choice,
            why=f"{rule}: float32 whatever the timings (tf_mixed.policy.precision_map)"))
    if emulated:
        return decided, f"float32 for every layer: {emulated}"
    timed = [row for row in decided if row.seconds]
    counts = {p: sum(row.choice == p for row in timed) for p in ("float32", half_dtype, FLOAT8)}
    shown = {k: f"{ms(v)} ms" for k, v in step_seconds.items()}
    split = ", ".join(f"{n} {p}" for p, n in counts.items() if n)
    summary = (f"{final}: {split} of {len(timed)} timed layers; timed layers' step "
               f"{shown['plan']} (float32 {shown['float32']}, whole-model {half_dtype} "
               f"{shown[half_dtype]})")
    return decided, summary


_FIELDS: dict[str, Any] = {
    "model_name": str, "policy": str, "half_dtype": str, "precisions": list, "layers": list,
    "step_seconds": dict, "summary": str}
_ROW_FIELDS: dict[str, Any] = {
    "name": str, "class_name": str, "seconds": dict, "cast_seconds": (int, float),
    "error": (int, float, type(None)), "choice": str, "why": str}


def _problem(where: str, value: Any, expected: str) -> ValueError:
    return ValueError(
        f"A plan record's {where} must be {expected}. Received: {value!r} (of type "
        f"{type(value).__name__}). Load what Plan.to_dict wrote (json.dump(plan.to_dict())).")


def _checked_plan_record(cls, record: Any) -> "Plan":
    if not isinstance(record, Mapping):
        raise _problem("value", record, "a dict (what Plan.to_dict returns)")
    for key, kind in _FIELDS.items():
        if key not in record:
            raise ValueError(
                f"A plan record needs the key {key!r}; it has {sorted(record)}. Load what "
                "Plan.to_dict wrote (json.dump(plan.to_dict())).")
        if not isinstance(record[key], kind):
            raise _problem(f"{key!r}", record[key], f"a {kind.__name__}")
    policies = ("float32",) + tuple(p for p, d in COMPUTE_DTYPES.items() if d != "float32")
    if record["policy"] not in policies:
        raise _problem("'policy'", record["policy"], f"one of {list(policies)}")
    choices = ("float32", record["half_dtype"], FLOAT8)
    rows = []
    for i, row in enumerate(record["layers"]):
        if not isinstance(row, Mapping):
            raise _problem(f"layers[{i}]", row, "a dict (a LayerChoice)")
        for key, kind in _ROW_FIELDS.items():
            if key not in row:
                raise ValueError(f"A plan record's layers[{i}] needs the key {key!r}; it has "
                                 f"{sorted(row)}.")
            if not isinstance(row[key], kind):
                raise _problem(f"layers[{i}][{key!r}]", row[key], f"of type {kind}")
        if row["choice"] not in choices:
            raise _problem(f"layers[{i}]['choice'] (layer {row['name']!r})", row["choice"],
                           f"one of {list(choices)}")
        rows.append(LayerChoice(**{k: row[k] for k in _ROW_FIELDS}))
    precision = None
    if "precision" in record:
        try:
            precision = PrecisionMap.from_dict(record["precision"])
        except ValueError as error:
            raise ValueError(f"A plan record's 'precision': {error}") from None
    return cls(
        record["model_name"], record["policy"], record["half_dtype"],
        tuple(record["precisions"]), tuple(rows), dict(record["step_seconds"]),
        record["summary"], str(record.get("host", "")), bool(record.get("cached", False)),
        str(record.get("cache_path", "")), None, precision,
        {str(k): str(v) for k, v in dict(record.get("from_catalog") or {}).items()})
