"""Did XLA run the float8 layers' matrix products as float8 GEMMs?"""

# Keras's float8 is quantize-dequantize around an ordinary matmul; on a GPU,
# XLA's GEMM rewriter can fold the float8 casts into one cuBLASLt float8 call
# (``custom_call_target="__cublas$lt$matmul$f8"``), and only then does float8
# save time. When the pattern does not match (a dimension not a multiple of
# 16, an op between the cast and the matmul, no Hopper/Ada GPU) the product
# runs in the wider type and float8 is emulated: the numerics of float8 at
# the cost of extra casts.
#
# `lowering_report` compiles the model's train step with XLA on a GPU, reads
# the optimized HLO, and says per float8 layer how many of its GEMMs (forward,
# input gradient, weight gradient) are float8. Without a GPU it answers
# "emulated (no GPU)" for every layer. `parse_gemms` and `attribute` are the
# pure parsing, tested on recorded HLO text.

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import keras
import tensorflow as tf

from tf_mixed._internal.facts import walk_layers
from tf_mixed.float8 import readiness

__all__ = ["FLOAT8_GEMM_TARGET", "Gemm", "LayerLowering", "LoweringReport",
           "attribute", "lowering_report", "parse_gemms"]

FLOAT8_GEMM_TARGET = "__cublas$lt$matmul$f8"
# cuBLAS / cuBLASLt GEMM custom-call targets (xla/service/gpu/cublas_cudnn.cc).
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", FLOAT8_GEMM_TARGET)
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]+)"')
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")

NO_GPU = "emulated (no GPU)"


class Gemm(NamedTuple):
    """One matrix product of an HLO module.

    Attributes:
        name: The HLO instruction's name.
        op_name: The TensorFlow op it came from (HLO metadata), or "".
        float8: Whether it is a cuBLASLt float8 GEMM.
    """

    name: str
    op_name: str
    float8: bool


def parse_gemms(hlo_text: str) -> list[Gemm]:
    """Every matrix product of an HLO module's text: dots and cuBLAS calls.

    Args:
        hlo_text: HLO text (``stage="optimized_hlo"``).

    Returns:
        One `Gemm` per ``dot`` or cuBLAS GEMM custom-call, in text order.
    """
    gemms = []
    for line in hlo_text.splitlines():
        name = _NAME.match(line)
        if name is None:  # not an instruction
            continue
        target = _TARGET.search(line)
        is_dot = " dot(" in line
        if not is_dot and not (target and target.group(1) in _GEMM_TARGETS):
            continue
        op_name = _OP_NAME.search(line)
        gemms.append(Gemm(name.group(1),
                          op_name.group(1) if op_name else "",
                          bool(target and target.group(1) == FLOAT8_GEMM_TARGET)))
    return gemms


def attribute(op_name: str, layer_names) -> str | None:
    """The layer an op belongs to, from its name scopes.

    TensorFlow names an op by the name scopes it was built in; a Keras layer
    opens one named after the layer, which ``tf.function`` may suffix with
    ``_N`` (``sequential_1/mid_1/MatMul`` for layer ``mid``; gradients get
    a ``gradient_tape/`` prefix). An exact scope match wins over a suffixed
    one.

    Args:
        op_name: The op's name.
        layer_names: The candidate layers' names.

    Returns:
        The deepest matching layer name, or None.
    """
    names = set(layer_names)
    found = None
    for part in op_name.split("/"):
        if part in names:
            found = part
        else:
            stripped = re.sub(r"_\d+$", "", part)
            if stripped in names:
                found = stripped
    return found


@dataclasses.dataclass(frozen=True)
class LayerLowering:
    """How one float8 layer was lowered.

    Attributes:
        layer: The layer's name.
        verdict: ``"float8 GEMM"`` (all its GEMMs), ``"partly float8"``,
            ``"emulated"`` (none), ``"emulated (no GPU)"``, or ``"no GEMM
            found"`` (its ops were not recognised in the HLO).
        float8_gemms: Its float8 GEMMs.
        gemms: All its GEMMs.
    """

    layer: str
    verdict: str
    float8_gemms: int
    gemms: int


@dataclasses.dataclass(frozen=True)
class LoweringReport:
    """`lowering_report`'s answer, per float8 layer.

    Attributes:
        model_name: The model's name.
        device: What was compiled for (``"GPU"``, ``"no GPU"`` or ``"HLO
            text"`` when given).
        layers: One `LayerLowering` per float8 layer.
    """

    model_name: str
    device: str
    layers: tuple[LayerLowering, ...]

    def verdicts(self) -> dict[str, str]:
        """Layer name -> verdict."""
        return {item.layer: item.verdict for item in self.layers}

    def __str__(self) -> str:
        lines = [f"Float8 lowering of model '{self.model_name}' ({self.device}):"]
        width = max([len(item.layer) for item in self.layers] + [5])
        for item in self.layers:
            counts = (f" ({item.float8_gemms} of {item.gemms} GEMMs float8)"
                      if item.gemms else "")
            lines.append(f"  {item.layer.ljust(width)}  {item.verdict}{counts}")
        return "\n".join(lines)


def _verdicts(layer_names, gemms) -> tuple[LayerLowering, ...]:
    counts = {name: [0, 0] for name in layer_names}
    for gemm in gemms:
        owner = attribute(gemm.op_name, layer_names)
        if owner is not None:
            counts[owner][1] += 1
            counts[owner][0] += int(gemm.float8)
    out = []
    for name in layer_names:
        fp8, total = counts[name]
        if total == 0:
            verdict = "no GEMM found"
        elif fp8 == total:
            verdict = "float8 GEMM"
        elif fp8:
            verdict = "partly float8"
        else:
            verdict = "emulated"
        out.append(LayerLowering(name, verdict, fp8, total))
    return tuple(out)


def lowering_report(model: keras.Model, x=None, y=None, *, loss=None,
                    hlo_text: str | None = None) -> LoweringReport:
    """Says per float8 layer whether XLA emitted a float8 GEMM for it.

    Args:
        model: A model with float8 layers.
        x: A batch of inputs (needed to compile on a GPU).
        y: Its targets.
        loss: The loss; default the compiled model's.
        hlo_text: Optimized HLO text to read instead of compiling (e.g. a
            dump from a GPU host, ``XLA_FLAGS=--xla_dump_to=...``).

    Returns:
        A `LoweringReport`.

    Raises:
        ValueError: the model has no float8 layer; on a GPU without
            ``hlo_text``, no batch or no loss.
    """
    names = []
    for _, layer in walk_layers(model):
        if readiness.is_float8(layer) and layer.name not in names:
            names.append(layer.name)
    if not names:
        raise ValueError(
            f"Model '{model.name}' has no float8 layer. Quantize it first: "
            "tf_mixed.float8.quantize(model).")
    if hlo_text is not None:
        return LoweringReport(model.name, "HLO text",
                              _verdicts(names, parse_gemms(hlo_text)))
    if not tf.config.list_logical_devices("GPU"):
        return LoweringReport(model.name, "no GPU", tuple(
            LayerLowering(name, NO_GPU, 0, 0) for name in names))
    if x is None or y is None:
        raise ValueError(
            "lowering_report() compiles the train step on this GPU and needs "
            "a batch: pass x=... and y=.... Received: x or y None.")
    text = _compiled_hlo(model, x, y, loss)
    return LoweringReport(model.name, "GPU", _verdicts(names, parse_gemms(text)))


def _compiled_hlo(model, x, y, loss) -> str:  # pragma: no cover - GPU only
    if loss is None:
        loss = getattr(model, "loss", None)
    if loss is None:
        raise ValueError(
            "lowering_report() needs a loss: pass loss=... or compile the "
            "model. Received: loss=None.")
    loss_fn = keras.losses.get(loss) if isinstance(loss, str) else loss
    variables = model.trainable_variables

    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss_fn(yb, model(xb, training=True)))
        return tape.gradient(value, variables)

    compiled = tf.function(step, jit_compile=True)
    return compiled.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
