"""A user's data file (``--dataset=npz:PATH``) read once; each wrong shape said one way."""

# probe, doctor and export take ``npz:PATH``: arrays x and y (or x0, x1, ... for a
# model of several inputs, y0, y1, ... for several outputs; export needs only x).
# `load` reads the file and checks it against the model; `input_problem` is the one
# sentence for data whose inputs the model does not take, which doctor also says of
# the bench's generated sets. Every message names the file, the array, the shape
# received and what the model expects.

from __future__ import annotations

import os
import zipfile
from typing import Any, Sequence

import numpy as np

from tf_mixed._internal.cli_errors import UsageError

PREFIX = "npz:"
ACCEPTED_XY = "npz:PATH with arrays x and y (or x0, x1, ... and y0, y1, ...)"
ACCEPTED_X = "npz:PATH with an array x (or x0, x1, ...)"


def shape_text(shape: Sequence[Any]) -> str:
    """``(None, 8)``, ``(16,)``, ``()``: a shape as Python writes a tuple, None kept."""
    dims = ["None" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _detail(expected: tuple, received: tuple) -> str:
    if len(expected) != len(received):
        return f"rank {len(expected)} expected, got {len(received)}"
    return "; ".join(
        f"{'width' if i == len(expected) - 1 else f'dimension {i}'} {w} expected, got {h}"
        for i, (w, h) in enumerate(zip(expected, received))
        if i and w is not None and h is not None and w != h)


def _fits(expected: tuple, received: tuple) -> bool:
    return len(expected) == len(received) and all(
        w is None or h is None or w == h for w, h in zip(expected[1:], received[1:]))


def input_problem(model, keys: Sequence[str], shapes: Sequence[tuple]) -> str | None:
    """The sentence for inputs ``model`` cannot take, or None when they fit.

    Args:
        model: A `keras.Model`.
        keys: The name of each input array as the user knows it ("x", "x0", ...).
        shapes: Each input array's shape, batch dimension first (None where unknown).

    Returns:
        "model 'm' takes 2 input(s); the data has 1 x array(s) (x)", or "x has shape
        (16, 7); model 'm' input 'features' takes (None, 8) (width 8 expected,
        got 7)", or None (also for a model without known inputs).
    """
    inputs = list(getattr(model, "inputs", None) or [])
    if not inputs:  # a subclassed model that was never called: nothing to check against
        return None
    if len(inputs) != len(shapes):
        return (f"model {model.name!r} takes {len(inputs)} input(s); the data has "
                f"{len(shapes)} x array(s) ({', '.join(keys)})")
    for key, tensor, received in zip(keys, inputs, shapes):
        expected, received = tuple(tensor.shape), tuple(received)
        if not _fits(expected, received):
            return (f"{key} has shape {shape_text(received)}; model {model.name!r} input "
                    f"{tensor.name!r} takes {shape_text(expected)} "
                    f"({_detail(expected, received)})")
    return None


def _numbered(archive, key: str) -> tuple[list[str], list[np.ndarray]]:
    if key in archive.files:
        return [key], [archive[key]]
    keys: list[str] = []
    while f"{key}{len(keys)}" in archive.files:
        keys.append(f"{key}{len(keys)}")
    return keys, [archive[k] for k in keys]


def _target_problem(model, key: str, y: np.ndarray) -> str | None:
    """A single y that is neither class indices nor targets of the output's shape.

    Class indices have the output's shape without its last axis (or with 1 there):
    ``(n,)`` for outputs ``(None, 3)``, ``(n, 20)`` for per-token outputs ``(None, 20, 64)``.
    """
    outputs = list(getattr(model, "outputs", None) or [])
    if len(outputs) != 1:
        return None
    output = tuple(outputs[0].shape)
    indices = output[:-1]
    if any(_fits(shape, (None, *y.shape[1:])) for shape in (output, indices, (*indices, 1))):
        return None
    count = len(y)
    return (f"{key} has shape {shape_text(y.shape)}; model {model.name!r} gives outputs of "
            f"shape {shape_text(output)}, so {key} takes class indices "
            f"{shape_text((count, *indices[1:]))} or targets {shape_text((count, *output[1:]))}")


def load(spec: str, model, *, need_y: bool, limit: int) -> tuple[Any, Any]:
    """Reads ``npz:PATH`` and checks it against ``model``.

    Args:
        spec: The ``--dataset`` value, ``"npz:PATH"``.
        model: The `keras.Model` the data is for.
        need_y: Whether targets are needed (probe, doctor) or only inputs (export).
        limit: How many examples to keep (the first ones).

    Returns:
        ``(x, y)``: each an array, or a list of arrays for several inputs/outputs;
        y is None when not ``need_y``.

    Raises:
        UsageError: For a file that is missing or not an .npz archive, a missing
            array, inputs the model does not take, arrays of different lengths,
            or a single y that fits neither class indices nor the output.
    """
    path = spec[len(PREFIX):]
    accepted = ACCEPTED_XY if need_y else ACCEPTED_X

    def refuse(problem: str) -> UsageError:
        return UsageError("dataset", spec, problem, accepted)

    if not os.path.isfile(path):
        raise refuse(f"no such file {path!r}")
    if not zipfile.is_zipfile(path):
        raise refuse(f"{path!r} is not an .npz archive (numpy.savez writes one)")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise refuse(f"cannot read {path!r} as .npz ({type(error).__name__}: {error})") from None
    with archive:
        x_keys, xs = _numbered(archive, "x")
        y_keys, ys = _numbered(archive, "y") if need_y else ([], [])
        missing = (["x"] if not xs else []) + (["y"] if need_y and not ys else [])
        if missing:
            raise refuse(f"the file has no {' or '.join(missing)} array "
                         f"(it has {', '.join(archive.files) or 'none'})")
    problem = input_problem(model, x_keys, [a.shape for a in xs])
    if problem:
        raise refuse(problem)
    lengths = {key: len(a) for key, a in zip(x_keys + y_keys, xs + ys) if a.ndim}
    flat = [key for key, a in zip(y_keys, ys) if not a.ndim]
    if flat:
        raise refuse(f"{flat[0]} has shape (); it needs one target per example")
    if len(set(lengths.values())) > 1:
        listed = " and ".join(f"{key} has {n}" for key, n in lengths.items())
        raise refuse(f"the arrays hold different numbers of examples: {listed}")
    if len(ys) == 1:
        problem = _target_problem(model, y_keys[0], ys[0])
        if problem:
            raise refuse(problem)

    def first(arrays: list[np.ndarray]):
        kept = [a[:limit] for a in arrays]
        return kept[0] if len(kept) == 1 else kept

    return first(xs), (first(ys) if need_y else None)
