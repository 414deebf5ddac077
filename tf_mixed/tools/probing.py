"""Measure a model's numerics in half precision against float32, layer by layer."""

#     report = tf_mixed.probe(model, x, y, loss="sparse_categorical_crossentropy")
#     print(report)            # per-layer and per-variable table, scale, advice
#     report.plot("probe.png")
#
# How: the model is cloned twice with the same weights, once computing in
# the half-precision policy and once in float32. Each clone is wrapped in a
# multi-output model over every top-level layer's output, and both run the
# same batch with ``training=True`` (random layers aside, see below; the
# clones, not the model, so BatchNorm statistics and other state of the model
# stay as they were):
#
# * forward: each layer's half-precision output against the float32 one;
# * backward, half run: the gradient of the loss times the current loss
#   scale with respect to each layer's output (output gradients only: no
#   weight gradients are taken in half precision, whose CPU float16 kernels
#   can be very slow, e.g. the Conv2D filter gradient);
# * backward, float32 run: the gradient of the unscaled loss with respect to
#   every trainable variable and every layer output. What float16 would do to
#   these at a loss scale is computed from them: scaled values above 65504
#   overflow, below 2^-25 round to zero, below 2^-14 are subnormal. The
#   recommended scale is the largest power of two at which none of those
#   gradients of half-precision layers overflows.
#
# Random layers (every layer, or layer inside a layer, holding a
# `keras.random.SeedGenerator`: Dropout, GaussianNoise, SpatialDropout, the
# dropout inside MultiHeadAttention, ...) run as in inference in both copies:
# Dropout passes its input through and noise layers add nothing, so the two
# runs cannot draw different values (a float16 and a float32 draw from the
# same seed give different masks: measured, about half the elements of a
# rate-0.5 mask differ) and a random layer is never blamed for its own draw.
# Every other layer runs as in training.
#
# Which layers compute in float32 in the half copy: every layer the model
# itself keeps in float32 (in a mixed model: layers converted with
# ``keep_float32``, given ``dtype="float32"``, or kept by an `enable` rule);
# in a float32-built model, tf_mixed's float32 heads, the layers the
# ``keep_float32`` rules of the active `tf_mixed.enable` match, and layers
# that would round float token ids on their way into an Embedding (as
# `tf_mixed.convert` keeps them). So a model `tf_mixed.convert` fixed probes
# as it trains.
#
# Layer names are those of `tf_mixed.audit`: a layer inside a nested model is
# its own row, named ``outer/inner`` (the clones inline nested models, so the
# inner outputs are tensors of one graph), and an overflow there is reported
# and fixed at that innermost layer. Lambda layers are cloned from their
# in-memory function (`tf_mixed.models.cloning`).

from __future__ import annotations

import math
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal import losses as _losses
from tf_mixed._internal import tf_keras_check
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import (
    COMPUTE_DTYPES,
    FLOAT32_HEADS,
    FLOAT_POLICIES,
    HALF_DTYPES,
    MIXED_FLOAT16,
    POLICY_ALIASES,
    check_model_kind,
    half_policy,
    is_input_layer,
    out_of_range,
    policy_fix,
)
from tf_mixed.float8 import readiness as float8_readiness
from tf_mixed.float8 import reading as float8_reading
from tf_mixed.models import cloning as _cloning
from tf_mixed.policy import keep_float32 as keep_float32_rules
from tf_mixed.policy import precision_map
from tf_mixed.tools.probe_report import DTYPE_LIMITS, LayerStats, ProbeReport, VariableStats

__all__ = ["probe"]

# The names `probe(policy=...)` takes: the half-precision entries of the table.
_POLICY_ALIASES = {name: policy for name, policy in POLICY_ALIASES.items()
                   if COMPUTE_DTYPES.get(policy) in HALF_DTYPES}
# Keras's and tf_mixed's default initial loss scale for float16.
_DEFAULT_FLOAT16_SCALE = 2.0**15
# A layer whose output differs this much from float32 is named in the advice.
_LARGE_ERROR = 0.1
_FLOAT16_MAX = DTYPE_LIMITS["float16"][0]
_FLOAT16_ZERO_BELOW = 2.0**-25  # half the smallest subnormal: rounds to 0
_FLOAT16_NORMAL = DTYPE_LIMITS["float16"][1]


def probe(model: keras.Model, x, y=None, *, loss=None, policy: str | None = None,
          batches: int = 1, half_gradients: bool | None = None) -> ProbeReport:
    """Measures every layer in half precision against float32 on real batches.

    Args:
      model: a built Sequential or functional `keras.Model`, float32-built
        or mixed. It is not modified.
      x: the inputs: an array (or a structure of arrays, as the model takes
        them), split into `batches` consecutive batches; or a `tf.data`
        dataset of ``(x, y)`` batches, of which the first `batches` are used.
      y: the targets for an array `x`.
      loss: what to differentiate, as ``model.compile`` takes it: a Keras
        loss name, `keras.losses.Loss` or callable ``loss(y_true, y_pred)``,
        or for several outputs a list (one per output) or a dict keyed by
        output name; None for the compiled model's loss (the per-output
        losses are summed, unweighted).
      policy: the half-precision policy to probe, "mixed_float16" or
        "mixed_bfloat16" (aliases "fp16", "bf16"). None: the model's own
        half dtype if it has half-precision layers, else the global policy
        if it is mixed, else "mixed_float16". A float32-built model is
        probed as `tf_mixed.convert` would run it (inputs and tf_mixed's
        float32 heads stay float32); in a mixed model every float32 layer
        stays float32.
      batches: how many batches to measure, at least 1.
      half_gradients: True to measure which output gradients overflow in a
        half-precision backward pass at the current scale; False to predict
        it from the float32 gradients (|gradient| * scale above the dtype's
        largest finite value). None: measure, except for float16 on a host
        without a GPU, where TF's float16 convolution filter gradient takes
        seconds per op.

    Returns:
      A `ProbeReport`.

    Raises:
      TypeError: `model` is not a Keras model, or is subclassed; `batches`
        is not an int.
      ValueError: the model is not built; `x` does not fit its inputs; `x`
        or `y` holds inf/NaN (named with the batch, example and column); `y`
        is missing; `loss` is missing and the model not compiled with one;
        `batches` < 1 or more than the examples; `policy` is unknown.
    """
    tf_keras_check.check_objects("tf_mixed.probe", model=model)
    check_model_kind(
        model, "probe()",
        why_traced="its layer outputs exist only inside Python code",
        fix="Probe a Sequential or functional version of it.")
    found = precision_map.survey(model)
    loss_fn = _losses.resolve_named(loss, found.output_names, model, "probe()")
    return probe_surveyed(found, x, y, loss_fn, policy=policy, batches=batches,
                          half_gradients=half_gradients)


def probe_surveyed(found: precision_map.Survey, x, y, loss_fn: Callable, *,
                   policy: str | None = None, batches: int = 1,
                   half_gradients: bool | None = None) -> ProbeReport:
    """`probe` of a model already checked and surveyed (`precision_map.survey`),
    its loss resolved.

    `tf_mixed.plan` calls it with the survey it made once and the loss it
    resolved once (`tf_mixed._internal.losses.resolve_named`, on the survey's
    output names), so the probe reads that walk and that loss: it asks
    nothing more about the model than the survey holds and the copies it
    makes (`tf_mixed.models.cloning.clone`) give.

    Args:
        found: The model's survey.
        x, y, policy, batches, half_gradients: As `probe` takes them.
        loss_fn: ``loss_fn(y_true, y_pred) -> float32 scalar``.

    Returns and errors (the model's kind and loss aside) as `probe`'s.
    """
    model = found.model
    batches_list = _batches(model, x, y, batches)
    target = _resolve_policy(found, policy)
    half_dtype = keras.DTypePolicy(target).compute_dtype
    kept = _kept_float32(found, target)
    mixed = found.half_policy is not None  # made mixed: its float32 layers stay so
    # The half and the float32 copy, nested models inlined (each leaf layer's
    # outputs are tensors of one graph, which the copy records), random
    # layers drawing nothing (see the module's comment); then a tap on each.
    copies = [_cloning.clone(model, policy_for, inline_nested=True, random_draws=False)
              for policy_for in (lambda layer: _half_dtype(layer, target, kept, mixed),
                                 _float32_dtype)]
    half, ref = (_Tap(copy) for copy in copies)
    current = _current_scale(model, half_dtype)
    if half_gradients is None:
        # Measuring means a float16 backward pass; on a CPU TF's float16
        # Conv2D filter gradient (computed with every input gradient) takes
        # seconds per op (measured: the probe of the bench CNN took 44 s
        # instead of 0.4 s), so there the float32 gradients predict it.
        half_gradients = half_dtype != "float16" or bool(tf.config.list_logical_devices("GPU"))
    acc = _Accumulator(half, ref)
    for xb, yb in batches_list:
        acc.add(xb, yb, loss_fn, current, bool(half_gradients))
    layers = acc.layer_stats()
    # bfloat16 has float32's range: no loss scale to recommend.
    recommended = 1.0 if half_dtype == "bfloat16" else _recommended_scale(layers, acc, half)
    variables = acc.variable_stats(current, recommended)
    underflow, entries = acc.underflow(recommended)
    first, where = _first_nonfinite(layers)
    beyond = _out_of_range(half, target)
    advice = beyond[0] if beyond else _advice(
        layers, first, where, target, current, recommended, half_dtype)
    return ProbeReport(
        model_name=model.name, policy=target, batches=len(batches_list),
        examples=sum(_length(xb) for xb, _ in batches_list), layers=tuple(layers),
        variables=tuple(variables), current_scale=current,
        recommended_scale=recommended, underflow_at_recommended=underflow,
        gradient_entries=entries, first_nonfinite=first, first_nonfinite_in=where,
        advice=advice, half_gradients="measured" if half_gradients else "predicted",
        float8=_float8_section(model, batches_list[0], loss_fn), out_of_range=beyond)


def _out_of_range(half, policy: str) -> tuple[str, ...]:
    """One sentence per half-run layer computing with a value its dtype cannot hold."""
    found = []
    for name, layer, _ in half.layers:
        beyond = out_of_range(layer)
        if beyond is None:
            continue
        what, largest, limit = beyond
        dtype = keras.backend.standardize_dtype(layer.compute_dtype)
        argument = keep_float32_rules.argument([name.rsplit("/", 1)[-1]])
        found.append(
            f"Layer '{name}' ({type(layer).__name__}) computes in {dtype} with its {what} "
            f"reaching {largest:.4g}, beyond {dtype}'s largest value {limit:.6g}, so that "
            f"value is inf there and the outputs it touches are wrong (an adapted "
            f"Normalization outputs 0): keep it in float32 with tf_mixed.enable("
            f"'{policy}', {argument}) or model = tf_mixed.convert(model, {argument}).")
    return tuple(found)


def _float8_section(model, batch, loss_fn) -> tuple:
    """Float8 scales and saturation on the first batch, for a float8 model."""
    if not any(float8_readiness.is_float8(layer) for layer in model.layers):
        return ()
    return float8_reading.state(model, batch[0], batch[1], loss=loss_fn).tensors


# ------------------------------------------------------------------ checks


def _resolve_policy(found: precision_map.Survey, policy) -> str:
    if policy is not None:
        name = policy.name if isinstance(policy, keras.DTypePolicy) else policy
        key = name.strip().lower() if isinstance(name, str) else name
        if key not in _POLICY_ALIASES:
            raise ValueError(
                "policy must be a half-precision policy: "
                f"{', '.join(_POLICY_ALIASES)}, or None. Received: policy={policy!r}")
        return _POLICY_ALIASES[key]
    if found.half_policy is not None:  # the model's own half dtype
        return found.half_policy
    return half_policy(keras.config.dtype_policy().compute_dtype) or MIXED_FLOAT16


def _length(xb) -> int:
    return int(keras.tree.flatten(xb)[0].shape[0])


def _batches(model, x, y, batches) -> list[tuple[Any, Any]]:
    _validate.number(batches, "batches", integer=True, rule=lambda v: v >= 1,
                     valid="a positive integer, such as 1", owner="probe()")
    if isinstance(x, tf.data.Dataset):
        out = []
        for element in x.take(batches):
            if not isinstance(element, (tuple, list)) or len(element) < 2:
                raise ValueError(
                    "The dataset must yield (x, y) batches so the loss has "
                    f"targets. Received an element of type {type(element).__name__}.")
            out.append((element[0], element[1]))
        if not out:
            raise ValueError("The dataset x is empty: no batch to probe.")
        for xb, _ in out:
            _check_fits(model, xb)
        _check_finite(out)
        return out
    if x is None:
        raise ValueError("x is None: pass a batch of inputs. Received: x=None")
    if y is None:
        raise ValueError(
            "y is missing: the loss needs targets for x. Pass y=... (the "
            "labels or targets of the batch). Received: y=None")
    x = keras.tree.map_structure(np.asarray, x)
    y = keras.tree.map_structure(np.asarray, y)
    _check_fits(model, x)
    n = _length(x)
    if batches > n:
        raise ValueError(
            f"batches={batches} is more than the {n} examples in x: each batch "
            "needs at least one example.")
    if _length(y) != n:
        raise ValueError(
            f"x has {n} examples but y has {_length(y)}. Received: y of shape "
            f"{keras.tree.flatten(y)[0].shape}")
    bounds = np.linspace(0, n, batches + 1).astype(int)
    out = [(keras.tree.map_structure(lambda a, s=s, e=e: a[s:e], x),
            keras.tree.map_structure(lambda a, s=s, e=e: a[s:e], y))
           for s, e in zip(bounds[:-1], bounds[1:])]
    _check_finite(out)
    return out


def _check_finite(batches) -> None:
    """Raises if the data itself holds inf/NaN: a data problem, not precision."""
    for index, (xb, yb) in enumerate(batches):
        for role, structure in (("x", xb), ("y", yb)):
            arrays = keras.tree.flatten(structure)
            for k, array in enumerate(arrays):
                a = np.asarray(keras.ops.convert_to_numpy(array))
                if not np.issubdtype(a.dtype, np.floating) or np.isfinite(a).all():
                    continue
                where = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
                count = int(np.count_nonzero(~np.isfinite(a)))
                part = f"{role}[{k}]" if len(arrays) > 1 else role
                column = (f", column {where[1]}" if len(where) == 2
                          else f", position {where[1:]}" if len(where) > 2 else "")
                raise ValueError(
                    f"The data is not finite: {part} holds {count} inf/NaN value(s), the "
                    f"first ({a[where]}) in batch {index}, example {where[0]}{column}. "
                    "This is a data problem, not a precision one (float32 cannot "
                    "compute with it either): clean or filter the data, then probe again.")


def _check_fits(model, x) -> None:
    arrays = keras.tree.flatten(x)
    inputs = keras.tree.flatten(model.inputs)
    if len(arrays) != len(inputs):
        raise ValueError(
            f"Model '{model.name}' takes {len(inputs)} input(s) but x holds "
            f"{len(arrays)} array(s).")
    for array, spec in zip(arrays, inputs):
        shape, expected = tuple(array.shape), tuple(spec.shape)
        fits = len(shape) == len(expected) and all(
            e is None or e == s for s, e in zip(shape[1:], expected[1:]))
        if not fits:
            raise ValueError(
                f"x does not fit model '{model.name}': it takes batches of shape "
                f"{expected}, received x of shape {shape}. Pass a batch shaped "
                "like the model's training data.")


# ------------------------------------------------------------------ clones


def _half_dtype(layer, target, kept: frozenset = frozenset(),
                mixed: bool = False) -> str | None:
    """The policy `layer` gets in the half clone (None: keep its own).

    ``kept``: ids of the layers the active `enable` rules keep in float32;
    ``mixed``: the model was made mixed (`precision_map.Survey.half_policy`).
    """
    name = _policy_name(layer)
    if name not in FLOAT_POLICIES or is_input_layer(layer):
        return None
    if keras.backend.standardize_dtype(layer.compute_dtype) in HALF_DTYPES:
        return target
    if (type(layer).__name__ in FLOAT32_HEADS or id(layer) in kept
            or mixed):
        return None  # float32 on purpose
    return target


def _kept_float32(found: precision_map.Survey, target: str) -> frozenset:
    """Ids of the layers of a float32-built model that stay float32 when it is
    made ``target``: `tf_mixed.policy.precision_map.decide`'s, with the
    ``keep_float32`` rules of `enable` active in this thread. Output layers
    compute in half precision, as under `enable` (only `convert` keeps them
    float32: ``outputs=False``)."""
    precision = precision_map.decide(
        found.model, target, keep_float32=keep_float32_rules.active(), outputs=False,
        check_names=False, found=found)
    return frozenset(key for key, name in found.names.items()
                     if precision.policy(name) == "float32")


def _float32_dtype(layer) -> str | None:
    """The policy `layer` gets in the float32 clone (None: keep its own)."""
    return "float32" if _policy_name(layer) in FLOAT_POLICIES else None


def _policy_name(layer) -> str | None:
    """The layer's policy name; a float8 layer's source policy (its compute
    policy without the float8 quantization)."""
    if float8_readiness.is_float8(layer):
        return layer.dtype_policy.name.partition("_from_")[2] or None
    return getattr(layer.dtype_policy, "name", None)


class _Tap:
    """A flat clone and a model returning every leaf layer's outputs, then its own."""

    def __init__(self, flat: _cloning.Clone):
        model = flat.model
        self.model = model
        self.layers = []  # (qualified name, layer, number of float outputs)
        outputs = []
        for (name, _, layer), made in zip(flat.layers, flat.outputs):
            outs = [t for t in made if "float" in keras.backend.standardize_dtype(t.dtype)]
            if not outs:
                continue
            self.layers.append((name, layer, len(outs)))
            outputs.extend(outs)
        self.final = keras.tree.flatten(model.outputs)
        # The clone's input keeps the structure (single tensor, list or
        # dict) the model is called with, so batches go in as given.
        self.tap = keras.Model(model.input, outputs + list(self.final))
        self.variables = [(f"{name}/{v.path.split('/')[-1]}", name,
                           keras.backend.standardize_dtype(layer.compute_dtype), v)
                          for name, _, layer in flat.layers for v in layer.trainable_variables]

    def run(self, xb, yb, loss_fn, scale: float, with_variables: bool,
            gradients: bool = True):
        """Forward under a tape; gradients of loss*scale wrt outputs (and variables)."""
        if not gradients:
            outs = self.tap(xb, training=True)[:-len(self.final)]
            return outs, [None] * len(outs), [], None
        with tf.GradientTape() as tape:
            values = self.tap(xb, training=True)
            k = len(self.final)
            outs, preds = values[:-k], values[-k:]
            preds = preds[0] if k == 1 else preds
            loss = tf.reduce_mean(tf.cast(loss_fn(yb, preds), "float32"))
            scaled = loss * scale
        sources = list(outs) + ([v for *_, v in self.variables] if with_variables else [])
        grads = tape.gradient(scaled, sources)
        return outs, grads[:len(outs)], grads[len(outs):], float(loss)


def _current_scale(model, half_dtype) -> float:
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if getattr(optimizer, "built", False):
            return float(optimizer.dynamic_scale.numpy())
        return float(optimizer.initial_scale)
    return _DEFAULT_FLOAT16_SCALE if half_dtype == "float16" else 1.0


# ------------------------------------------------------------------ statistics


class _Accumulator:
    """Sums over batches what the report needs."""

    def __init__(self, half: _Tap, ref: _Tap):
        self.half, self.ref = half, ref
        n = len(half.layers)
        self.count = np.zeros(n)
        self.nonfinite = np.zeros(n)
        self.flushed = np.zeros(n)
        self.subnormal = np.zeros(n)
        self.diff2 = np.zeros(n)
        self.ref2 = np.zeros(n)
        self.max_abs = np.zeros(n)
        self.ref_max = np.zeros(n)
        self.grad_count = np.zeros(n)
        self.grad_bad = np.zeros(n)
        self.ref_grad_max = np.full(n, -1.0)  # -1: no gradient
        self.var_grads: list[list[np.ndarray]] = [[] for _ in ref.variables]
        self.dtypes: dict[int, str] = {}  # output dtype per layer, half run

    def add(self, xb, yb, loss_fn, scale, half_gradients: bool):
        h_outs, h_grads, _, _ = self.half.run(xb, yb, loss_fn, scale, False, half_gradients)
        r_outs, r_grads, r_var_grads, _ = self.ref.run(xb, yb, loss_fn, 1.0, True)
        i = 0
        for j, (_, _layer, n_outs) in enumerate(self.half.layers):
            h = np.concatenate([_np(t).ravel() for t in h_outs[i:i + n_outs]])
            r = np.concatenate([_np(t).ravel() for t in r_outs[i:i + n_outs]])
            hg = [g for g in h_grads[i:i + n_outs] if g is not None]
            rg = [g for g in r_grads[i:i + n_outs] if g is not None]
            i += n_outs
            dtype = keras.backend.standardize_dtype(h_outs[i - 1].dtype)
            self._forward(j, h, r, dtype)
            if hg:
                hgv = np.concatenate([_np(g).ravel() for g in hg])
                self.grad_count[j] += hgv.size
                self.grad_bad[j] += np.count_nonzero(~np.isfinite(hgv))
            if rg:
                rgv = np.concatenate([np.abs(_np(g).ravel()) for g in rg])
                self.ref_grad_max[j] = max(self.ref_grad_max[j], float(rgv.max(initial=0)))
                if not half_gradients:  # predicted: what overflows the output dtype
                    self.grad_count[j] += rgv.size
                    top = DTYPE_LIMITS.get(dtype, DTYPE_LIMITS["float32"])[0]
                    self.grad_bad[j] += np.count_nonzero(rgv * scale > top)
        for k, g in enumerate(r_var_grads):
            if g is not None:
                self.var_grads[k].append(np.abs(_np(g).ravel()))

    def _forward(self, j, h, r, dtype):
        limits = DTYPE_LIMITS.get(dtype, DTYPE_LIMITS["float32"])
        finite = np.isfinite(h)
        a = np.abs(h)
        self.count[j] += h.size
        self.nonfinite[j] += np.count_nonzero(~finite)
        self.flushed[j] += np.count_nonzero((h == 0) & (r != 0))
        self.subnormal[j] += np.count_nonzero((a > 0) & (a < limits[1]))
        self.max_abs[j] = max(self.max_abs[j],
                              float(np.max(np.where(np.isnan(a), 0, a), initial=0)))
        # A NaN in the float32 run must survive max() (max(0.0, nan) is 0.0).
        r_max = float(np.max(np.abs(r), initial=0)) if np.isfinite(r).all() else math.inf
        self.ref_max[j] = max(self.ref_max[j], r_max)
        self.diff2[j] += float(np.sum((h - r) ** 2)) if finite.all() else math.inf
        self.ref2[j] += float(np.sum(r * r))
        self.dtypes[j] = dtype

    def layer_stats(self) -> list[LayerStats]:
        stats = []
        for j, (name, layer, _) in enumerate(self.half.layers):
            dtype = self.dtypes[j]
            top = DTYPE_LIMITS.get(dtype, DTYPE_LIMITS["float32"])[0]
            count = max(self.count[j], 1)
            rel = (math.sqrt(self.diff2[j] / self.ref2[j]) if self.ref2[j] > 0
                   else (0.0 if self.diff2[j] == 0 else math.nan))
            stats.append(LayerStats(
                name=name, class_name=type(layer).__name__,
                compute_dtype=keras.backend.standardize_dtype(layer.compute_dtype),
                output_dtype=dtype, max_abs=float(self.max_abs[j]) if
                self.nonfinite[j] == 0 else math.inf,
                float32_max_abs=float(self.ref_max[j]),
                headroom_log2=(math.log2(top / self.ref_max[j])
                               if 0 < self.ref_max[j] < math.inf else None),
                nonfinite=float(self.nonfinite[j] / count),
                flushed=float(self.flushed[j] / count),
                subnormal=float(self.subnormal[j] / count),
                rel_error=rel,
                grad_nonfinite=(float(self.grad_bad[j] / self.grad_count[j])
                                if self.grad_count[j] else None),
                float32_grad_max_abs=(float(self.ref_grad_max[j])
                                      if self.ref_grad_max[j] >= 0 else None)))
        return stats

    def _grads(self, k) -> np.ndarray:
        parts = self.var_grads[k]
        return np.concatenate(parts) if parts else np.zeros(0)

    def variable_stats(self, current, recommended) -> list[VariableStats]:
        stats = []
        for k, (name, layer, _dtype, variable) in enumerate(self.ref.variables):
            g = self._grads(k)
            half_dtype = self.half.variables[k][2]
            zc, sc = _underflow(g, current)
            zr, sr = _underflow(g, recommended)
            stats.append(VariableStats(
                name=name, layer=layer, compute_dtype=half_dtype,
                size=int(np.prod(variable.shape)),
                max_abs=float(g.max(initial=0)), median_abs=float(np.median(g)) if g.size else 0.0,
                zero_at_current=zc, subnormal_at_current=sc,
                zero_at_recommended=zr, subnormal_at_recommended=sr))
        return stats

    def half_variable_max(self) -> float:
        """Max |gradient| over variables of layers computing in half precision."""
        top = 0.0
        for k, (_, _, dtype, _) in enumerate(self.half.variables):
            if dtype in HALF_DTYPES:
                top = max(top, float(self._grads(k).max(initial=0)))
        return top

    def underflow(self, scale) -> tuple[int, int]:
        lost = total = 0
        for k, (_, _, dtype, _) in enumerate(self.half.variables):
            if dtype in HALF_DTYPES:
                g = self._grads(k)
                total += g.size
                lost += int(np.count_nonzero((g > 0) & (g * scale < _FLOAT16_ZERO_BELOW)))
        return lost, total


def _np(tensor) -> np.ndarray:
    return keras.ops.convert_to_numpy(tf.cast(tensor, "float32")).astype(np.float64)


def _underflow(g: np.ndarray, scale: float) -> tuple[float, float]:
    nonzero = g[g > 0]
    if not nonzero.size:
        return 0.0, 0.0
    scaled = nonzero * scale
    zero = np.count_nonzero(scaled < _FLOAT16_ZERO_BELOW)
    subnormal = np.count_nonzero((scaled >= _FLOAT16_ZERO_BELOW) & (scaled < _FLOAT16_NORMAL))
    return float(zero / g.size), float(subnormal / g.size)


def _recommended_scale(layers, acc: _Accumulator, half: _Tap) -> float:
    """Largest 2^k with every half-precision gradient * 2^k <= float16's max."""
    top = acc.half_variable_max()
    for stats in layers:
        if stats.output_dtype in HALF_DTYPES and stats.float32_grad_max_abs:
            top = max(top, stats.float32_grad_max_abs)
    if top == 0 or not math.isfinite(top):
        return 1.0
    return 2.0 ** math.floor(math.log2(_FLOAT16_MAX / top))


# ------------------------------------------------------------------ advice


def _first_nonfinite(layers) -> tuple[str | None, str | None]:
    for stats in layers:
        if stats.nonfinite > 0:
            return stats.name, "forward"
    for stats in reversed(layers):  # backward: the overflow starts nearest the loss
        if stats.grad_nonfinite:
            return stats.name, "backward"
    return None, None


def _scale_text(scale: float) -> str:
    exponent = math.log2(scale)
    return f"2**{int(exponent)}" if exponent.is_integer() else f"{scale:g}"


def _advice(layers, first, where, policy, current, recommended, half_dtype) -> str:
    by_name = {s.name: s for s in layers}
    if where == "forward":
        s = by_name[first]
        if not math.isfinite(s.float32_max_abs):
            return (f"Layer '{first}' ({s.class_name}) is the first to produce "
                    "inf/NaN, and it does so in the float32 run too: this is not a "
                    "precision problem; check the data and the model there.")
        # keep_float32 matches a layer's own name, also inside a nested model.
        argument = keep_float32_rules.argument([first.rsplit("/", 1)[-1]])
        if s.headroom_log2 is not None and s.headroom_log2 < 0:
            why = (f"its float32 output reaches {s.float32_max_abs:.4g}, beyond "
                   f"{s.output_dtype}'s largest finite value")
        else:
            why = (f"its float32 output is at most {s.float32_max_abs:.4g}, so the "
                   f"overflow is inside its {s.compute_dtype} arithmetic")
        return (f"Layer '{first}' ({s.class_name}) is the first to produce inf/NaN "
                f"in {s.compute_dtype} ({why}): keep it in float32 with "
                f"tf_mixed.enable('{policy}', {argument}) before building the "
                f"model, or model = tf_mixed.convert(model, {argument}).")
    if where == "backward" and half_dtype != "float16":
        return (f"The gradient reaching layer '{first}' ({by_name[first].class_name}) "
                f"is not finite in {half_dtype}, which has float32's range: no loss "
                f"scale would help; {policy_fix(half_dtype, 'no_scale')}.")
    if where == "backward":
        return (f"The gradient reaching layer '{first}' ({by_name[first].class_name}) "
                f"overflows float16 at loss scale {_scale_text(current)}: start the "
                f"loss scale at {_scale_text(recommended)}, e.g. "
                "tf_mixed.LossScaleOptimizer(optimizer, "
                f"initial_scale={_scale_text(recommended)}).")
    for s in layers:
        if math.isfinite(s.rel_error) and s.rel_error > _LARGE_ERROR:
            argument = keep_float32_rules.argument([s.name.rsplit("/", 1)[-1]])
            return (f"No layer produced inf/NaN, but layer '{s.name}' ({s.class_name}) "
                    f"differs from float32 by {s.rel_error:.0%} (relative error; "
                    f"{s.flushed:.0%} of its outputs flushed to zero): keep it in "
                    f"float32 with {argument} in tf_mixed.enable or tf_mixed.convert.")
    if half_dtype == "bfloat16":
        return ("No layer produced inf/NaN and every output is within 10% of "
                "float32; bfloat16 has float32's range, so no loss scaling is needed.")
    return ("No layer produced inf/NaN and every output is within 10% of float32; "
            f"start the loss scale at {_scale_text(recommended)}, e.g. "
            f"tf_mixed.LossScaleOptimizer(optimizer, initial_scale={_scale_text(recommended)}).")
