"""A per-layer dtype report for a Keras model, with the mixed-precision risks found."""

#     report = tf_mixed.audit(model, batch_size=64)
#     print(report)              # aligned table + findings + memory estimate
#     report.to_dict()           # the same as plain data (for JSON)
#
# or, for a saved model, ``python -m tf_mixed audit path/to/model.keras``.
#
# What is checked (each finding has a severity, the layer, and the fix):
#
# * ``half_output_activation`` (error): a softmax/sigmoid/log_softmax computed in
#   float16/bfloat16 produces a model output. The probabilities saturate and
#   Keras loses its exact logits shortcut in the cross-entropy.
# * ``half_output`` (warning): a model output is float16/bfloat16 at run time;
#   an error when the model is compiled with a top-k metric, which fails on it
#   (Keras computes top-k with TensorFlow's InTopKV2, float32 only). An output
#   declared half in the graph is confirmed by one traced call: KerasHub's
#   ``ReversibleEmbedding`` (every causal LM's tied output) declares its
#   compute dtype but returns float32, and is not reported.
# * ``half_range`` (error): a layer computing in float16/bfloat16 holds a
#   value that dtype cannot represent (a variable, or an adapted
#   ``Normalization``'s mean or variance: a feature ~1e4 wide has a variance
#   above float16's 65504): cast to the compute dtype at each call, it is inf
#   there, and an adapted Normalization outputs 0 for that feature
#   (`tf_mixed._internal.facts.out_of_range`).
# * ``half_resolution`` (error from a quarter of a standard deviation, else
#   warning): a layer computing in float16/bfloat16 whose statistics its dtype
#   cannot resolve (an adapted ``Normalization`` of a feature whose mean is large
#   against its spread: float16's spacing at 1e4 is 8), the error measured on
#   the layer's own statistics against float32 (`tf_mixed.tools.half_resolution`).
# * ``rounded_ids`` (error): a layer computing in float16/bfloat16 that is or
#   holds an ``Embedding`` takes its ids as floats straight from a model input:
#   Keras casts them to the half dtype first, which represents integers exactly
#   only up to 2048 (float16) / 256 (bfloat16) (`largest_exact_integer`), so
#   larger ids become other ids (bfloat16: 499 -> 500).
# * ``norm_overflow`` (warning): a normalization layer computing in float16
#   whose arithmetic is known to overflow there. In Keras 3 BatchNormalization,
#   LayerNormalization, GroupNormalization and RMSNormalization compute their
#   statistics in float32 internally (checked: inputs of +-300 normalise
#   correctly in float16), but UnitNormalization sums squares in float16: the
#   norm becomes inf once it passes ~256 and the output silently becomes 0.
# * ``not_multiple_of_8`` (warning for layers computing in half precision, info
#   otherwise or for output layers): Dense/RNN ``units``, Conv ``filters``,
#   Embedding ``output_dim``, attention ``key_dim``/``value_dim``. Tensor Cores
#   run float16 matrix products only on dimensions that are multiples of 8.
# * ``batch_not_multiple_of_8`` (warning): the batch size, when given.
# * ``policy_mismatch`` (warning): the model's policy differs from the global
#   one (a model built before ``tf_mixed.enable()``).
# * ``not_mixed`` (info): the model computes in float32 everywhere (and no
#   ``policy_mismatch`` said why): turn mixed precision on. Its memory line
#   then gives the float32 bytes alone, not float32 against itself.
# * ``policy_given`` (info), instead of ``policy_mismatch``: the model has a
#   half policy of its own while the global one is float32, as a model
#   given ``dtype="mixed_float16"`` at construction (KerasHub's ``dtype=``)
#   has: it computes as asked.
# * ``explicit_float32`` (info): layers with a float32 policy in a mixed model
#   (often deliberate; listed so they are not a surprise). tf_mixed's own
#   float32 heads are not listed.
# * ``healed`` (info): a layer that healing (`tf_mixed.callbacks.Heal`)
#   moved to float32 compute during training, read from the optimizer's state.
# * ``no_graph`` (info): a subclassed model has no symbolic graph, so
#   per-layer output dtypes and the memory estimate are unavailable. Its
#   outputs are read from a traced call of the built model (float32 inputs
#   shaped as it was built), so the output findings above still apply.
# * ``catalog_range`` (warning), ``catalog_narrow`` (info), ``catalog_no_kernel``
#   (error): a layer compared with the numerics catalog (docs/catalog.md) under
#   its half policy: inputs (``magnitudes=``) outside its safe range; without
#   magnitudes, a safe range narrower than 1e-3 .. 1e3; a layer that does not
#   run under its policy on a host like this one (no GPU).
# * float8 readiness (with ``float8=True``, or for a model with float8
#   layers; `tf_mixed.float8.readiness`): ``float8_flop_share`` (info),
#   ``float8_not_multiple_of_16`` and ``float8_keep_higher_precision``
#   (warnings for float8 layers, info for candidates).
#
# The activation-memory estimate adds up the bytes of every layer output for
# one batch, once as if everything were float32 and once with the dtypes the
# model really produces. It ignores gradients, optimizer slots and the
# framework's own buffers, so it is a guide to the ratio, not to peak memory.

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import tf_keras_check
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import (
    FLOAT32_HEADS,
    FLOAT_POLICIES,
    HALF_DTYPES,
    SQUASHING_ACTIVATIONS,
    activation_name,
    check_model_kind,
    is_float32_head,
    is_input_layer,
    keeps_float32_statistics,
    layer_outputs,
    model_outputs,
    out_of_range,
    published_layers,
    rounded_ids,
    walk_layers,
)
from tf_mixed.float8 import readiness as float8_readiness
from tf_mixed.models.cloning import model_input
from tf_mixed.policy import precision_map
from tf_mixed.tools import half_resolution

__all__ = ["AuditReport", "Finding", "LayerRow", "MemoryEstimate", "audit"]

SEVERITIES = ("error", "warning", "info")
DEFAULT_MEMORY_BATCH = 32
# Attributes that become matrix dimensions: (attribute, description).
_DIMENSIONS = (
    ("units", "units"),
    ("filters", "filters"),
    ("output_dim", "embedding output_dim"),
    ("key_dim", "attention key_dim"),
    ("value_dim", "attention value_dim"),
)
# Normalization layers whose float16 arithmetic is known to overflow.
_OVERFLOWING_NORMS = {
    "UnitNormalization": (
        "it sums squares in float16, so the norm overflows to inf once it "
        "passes ~256 and the output silently becomes 0"
    ),
}


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One layer of the report.

    Attributes:
      name: layer name (``outer/inner`` inside a nested model).
      class_name: the layer's class.
      compute_dtype: dtype the layer computes in.
      variable_dtype: dtype of its weights.
      output_dtype: dtype of its (first) output, or None without a graph.
      params: number of weights (trainable and not).
    """

    name: str
    class_name: str
    compute_dtype: str
    variable_dtype: str
    output_dtype: str | None
    params: int


@dataclasses.dataclass(frozen=True)
class Finding:
    """A risk found in the model.

    Attributes:
      severity: "error", "warning" or "info".
      code: a stable identifier, such as "half_output_activation".
      layer: the layer concerned, or None for the whole model.
      message: what is wrong.
      fix: what to do about it.
    """

    severity: str
    code: str
    layer: str | None
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.layer}: " if self.layer else ""
        return f"[{self.severity}] {where}{self.message} Fix: {self.fix}"


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of layer outputs for one training step.

    Attributes:
      batch_size: the batch size the estimate is for.
      float32_bytes: if every floating output were float32.
      policy_bytes: with the output dtypes the model really has.
      policy: the model's dtype policy name.
      exact: False when some output dimensions were unknown (counted as 1).
    """

    batch_size: int
    float32_bytes: int
    policy_bytes: int
    policy: str
    exact: bool = True

    @property
    def ratio(self) -> float:
        """policy_bytes / float32_bytes (1.0 for an empty model)."""
        return self.policy_bytes / self.float32_bytes if self.float32_bytes else 1.0


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What `audit` found: per-layer rows, findings and a memory estimate.

    ``str(report)`` prints an aligned table; ``to_dict()`` gives plain data.
    """

    model_name: str
    policy: str
    params: int
    rows: tuple[LayerRow, ...]
    findings: tuple[Finding, ...]
    memory: MemoryEstimate | None

    def by_code(self, code: str) -> list[Finding]:
        """The findings with this code."""
        return [f for f in self.findings if f.code == code]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready dicts and lists."""
        memory = None
        if self.memory is not None:
            memory = dataclasses.asdict(self.memory)
            memory["ratio"] = self.memory.ratio
        return {
            "model": self.model_name,
            "policy": self.policy,
            "params": self.params,
            "layers": [dataclasses.asdict(row) for row in self.rows],
            "findings": [dataclasses.asdict(f) for f in self.findings],
            "memory": memory,
        }

    def __str__(self) -> str:
        lines = [f"Model '{self.model_name}': policy {self.policy}, "
                 f"{self.params:,} parameters"]
        header = ("layer", "class", "compute", "variables", "output", "params")
        table = [header] + [
            (r.name, r.class_name, r.compute_dtype, r.variable_dtype,
             r.output_dtype or "-", f"{r.params:,}") for r in self.rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for i, row in enumerate(table):
            cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths)]
            cells.append(row[-1].rjust(widths[-1]))
            lines.append("  ".join(cells).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        if self.memory is not None:
            m = self.memory
            approx = "" if m.exact else " (unknown dimensions counted as 1)"
            prefix = (f"Activation memory, layer outputs of one step at batch size "
                      f"{m.batch_size}{approx}: ")
            if any(f.code == "not_mixed" for f in self.findings):
                # float32 against itself says nothing: what it is, and what to do.
                lines.append(f"{prefix}{_human(m.float32_bytes)} in float32 (mixed "
                             "precision stores most of it in half the bytes)")
            else:
                lines.append(f"{prefix}float32 {_human(m.float32_bytes)}, "
                             f"{m.policy} {_human(m.policy_bytes)} ({m.ratio:.2f}x)")
        if self.findings:
            lines.append(f"Findings ({len(self.findings)}):")
            lines.extend(f"  {finding}" for finding in self.findings)
        else:
            lines.append("Findings: none")
        return "\n".join(lines)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # unreachable


# ------------------------------------------------------------------ traversal


def _leaf_layers(model) -> list:
    """(qualified name, layer) for every layer that is not itself a model."""
    return [(name, layer) for name, layer in walk_layers(model)
            if not isinstance(layer, keras.Model)]


def _producer(tensor, layers):
    """The (name, layer) that produced a symbolic tensor."""
    for name, layer in layers:
        if any(out is tensor for out in layer_outputs(layer)):
            return name, layer
    history = _internals.keras_history(tensor)
    if history is None:
        return None, None
    op = history.operation
    if isinstance(op, keras.Model):  # a nested model: find the layer inside it
        inner = model_outputs(op)
        if history.tensor_index < len(inner):
            inner_layers = [(f"{op.name}/{n}", lay) for n, lay in _leaf_layers(op)]
            name, layer = _producer(inner[history.tensor_index], inner_layers)
            if layer is not None:
                return name, layer
    return getattr(op, "name", "?"), op


def _dtype(x) -> str:
    return keras.backend.standardize_dtype(x)


def _params(layer) -> int:
    return int(sum(math.prod(w.shape) for w in layer.weights))


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


# ------------------------------------------------------------------ audit


def audit(model, batch_size: int | None = None, *,
          check_global_policy: bool = True,
          float8: bool | None = None, magnitudes=None) -> AuditReport:
    """Lists each layer's dtypes and parameters and the mixed-precision risks.

    Args:
      model: a built `keras.Model` (Sequential, functional or subclassed;
        output dtypes and the memory estimate need a Sequential/functional
        model).
      batch_size: the training batch size. Checked for being a multiple of
        8 and used for the memory estimate (default 32 for the estimate).
      check_global_policy: report a model whose policy differs from the
        global one (off for a model loaded from a file, as in the CLI).
      float8: add the float8 readiness findings
        (`tf_mixed.float8.readiness`: share of FLOPs float8 can run,
        dimensions not a multiple of 16, layers to keep in higher
        precision). None (default): only for a model with float8 layers.
      magnitudes: what each layer's inputs reach, to compare with the numerics
        catalog (docs/catalog.md): a `tf_mixed.probe` report, or a mapping
        layer name -> max |input| (`tf_mixed.tools.catalog.input_magnitudes`
        reads it from a batch). A layer outside its safe range is a
        ``catalog_range`` warning; None lists layers with a narrow safe range
        (``catalog_narrow``, info).

    Returns:
      An `AuditReport`. The model is not modified.

    Raises:
      TypeError: `model` is not a Keras model, or `batch_size` not an int.
      ValueError: `batch_size` is not positive.
    """
    tf_keras_check.check_objects("tf_mixed.audit", model=model)
    check_model_kind(
        model, "audit()", traced=False,
        hint=(" To audit a saved model, run `python -m tf_mixed audit PATH`."
              if isinstance(model, (str, os.PathLike)) else ""))
    if batch_size is not None:
        _validate.number(batch_size, "batch_size", integer=True,
                         rule=lambda v: v >= 1, owner="audit()",
                         valid="a positive integer or None, such as 64")

    layers = _leaf_layers(model)
    policy = _effective_policy(model, layers)
    moved = precision_map.built_as(model)
    rows = []
    for name, layer in layers:
        outs = layer_outputs(layer)
        is_input = is_input_layer(layer)
        rows.append(LayerRow(
            name=name,
            class_name=type(layer).__name__,
            # An input layer computes nothing; its policy is meaningless.
            compute_dtype="-" if is_input else _dtype(layer.compute_dtype),
            variable_dtype="-" if is_input else _dtype(layer.variable_dtype),
            output_dtype=_output_dtype(layer, outs[0], moved) if outs else None,
            params=_params(layer),
        ))
    mixed = policy.startswith("mixed") or any(
        r.compute_dtype in HALF_DTYPES for r in rows)

    findings: list[Finding] = []
    outputs = model_outputs(model)
    output_layers = set()
    top_k = _top_k_metrics(model)
    run_time = _run_time_dtypes(model, outputs, force=bool(moved))
    for tensor, dtype in zip(outputs, run_time):
        name, layer = _producer(tensor, layers)
        output_layers.add(name)
        findings.extend(_output_findings(dtype, name, layer, top_k))
        if is_float32_head(layer, output=True):
            # The layer feeding a float32 head is the real output layer.
            for inner in _internals.call_inputs(layer):
                output_layers.add(_producer(inner, layers)[0])
    read = [] if outputs else _traced_outputs(model, layers)
    trace_error = read if isinstance(read, str) else None
    traced = [] if isinstance(read, str) else read
    for dtype, name, layer in traced:
        output_layers.add(name)
        findings.extend(_output_findings(
            dtype, name or f"{model.name} (its call)", layer, top_k))
    global_policy = keras.config.dtype_policy().name
    model_policy = model.dtype_policy.name
    given = _given_policy(model_policy, global_policy)
    if given:
        findings.append(Finding(
            "info", "policy_given", None,
            f"Model '{model.name}' has its own policy '{model_policy}' ("
            + ("moved there in place by tf_mixed: enable('auto', model=...) or the check "
               "of auto's choice on its own step" if moved else
               "given at construction: a dtype= argument, as KerasHub models take, or a "
               "global policy since changed")
            + f") while the global policy is '{global_policy}': it "
            f"computes under '{model_policy}'.",
            "nothing; layers you build later with dtype=None get the global policy."))
    elif check_global_policy and model_policy != global_policy:
        findings.append(Finding(
            "warning", "policy_mismatch", None,
            f"Model '{model.name}' has policy '{model_policy}' but the global policy "
            f"is '{global_policy}': it was built before the policy was set, "
            f"so it does not compute under '{global_policy}'.",
            "call tf_mixed.enable() before building the model, or use "
            "model = tf_mixed.convert(model)."))
    findings.extend(_optimizer_findings(model, rows))
    findings.extend(_healed_findings(model))
    findings.extend(catalog_findings(model, magnitudes))
    if not mixed and not any(f.code == "policy_mismatch" for f in findings):
        findings.append(Finding(
            "info", "not_mixed", None,
            f"Model '{model.name}' computes in float32 everywhere: mixed precision is "
            "off, so nothing runs in half precision and no memory is saved.",
            "turn mixed precision on: tf_mixed.enable() (\"auto\") before building the "
            "model, or model = tf_mixed.convert(model) for one already built or loaded."))
    if not outputs and traced:
        findings.append(Finding(
            "info", "no_graph", None,
            f"Model '{model.name}' ({type(model).__name__}) has no symbolic "
            "graph: its outputs were read from a traced call, but per-layer "
            "output dtypes and activation memory are not reported.",
            "audit a Sequential or functional version of the model for these."))
    elif not outputs and trace_error:
        findings.append(Finding(
            "info", "no_graph", None,
            f"Model '{model.name}' ({type(model).__name__}) has no symbolic "
            f"graph, and a traced call to read its outputs failed ({trace_error}), "
            "so output dtypes and activation memory are not reported.",
            "check its outputs are float32, or audit a Sequential or "
            "functional version of the model."))
    elif not outputs:
        findings.append(Finding(
            "info", "no_graph", None,
            f"Model '{model.name}' ({type(model).__name__}) has no symbolic "
            "outputs and is not built, so output dtypes and activation memory "
            "are not reported.",
            "build it (call it on a batch) and audit again, or audit a "
            "Sequential or functional version of the model."))
    published = published_layers(model)
    for name, layer in layers:
        findings.extend(_layer_findings(name, layer, mixed, name in output_layers,
                                        published.get(name, "")))
        findings.extend(_ids_findings(name, layer))
    findings.extend(Finding(*found) for found in half_resolution.findings(layers))
    if batch_size is not None and batch_size % 8:
        findings.append(Finding(
            "warning", "batch_not_multiple_of_8", None,
            f"batch_size={batch_size} is not a multiple of 8, so the batch "
            "dimension of every matrix product misses the Tensor Core tiles.",
            f"use batch_size={_round8(batch_size)} (or another multiple of 8)."))

    if float8 or (float8 is None and any(float8_readiness.is_float8(layer)
                                         for _, layer in layers)):
        findings.extend(Finding(*found)
                        for found in float8_readiness.findings(model))

    memory = _memory(layers, policy, batch_size or DEFAULT_MEMORY_BATCH, moved) \
        if outputs else None
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    total = sum(r.params for r in rows)
    return AuditReport(model.name, policy, total, tuple(rows), tuple(findings),
                       memory)


def _healed_findings(model) -> list[Finding]:
    """Layers healing moved to float32 (the optimizer's state says which)."""
    from tf_mixed.scaling.optimizer import step_state_of

    state = step_state_of(getattr(model, "optimizer", None))
    if state is None:
        return []
    attached = state.attribution.attached
    names = attached.read().healed if attached is not None else \
        state.attribution.pending_healed()
    return [Finding(
        "info", "healed", name,
        f"Layer '{name}' computes in float32 because healing moved it there during "
        "training (its outputs or gradients kept overflowing the half dtype; "
        "docs/healing.md).",
        "nothing to do; to keep it there from the start, name it in "
        "tf_mixed.enable(keep_float32=...).") for name in names]


def catalog_findings(model, magnitudes=None) -> list[Finding]:
    """The numerics catalog's findings for `model` (`tf_mixed.tools.catalog.model_check`).

    Args:
      model: the model audited.
      magnitudes: None, a `tf_mixed.probe` report, or layer name -> max |input|.

    Raises:
      TypeError: `magnitudes` is none of those.
    """
    from collections.abc import Mapping

    from tf_mixed.tools.catalog import model_check

    if magnitudes is not None and not isinstance(magnitudes, Mapping):
        if not hasattr(magnitudes, "layers"):
            raise TypeError(
                "magnitudes must be a tf_mixed.probe report or a mapping of layer name to "
                "max |input|, such as {'dense': 12.5}. Received: magnitudes="
                f"{magnitudes!r} (of type {type(magnitudes).__name__})")
        magnitudes = model_check.magnitudes_from_probe(model, magnitudes)
    return [Finding(n.severity, n.code, n.layer, n.message, n.fix)
            for n in model_check.check_model(model, magnitudes)]


def _given_policy(model_policy: str, global_policy: str) -> bool:
    """Whether the model was given a half policy of its own (``dtype=`` at
    construction) while the global policy is float32: not "built before the
    policy was set", which is a float32 model under a mixed global policy."""
    compute = (keras.DTypePolicy(model_policy).compute_dtype if model_policy in FLOAT_POLICIES
               else None)
    return global_policy == "float32" and compute in HALF_DTYPES


def _output_dtype(layer, tensor, moved) -> str:
    """A layer's output dtype: its symbolic tensor's, or, for a layer moved in
    place (``moved``: `tf_mixed.policy.precision_map.built_as`) whose output
    followed its compute dtype when built, its compute dtype now."""
    declared = _dtype(tensor.dtype)
    was = moved.get(getattr(layer, "path", None) or layer.name)
    if was is None or is_input_layer(layer) or declared != keras.DTypePolicy(was).compute_dtype:
        return declared
    return _dtype(layer.compute_dtype)


def _run_time_dtypes(model, outputs, force: bool = False) -> list[str]:
    """The dtype of each output at run time, read from one traced call.

    Traced when an output is declared half, or with ``force`` (a model
    moved in place: its symbolic tensors keep the dtypes it was built with).

    A layer can declare one dtype symbolically and return another:
    KerasHub's ``ReversibleEmbedding`` (the tied output of every causal LM)
    declares its compute dtype but returns float32 (``autocast=False``,
    measured on KerasHub 0.32). Only outputs declared half are checked (one
    ``tf.function`` trace of the model on its own input specs, no step run,
    no weight touched); the declared dtype stands when the trace fails.
    """
    declared = [_dtype(t.dtype) for t in outputs]
    if not force and not any(d in HALF_DTYPES for d in declared):
        return declared
    import tensorflow as tf

    specs = keras.tree.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype), model_input(model))
    try:
        traced = tf.function(lambda inputs: model(inputs, training=False),
                             autograph=False).get_concrete_function(specs)
    except Exception:  # the declared dtypes stand
        return declared
    got = [_dtype(o.dtype) for o in keras.tree.flatten(traced.structured_outputs)]
    return got if len(got) == len(declared) else declared


def _optimizer_findings(model, rows) -> list[Finding]:
    """Keras's own loss-scale wrapper on a float16 model: ``wrap_optimizer`` forgotten.

    Under ``mixed_float16``, ``model.compile`` wraps an unwrapped optimizer in
    ``keras.optimizers.LossScaleOptimizer`` without a word; tf_mixed cannot
    see ``compile`` (Keras has no public hook there), so this finding, and
    ``LossScaleMonitor`` which reports it, are where it is said.
    """
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return []
    from tf_mixed.scaling.optimizer import LossScaleOptimizer

    if isinstance(optimizer, LossScaleOptimizer):
        return []
    if not any(r.compute_dtype == "float16" for r in rows):
        return []
    inner = type(optimizer.inner_optimizer).__name__
    return [Finding(
        "warning", "keras_loss_scale_optimizer", None,
        f"Model '{model.name}' computes in float16 and is compiled with Keras's "
        f"own keras.optimizers.LossScaleOptimizer around {inner} (model.compile "
        "adds it under mixed_float16 when the optimizer is not wrapped): under "
        "MirroredStrategy it writes -inf into the weights when only a later "
        "replica overflows, and its scale has no floor (python -m tf_mixed "
        "check lists these defects).",
        f"compile with optimizer={wrap_advice()}, or "
        f"{wrap_advice('model.optimizer')} to keep its scale.")]


def wrap_advice(optimizer: str = "optimizer") -> str:
    """The ``wrap_optimizer`` call that scales the loss under the current global policy.

    ``wrap_optimizer`` scales dynamically under a global ``mixed_float16``;
    under any other global policy it passes a plain optimizer through unless
    ``force=True``. A model given ``dtype="mixed_float16"`` itself (KerasHub's
    ``dtype=``) while the global policy is float32 needs ``force=True``.
    """
    if keras.config.dtype_policy().name == "mixed_float16":
        return f"tf_mixed.wrap_optimizer({optimizer})"
    return (f"tf_mixed.wrap_optimizer({optimizer}, force=True) (force=True: the global "
            f"policy is '{keras.config.dtype_policy().name}', under which wrap_optimizer "
            "passes the optimizer through)")


def _effective_policy(model, layers) -> str:
    """The policy most layers have (a loaded model's own policy can differ)."""
    counts: dict[str, int] = {}
    for _, layer in layers:
        if is_input_layer(layer) or type(layer).__name__ in FLOAT32_HEADS:
            continue
        name = getattr(layer.dtype_policy, "name", None)
        if name:
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return model.dtype_policy.name
    return max(counts, key=lambda name: (counts[name], name == model.dtype_policy.name))


def _traced_outputs(model, layers) -> list[tuple[str, str | None, Any]] | str:
    """``(dtype, producer name, producer layer)`` per output of a subclassed model.

    The model is called once in a ``tf.function`` trace (no step is run, no
    weight is touched) on float32 inputs shaped as it was built
    (``model.get_build_config()``); the layer whose ``call`` returned each
    output is found by recording every layer's outputs. An output no layer
    returned as is (an op in the model's own ``call``) has no producer.

    Returns:
      One entry per output; [] for a model (or a layer of it) that is not
      built, or whose build shapes do not say how to call it (several
      ``build`` arguments); the error in one line when the traced call
      raised.
    """
    import tensorflow as tf

    if not (model.built and all(layer.built for _, layer in layers)):
        return []  # a trace would create the missing weights inside a graph
    shapes = (model.get_build_config() or {}).get("input_shape")
    if shapes is None:
        return []
    specs = keras.tree.map_shape_structure(
        lambda shape: tf.TensorSpec(shape, "float32"), shapes)
    found: list[tuple[str, str | None, Any]] = []

    def trace(inputs):
        found.clear()  # only the last trace counts
        outputs = model(inputs, training=False)
        for tensor in keras.tree.flatten(outputs):
            name, layer = produced.get(id(tensor), (None, None))
            found.append((_dtype(tensor.dtype), name, layer))

    with _internals.recording_layer_outputs(layers) as produced:
        try:
            tf.function(trace, autograph=False).get_concrete_function(specs)
        except Exception as error:  # the model's own call: report, not crash
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return f"{type(error).__name__}: {first}"
    return found


def _top_k_metrics(model) -> list[str]:
    """The top-k metrics the model is compiled with, by name."""
    if not getattr(model, "compiled", False):
        return []
    found: list[str] = []

    def visit(value):
        if isinstance(value, dict):
            name = value.get("class_name")
            if isinstance(name, str) and "topk" in name.lower():
                found.append(name)
                return
            for inner in value.values():
                visit(inner)
        elif isinstance(value, (list, tuple)):
            for inner in value:
                visit(inner)
        elif isinstance(value, str) and "top_k" in value.lower():
            found.append(value)

    try:
        config = model.get_compile_config() or {}
    except Exception:  # a compile argument Keras cannot serialise
        return []
    visit(config.get("metrics"))
    visit(config.get("weighted_metrics"))
    return found


def _output_findings(tensor, name, layer, top_k=()) -> list[Finding]:
    dtype = tensor if isinstance(tensor, str) else _dtype(tensor.dtype)
    if dtype not in HALF_DTYPES:
        return []
    activation = activation_name(layer) if layer is not None else None
    if activation in SQUASHING_ACTIVATIONS:
        return [Finding(
            "error", "half_output_activation", name,
            f"the model output is a {activation} computed in {dtype}: "
            "probabilities saturate and the loss loses Keras's exact "
            "logits shortcut (for logits [0, 30, -30] the cross-entropy is "
            "clipped to 16.1 instead of 60).",
            f"give '{name}' activation=None and add "
            f"tf_mixed.OutputActivation('{activation}') after it, or "
            "run model = tf_mixed.convert(model).")]
    if top_k:
        return [Finding(
            "error", "half_output", name,
            f"the model output is {dtype} and the model is compiled with the "
            f"top-k metric {top_k[0]}: Keras computes it with TensorFlow's "
            "InTopKV2, which takes float32 only, so fit fails at its first step.",
            f"add tf_mixed.Float32Output() after '{name}' (or give it "
            "dtype='float32').")]
    return [Finding(
        "warning", "half_output", name,
        f"the model output is {dtype}, so the loss and metrics see "
        "half-precision values.",
        f"add tf_mixed.Float32Output() after '{name}' (or give it "
        "dtype='float32').")]


def _layer_findings(name, layer, mixed, is_output, origin: str = "") -> list[Finding]:
    found = []
    cls = type(layer).__name__
    compute = _dtype(layer.compute_dtype)
    beyond = None if is_input_layer(layer) else out_of_range(layer)
    if beyond is not None:
        what, largest, limit = beyond
        found.append(Finding(
            "error", "half_range", name,
            f"{cls} computes in {compute} with its {what} reaching {largest:.4g}, "
            f"beyond {compute}'s largest value {limit:.6g}: Keras casts it to {compute} "
            "at each call, where it is inf, so the outputs it touches are wrong (an "
            "adapted Normalization outputs 0 for that feature, silently).",
            f"keep '{name}' in float32: tf_mixed.convert(model) does for Normalization "
            f"and Discretization; or create it with dtype='float32'."))
    if cls in _OVERFLOWING_NORMS and compute == "float16":
        found.append(Finding(
            "warning", "norm_overflow", name,
            f"{cls} computes in float16: {_OVERFLOWING_NORMS[cls]}.",
            "create it with dtype='float32' (or 'mixed_bfloat16').",
        ))
    for attribute, what in _DIMENSIONS:
        value = getattr(layer, attribute, None)
        if isinstance(value, bool) or not isinstance(value, int) or value % 8 == 0:
            continue
        severity = "warning" if compute in HALF_DTYPES and not is_output else "info"
        note = " (an output layer: pad only if the cost matters)" if is_output else ""
        if origin and not is_output:  # a published design fixes its widths: nothing to resize
            severity, note = "info", f" (a {origin} layer: its design fixes the width)"
        found.append(Finding(
            severity, "not_multiple_of_8", name,
            f"{cls} {what}={value} is not a multiple of 8; Tensor Cores need "
            f"multiples of 8 for float16{note}.",
            "nothing to resize (pad only layers you added)." if origin and not is_output
            else f"use {attribute}={_round8(value)}."))
    explicit32 = (
        mixed and compute == "float32" and not is_input_layer(layer)
        and not is_float32_head(layer, output=is_output)
        and getattr(layer.dtype_policy, "name", None) == "float32")
    if explicit32 and keeps_float32_statistics(layer):
        # enable() and convert() keep it so themselves: there is no dtype argument to drop.
        found.append(Finding(
            "info", "explicit_float32", name,
            f"{cls} computes in float32 in a mixed-precision model: tf_mixed keeps "
            "Normalization and Discretization there (their adapted statistics overflow or "
            "round in half precision).",
            "nothing."))
    elif explicit32:
        found.append(Finding(
            "info", "explicit_float32", name,
            f"{cls} has a float32 policy in a mixed-precision model.",
            "nothing, if deliberate (outputs, numerically sensitive layers); "
            "otherwise drop its dtype argument."))
    return found


def _ids_findings(name, layer) -> list[Finding]:
    """Token ids a half-precision layer rounds on their way in (`rounded_ids`)."""
    for tensor in _internals.call_inputs(layer):
        found = rounded_ids(layer, tensor)
        if found is None:
            continue
        input_dim, limit = found
        dtype = _dtype(layer.compute_dtype)
        source = _internals.keras_history(tensor).operation.name  # type: ignore[union-attr]
        rounded = int(float(keras.ops.cast(float(limit + 1), dtype)))
        return [Finding(
            "error", "rounded_ids", name,
            f"{type(layer).__name__} reads its input as indices (an Embedding of "
            f"input_dim={input_dim}) but takes them as floats from input "
            f"'{source}' and computes in {dtype}, so Keras casts the ids to {dtype} "
            f"on the way in: ids above {limit} are rounded ({limit + 1} becomes "
            f"{rounded}), and become other tokens or fall out of range.",
            f"keep '{name}' in float32 (tf_mixed.convert(model) does; or "
            f"tf_mixed.enable(..., keep_float32=['{name.rsplit('/', 1)[-1]}'])), or "
            "feed the ids as integers: keras.Input(..., dtype='int32').")]
    return []


def _memory(layers, policy, batch_size, moved) -> MemoryEstimate:
    float32_bytes = policy_bytes = 0
    exact = True
    for _, layer in layers:
        if is_input_layer(layer):
            continue  # inputs are data, not activations
        for tensor in layer_outputs(layer):
            dims = list(tensor.shape)[1:]
            if any(d is None for d in dims):
                exact = False
            count = batch_size * math.prod(d or 1 for d in dims)
            dtype = _output_dtype(layer, tensor, moved)
            size = _itemsize(dtype)
            policy_bytes += count * size
            float32_bytes += count * (4 if "float" in dtype else size)
    return MemoryEstimate(batch_size, float32_bytes, policy_bytes, policy, exact)


def _itemsize(dtype: str) -> int:
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return max(1, int(digits) // 8) if digits else 4
