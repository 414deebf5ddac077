"""The ops of a traced training step as plain records: type, dtype, FLOPs, casts."""

# `read_graph` walks a ``tf.Graph`` (a ``tf.function``'s ``FuncGraph``),
# entering the functions its control-flow ops run (the loss-scale optimizer's
# ``cond``), and returns one `OpRecord` per op that computes something.
# `tf_mixed.tools.census.hlo_ops` reads XLA's optimized HLO into the same records, so
# `tf_mixed.census` aggregates both the same way.
#
# FLOPs are counted for matrix products and convolutions only, from static
# shapes, as 2 x (multiply-adds): a ``MatMul`` of (m, k) by (k, n) is 2mkn; a
# convolution 2 x (output elements) x (filter elements per output channel);
# the backward convolutions the same from their ``out_backprop``. A shape with
# an unknown dimension gives None (counted apart, never guessed).

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["COMPUTE_KINDS", "OpRecord", "itemsize", "read_graph"]

# Op types that move or hold data without computing on it: not counted.
_BOOKKEEPING = frozenset({
    "Placeholder", "Const", "NoOp", "Identity", "IdentityN", "ReadVariableOp",
    "VarHandleOp", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "If", "StatelessIf", "While", "StatelessWhile",
    "PartitionedCall", "StatefulPartitionedCall", "Shape", "ShapeN", "Rank",
    "Size", "StopGradient", "PreventGradient", "Reshape", "ExpandDims",
    "Squeeze", "Pack", "Unpack", "ConcatV2", "StridedSlice", "Fill", "Range",
    "DestroyResourceOp", "OptionalFromValue", "OptionalGetValue",
    "OptionalHasValue", "OptionalNone", "Enter", "Exit", "Merge", "Switch",
    "NextIteration", "LoopCond",
})

# Matrix products and convolutions, the ops Tensor Cores and AMX run:
# op type -> how their FLOPs are read (see `_flops`).
COMPUTE_KINDS = {
    "MatMul": "matmul", "BatchMatMul": "batch_matmul",
    "BatchMatMulV2": "batch_matmul", "BatchMatMulV3": "batch_matmul",
    "Einsum": "einsum",
    "Conv2D": "conv", "Conv3D": "conv", "Conv": "conv",
    "Conv2DBackpropInput": "conv_input", "Conv3DBackpropInputV2": "conv_input",
    "Conv2DBackpropFilter": "conv_filter", "Conv3DBackpropFilterV2": "conv_filter",
    "DepthwiseConv2dNative": "depthwise",
    "DepthwiseConv2dNativeBackpropInput": "depthwise_input",
    "DepthwiseConv2dNativeBackpropFilter": "depthwise_filter",
}


@dataclasses.dataclass(frozen=True)
class OpRecord:
    """One op of the step.

    Attributes:
      name: the op's name (its name scope tells the layer).
      type: the TF op type (``MatMul``) or HLO opcode (``dot``).
      dtype: the float dtype it computes in (``float16``...), or "other"
        for an op on integers/booleans only.
      flops: matmul/conv FLOPs, 0 for other ops, None when a shape is unknown.
      cast_from: for a cast between two float dtypes, the source dtype.
      elements: elements the op outputs (None if unknown).
      dims: for a matmul/conv, ``(("n", N), ("k", K))``: the output features
        and the contracted width (for a convolution, the output and input
        channels); () otherwise.
      inputs: names of the ops whose outputs it reads.
      from_constant: for a cast, whether it casts a constant of the graph
        (a NumPy scalar a layer computes with), not data or a variable.
    """

    name: str
    type: str
    dtype: str
    flops: int | None = 0
    cast_from: str | None = None
    elements: int | None = None
    dims: tuple = ()
    inputs: tuple[str, ...] = ()
    from_constant: bool = False

    @property
    def is_compute(self) -> bool:
        """A matrix product or convolution."""
        return self.type in COMPUTE_KINDS or self.type in ("dot", "convolution")

    @property
    def cast_bytes(self) -> int | None:
        """Bytes a float cast reads and writes (None: not a cast, or unknown)."""
        if self.cast_from is None or self.elements is None:
            return None
        return self.elements * (itemsize(self.cast_from) + itemsize(self.dtype))


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (``bfloat16`` -> 2)."""
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return max(1, int(digits) // 8) if digits else 1


def _float_name(dtype) -> str | None:
    return dtype.name if dtype.is_floating else None


def _op_dtype(op) -> str:
    for tensor in list(op.outputs) + list(op.inputs):
        name = _float_name(tensor.dtype)
        if name:
            return name
    return "other"


def _shape(tensor) -> Any:  # a list of int | None, or None for an unknown rank
    if tensor.shape.rank is None:
        return None
    return list(tensor.shape.as_list())


def _known(*shapes) -> bool:
    return all(s is not None and None not in s for s in shapes)


# Ops that pass a tensor on (or change its dtype or layout) between where it
# is made and where it is used: looked through to find a tensor's source.
_PASS_THROUGH = frozenset({"Identity", "Cast", "Reshape", "Transpose", "ExpandDims", "Squeeze"})


def _source(tensor):
    """The op that made `tensor`, through casts, identities and reshapes."""
    op = tensor.op
    for _ in range(8):
        if op.type not in _PASS_THROUGH or not op.inputs:
            return op
        op = op.inputs[0].op
    return op


def _reads_weight(op) -> bool:
    """Whether a matrix product multiplies by a variable (a layer's kernel).

    A product of two activations (attention scores ``q @ k^T``, the context
    ``scores @ v``) has the sequence length, not a layer width, as its
    output dimension: its dims are not a width to pad.
    """
    return any(_source(t).type in ("ReadVariableOp", "ResourceGather") for t in op.inputs)


def _flops(op) -> tuple[int | None, tuple]:
    """(FLOPs, dims) of a matmul/conv op from its static shapes.

    The dims of a product of two activations (no operand reads a variable)
    are left out: its output dimension is a token count, not a width.
    """
    kind = COMPUTE_KINDS[op.type]
    if kind in ("matmul", "batch_matmul", "einsum"):
        flops, dims = _product_flops(op, kind)
        return flops, dims if _reads_weight(op) else ()
    return _conv_flops(op, kind)


def _product_flops(op, kind: str) -> tuple[int | None, tuple]:
    out = _shape(op.outputs[0])
    if kind in ("matmul", "batch_matmul"):
        a = _shape(op.inputs[0])
        if not _known(out, a):
            return None, ()
        try:
            adjoint = op.get_attr("transpose_a" if kind == "matmul" else "adj_x")
        except ValueError:
            adjoint = False
        k = a[-2] if adjoint else a[-1]
        return 2 * _prod(out) * k, (("n", out[-1]), ("k", k))
    return _einsum_flops(op.get_attr("equation").decode(), op.inputs, out)


def _conv_flops(op, kind: str) -> tuple[int | None, tuple]:
    out = _shape(op.outputs[0])
    if kind in ("conv", "depthwise"):
        grad, filt = out, _shape(op.inputs[1])
    elif kind in ("conv_input", "depthwise_input"):
        grad, filt = _shape(op.inputs[2]), _shape(op.inputs[1])
    else:  # the filter gradient: its output has the filter's shape
        grad, filt = _shape(op.inputs[2]), out
    if not _known(grad, filt):
        return None, ()
    if kind.startswith("depthwise"):  # per channel: no matrix tile to fill
        return 2 * _prod(grad) * _prod(filt[:-2]), ()
    return 2 * _prod(grad) * _prod(filt[:-1]), (("n", filt[-1]), ("k", filt[-2]))


def _prod(shape) -> int:
    """The product of a fully known shape's dimensions."""
    return math.prod(int(d) for d in shape)


def _einsum_flops(equation: str, inputs, out) -> tuple[int | None, tuple]:
    """2 x output elements x the product of the contracted letters' sizes."""
    if "->" not in equation:
        return None, ()
    operands, result = equation.replace(" ", "").split("->")
    sizes: dict[str, int | None] = {}
    for letters, tensor in zip(operands.split(","), inputs):
        shape = _shape(tensor)
        if shape is None or "." in letters:
            letters = letters.replace("...", "")
            if shape is None:
                return None, ()
            shape = shape[len(shape) - len(letters):]
        for letter, size in zip(letters, shape):
            sizes[letter] = size
    contracted = [c for c in sizes if c not in result]
    if not _known(out) or any(sizes[c] is None for c in contracted):
        return None, ()
    k = _prod(sizes[c] for c in contracted)
    return 2 * _prod(out) * k, (("n", out[-1]), ("k", k))


def _elements(op) -> int | None:
    if not op.outputs:
        return None
    shape = _shape(op.outputs[0])
    return _prod(shape) if _known(shape) else None


def _record(op) -> OpRecord:
    inputs = tuple(t.op.name for t in op.inputs)
    if op.type == "Cast":
        source = _float_name(op.inputs[0].dtype)
        target = _float_name(op.outputs[0].dtype)
        if source and target and source != target:
            return OpRecord(op.name, "Cast", target, cast_from=source,
                            elements=_elements(op), inputs=inputs,
                            from_constant=_source(op.inputs[0]).type == "Const")
    if op.type in COMPUTE_KINDS:
        flops, dims = _flops(op)
        return OpRecord(op.name, op.type, _op_dtype(op), flops=flops,
                        elements=_elements(op), dims=dims, inputs=inputs)
    return OpRecord(op.name, op.type, _op_dtype(op), elements=_elements(op),
                    inputs=inputs)


def read_graph(graph, *, skip_scope=None) -> list[OpRecord]:
    """Every computing op of `graph` and of the functions it calls.

    Args:
      graph: a ``tf.Graph``.
      skip_scope: a predicate on an op name; ops for which it is true (and
        the functions they call) are left out (the census uses it to keep
        one replica of a multi-replica step).

    Returns:
      `OpRecord`s in graph order, a called function's ops after the op that
      calls it. Dead ops are left out: TF's gradient functions build some
      results nothing reads (a convolution's input gradient for the first
      layer, whose input is data), which the runtime prunes. The ops of both
      branches of a ``cond`` are included (one of them runs); the body of a
      ``while`` loop is counted once.
    """
    from tf_mixed._internal import shims as _internals

    records: list[OpRecord] = []
    stack: list[Iterable] = [_live(graph)]
    while stack:
        for op in stack.pop():
            if skip_scope is not None and skip_scope(op.name):
                continue
            for _, inner in _internals.function_graphs(op):
                stack.append(_live(inner))
            if op.type not in _BOOKKEEPING:
                records.append(_record(op))
    return records


def _live(graph) -> list:
    """The ops of `graph` that run: those the outputs or a stateful op need."""
    ops = graph.get_operations()
    roots = [t.op for t in getattr(graph, "outputs", ()) or ()]
    roots += list(getattr(graph, "control_outputs", ()) or ())
    roots += [op for op in ops if op.op_def is not None and op.op_def.is_stateful]
    live: set = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op in live:
            continue
        live.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in ops if op in live]
