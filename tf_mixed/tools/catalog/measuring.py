"""One layer configuration run in float32 and each half policy over every magnitude at once."""

# How (one compiled function per configuration, not a model per point):
#
# * a base input per magnitude group is drawn once (seeded), scaled so that its
#   largest element is exactly 1, then multiplied by the magnitude: magnitude
#   ``m`` means ``max |input| == m`` (what `tf_mixed.probe`'s ``max_abs`` of the
#   layer feeding it reads, so a model's layers can be looked up by it);
# * the float32 layer is built and its weights copied into one copy per half
#   policy (same config, ``dtype=policy``), so the copies differ only in
#   precision; a half copy takes its inputs rounded to its compute dtype, as
#   inside a mixed model;
# * one ``tf.function`` runs every copy over all magnitude groups with
#   ``tf.map_fn`` (a group is one batch, so a layer that reads batch
#   statistics sees only its own group) and, inside it, the gradient of
#   ``sum(output * cotangent)`` with respect to the inputs and every trainable
#   weight; the cotangent is a fixed unit-scale draw, the same for every copy
#   (so the gradient error is the layer's own, at an upstream gradient of
#   order 1: a loss scale moves that, not the layer's arithmetic);
# * a layer that selects (``Case.selects``: max pooling, Maximum, Minimum, a
#   clip such as ReLU's ``max_value``) has its half gradient also compared
#   with float32's at the inputs rounded as the half copy sees them (by a
#   float32 copy of its own per half policy, called as often as the others,
#   so a random layer draws the same numbers in every copy), and the smaller
#   error counts: two inputs that tie once rounded, or an input rounded onto
#   a clip's bound, send the gradient either way, both correct subgradients,
#   while an error of the selection's own arithmetic shows in both;
# * a configuration whose statistics are set from data (``per_magnitude``:
#   ``Normalization``'s mean and variance, ``Discretization``'s boundaries) is
#   made once per magnitude instead, eagerly.
#
# What comes back per policy and magnitude is a `Point` of plain numbers; the
# judging (tolerance, status, safe range) is `tf_mixed.tools.catalog.reading`'s.

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, NamedTuple, Sequence

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal.facts import HALF_DTYPES
from tf_mixed.tools.catalog.registry import Case

__all__ = ["Measured", "Point", "measure"]


class Point(NamedTuple):
    """What a half copy did at one magnitude, against float32.

    Attributes:
        forward: relative L2 error of the output (inf where the half output is
            not finite but float32's is; nan where float32's is not finite).
        gradient: the larger relative L2 error of the input and weight
            gradients (same conventions); None for a layer with nothing to
            differentiate (integer outputs).
        reference_finite: whether float32's output and gradients are finite.
        half_finite: whether the half copy's output and gradients are finite.
        flushed: the largest fraction, over output and gradients, of elements
            non-zero in float32 and exactly zero in half precision.
    """

    forward: float
    gradient: float | None
    reference_finite: bool
    half_finite: bool
    flushed: float


class Measured(NamedTuple):
    """One half policy's measurement of one configuration.

    Attributes:
        points: a `Point` per magnitude (empty when ``failure``).
        failure: why the layer could not run under this policy at all (its
            error's first line, e.g. no float16 kernel on this device), or "".
        no_gradient: why gradients were not measured (the gradient itself
            fails under this policy), or "".
    """

    points: tuple[Point, ...]
    failure: str = ""
    no_gradient: str = ""


def inputs_for(case: Case, magnitudes: Sequence[float], seed: int) -> list[np.ndarray]:
    """The inputs of every magnitude group, shaped ``(groups, batch, *shape)``.

    Args:
        case: the configuration (its input shapes and distribution).
        magnitudes: ``max |input|`` of each group.
        seed: the draw's seed.

    Returns:
        One float32 array per input of the layer.
    """
    rng = np.random.default_rng(seed)
    groups = len(magnitudes)
    arrays = []
    for shape in case.inputs:
        full = (groups, case.batch) + tuple(shape)
        base = rng.standard_normal(full)
        if case.distribution == "positive":
            base = np.abs(base)
        elif case.distribution == "offset":  # a large mean, a small spread: cancellation
            base = 1.0 + 0.01 * base
        elif case.distribution == "ids":
            base = rng.uniform(0.0, 1.0, full)
        peak = np.abs(base).reshape(groups, -1).max(axis=1)
        scale = (np.asarray(magnitudes, dtype=np.float64) / peak).reshape(
            (groups,) + (1,) * (base.ndim - 1))
        values = base * scale
        if case.distribution == "ids":
            values = np.minimum(np.round(values), case.ids - 1)
        arrays.append(values.astype(np.float32))
    return arrays


def measure(case: Case, policies: Sequence[str], magnitudes: Sequence[float],
            seed: int = 0) -> dict[str, Measured]:
    """Runs `case` in float32 and in each policy over `magnitudes`.

    Args:
        case: the layer configuration.
        policies: half policies, such as ``("mixed_float16", "mixed_bfloat16")``.
        magnitudes: ``max |input|`` per point.
        seed: seeds the inputs, the cotangent and the weights.

    Returns:
        ``{policy: Measured}``. A policy under which the layer cannot run (or
        cannot be differentiated) is measured alone, so its failure is its own.
    """
    # Values beyond a half dtype's range are what is measured: NumPy's
    # "overflow encountered in cast" (a statistic cast to float16 by Keras)
    # says nothing new.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
        return _measure(case, policies, magnitudes, seed)


def _measure(case: Case, policies: Sequence[str], magnitudes: Sequence[float],
             seed: int) -> dict[str, Measured]:
    xs = inputs_for(case, magnitudes, seed)
    try:
        stats = _run(case, tuple(policies), magnitudes, xs, seed, True)
        return {policy: Measured(_points(stats, i)) for i, policy in enumerate(policies)}
    except Exception:  # noqa: BLE001 - one policy's failure is a finding: find which
        pass
    found = {}
    for policy in policies:
        try:
            found[policy] = Measured(_points(_run(case, (policy,), magnitudes, xs, seed, True), 0))
            continue
        except Exception as error:  # noqa: BLE001
            gradient_error = _first_line(error)
        try:
            stats = _run(case, (policy,), magnitudes, xs, seed, False)
            found[policy] = Measured(_points(stats, 0), no_gradient=gradient_error)
        except Exception as error:  # noqa: BLE001
            found[policy] = Measured((), failure=_first_line(error))
    return found


def _run(case, policies, magnitudes, xs, seed, gradients: bool) -> np.ndarray:
    """Stats ``(magnitudes, policies, parts, 5)`` of each policy against float32."""
    if case.per_magnitude:
        return _run_per_magnitude(case, policies, magnitudes, xs, seed, gradients)
    return _run_batched(case, policies, xs, seed, gradients)


def _points(stats: np.ndarray, i: int) -> tuple[Point, ...]:
    return tuple(_point(stats[g, i]) for g in range(stats.shape[0]))


def _first_line(error: BaseException) -> str:
    """The error's class and the first informative line of its message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if lines and lines[0].startswith("in user code"):  # a traced error: its last line says it
        lines = lines[-1:]
    useful = [line for line in lines if not line.startswith(("File ", "Exception encountered"))]
    text = (useful or lines or [""])[0]
    text = text.replace("\x1b[1m", "").replace("\x1b[0m", "")
    return f"{type(error).__name__}: {text[:200]}"


def _make(case: Case, policy: str, magnitude: float | None = None):
    keras.utils.set_random_seed(case.seed_offset + 1)  # the same draws for every copy
    return case.make(policy) if magnitude is None else case.make(policy, magnitude)


def _build_copies(case: Case, policies, first_inputs, magnitude=None) -> tuple[list, Any]:
    """The float32 layer, its half copies and (for a selecting ``case``) one more
    float32 copy per half policy, run at that policy's rounded inputs; built and
    sharing weights; float32's output.

    Every copy is called exactly as often (once here), so layers that draw
    random numbers from a seeded generator draw the same numbers in each.
    """
    tied = ("float32",) * len(policies) if case.selects else ()
    layers = [_make(case, p, magnitude) for p in ("float32", *policies, *tied)]
    outputs = [case.call(layer, [tf.constant(x) for x in first_inputs], case.training)
               for layer in layers]
    weights = layers[0].get_weights()
    for layer in layers[1:]:
        layer.set_weights(weights)
    return layers, outputs[0]


def _pair_stats(half, ref) -> tf.Tensor:
    """``[|half - ref|, |ref|, half finite, ref finite, flushed fraction]`` in float64."""
    half = tf.cast(tf.reshape(half, [-1]), "float64")
    ref = tf.cast(tf.reshape(ref, [-1]), "float64")
    finite_h = tf.reduce_all(tf.math.is_finite(half))
    finite_r = tf.reduce_all(tf.math.is_finite(ref))
    clean_h = tf.where(tf.math.is_finite(half), half, tf.zeros_like(half))
    clean_r = tf.where(tf.math.is_finite(ref), ref, tf.zeros_like(ref))
    nonzero = tf.not_equal(ref, 0.0)
    count = tf.reduce_sum(tf.cast(nonzero, "float64"))
    flushed = tf.reduce_sum(tf.cast(nonzero & tf.equal(half, 0.0), "float64"))
    return tf.stack([tf.norm(clean_h - clean_r), tf.norm(clean_r),
                     tf.cast(finite_h, "float64"), tf.cast(finite_r, "float64"),
                     tf.math.divide_no_nan(flushed, count)])


def _forward_and_gradients(case: Case, layer, inputs, cot, wrt_inputs: bool,
                           gradients: bool = True):
    """The output (float32) and the gradients of ``sum(output * cot)`` (or []).

    The gradients are one per input, then every weight's as one flat vector:
    a weight whose exact gradient is zero (the key projection's bias in
    attention: a softmax ignores a shift) is judged with the others, not
    against its own rounding noise.

    A half copy takes its inputs in its compute dtype, as a layer inside a
    mixed model gets them from the half layer before it (a layer that
    computes in float32 inside, such as LayerNormalization, still sees
    rounded inputs, as it does there). Integer ids (``case.integer_ids``) are not
    rounded: a model hands them on as integers.
    """
    dtype = keras.backend.standardize_dtype(layer.compute_dtype)
    with tf.GradientTape() as tape:
        for x in inputs:
            tape.watch(x)
        rounds = dtype in HALF_DTYPES and not case.integer_ids
        fed = [tf.cast(x, dtype) for x in inputs] if rounds else list(inputs)
        raw = case.call(layer, fed, case.training)
        y = tf.cast(raw, "float32")
        loss = tf.reduce_sum(y * cot)
    if not gradients or not keras.backend.is_float_dtype(raw.dtype):
        return y, []
    targets = (list(inputs) if wrt_inputs else []) + list(layer.trainable_variables)
    grads = [tf.zeros(t.shape, "float32") if g is None
             else tf.cast(tf.convert_to_tensor(g), "float32")
             for g, t in zip(tape.gradient(loss, targets), targets)]
    split = len(inputs) if wrt_inputs else 0
    weights = [tf.concat([tf.reshape(g, [-1]) for g in grads[split:]], 0)] if grads[split:] else []
    return y, grads[:split] + weights


def _closer(first: tf.Tensor, second: tf.Tensor) -> tf.Tensor:
    """Of two `_pair_stats`, the one with the smaller relative error (a finite one
    first); `second` (at the rounded inputs) only where its float32 reference is
    finite: an input rounded to inf (float16 above 65504) is the half copy's
    overflow, not float32's."""
    def rank(stats):
        finite = stats[2] * stats[3]
        return tf.stack([1.0 - finite, tf.math.divide_no_nan(stats[0], stats[1])])

    a, b = rank(first), rank(second)
    second_better = (second[3] > 0.0) & ((b[0] < a[0]) | ((b[0] == a[0]) & (b[1] < a[1])))
    return tf.where(second_better, second, first)


def _compare(case: Case, layers, inputs, cot, wrt_inputs: bool, gradients: bool) -> tf.Tensor:
    """Stats of each half copy against the first (float32): ``(half copies, parts, 5)``.

    For a layer that selects (``case.selects``; `_build_copies` then made one
    float32 copy per half copy after them), each gradient's stats are the
    closer of float32's at the inputs and float32's at the inputs rounded to
    the half copy's compute dtype; the output's are always against float32's
    at the inputs.
    """
    halves = (len(layers) - 1) // 2 if case.selects else len(layers) - 1
    ref_y, ref_grads = _forward_and_gradients(case, layers[0], inputs, cot, wrt_inputs,
                                              gradients)
    rows = []
    for layer, tied_layer in zip(layers[1:1 + halves], layers[1 + halves:] + [None] * halves):
        y, grads = _forward_and_gradients(case, layer, inputs, cot, wrt_inputs, gradients)
        parts = [_pair_stats(h, r) for h, r in zip(grads, ref_grads)]
        dtype = keras.backend.standardize_dtype(layer.compute_dtype)
        if tied_layer is not None and grads and dtype in HALF_DTYPES:
            rounded = [tf.cast(tf.cast(x, dtype), "float32") for x in inputs]
            _, tied = _forward_and_gradients(case, tied_layer, rounded, cot, wrt_inputs)
            parts = [_closer(part, _pair_stats(h, r)) for part, h, r in zip(parts, grads, tied)]
        rows.append(tf.stack([_pair_stats(y, ref_y)] + parts))
    return tf.stack(rows)


def _run_batched(case: Case, policies, xs, seed, gradients: bool) -> np.ndarray:
    layers, sample = _build_copies(case, policies, [x[0] for x in xs])
    rng = np.random.default_rng(seed + 1)
    cotangent = rng.standard_normal((len(xs[0]),) + tuple(sample.shape)).astype(np.float32)
    wrt_inputs = case.distribution != "ids"

    @tf.function
    def run_all(elems):
        def body(group):
            return _compare(case, layers, list(group[:-1]), group[-1], wrt_inputs, gradients)

        return tf.map_fn(body, elems, fn_output_signature=tf.float64)

    # A new function per configuration is the design (one trace each): TF's
    # "N calls triggered tf.function retracing" warning says nothing here.
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        stats = run_all(tuple(tf.constant(x) for x in xs) + (tf.constant(cotangent),))
    finally:
        logger.setLevel(level)
    return stats.numpy()


def _run_per_magnitude(case: Case, policies, magnitudes, xs, seed,
                       gradients: bool) -> np.ndarray:
    """Eagerly, one set of copies per magnitude (statistics set from that magnitude)."""
    rng = np.random.default_rng(seed + 1)
    stats = []
    for g, magnitude in enumerate(magnitudes):
        inputs = [tf.constant(x[g]) for x in xs]
        layers, sample = _build_copies(case, policies, [x[g] for x in xs], float(magnitude))
        cot = tf.constant(rng.standard_normal(tuple(sample.shape)).astype(np.float32))
        stats.append(_compare(case, layers, inputs, cot, True, gradients).numpy())
    return np.stack(stats)


def _relative(diff: float, norm: float, half_finite: bool, ref_finite: bool) -> float:
    if not ref_finite:
        return math.nan
    if not half_finite:
        return math.inf
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def _worst(errors: list[float]) -> float:
    return math.nan if any(math.isnan(e) for e in errors) else max(errors)


def _point(parts: np.ndarray) -> Point:
    """A `Point` from one copy's stats at one magnitude (``(parts, 5)``: output first)."""
    errors = [_relative(float(d), float(n), bool(h), bool(r)) for d, n, h, r, _ in parts]
    return Point(
        forward=errors[0],
        gradient=_worst(errors[1:]) if len(errors) > 1 else None,
        reference_finite=bool(parts[:, 3].all()),
        half_finite=bool(parts[:, 2].all()),
        flushed=float(parts[:, 4].max()),
    )
