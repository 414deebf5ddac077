"""Reading a float8 model: scales, amaxes, saturated and flushed fractions."""

# `state(model)` reads, for every float8 layer and each of its quantized
# tensors (inputs, kernel, output gradient), the scale in use, the amax
# history, and the counters the tf_mixed optimizer keeps. With a batch
# (``state(model, x, y)``) it also measures, on that batch and with the
# current scales, the fraction of values that saturate (``|x| / scale`` beyond
# the format's largest finite value by more than the cast's rounding, so
# clipped) and that flush to zero (non-
# zero values that quantize to 0). The kernel's fractions need no batch.
#
# Keras's scale is a *dequantization* factor: a value ``x`` is stored as
# ``float8(x / scale)``. Transformer Engine's scale is its reciprocal.

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras
import ml_dtypes
import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import check_model_kind, walk_layers
from tf_mixed.float8 import readiness
from tf_mixed.scaling import float8_sync
from tf_mixed.scaling.optimizer import float8_sync_of

__all__ = ["Float8State", "TensorState", "fractions", "state"]


@dataclasses.dataclass(frozen=True)
class TensorState:
    """One quantized tensor of one float8 layer.

    Attributes:
        layer: Qualified layer name.
        tensor: ``"inputs"``, ``"kernel"`` or ``"outputs_grad"``.
        format: ``"float8_e4m3fn"`` or ``"float8_e5m2"``.
        scale: The scale in use, in unscaled units (loss scale removed).
        amax: The newest amax of the history (unscaled units).
        history_max: The largest amax in the history.
        saturated: Fraction of the measured values the clip changed by
            more than rounding (``|x| / scale`` beyond
            `tf_mixed.scaling.float8_sync.SATURATION_LIMITS`); None if not measured
            (inputs and output gradient need a batch).
        flushed: Fraction of the measured values that are non-zero but
            quantize to 0; None if not measured. An output gradient is not
            measured when the loss reads past the layer's output (Keras's
            cross-entropy takes a softmax layer's logits directly).
        saturated_steps: Steps whose global amax, over the scale in use,
            was clipped (beyond `SATURATION_LIMITS`; tf_mixed optimizer
            only, else None).
        nonfinite_amax: Steps whose global amax was inf/NaN and was kept
            out of the history (tf_mixed optimizer only, else None).
        replicas_agree: Whether every local replica holds the same scale
            and history (always True without a strategy).
    """

    layer: str
    tensor: str
    format: str
    scale: float
    amax: float
    history_max: float
    saturated: float | None
    flushed: float | None
    saturated_steps: int | None
    nonfinite_amax: int | None
    replicas_agree: bool


@dataclasses.dataclass(frozen=True)
class Float8State:
    """What `state` read, per float8 layer and tensor.

    Attributes:
        model_name: The model's name.
        loss_scale: The loss scale the output-gradient scales were divided
            by (1.0 without loss scaling).
        measured_examples: Examples of the batch the fractions were
            measured on (0: only the kernels were measured).
        tensors: One `TensorState` per float8 layer and tensor.
    """

    model_name: str
    loss_scale: float
    measured_examples: int
    tensors: tuple[TensorState, ...]

    def get(self, layer: str, tensor: str) -> TensorState:
        """The `TensorState` of one layer's tensor.

        Raises:
            KeyError: naming the float8 layers there are.
        """
        for item in self.tensors:
            if item.layer == layer and item.tensor == tensor:
                return item
        raise KeyError(
            f"No float8 tensor {tensor!r} of layer {layer!r}. Float8 layers: "
            f"{sorted({t.layer for t in self.tensors})}; tensors: "
            f"{list(float8_sync.KINDS)}.")

    @property
    def max_saturated(self) -> float:
        """The largest measured saturated fraction (0.0 if none measured)."""
        return max([t.saturated for t in self.tensors
                    if t.saturated is not None] + [0.0])

    @property
    def max_flushed(self) -> float:
        """The largest measured flushed fraction (0.0 if none measured)."""
        return max([t.flushed for t in self.tensors
                    if t.flushed is not None] + [0.0])

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON-ready data (non-finite floats as strings)."""
        data = dataclasses.asdict(self)
        for item in data["tensors"]:
            for key, value in item.items():
                if isinstance(value, float) and not math.isfinite(value):
                    item[key] = str(value)
        return data

    def __str__(self) -> str:
        head = (f"Float8 state of model '{self.model_name}' (loss scale "
                f"{self.loss_scale:g} removed; fractions on "
                f"{self.measured_examples} examples):")
        header = ("layer", "tensor", "format", "scale", "amax", "hist max",
                  "saturated", "flushed", "sat steps", "agree")
        rows = [header] + [
            (t.layer, t.tensor, t.format.replace("float8_", ""),
             f"{t.scale:.4g}", f"{t.amax:.4g}", f"{t.history_max:.4g}",
             _pct(t.saturated), _pct(t.flushed),
             "-" if t.saturated_steps is None else str(t.saturated_steps),
             "yes" if t.replicas_agree else "NO") for t in self.tensors]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [head]
        for i, row in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3g}%"


def _measured_fractions(layer, kind: str, measured, scale: float,
                        fmt: str) -> tuple[float | None, float | None]:
    """`fractions` of the kernel, or of the measured values of ``kind``; Nones without them."""
    if kind == "kernel":
        return fractions(layer.kernel.numpy(), scale, fmt)
    if measured is not None:
        return fractions(measured, scale, fmt)
    return None, None


def fractions(values, scale: float, fmt: str) -> tuple[float, float]:
    """Saturated and flushed fractions of ``values`` quantized with ``scale``.

    Exactly Keras's quantization (``x / scale``, clipped to the format's
    range, cast): saturated counts values the clip changed by more than the
    cast's rounding would, ``|x| / scale`` beyond the largest finite value
    plus half the spacing below it
    (`tf_mixed.scaling.float8_sync.SATURATION_LIMITS`: 464 for e4m3fn);
    flushed counts non-zero values that become 0.

    Args:
        values: An array of any shape.
        scale: The scale (Keras's dequantization factor), > 0.
        fmt: ``"float8_e4m3fn"`` or ``"float8_e5m2"``.

    Returns:
        ``(saturated, flushed)``, fractions of all values (0.0, 0.0 for an
        empty array).
    """
    x = np.asarray(values, dtype=np.float32).ravel()
    if x.size == 0:
        return 0.0, 0.0
    top = float(ml_dtypes.finfo(fmt).max)
    scaled = x / np.float32(scale)
    saturated = np.count_nonzero(
        np.abs(scaled) > float8_sync.SATURATION_LIMITS[fmt])
    quantized = np.clip(scaled, -top, top).astype(getattr(ml_dtypes, fmt))
    flushed = np.count_nonzero((x != 0) & (quantized.astype(np.float32) == 0))
    return saturated / x.size, flushed / x.size


def _copies(variable) -> list[np.ndarray]:
    value = variable.value if isinstance(variable, keras.Variable) else variable
    parts = value.values if isinstance(value, tf.distribute.DistributedValues) \
        else [value]
    return [np.asarray(p.numpy()) for p in parts]


def _float8_layers(model) -> list[tuple[str, Any]]:
    seen, out = set(), []
    for name, layer in walk_layers(model):
        if readiness.is_float8(layer) and id(layer) not in seen:
            seen.add(id(layer))
            out.append((name, layer))
    return out


def state(model: keras.Model, x=None, y=None, *, loss=None,
          optimizer=None) -> Float8State:
    """Reads every float8 layer's scales and amaxes; measures a batch if given.

    Args:
        model: A Keras model with float8 layers (`tf_mixed.float8.quantize`
            or ``model.quantize("float8")``).
        x: Optional batch of inputs to measure the saturated/flushed
            fractions of the inputs and output gradients on. Use a batch of
            the training batch size: output gradients scale with 1/batch.
        y: Its targets (needed with ``x``).
        loss: The loss for the output gradients; default the compiled one.
        optimizer: The optimizer training the model, for its loss scale and
            float8 counters; default ``model.optimizer`` (set by compile).

    Returns:
        A `Float8State`. Under a strategy the values are replica 0's, and
        ``replicas_agree`` says whether the other local copies match.

    Raises:
        TypeError: ``model`` is not a Keras model.
        ValueError: the model has no float8 layer; ``x`` without ``y``; no
            loss given and the model is not compiled with one.
    """
    check_model_kind(model, "tf_mixed.float8.state()", traced=False)
    layers = _float8_layers(model)
    if not layers:
        raise ValueError(
            f"Model '{model.name}' has no float8 layer. Quantize it first: "
            "tf_mixed.float8.quantize(model).")
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None)
    sync = float8_sync_of(optimizer)
    loss_scale = 1.0
    if sync is not None:
        loss_scale = float(optimizer.dynamic_scale.numpy())
    counters = _counters(sync)
    measured = {}
    examples = 0
    if x is not None:
        if y is None:
            raise ValueError(
                "state() got a batch `x` without its targets: pass y=... so "
                "the output gradients can be measured. Received: y=None.")
        measured = _measure(model, layers, x, y, loss)
        examples = int(keras.tree.flatten(x)[0].shape[0])
    tensors = []
    for name, layer in layers:
        for kind in float8_sync.KINDS:
            scale_variable, history_variable = _internals.float8_variables(layer, kind)
            scale_copies = _copies(scale_variable)
            history_copies = _copies(history_variable)
            agree = all(np.array_equal(c, scale_copies[0]) for c in scale_copies) \
                and all(np.array_equal(c, history_copies[0]) for c in history_copies)
            scale = float(scale_copies[0])
            if kind == "outputs_grad":
                scale /= loss_scale
            history = history_copies[0]
            fmt = float8_sync.FORMATS[kind]
            saturated, flushed = _measured_fractions(layer, kind, measured.get((name, kind)),
                                                     scale, fmt)
            path = layer.inputs_amax_history.path.rpartition("/")[0]
            count = counters.get((path, kind), (None, None))
            tensors.append(TensorState(
                layer=name, tensor=kind, format=fmt, scale=scale,
                amax=float(history[0]), history_max=float(np.max(history)),
                saturated=saturated, flushed=flushed,
                saturated_steps=count[0], nonfinite_amax=count[1],
                replicas_agree=bool(agree)))
    return Float8State(model.name, loss_scale, examples, tuple(tensors))


def _counters(sync) -> dict[tuple[str, str], tuple[int, int]]:
    if sync is None:
        return {}
    saturated = _copies(sync.saturated_steps)[0]
    nonfinite = _copies(sync.nonfinite_amax)[0]
    return {(slot.layer, slot.kind): (int(saturated[i]), int(nonfinite[i]))
            for i, slot in enumerate(sync.slots)}


def _loss_function(model, loss):
    """``loss(y, pred)``: the given loss, or the compiled model's whole loss."""
    if loss is not None:
        return keras.losses.get(loss) if isinstance(loss, (str, dict)) else loss
    if getattr(model, "compiled", False) and getattr(model, "loss", None) is not None:
        return lambda y, pred: model.compute_loss(y=y, y_pred=pred)
    raise ValueError(
        "state() needs a loss to measure output gradients: pass loss=..., "
        "such as loss='mse', or compile the model with one. Received: "
        "loss=None.")


def _measure(model, layers, x, y, loss) -> dict[tuple[str, str], np.ndarray]:
    """Inputs and output gradients (unscaled loss) of each float8 layer."""
    loss_fn = _loss_function(model, loss)
    records: dict[int, list] = {}

    @tf.function
    def run(xb, yb):
        records.clear()
        with tf.GradientTape() as tape:
            pred = model(xb, training=False)
            value = tf.reduce_mean(tf.cast(loss_fn(yb, pred), tf.float32))
        keys = sorted(records)
        outs = [out for k in keys for _, out in records[k]]
        grads = tape.gradient(value, outs)
        inputs = [inp for k in keys for inp, _ in records[k]]
        counts = [len(records[k]) for k in keys]
        return keys, counts, inputs, outs, grads

    with _internals.recording_quantized_calls([layer for _, layer in layers],
                                              records):
        keys, counts, inputs, _, grads = run(x, y)
    measured = {}
    position = 0
    for key, count in zip(keys, counts):
        name, layer = layers[int(key)]
        xs, ups = [], []
        for j in range(position, position + int(count)):
            xs.append(np.asarray(inputs[j], np.float32).ravel())
            if grads[j] is not None:  # None: this output does not reach the loss
                ups.append(np.asarray(_upstream(layer, inputs[j], grads[j]),
                                      np.float32).ravel())
        position += int(count)
        measured[(name, "inputs")] = np.concatenate(xs)
        if ups:
            measured[(name, "outputs_grad")] = np.concatenate(ups)
    return measured


def _upstream(layer, inputs, output_gradient):
    """The gradient at the layer's matrix product (before bias/activation)."""
    dtype = layer.compute_dtype
    kernel = tf.cast(keras.ops.convert_to_tensor(layer.kernel), dtype)
    x = tf.cast(inputs, dtype)
    quantize = keras.quantizers.quantize_and_dequantize
    inputs_scale, _ = _internals.float8_variables(layer, "inputs")
    kernel_scale, _ = _internals.float8_variables(layer, "kernel")
    qx = quantize(x, inputs_scale, "float8_e4m3fn", dtype)
    qk = quantize(kernel, kernel_scale, "float8_e4m3fn", dtype)
    if type(layer).__name__ == "EinsumDense":
        product = keras.ops.einsum(layer.equation, qx, qk)
    else:
        product = keras.ops.matmul(qx, qk)
    with tf.GradientTape() as tape:
        tape.watch(product)
        out = product
        if layer.bias is not None:
            out = out + tf.cast(layer.bias, dtype)
        if layer.activation is not None:
            out = layer.activation(out)
    return tape.gradient(out, product,
                         output_gradients=tf.cast(output_gradient, out.dtype))
