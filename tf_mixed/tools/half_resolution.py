"""Statistics a half-precision layer cannot resolve, measured against float32."""

# A layer computing in float16/bfloat16 rounds what it computes with to that
# dtype. For Keras's ``Normalization`` adapted to a feature whose mean is large
# against its spread (a feature around 1e4 with a standard deviation of 10)
# the rounding is most of a standard deviation: float16 holds values near 1e4
# only to the nearest 8, so ``(x - mean) / std`` is off by up to 0.4 of the
# feature's spread, silently (a model trained so reached 0.72 accuracy where
# the same model with `tf_mixed.enable`, which keeps Normalization in
# float32, reached 0.997). Whoever set the precision (`tf_mixed.enable` with
# an explicit dtype, Keras's ``set_dtype_policy``, a ``dtype=`` argument, a
# ``DTypePolicyMap``, KerasHub's ``dtype=``) the check is the same: it reads
# the layer's compute dtype.
#
# Measured, not guessed: probe values spread over the layer's own statistics
# (its mean +- 2 standard deviations, per feature) go through the layer itself
# in its half dtype, and the output is compared with the same arithmetic in
# float64 on the float32 statistics:
#
# * ``Normalization``: the worst error of the output, in standard deviations
#   of the feature (``invert=True``: of the restored value, likewise);
# * ``Discretization`` (``output_mode="int"``): probes at and between the bin
#   boundaries, the fraction put into another bin than float32 puts them
#   (Keras 3.15 bucketizes in float32 whatever the policy: measured 0, no
#   finding);
# * any other layer with float variables ``<prefix>mean`` and
#   ``<prefix>variance`` (a custom statistics layer; not the normalizations
#   that compute their statistics in float32, `FLOAT32_STATISTICS_NORMS`):
#   probes and mean cast to the half dtype, their difference against float64.
#
# A value beyond the dtype's range (a variance above 65504) is the
# ``half_range`` finding of `tf_mixed.tools.auditing`; such a layer is not
# measured here.

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np

from tf_mixed._internal.facts import (
    FLOAT32_STATISTICS_NORMS,
    HALF_DTYPES,
    dtype_limits,
    is_input_layer,
    out_of_range,
)

__all__ = ["CODE", "ERROR_AT", "WARN_AT", "Resolution", "findings", "measure"]

CODE = "half_resolution"
WARN_AT = 0.05
"""Worst error, in standard deviations, from which a Normalization is reported."""
ERROR_AT = 0.25
"""From here it is an error: a quarter of the feature's spread."""
# Probe points per feature: the mean +- this many standard deviations.
_SPAN = 2.0
_PROBES = 41


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What a half-precision layer's statistics lose, measured.

    Attributes:
      error: the worst error measured: in standard deviations of the feature
        (``unit="std"``) or the fraction of values put into another bin
        (``unit="bins"``).
      unit: "std" or "bins".
      what: the statistic, such as "mean" or "bin boundaries".
      value: the statistic's value where the error is worst (a mean, a boundary).
      spread: the feature's standard deviation there (the gap between
        boundaries for ``"bins"``).
      feature: the flat index of the worst feature (0 for one feature).
      dtype: the half dtype.
    """

    error: float
    unit: str
    what: str
    value: float
    spread: float
    feature: int
    dtype: str

    @property
    def spacing(self) -> float:
        """The dtype's spacing at ``value`` (float16: 8 near 1e4)."""
        if not self.value:
            return 0.0
        return dtype_limits(self.dtype).eps * 2.0 ** math.floor(math.log2(abs(self.value)))


def _np(value) -> np.ndarray:
    # Cast first (exact from a half dtype): NumPy 2 warns (DeprecationWarning)
    # on np.array() of a variable or of a bfloat16 tensor, not of a float32 tensor.
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(value, "float32")),
                      dtype="float64")


def _float32_statistics(layer) -> tuple[np.ndarray, np.ndarray] | None:
    """A Normalization's float32 mean and variance, shaped as the ones it computes with."""
    shape = tuple(keras.ops.shape(layer.mean))
    if layer.input_mean is None:  # adapted: the float32 weights hold them
        mean, variance = _np(layer.adapt_mean), _np(layer.adapt_variance)
    else:
        mean, variance = _np(layer.input_mean), _np(layer.input_variance)
    try:
        if mean.size == math.prod(shape):
            return mean.reshape(shape), variance.reshape(shape)
        return np.broadcast_to(mean, shape), np.broadcast_to(variance, shape)
    except ValueError:
        return None


def _worst(error: np.ndarray, value: np.ndarray, spread: np.ndarray, unit: str, what: str,
           dtype: str) -> Resolution:
    per_feature = error.max(axis=0).reshape(-1)
    feature = int(np.argmax(per_feature))
    return Resolution(float(per_feature[feature]), unit, what,
                      float(value.reshape(-1)[feature]), float(spread.reshape(-1)[feature]),
                      feature, dtype)


def _normalization(layer, dtype: str) -> Resolution | None:
    statistics = _float32_statistics(layer)
    if statistics is None:
        return None
    mean, variance = statistics
    std = np.maximum(np.sqrt(np.maximum(variance, 0.0)), keras.backend.epsilon())
    k = np.linspace(-_SPAN, _SPAN, _PROBES).reshape((-1,) + (1,) * (mean.ndim - 1))
    probes = (k + np.zeros_like(mean) if layer.invert else mean + k * std).astype("float32")
    got = _np(layer(probes))
    x = probes.astype("float64")
    want = mean + x * std if layer.invert else (x - mean) / std
    error = np.abs(got - want) / (std if layer.invert else 1.0)
    return _worst(error, mean, np.sqrt(np.maximum(variance, 0.0)), "std", "mean", dtype)


def _discretization(layer, dtype: str) -> Resolution | None:
    if layer.output_mode != "int" or not layer.bin_boundaries:
        return None
    bounds = np.asarray(layer.bin_boundaries, "float64")
    gaps = np.diff(bounds) if len(bounds) > 1 else np.ones(1)
    inside = (bounds[:-1, None] + gaps[:, None] * np.array([0.1, 0.5, 0.9])).reshape(-1)
    probes = np.concatenate([bounds, inside, [bounds[0] - gaps[0], bounds[-1] + gaps[-1]]])
    probes32 = probes.astype("float32")
    got = np.asarray(keras.ops.convert_to_numpy(layer(probes32[:, None]))).reshape(-1)
    want = np.digitize(probes32, bounds.astype("float32"))
    wrong = got != want
    if not wrong.any():
        return Resolution(0.0, "bins", "bin boundaries", float(bounds[0]),
                          float(gaps.min()), 0, dtype)
    first = int(np.argmax(wrong))
    nearest = int(np.argmin(np.abs(bounds - probes[first])))
    return Resolution(float(wrong.mean()), "bins", "bin boundaries", float(bounds[nearest]),
                      float(gaps[min(nearest, len(gaps) - 1)]), nearest, dtype)


def _statistics_pairs(layer) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(prefix, mean, variance)`` of float variables named ``<prefix>mean``/``variance``."""
    floats = {w.path.rsplit("/", 1)[-1]: w for w in layer.weights
              if keras.backend.is_float_dtype(w.dtype)}
    pairs = []
    for name, weight in floats.items():
        if name.endswith("mean") and name[:-4] + "variance" in floats:
            variance = floats[name[:-4] + "variance"]
            if tuple(weight.shape) == tuple(variance.shape):
                pairs.append((name[:-4], _np(weight), _np(variance)))
    return pairs


def _generic(layer, dtype: str) -> Resolution | None:
    worst = None
    for prefix, mean, variance in _statistics_pairs(layer):
        std = np.sqrt(np.maximum(variance, 0.0))
        k = np.linspace(-_SPAN, _SPAN, _PROBES).reshape((-1,) + (1,) * mean.ndim)
        probes = (mean + k * std).astype("float32")
        halves = _np(keras.ops.cast(probes, dtype)) - _np(keras.ops.cast(
            mean.astype("float32"), dtype))
        error = np.abs(halves - (probes.astype("float64") - mean)) / np.maximum(
            std, keras.backend.epsilon())
        found = _worst(error, mean, std, "std", f"{prefix}mean", dtype)
        if worst is None or found.error > worst.error:
            worst = found
    return worst


def measure(layer) -> Resolution | None:
    """What ``layer``'s statistics lose in its half compute dtype, measured.

    Args:
      layer: a built Keras layer.

    Returns:
      A `Resolution`, or None for a layer that does not compute in a half
      dtype, holds no statistics measured here, holds a value beyond the
      dtype's range (`half_range`), or whose probe call fails.
    """
    dtype = keras.backend.standardize_dtype(layer.compute_dtype)
    if (dtype not in HALF_DTYPES or not layer.built or is_input_layer(layer)
            or type(layer).__name__ in FLOAT32_STATISTICS_NORMS
            or out_of_range(layer) is not None):
        return None
    try:
        if isinstance(layer, keras.layers.Normalization):
            return _normalization(layer, dtype)
        if isinstance(layer, keras.layers.Discretization):
            return _discretization(layer, dtype)
        return _generic(layer, dtype)
    except Exception:  # a layer that cannot be probed is not judged
        return None


def _message(cls: str, found: Resolution) -> str:
    if found.unit == "bins":
        return (f"{cls} computes in {found.dtype}: of values at and between its bin "
                f"boundaries (near {found.value:.6g}, {found.spread:.3g} apart), "
                f"{found.error:.0%} land in another bin than in float32 (measured).")
    where = f" (feature {found.feature})" if found.feature else ""
    return (f"{cls} computes in {found.dtype} with a {found.what} of {found.value:.6g} "
            f"against a spread (standard deviation) of {found.spread:.3g}{where}: "
            f"{found.dtype} holds values near {abs(found.value):.3g} only to the nearest "
            f"{found.spacing:.3g}, so its output is off by up to {found.error:.2f} standard "
            "deviations (measured on its own statistics against float32).")


def findings(layers) -> list[tuple[str, str, str, str, str]]:
    """The ``half_resolution`` findings of ``(name, layer)`` pairs.

    Args:
      layers: ``(qualified name, layer)`` pairs, as `tf_mixed.audit` walks them.

    Returns:
      ``(severity, code, layer name, message, fix)`` tuples (`tf_mixed.audit`'s
      ``Finding`` fields): an error from `ERROR_AT` standard deviations (or any
      value in another bin), a warning from `WARN_AT`.
    """
    found = []
    for name, layer in layers:
        resolution = measure(layer)
        if resolution is None:
            continue
        error_at, warn_at = (0.0, 0.0) if resolution.unit == "bins" else (ERROR_AT, WARN_AT)
        if resolution.error <= warn_at:
            continue
        severity = "error" if resolution.error >= error_at else "warning"
        found.append((
            severity, CODE, name, _message(type(layer).__name__, resolution),
            f"keep '{name}' in float32: create it with dtype='float32' (tf_mixed.enable() "
            "does so for Normalization and Discretization; for a built model, "
            "model = tf_mixed.convert(model))."))
    return found
