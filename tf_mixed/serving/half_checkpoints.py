"""Half-size weight checkpoints that load into a model of any policy.

Keras saves weights in the variables' dtype: float32 under every mixed
policy, so a checkpoint is full size (keras-team/keras#17381, #18979).

    tf_mixed.serving.save_weights(model, "model.npz", dtype="float16")   # half the bytes
    tf_mixed.serving.load_weights(float32_model, "model.npz")            # any policy

The file is a NumPy ``.npz`` archive: one array per variable of
``model.weights``, in that order, plus ``__meta__`` (format version, saved
dtype, variable paths, shapes and dtypes). Float variables are stored in
`dtype` (bfloat16 as its raw 16 bits, NumPy having no bfloat16); other
variables (integer counters, ...) as they are. Loading casts each array to
the variable's own dtype, so a checkpoint written from a ``mixed_float16``
model loads into a float32 one and the reverse; rounding to float16 or
bfloat16 is the only change (half an ulp of that dtype, relative).

What is refused, before anything is written: a finite value that float16
(or bfloat16) cannot hold, naming the variables. What is reported: nonzero
values that become exactly 0 in `dtype` (below half its smallest subnormal:
float16 3e-8, bfloat16 5e-41) are saved as 0, with a ``UserWarning`` naming
each variable where they matter, how many values flush and the largest of
them; save with dtype="float32" to keep them. They matter when the largest
of them exceeds the error rounding may give the variable's largest value
(max|value| * eps / 2, eps of `dtype`): a variable of values near 1e-8 is
named, a bias of 1e-10 beside values of 0.01 is not (its loss is smaller
than the rounding of its other values). The optimizer's state is not part of
these files: it is never downcast; save it with the model (``model.save``)
when training is to resume. The file gets the permissions any new file
gets (``0o666`` less the umask), as Keras's files do.

Loading matches variables by path: each variable's ``path`` with the
model's name in front removed (``"m/dense/kernel"`` of a model "m" is
``"dense/kernel"``; a functional model's paths have no model name), so a
file loads into a model with the same layer names whatever the model's own
name and the order of its variables, and a model whose layers differ is
refused, naming the paths each side lacks. Keras numbers unnamed layers
per process (``dense``, ``dense_1``, ...): to load into a model whose
layers only got other numbers, name the layers, or pass ``by="order"`` to
pair variables by position (shapes still checked). Every file of this
format (``tf_mixed.weights/1``, the only one so far) holds the paths.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import warnings
from typing import Any

import keras
import numpy as np

from tf_mixed._internal.facts import EPSILON
from tf_mixed._internal.facts import HALF_DTYPES
from tf_mixed._internal.facts import check_model_kind

__all__ = ["load_weights", "save_weights"]

SAVE_DTYPES = ("float16", "bfloat16", "float32")
MATCH_BY = ("path", "order")
_FORMAT = "tf_mixed.weights/1"


def _numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # a TensorFlow dependency

        return ml_dtypes.bfloat16
    return np.dtype(name)


def _is_float(dtype: str) -> bool:
    return dtype in HALF_DTYPES or dtype in ("float32", "float64")


def save_weights(model: keras.Model, path: str | os.PathLike, *,
                 dtype: str = "float16") -> int:
    """Saves `model`'s weights with float variables stored in `dtype`.

    Args:
      model: A built `keras.Model` of any policy.
      path: The file to write (an ``.npz`` archive; the name is kept as
        given). Written to a temporary file and renamed.
      dtype: "float16", "bfloat16" or "float32".

    Returns:
      The number of bytes written.

    Raises:
      ValueError: An unknown `dtype`; an unbuilt model; a finite value that
        `dtype` cannot hold (the message names every such variable and its
        largest magnitude). Nothing is written then.
      TypeError: `model` is not a Keras model.

    Warns:
      UserWarning: Nonzero values that become 0 in `dtype` (the file is
        written, with those zeros), naming each variable, the count and the
        largest such magnitude.
    """
    check_model_kind(model, "save_weights()", traced=False)
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"save_weights() stores float variables in one of "
                         f"{', '.join(SAVE_DTYPES)}. Received: dtype={dtype!r}")
    if not model.built or not model.weights:
        raise ValueError(f"Model '{model.name}' has no weights yet: build it "
                         "(call it on data or model.build(input_shape)) first.")
    target = _numpy_dtype(dtype)
    import ml_dtypes  # a TensorFlow dependency; its finfo knows bfloat16

    limit = float(ml_dtypes.finfo(target).max)
    arrays: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    too_large: list[str] = []
    flushed: list[str] = []
    for i, variable in enumerate(model.weights):
        value = np.asarray(keras.ops.convert_to_numpy(variable.value))
        stored_dtype = variable.dtype
        if _is_float(variable.dtype):
            wide = value.astype(np.float32)
            # A finite value that rounds to inf does not fit (float16 from
            # 65520 up, say); inf and NaN already there are kept.
            if _overflows(wide, dtype).any():
                too_large.append(f"{variable.path} (max |value| {_largest(wide):.6g})")
            with np.errstate(over="ignore"):  # refused below, before writing
                value, stored_dtype = wide.astype(target), dtype
            zeros = (wide != 0) & (value.astype(np.float32) == 0)
            if zeros.any() and _flush_matters(wide, zeros, dtype):
                flushed.append(f"{variable.path} ({int(zeros.sum())} of {wide.size}, "
                               f"largest |value| {float(np.max(np.abs(wide[zeros]))):.3g})")
        if stored_dtype == "bfloat16":
            value = value.view(np.uint16)
        arrays[f"w{i}"] = value
        records.append({"path": variable.path, "shape": list(variable.shape),
                        "dtype": stored_dtype})
    if too_large:
        raise ValueError(
            f"Cannot store the weights of model '{model.name}' in {dtype}: "
            f"values beyond its largest finite value ({limit:g}) in "
            f"{', '.join(too_large)}. Nothing was written. Save with "
            "dtype='bfloat16' (float32's range) or dtype='float32'.")
    if flushed:
        warnings.warn(
            f"save_weights(dtype={dtype!r}) of model '{model.name}' stores as 0 "
            f"nonzero values too small for {dtype} (below "
            f"{float(ml_dtypes.finfo(target).smallest_subnormal) / 2:.3g}): "
            f"{', '.join(flushed)}. Save with dtype='float32' to keep them.",
            UserWarning, stacklevel=2)
    meta = {"format": _FORMAT, "dtype": dtype, "model": model.name, "variables": records}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    partial = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(4)}")
    # 0o666 less the umask, as open() and Keras give (mkstemp would give 0o600).
    handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return len(data)


def load_weights(model: keras.Model, path: str | os.PathLike, *, by: str = "path") -> None:
    """Loads a `save_weights` file into `model`, casting to its variables' dtypes.

    Args:
      model: A built `keras.Model` with the architecture the file was saved
        from, under any policy.
      path: A file written by `save_weights`.
      by: "path" (default): each variable takes the array saved under its
        path relative to its model (the model's own name removed), in any
        order. "order": the i-th variable takes the i-th array, for a model
        whose layers carry other names (Keras numbers unnamed layers per
        process); shapes are still checked.

    Raises:
      ValueError: An unknown `by`; the file is not a `save_weights` file; its
        variables do not match the model's (by path: the paths the file
        lacks and those the model lacks; by order: the count, or the first
        shape that differs); a value the model's half-precision variables
        cannot hold. The model is unchanged then.
      TypeError: `model` is not a Keras model.
    """
    check_model_kind(model, "load_weights()", traced=False)
    if by not in MATCH_BY:
        raise ValueError(f"load_weights() matches variables by one of "
                         f"{', '.join(map(repr, MATCH_BY))}. Received: by={by!r}")
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(bytes(archive["__meta__"]).decode())
            arrays = [archive[f"w{i}"] for i in range(len(meta["variables"]))]
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(
            f"{path!r} is not a weights file written by tf_mixed.serving.save_weights "
            f"({type(error).__name__}: {error}).") from None
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path!r} has format {meta.get('format')!r}; "
                         f"tf_mixed.serving.load_weights reads {_FORMAT!r}.")
    records, variables = meta["variables"], list(model.weights)
    if by == "path":
        records, arrays = _by_path(path, meta, arrays, model)
    elif len(records) != len(variables):
        raise ValueError(
            f"{path!r} holds {len(records)} variables (model '{meta['model']}') "
            f"but model '{model.name}' has {len(variables)}: load it into a model "
            "of the same architecture.")
    values = []
    for record, array, variable in zip(records, arrays, variables):
        if list(variable.shape) != record["shape"]:
            raise ValueError(
                f"{path!r}: variable {record['path']} has shape {record['shape']} "
                f"but the model's variable {variable.path} has shape "
                f"{list(variable.shape)}. Load it into a model of the same architecture.")
        if record["dtype"] == "bfloat16":
            array = array.view(_numpy_dtype("bfloat16"))
        values.append(array)
    too_large = [f"{v.path} (max |value| {_largest(a):.6g})"
                 for v, a in zip(variables, values)
                 if _is_float(str(a.dtype)) and v.dtype in HALF_DTYPES
                 and _overflows(a.astype(np.float32), v.dtype).any()]
    if too_large:
        raise ValueError(
            f"{path!r} holds values that model '{model.name}' cannot store in "
            f"its half-precision variables: {', '.join(too_large)}. The model "
            "is unchanged. Load it into a model with float32 variables.")
    # Every check passed: only now change the model.
    for variable, array in zip(variables, values):
        if _is_float(str(array.dtype)):
            array = array.astype(np.float32)
        variable.assign(keras.ops.cast(array, variable.dtype))


def _relative(variable_path: str, model_name: str) -> str:
    """A variable's path without its model's name in front (if it is there)."""
    prefix = f"{model_name}/"
    return variable_path[len(prefix):] if variable_path.startswith(prefix) else variable_path


def _by_path(path: str, meta: dict, arrays: list, model) -> tuple[list, list]:
    """The file's records and arrays in the order of ``model.weights``, by path."""
    saved = [_relative(r["path"], meta["model"]) for r in meta["variables"]]
    wanted = [_relative(v.path, model.name) for v in model.weights]
    for side, names in (("the file", saved), (f"model '{model.name}'", wanted)):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"{path!r}: {side} has several variables with the path "
                f"{', '.join(repeated[:5])}, so they cannot be matched by path. "
                "Pass by='order' to pair variables by position.")
    index = {name: i for i, name in enumerate(saved)}
    missing = [n for n in wanted if n not in index]
    extra = [n for n in saved if n not in set(wanted)]
    if missing or extra:
        def listed(names):
            shown = ", ".join(names[:8])
            return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")

        parts = []
        if missing:
            parts.append(f"model '{model.name}' has {listed(missing)}, which the file lacks")
        if extra:
            parts.append(f"the file (model '{meta['model']}') has {listed(extra)}, "
                         "which the model lacks")
        raise ValueError(
            f"{path!r} does not match model '{model.name}' by variable path "
            f"(paths without the model's name): {'; '.join(parts)}. The model is "
            "unchanged. Load it into a model with the same layers and layer "
            "names; if only Keras's automatic layer numbers differ "
            "(dense_1 for dense), name the layers or pass by='order'.")
    order = [index[n] for n in wanted]
    return [meta["variables"][i] for i in order], [arrays[i] for i in order]


def _flush_matters(wide: np.ndarray, zeros: np.ndarray, dtype: str) -> bool:
    """Whether the values flushed to 0 exceed the variable's own rounding.

    Rounding to `dtype` may move the variable's largest value by half an ulp
    (max|value| * eps / 2); values that vanish while smaller than that are
    lost within the error the variable already has (a bias of 1e-10 beside
    0.01), and are not reported.
    """
    largest = float(np.max(np.abs(wide[np.isfinite(wide)]), initial=0.0))
    lost = float(np.max(np.abs(wide[zeros])))
    return lost > largest * EPSILON[dtype] / 2


def _overflows(wide: np.ndarray, dtype: str) -> np.ndarray:
    """Where a finite float32 value becomes inf in `dtype` (inf/NaN kept)."""
    with np.errstate(over="ignore"):
        rounded = wide.astype(_numpy_dtype(dtype)).astype(np.float32)
    return np.isfinite(wide) & ~np.isfinite(rounded)


def _largest(array: np.ndarray) -> float:
    wide = np.abs(array.astype(np.float32))
    return float(np.max(wide[np.isfinite(wide)], initial=0.0))
