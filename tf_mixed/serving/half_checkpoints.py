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
(or bfloat16) cannot hold, naming the variables. The optimizer's state is
not part of these files: it is never downcast; save it with the model
(``model.save``) when training is to resume.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any

import keras
import numpy as np

from tf_mixed._internal.facts import HALF_DTYPES
from tf_mixed._internal.facts import check_model_kind

__all__ = ["load_weights", "save_weights"]

SAVE_DTYPES = ("float16", "bfloat16", "float32")
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
    meta = {"format": _FORMAT, "dtype": dtype, "model": model.name, "variables": records}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    handle, partial = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    return len(data)


def load_weights(model: keras.Model, path: str | os.PathLike) -> None:
    """Loads a `save_weights` file into `model`, casting to its variables' dtypes.

    Args:
      model: A built `keras.Model` with the architecture the file was saved
        from, under any policy.
      path: A file written by `save_weights`.

    Raises:
      ValueError: The file is not a `save_weights` file, or its variables
        do not match the model's (count or a shape; the message names the
        first mismatch). The model is unchanged then.
      TypeError: `model` is not a Keras model.
    """
    check_model_kind(model, "load_weights()", traced=False)
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
    records, variables = meta["variables"], model.weights
    if len(records) != len(variables):
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


def _overflows(wide: np.ndarray, dtype: str) -> np.ndarray:
    """Where a finite float32 value becomes inf in `dtype` (inf/NaN kept)."""
    with np.errstate(over="ignore"):
        rounded = wide.astype(_numpy_dtype(dtype)).astype(np.float32)
    return np.isfinite(wide) & ~np.isfinite(rounded)


def _largest(array: np.ndarray) -> float:
    wide = np.abs(array.astype(np.float32))
    return float(np.max(wide[np.isfinite(wide)], initial=0.0))
