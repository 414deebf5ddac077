"""XLA's optimized HLO text read into `tf_mixed.tools.census.step_ops.OpRecord`s."""

# With ``jit_compile=True`` the step that runs is what XLA made of the graph,
# and XLA may change dtypes: on a CPU it computes a float16 ``dot`` in float32
# (converting the operands first). ``tf.function.experimental_get_compiler_ir``
# hands out that program as text (``stage="optimized_hlo"``); this module reads
# one instruction per line:
#
#     %MatMul.0 = f32[8,16]{1,0} dot(%a, %b), lhs_contracting_dims={1}, ...,
#         metadata={op_type="MatMul" op_name="sequential_1/d1_1/MatMul" ...}
#
# The ``op_name`` in the metadata is the TF op the instruction came from, so
# instructions map to layers as graph ops do. FLOPs: a ``dot`` is 2 x output
# elements x the contracted size; a ``convolution`` 2 x output elements x the
# window size x the kernel's input features (its ``i`` dimension).

from __future__ import annotations

import math
import re

from tf_mixed.tools.census.step_ops import OpRecord

# The FLOPs and dimensions of an op that is no matrix product.
_NO_PRODUCT: tuple[int | None, tuple] = (0, ())

__all__ = ["HLO_DTYPES", "read_hlo"]

# HLO element types -> NumPy/TF dtype names (the others count as "other").
HLO_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
              "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}

# Opcodes that arrange or name data without computing on it: not counted.
_BOOKKEEPING = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy",
    "reshape", "broadcast", "transpose", "slice", "concatenate", "fusion",
    "call", "while", "conditional", "iota", "after-all", "custom-call",
    "dynamic-slice", "dynamic-update-slice", "copy-start", "copy-done",
    "pad", "reverse", "gather", "scatter", "opt-barrier", "partition-id",
    "replica-id",
})

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*"
    r"(?P<type>[a-z][a-z0-9]*)\[(?P<dims>[0-9,]*)\](?:\{[^}]*\})?\s+"
    r"(?P<opcode>[a-z][\w\-]*)\((?P<operands>[^)]*)\)(?P<rest>.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_PARAMETER = re.compile(r"^\s*(\d+)")


def _origins(parsed) -> dict[str, str]:
    """HLO name -> the TF op it came from (``op_name``), inherited where XLA added it.

    An instruction without metadata (a ``convert`` XLA put in front of a
    ``dot``, a fused computation's parameter) takes its origin from its first
    operand that has one; a fused computation's parameter i from operand i
    of the ``fusion`` calling it.
    """
    origin: dict[str, str] = {}
    callers: dict[str, list[str]] = {}  # computation -> the caller's operands
    for match, _, _ in parsed:
        found = _OP_NAME.search(match["rest"])
        if found:
            origin[match["name"]] = found.group(1)
        called = _CALLS.search(match["rest"])
        if called:
            callers.setdefault(called.group(1), _OPERAND.findall(match["operands"]))
    for _ in range(32):  # to a fixed point: origins flow along operands
        changed = False
        for match, _, computation in parsed:
            name = match["name"]
            if name in origin:
                continue
            if match["opcode"] == "parameter":
                index = _PARAMETER.match(match["operands"])
                sources = callers.get(computation, [])
                candidates = ([sources[int(index.group(1))]]
                              if index and int(index.group(1)) < len(sources) else [])
            else:
                candidates = _OPERAND.findall(match["operands"])
            inherited = next((origin[c] for c in candidates if c in origin), None)
            if inherited is not None:
                origin[name] = inherited
                changed = True
        if not changed:
            break
    return origin


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def _attr(rest: str, key: str) -> str | None:
    found = re.search(key + r"=\{?([^},\s]*(?:,[^},\s]*)*)\}?", rest)
    return found.group(1) if found else None


def read_hlo(text: str) -> list[OpRecord]:
    """The computing instructions of an HLO module as `OpRecord`s.

    Args:
      text: an HLO module as text (``experimental_get_compiler_ir(...)(
        stage="optimized_hlo")``).

    Returns:
      One record per array-valued instruction that computes (fusion
      wrappers, parameters, constants, reshapes and the like are left out;
      the instructions inside fused computations are counted). The record's
      name is the TF op the instruction came from (its ``op_name``; for an
      instruction XLA added without one, its first operand's), or the HLO
      name when none is known.

    Raises:
      ValueError: `text` holds no HLO instruction.
    """
    shapes: dict[str, tuple[str, list[int]]] = {}
    parsed = []
    computation = ""
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header is not None:
            computation = header.group(1)
            continue
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        shape = _dims(match["dims"])
        shapes[match["name"]] = (match["type"], shape)
        parsed.append((match, shape, computation))
    if not parsed:
        raise ValueError("the text holds no HLO instruction (expected lines such as "
                         "'%dot.1 = f32[8,16]{1,0} dot(%a, %b), ...')")
    origin = _origins(parsed)
    records = []
    for match, shape, _ in parsed:
        opcode = match["opcode"]
        operands = _OPERAND.findall(match["operands"])
        if opcode in _BOOKKEEPING:
            continue
        name = origin.get(match["name"], match["name"])
        dtype = HLO_DTYPES.get(match["type"], "other")
        elements = math.prod(shape)
        if opcode == "convert":
            source = HLO_DTYPES.get(shapes.get(operands[0], ("", []))[0]) if operands else None
            if source and dtype != "other" and source != dtype:
                records.append(OpRecord(name, "convert", dtype, cast_from=source,
                                        elements=elements))
            continue
        flops, dims = _NO_PRODUCT
        if opcode == "dot":
            flops, dims = _dot(match["rest"], operands, shapes, shape)
        elif opcode == "convolution":
            flops, dims = _convolution(match["rest"], operands, shapes, shape)
        if opcode in ("dot", "convolution") and dtype == "other":
            dtype = (HLO_DTYPES.get(shapes.get(operands[0], ("", []))[0], "other") if operands
                     else dtype)
        records.append(OpRecord(name, opcode, dtype, flops=flops, elements=elements, dims=dims))
    return records


def _dot(rest, operands, shapes, out) -> tuple[int | None, tuple]:
    contracting = _attr(rest, "lhs_contracting_dims")
    lhs = shapes.get(operands[0]) if operands else None
    if contracting is None or lhs is None:
        return None, ()
    k = math.prod(lhs[1][int(i)] for i in contracting.split(",") if i)
    return 2 * math.prod(out) * k, (("n", out[-1] if out else 1), ("k", k))


def _convolution(rest, operands, shapes, out) -> tuple[int | None, tuple]:
    labels = _attr(rest, "dim_labels")
    window = re.search(r"window=\{size=([0-9x]+)", rest)
    rhs = shapes.get(operands[1]) if len(operands) > 1 else None
    if labels is None or rhs is None or "_" not in labels:
        return None, ()
    kernel_labels = labels.split("_")[1].split("->")[0]
    sizes = [int(s) for s in window.group(1).split("x")] if window else [1]
    features = rhs[1][kernel_labels.index("i")]
    outputs = rhs[1][kernel_labels.index("o")]
    return 2 * math.prod(out) * math.prod(sizes) * features, (("n", outputs), ("k", features))
