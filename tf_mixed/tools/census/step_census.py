"""A precision census of the step ``fit`` runs: where the time goes in half precision."""

#     report = tf_mixed.census(model, x, y)      # model compiled, or pass loss=
#     print(report)                              # op dtypes, casts, islands, findings
#     report.half_flop_share                     # 0.92: matmul/conv FLOPs in half
#     report.to_dict()                           # the same as plain data
#
# or, for a saved model, ``python -m tf_mixed doctor MODEL.keras``.
#
# What is read: the very function Keras's ``fit`` runs for one step (forward,
# gradient, optimizer apply; Keras's ``one_step_on_data`` ``tf.function``,
# made as ``make_train_function`` makes it), traced on the first batch of
# `x`/`y` as Keras's data adapter delivers it, so the dtypes are the ones
# ``fit`` feeds. Nothing runs: the weights do not change. (Tracing builds
# what ``fit``'s first step builds, such as the optimizer's slots; a model
# that is not compiled is compiled with ``optimizer="adam"`` and `loss`, as
# ``compile`` would wrap it under mixed_float16.)
#
# The report, per step of one replica:
#
# * per op type, how many ops compute in each dtype, and the share of the
#   matrix-product/convolution FLOPs (from static shapes,
#   `tf_mixed.tools.census.step_ops`) computed in float16/bfloat16;
# * every cast between float dtypes, with the bytes it reads and writes,
#   grouped by layer (a cast Keras inserts in front of a layer belongs to
#   that layer; a gradient op to the layer of its forward op);
# * float32 islands: matmul/conv ops computing in float32 (or float64) in a
#   model whose layers compute in half precision, with the reason;
# * dimensions of half-precision matmul/convs that miss the hardware's tiles
#   (``tf_mixed._internal.facts.TILE_MULTIPLES``: 8 for float16 Tensor Cores, 16 for
#   bfloat16 on AMX);
# * findings with fixes (`tf_mixed.tools.census.findings`).
#
# With ``jit_compile=True`` the ops are read from XLA's optimized HLO
# (`tf_mixed.tools.census.hlo_ops`), which is what runs: XLA may change dtypes (on a CPU
# it computes float16 dots in float32). Where TensorFlow cannot give the HLO
# the report says so in ``note`` and reads the graph.
#
# The graph is read as traced, before Grappler's rewrites (which may fuse or
# drop some casts at run time).

from __future__ import annotations

import dataclasses
import re
from typing import Any

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import (
    HALF_DTYPES,
    TILE_MULTIPLES,
    check_model_kind,
    is_float32_head,
    is_input_layer,
    model_outputs,
    walk_layers,
)
from tf_mixed.tools.census import hlo_ops, step_ops

__all__ = ["CastRow", "CensusReport", "Island", "Misfit", "census"]

# Labels for ops outside every layer.
LOSS, OPTIMIZER, MODEL, STEP = "(loss)", "(optimizer)", "(model)", "(step)"
_GRADIENT = "gradient_tape"
_REPLICA = re.compile(r"^replica_\d+$")
# Why a matmul/conv computes in float32 in a half-precision model.
REASONS = {
    "keep_float32": "pinned to float32 by a keep_float32 rule",
    "explicit_dtype": "the layer has an explicit float32 dtype policy",
    "lambda": "a Lambda computes in float32",
    "float_input": "its input arrives in {dtype} (the layer computes in {compute})",
    "inside_layer": "the layer computes them in {dtype} inside its own call, whatever its "
                    "{compute} inputs (a cast of its own, a variable read without autocast, "
                    "values it makes itself: KerasHub's rotary positions and tied output "
                    "embedding do so on purpose)",
    "xla_upcast": "XLA computes it in {dtype} (the layer computes in {compute})",
}


@dataclasses.dataclass(frozen=True)
class CastRow:
    """Float casts of one layer (or of the loss, optimizer...) per step.

    Attributes:
      layer: the layer, or "(loss)", "(optimizer)", "(model)", "(step)".
      source: dtype cast from.
      target: dtype cast to.
      count: casts per step.
      bytes: bytes they read and write per step (None: a shape is unknown).
      constants: how many of them cast a constant of the graph (a NumPy
        scalar in a layer's code), not data or a variable.
    """

    layer: str
    source: str
    target: str
    count: int
    bytes: int | None
    constants: int = 0


@dataclasses.dataclass(frozen=True)
class Island:
    """Matmul/conv ops of one layer computing in float32 in a half model.

    Attributes:
      layer: the layer's qualified name.
      class_name: its class.
      dtype: the dtype they compute in.
      reason: a key of `REASONS`.
      compute: the layer's own compute dtype.
      ops: how many ops (forward and backward).
      flops: their FLOPs per step (None: a shape is unknown).
      output: the layer produces a model output (often float32 on purpose).
    """

    layer: str
    class_name: str
    dtype: str
    reason: str
    compute: str
    ops: int
    flops: int | None
    output: bool = False

    @property
    def why(self) -> str:
        """The reason in words."""
        return REASONS[self.reason].format(dtype=self.dtype, compute=self.compute)


@dataclasses.dataclass(frozen=True)
class Misfit:
    """A half-precision matmul/conv dimension that misses the tiles.

    Attributes:
      layer: the layer's qualified name.
      class_name: its class.
      dtype: the half dtype it computes in.
      dimension: "n" (the layer's output features: units, filters) or "k"
        (the width it contracts: its input features).
      value: the dimension.
      multiple: the tile multiple for `dtype`.
      output: the layer produces a model output (its width is the task's).
    """

    layer: str
    class_name: str
    dtype: str
    dimension: str
    value: int
    multiple: int
    output: bool

    @property
    def padded(self) -> int:
        """The next multiple of `multiple`."""
        return -(-self.value // self.multiple) * self.multiple


@dataclasses.dataclass(frozen=True)
class CensusReport:
    """What `census` found in one training step (one replica).

    ``str(report)`` prints tables; ``to_dict()`` gives plain data.

    Attributes:
      model_name: the model's name.
      policy: the half-precision policy most of its layers have (the most
        common policy when none computes in half precision).
      source: "graph" (the traced TF graph) or "optimized_hlo" (XLA's).
      jit_compile: whether the step is compiled with XLA.
      batch_size: the batch one replica runs, the step was traced on (the
        global batch split over `replicas`, rounded up).
      op_counts: op type -> {dtype: ops per step}.
      flops: dtype -> matmul/conv FLOPs per step.
      unknown_flops: matmul/conv ops whose FLOPs are unknown.
      casts: `CastRow`s, by layer.
      islands: `Island`s.
      misfits: `Misfit`s.
      findings: `tf_mixed.tools.census.findings.Finding`s.
      note: how the step was read (and why not the HLO, when asked).
      replicas: the replicas in sync under the model's strategy (1 without
        one); every count is one replica's.
      global_batch_size: the batch `fit` would take from the data, all
        replicas together.
    """

    model_name: str
    policy: str
    source: str
    jit_compile: bool
    batch_size: int | None
    op_counts: dict[str, dict[str, int]]
    flops: dict[str, int]
    unknown_flops: int
    casts: tuple[CastRow, ...]
    islands: tuple[Island, ...]
    misfits: tuple[Misfit, ...]
    findings: tuple = ()
    note: str = ""
    replicas: int = 1
    global_batch_size: int | None = None

    @property
    def half_flop_share(self) -> float | None:
        """Share of the step's matmul/conv FLOPs in float16/bfloat16 (None: none)."""
        total = sum(self.flops.values())
        if not total:
            return None
        return sum(v for k, v in self.flops.items() if k in HALF_DTYPES) / total

    @property
    def casts_per_step(self) -> int:
        """Float casts per step."""
        return sum(row.count for row in self.casts)

    @property
    def cast_bytes_per_step(self) -> int | None:
        """Bytes the casts read and write per step (None: some unknown)."""
        sizes = [row.bytes for row in self.casts]
        return None if None in sizes else sum(sizes)  # type: ignore[arg-type]

    def by_code(self, code: str) -> list:
        """The findings with this code."""
        return [f for f in self.findings if f.code == code]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "model": self.model_name,
            "policy": self.policy,
            "source": self.source,
            "jit_compile": self.jit_compile,
            "batch_size": self.batch_size,
            "replicas": self.replicas,
            "global_batch_size": self.global_batch_size,
            "half_flop_share": self.half_flop_share,
            "casts_per_step": self.casts_per_step,
            "cast_bytes_per_step": self.cast_bytes_per_step,
            "op_counts": self.op_counts,
            "flops": self.flops,
            "unknown_flops": self.unknown_flops,
            "casts": [dataclasses.asdict(r) for r in self.casts],
            "islands": [dict(dataclasses.asdict(i), why=i.why) for i in self.islands],
            "misfits": [dict(dataclasses.asdict(m), padded=m.padded) for m in self.misfits],
            "findings": [f.to_dict() for f in self.findings],
            "note": self.note,
        }

    def __str__(self) -> str:
        share = self.half_flop_share
        lines = [
            f"Census of model '{self.model_name}' ({self.policy}, "
            f"{'XLA: optimized HLO' if self.source == 'optimized_hlo' else 'traced graph'}"
            f", batch {self.batch_size}"
            + (f" per replica, {self.replicas} replicas, global batch {self.global_batch_size}"
               if self.replicas > 1 else "") + "): "
            f"{'-' if share is None else f'{100 * share:.1f}%'} of matmul/conv FLOPs in half "
            f"precision, {self.casts_per_step} casts per step"
            + (f" ({_human(self.cast_bytes_per_step)})" if self.cast_bytes_per_step else "")]
        if self.note:
            lines.append(self.note)
        dtypes = sorted({d for counts in self.op_counts.values() for d in counts},
                        key=_dtype_order)
        rows = [("op", *dtypes)] + [
            (op, *(str(counts.get(d, "")) for d in dtypes))
            for op, counts in sorted(self.op_counts.items(),
                                     key=lambda kv: (-sum(kv[1].values()), kv[0]))]
        lines += ["", "Ops per step by dtype:"] + _table(rows)
        if self.flops:
            total = sum(self.flops.values())
            lines.append("Matmul/conv FLOPs: " + ", ".join(
                f"{d} {v:,} ({100 * v / total:.1f}%)" for d, v in
                sorted(self.flops.items(), key=lambda kv: _dtype_order(kv[0]))))
        if self.casts:
            lines += ["", "Casts per step:"] + _table(
                [("layer", "from", "to", "count", "bytes")] + [
                    (r.layer, r.source, r.target, str(r.count),
                     "?" if r.bytes is None else f"{r.bytes:,}") for r in self.casts])
        if self.islands:
            lines += ["", "Float32 islands:"] + _table(
                [("layer", "class", "dtype", "ops", "FLOPs", "why")] + [
                    (i.layer, i.class_name, i.dtype, str(i.ops),
                     "?" if i.flops is None else f"{i.flops:,}",
                     i.why + (" (a model output)" if i.output else "")) for i in self.islands])
        if self.misfits:
            lines += ["", "Dimensions off the tiles:"] + _table(
                [("layer", "class", "dtype", "dim", "value", "tile", "pad to")] + [
                    (m.layer, m.class_name, m.dtype, m.dimension, str(m.value),
                     str(m.multiple), str(m.padded) + (" (output)" if m.output else ""))
                    for m in self.misfits])
        lines.append("")
        if self.findings:
            lines.append(f"Findings ({len(self.findings)}):")
            lines += [f"  {f}" for f in self.findings]
        else:
            lines.append("Findings: none")
        return "\n".join(lines)


def _dtype_order(dtype: str) -> tuple:
    order = ("float16", "bfloat16", "float32", "float64", "other")
    return (order.index(dtype) if dtype in order else len(order) - 1, dtype)


def _table(rows) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for i, row in enumerate(rows):
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return out


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f} GiB"


# ------------------------------------------------------------------ census


def census(model, x, y=None, *, loss=None, jit_compile: bool | None = None,
           batch_size: int | None = None) -> CensusReport:
    """Traces the step ``fit`` runs and reports its dtypes, casts and FLOPs.

    Args:
      model: a built `keras.Model`, compiled or not.
      x: input data as ``fit`` takes it (arrays, tensors, a ``tf.data``
        dataset of batches); only the first batch is used, to trace.
      y: targets, as ``fit`` takes them (None with a dataset of pairs).
      loss: the loss for a model that is not compiled (it is then compiled
        with ``optimizer="adam"``); None for a compiled model.
      jit_compile: None for the model's own setting; True/False to census
        the step compiled with XLA or not.
      batch_size: the batch size for arrays (Keras's default, 32, if None).

    Returns:
      A `CensusReport`. The model's weights are not changed.

    Raises:
      TypeError: `model` is not a Keras model, or `jit_compile` not a bool.
      ValueError: an uncompiled model without `loss`, a compiled model with
        `loss`, or data the model cannot take.
    """
    _check_arguments(model, loss, jit_compile, batch_size)
    # fit compiles and runs the step in the model's strategy scope.
    with model.distribute_strategy.scope():
        return _census(model, x, y, loss, jit_compile, batch_size)


def _census(model, x, y, loss, jit_compile, batch_size) -> CensusReport:
    if not model.compiled:
        model.compile(optimizer="adam", loss=loss)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built and model.built:
        # fit builds the optimizer before its first trace under a strategy
        # (slot variables cannot be created inside a replica's trace).
        optimizer.build(model.trainable_variables)
    try:
        batch = _internals.fit_batch(x, y, batch_size)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"census() cannot take the data as fit would: {_first_line(error)}. "
            "Pass what model.fit accepts: arrays x (and y), or a tf.data.Dataset "
            f"of (x, y) batches. Received: x of type {type(x).__name__}") from None
    replicas = int(model.distribute_strategy.num_replicas_in_sync)
    batch, global_batch = _replica_share(batch, replicas)
    jit = bool(model.jit_compile) if jit_compile is None else jit_compile
    leaves = [(n, layer) for n, layer in walk_layers(model) if not isinstance(layer, keras.Model)]
    graph, scopes, hlo, note = _trace(model, batch, jit)
    records = step_ops.read_graph(graph, skip_scope=_other_replica)
    labels = _labels(records, _scopes_of(scopes), _optimizer_names(model))
    source = "graph"
    if hlo is not None:
        records, source = hlo, "optimized_hlo"
    layers = dict(leaves)
    policy = _policy(model, leaves)
    outputs = _output_layers(model, leaves) | _loss_readers(records, labels, layers)
    report = CensusReport(
        model_name=model.name,
        policy=policy,
        source=source,
        jit_compile=jit,
        batch_size=_batch_size(batch),
        op_counts=_op_counts(records),
        flops=_flops(records),
        unknown_flops=sum(1 for r in records if r.is_compute and r.flops is None),
        casts=_casts(records, labels),
        islands=_islands(records, labels, layers, policy, source, outputs),
        misfits=_misfits(records, labels, layers, outputs),
        note=note,
        replicas=replicas,
        global_batch_size=global_batch,
    )
    from tf_mixed.tools.census import findings as census_findings

    return dataclasses.replace(report, findings=census_findings.find(report, model))


def _replica_share(batch, replicas: int):
    """The first replica's share of a global batch, and the global batch size.

    Keras's ``one_step_on_data`` hands the batch it gets to
    ``strategy.run`` whole, but ``fit`` feeds it a distributed dataset: each
    of N replicas gets ``ceil(batch / N)`` rows (the first ones; TF's
    rebatching gives the first replicas the larger shares). Traced on the
    whole batch every replica would count N times its own work, so the
    census traces the first replica's share.
    """
    size = _batch_size(batch)
    if replicas <= 1 or size is None:
        return batch, size
    share = -(-size // replicas)
    return keras.tree.map_structure(lambda t: t[:share], batch), size


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def _check_arguments(model, loss, jit_compile, batch_size) -> None:
    check_model_kind(model, "census()", traced=False,
                     hint=" For a saved model run `python -m tf_mixed doctor PATH`.")
    if jit_compile is not None:
        _validate.boolean(jit_compile, "jit_compile", owner="census()",
                          valid="None (the model's own setting), True or False")
    if batch_size is not None:
        _validate.number(batch_size, "batch_size", integer=True, rule=lambda n: n >= 1,
                         owner="census()", valid="None or a positive integer, such as 64")
    if not model.compiled and loss is None:
        raise ValueError(
            f"census() traces the step fit runs, which needs a loss: model "
            f"'{model.name}' is not compiled. Pass loss=, such as "
            "loss='sparse_categorical_crossentropy', or compile the model first. "
            "Received: loss=None")
    if model.compiled and loss is not None:
        raise ValueError(
            f"model '{model.name}' is compiled already, with its own loss; census() "
            "traces that step. Pass loss=None, or compile the model with the loss "
            f"you want. Received: loss={loss!r}")


def _trace(model, batch, jit: bool):
    """(graph, {name scope: layer name}, HLO records or None, note) of one step."""
    import tensorflow as tf

    saved = bool(model.jit_compile)
    step: Any = None
    try:
        model.jit_compile = jit  # the step is made with the model's setting
        step, traced = _internals.keras_train_step(model)
    finally:
        model.jit_compile = saved
    note = ""
    if not traced:  # run_eagerly: the same ops, traced here to be read
        step = tf.function(step, jit_compile=jit)
        note = "The model runs eagerly (run_eagerly=True): its step was traced to be read."
    named = [(model.name, model)] + [(n, layer) for n, layer in walk_layers(model)]
    with _internals.recording_layer_scopes(named) as scopes:
        concrete = step.get_concrete_function(batch)
    hlo = None
    if jit:
        try:
            text = step.experimental_get_compiler_ir(batch)(stage="optimized_hlo")
            hlo = hlo_ops.read_hlo(text)
        except Exception as error:  # noqa: BLE001 - any failure: read the graph
            note = ("XLA's optimized HLO is unavailable here "
                    f"({type(error).__name__}: {_first_line(error)}); the traced graph "
                    "was read instead, so XLA's own dtype changes are not seen.")
    return concrete.graph, dict(scopes), hlo, note


def _other_replica(name: str) -> bool:
    """Ops of replicas after the first (the census is per replica)."""
    return any(_REPLICA.match(part) for part in name.split("/"))


def _scopes_of(scopes: dict[str, str]) -> dict[tuple[str, ...], str]:
    return {tuple(s.strip("/").split("/")): name for s, name in scopes.items() if s}


def _optimizer_names(model) -> set[str]:
    names = set()
    optimizer = getattr(model, "optimizer", None)
    while optimizer is not None:
        names.add(optimizer.name)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return names


def _matches(part: str, names: set[str]) -> bool:
    base = re.sub(r"(_\d+)+$", "", part)
    return part in names or base in {re.sub(r"(_\d+)+$", "", n) for n in names}


def _labels(records, scopes, optimizers) -> dict[str, str]:
    """Op name -> the layer it belongs to, or a label for the rest of the step."""
    by_name = {r.name: r for r in records}
    consumers: dict[str, list[str]] = {}
    for r in records:
        for source in r.inputs:
            consumers.setdefault(source, []).append(r.name)
    labels: dict[str, str] = {}

    def scoped(parts: tuple[str, ...]) -> str | None:
        for end in range(len(parts), 0, -1):
            found = scopes.get(parts[:end])
            if found is not None:
                return found
        return None

    def label(name: str, depth: int = 0) -> str:
        if name in labels:
            return labels[name]
        parts = tuple(name.split("/"))
        if parts and parts[0] == _GRADIENT:
            forward = parts[1:]
            for end in range(len(forward), 0, -1):  # the forward op's layer
                candidate = "/".join(forward[:end])
                if candidate in by_name and candidate != name:
                    labels[name] = label(candidate, depth + 1)
                    return labels[name]
            parts = forward
        found = scoped(parts)
        if found is None or found in _model_names:
            if any(p == "compile_loss" for p in parts):
                found = LOSS
            elif any(_matches(p, optimizers) for p in parts):
                found = OPTIMIZER
            else:  # Keras's cast in front of a layer: the layer that reads it
                outside = MODEL if found is not None else STEP
                readers = consumers.get(name, ()) if depth < 8 else ()
                found = next((label(c, depth + 1) for c in readers
                              if label(c, depth + 1) not in (MODEL, STEP, LOSS, OPTIMIZER)),
                             outside)
        labels[name] = found
        return found

    _model_names = {v for k, v in scopes.items() if len(k) == 1}
    for r in records:
        label(r.name)
    return labels


def _label_of(labels: dict[str, str], name: str) -> str:
    """The label of an op; an HLO op name may be a prefix of a graph op's."""
    if name in labels:
        return labels[name]
    parts = name.split("/")
    for end in range(len(parts) - 1, 0, -1):
        found = labels.get("/".join(parts[:end]))
        if found is not None:
            return found
    return STEP


def _op_counts(records) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for r in records:
        per_dtype = counts.setdefault(r.type, {})
        per_dtype[r.dtype] = per_dtype.get(r.dtype, 0) + 1
    return counts


def _flops(records) -> dict[str, int]:
    flops: dict[str, int] = {}
    for r in records:
        if r.is_compute and r.flops:
            flops[r.dtype] = flops.get(r.dtype, 0) + r.flops
    return flops


def _casts(records, labels) -> tuple[CastRow, ...]:
    groups: dict[tuple[str, str, str], list] = {}
    for r in records:
        if r.cast_from is not None:
            key = (_label_of(labels, r.name), r.cast_from, r.dtype)
            groups.setdefault(key, []).append(r)
    rows = []
    first: dict[str, int] = {}  # a layer's rows together, in the order the step meets them
    for layer, _, _ in groups:
        first.setdefault(layer, len(first))
    for (layer, source, target), casts in sorted(groups.items(),
                                                 key=lambda kv: first[kv[0][0]]):
        sizes = [c.cast_bytes for c in casts]
        rows.append(CastRow(layer, source, target, len(casts),
                            None if None in sizes else sum(sizes),
                            sum(c.from_constant for c in casts)))
    return tuple(rows)


def _policy(model, leaves) -> str:
    """The half policy most layers have; the most common one if none is half.

    A model with any layer computing in half precision is a half model: its
    float32 layers are what the census looks for.
    """
    counts: dict[str, int] = {}
    for _, layer in leaves:
        if is_input_layer(layer):
            continue
        name = getattr(layer.dtype_policy, "name", None)
        if name:
            counts[name] = counts.get(name, 0) + 1
    half = {n: c for n, c in counts.items() if _half_policy(n) is not None}
    counts = half or counts
    if not counts:
        return model.dtype_policy.name
    return max(counts, key=lambda n: (counts[n], n == model.dtype_policy.name))


def _half_policy(policy: str) -> str | None:
    try:
        compute = keras.DTypePolicy(policy).compute_dtype
    except ValueError:  # a quantized policy's name, say
        return None
    return compute if compute in HALF_DTYPES else None


def _islands(records, labels, layers, policy, source, outputs) -> tuple[Island, ...]:
    half = _half_policy(policy)
    if half is None:
        return ()
    from tf_mixed.policy import keep_float32

    rules = keep_float32.active()
    groups: dict[tuple[str, str], list] = {}
    for r in records:
        if r.is_compute and r.dtype in ("float32", "float64"):
            name = _label_of(labels, r.name)
            if name in layers:
                groups.setdefault((name, r.dtype), []).append(r)
    islands = []
    for (name, dtype), ops in groups.items():
        layer = layers[name]
        compute = keras.backend.standardize_dtype(layer.compute_dtype)
        if type(layer).__name__ == "Lambda":
            reason = "lambda"
        elif compute not in HALF_DTYPES and rules and rules.matches(layer):
            reason = "keep_float32"
        elif compute not in HALF_DTYPES:
            reason = "explicit_dtype"
        elif source == "optimized_hlo":
            reason = "xla_upcast"
        elif _inputs_not_wide(layer):
            reason = "inside_layer"
        else:
            reason = "float_input"
        flops = [r.flops for r in ops]
        islands.append(Island(name, type(layer).__name__, dtype, reason, compute, len(ops),
                              None if None in flops else sum(flops),
                              name in outputs))
    return tuple(islands)


def _inputs_not_wide(layer) -> bool:
    """Whether every input `layer` was called on in the model's graph is half
    precision or not a float (token ids, masks): its float32 products are
    then made inside it. False without a graph (nothing known)."""
    dtypes = [keras.backend.standardize_dtype(t.dtype) for t in _internals.call_inputs(layer)]
    return bool(dtypes) and not any(d in ("float32", "float64") for d in dtypes)


def _output_layers(model, leaves) -> set[str]:
    """Layers producing a model output (behind a float32 head: the layer it reads)."""
    by_id = {id(layer): name for name, layer in leaves}
    found = set()
    tensors = list(model_outputs(model))
    while tensors:
        history = _internals.keras_history(tensors.pop())
        if history is None or id(history.operation) not in by_id:
            continue
        found.add(by_id[id(history.operation)])
        if is_float32_head(history.operation, output=True):
            tensors.extend(_internals.call_inputs(history.operation))
    return found


def _loss_readers(records, labels, layers) -> set[str]:
    """Layers whose forward output the loss reads (outputs of a subclassed model too).

    Walks back from the loss's forward ops through ops of no layer (Keras's
    casts, the step's own) to the first layer met on each path.
    """
    by_name = {r.name: r for r in records}
    found: set[str] = set()
    stack = [r.name for r in records
             if labels.get(r.name) == LOSS and not r.name.startswith(_GRADIENT)]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        label = labels.get(name)
        if label in layers:
            found.add(label)
            continue
        record = by_name.get(name)
        if record is not None and label in (LOSS, MODEL, STEP):
            stack.extend(record.inputs)
    return found


def _misfits(records, labels, layers, outputs) -> tuple[Misfit, ...]:
    seen: dict[tuple[str, str], Misfit] = {}
    for r in records:
        if not r.is_compute or r.dtype not in TILE_MULTIPLES or r.name.startswith(_GRADIENT):
            continue
        name = _label_of(labels, r.name)
        if name not in layers:
            continue
        multiple = TILE_MULTIPLES[r.dtype]
        for dimension, value in r.dims:
            if value % multiple and (name, dimension) not in seen:
                seen[(name, dimension)] = Misfit(
                    name, type(layers[name]).__name__, r.dtype, dimension, value,
                    multiple, name in outputs)
    return tuple(seen.values())


def _batch_size(batch) -> int | None:
    first = keras.tree.flatten(batch)[0]
    dims = getattr(first, "shape", None)
    return int(dims[0]) if dims is not None and len(dims) and dims[0] is not None else None
