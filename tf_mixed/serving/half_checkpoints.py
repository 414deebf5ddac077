"""Half-size weight checkpoints that load into a model of any policy."""

# Keras saves weights in the variables' dtype: float32 under every mixed
# policy, so a checkpoint is full size (keras-team/keras#17381, #18979).
#
#     tf_mixed.serving.save_weights(model, "model.npz", dtype="float16")   # half the bytes
#     tf_mixed.serving.load_weights(float32_model, "model.npz")            # any policy
#
# The file is a NumPy ``.npz`` archive: one array per variable of
# ``model.weights``, in that order, plus ``__meta__`` (format version, saved
# dtype, and per variable its key, path, shape and dtype). Float variables are stored in
# `dtype` (bfloat16 as its raw 16 bits, NumPy having no bfloat16); other
# variables (integer counters, ...) as they are. Loading casts each array to
# the variable's own dtype, so a checkpoint written from a ``mixed_float16``
# model loads into a float32 one and the reverse; rounding to float16 or
# bfloat16 is the only change (half an ulp of that dtype, relative).
#
# What is refused, before anything is written: a finite value that float16
# (or bfloat16) cannot hold, naming the variables. What is reported: nonzero
# values that become exactly 0 in `dtype` (below half its smallest subnormal:
# float16 3e-8, bfloat16 5e-41) are saved as 0, with a ``UserWarning`` naming
# each variable where they matter, how many values flush and the largest of
# them; save with dtype="float32" to keep them. They matter when the largest
# of them exceeds the error rounding may give the variable's largest value
# (max|value| * eps / 2, eps of `dtype`): a variable of values near 1e-8 is
# named, a bias of 1e-10 beside values of 0.01 is not (its loss is smaller
# than the rounding of its other values). The optimizer's state is not part of
# these files: it is never downcast; save it with the model (``model.save``)
# when training is to resume. The file gets the permissions any new file
# gets (``0o666`` less the umask), as Keras's files do.
#
# Loading matches variables as Keras's own ``model.save_weights`` /
# ``load_weights`` does: by each variable's key, its place in the model's
# structure (``"layers/dense_1/vars/0"``: layers named by class, made unique
# within their container, as Keras's saving walks the model; a subclassed
# model's attributes by name), the very names Keras writes in a
# ``.weights.h5`` file. So a file loads into the same architecture built again
# in any process, whatever numbers Keras gave its layers (``dense_7`` for
# ``dense``) and whatever the model's name, and a changed architecture (a layer
# added or removed, a width changed, layers swapped) is refused before
# anything changes, naming the keys each side lacks or the shapes that differ.
# A variable Keras's saving does not store as itself (a LoRA-enabled layer's:
# it stores the merged kernel) keeps its variable path without the model's
# name. Files of format version 1 (``tf_mixed.weights/1``, which held only the
# process-wide variable paths) still load: by those paths where they match the
# model's, else by position where the count, order and shapes of the
# variables agree (a ``UserWarning`` says so in one line); otherwise they are
# refused, naming the paths each side lacks.

from __future__ import annotations

import io
import json
import os
import secrets
import warnings
from typing import Any

import keras
import numpy as np

from tf_mixed._internal import shims as _internals
from tf_mixed._internal.facts import EPSILON, HALF_DTYPES, check_model_kind

__all__ = ["load_weights", "save_weights"]

SAVE_DTYPES = ("float16", "bfloat16", "float32")
_FORMAT = "tf_mixed.weights/2"  # records: key, path, shape, dtype
_FORMAT_1 = "tf_mixed.weights/1"  # records: path, shape, dtype


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
    for i, (variable, key) in enumerate(zip(model.weights, _keys(model))):
        value = np.asarray(variable.numpy())
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
        records.append({"key": key, "path": variable.path, "shape": list(variable.shape),
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


def load_weights(model: keras.Model, path: str | os.PathLike) -> None:
    """Loads a `save_weights` file into `model`, casting to its variables' dtypes.

    Each variable takes the array saved under its key, its place in the
    model's structure as Keras's own ``save_weights`` names it
    (``"layers/dense_1/vars/0"``), in any order; see the module docstring
    for files of format version 1.

    Args:
      model: A built `keras.Model` with the architecture the file was saved
        from (built in any process, under any policy, under any name).
      path: A file written by `save_weights`.

    Raises:
      ValueError: The file is not a `save_weights` file; its variables do
        not match the model's (the keys each side lacks, or each variable
        whose shape differs, named); a value the model's half-precision
        variables cannot hold. The model is unchanged then.
      TypeError: `model` is not a Keras model.

    Warns:
      UserWarning: A version 1 file whose variable paths differ from the
        model's was loaded by position (count, order and shapes agreeing).
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
    if meta.get("format") not in (_FORMAT, _FORMAT_1):
        raise ValueError(f"{path!r} has format {meta.get('format')!r}; "
                         f"tf_mixed.serving.load_weights reads {_FORMAT!r} and {_FORMAT_1!r}.")
    variables = list(model.weights)
    if meta["format"] == _FORMAT:
        order = _match(path, meta, [r["key"] for r in meta["variables"]], _keys(model),
                       model, "key (its place in the model, as Keras's save_weights names it)")
    else:
        order = _match_version_1(path, meta, model)
    records = [meta["variables"][i] for i in order]
    arrays = [arrays[i] for i in order]
    differ = [f"{record.get('key', record['path'])} is {record['shape']} in the file, "
              f"{list(variable.shape)} in the model"
              for record, variable in zip(records, variables)
              if list(variable.shape) != record["shape"]]
    if differ:
        raise ValueError(
            f"{path!r} does not match model '{model.name}': {_listed(differ, '; ')}. "
            "The model is unchanged. Load it into a model of the architecture it "
            "was saved from.")
    values = []
    for record, array in zip(records, arrays):
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


def _keys(model) -> list[str]:
    """The key of each of ``model.weights``: where Keras's save_weights puts it.

    A variable Keras's walk does not store as itself keeps its path without
    the model's name.
    """
    placed = _internals.keras_weight_keys(model)
    keys = [placed.get(id(v), _relative(v.path, model.name)) for v in model.weights]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:  # only unplaced variables can share a key
        raise ValueError(
            f"Model '{model.name}' has several variables under the key "
            f"{_listed(repeated)}, so a weights file cannot tell them apart. "
            "Give the layers that own them distinct names.")
    return keys


def _listed(names: list[str], separator: str = ", ") -> str:
    shown = separator.join(names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _match(path: str, meta: dict, saved: list[str], wanted: list[str], model,
           what: str) -> list[int]:
    """For each of the model's variables, the index of the file's record of the same name.

    Raises:
      ValueError: The names differ, naming those each side lacks.
    """
    index = {name: i for i, name in enumerate(saved)}
    missing = [n for n in wanted if n not in index]
    extra = [n for n in saved if n not in set(wanted)]
    if missing or extra or len(saved) != len(wanted):
        parts = []
        if missing:
            parts.append(f"model '{model.name}' has {_listed(missing)}, which the file lacks")
        if extra:
            parts.append(f"the file (model '{meta['model']}') has {_listed(extra)}, "
                         "which the model lacks")
        raise ValueError(
            f"{path!r} does not match model '{model.name}' by each variable's "
            f"{what}: {'; '.join(parts) or 'a name repeats'}. The model is unchanged. "
            "Load it into a model of the architecture it was saved from.")
    return [index[n] for n in wanted]


def _match_version_1(path: str, meta: dict, model) -> list[int]:
    """`_match` for a version 1 file: by path, else by position where shapes agree."""
    records, variables = meta["variables"], list(model.weights)
    saved = [_relative(r["path"], meta["model"]) for r in records]
    wanted = [_relative(v.path, model.name) for v in variables]
    if sorted(saved) == sorted(wanted) and len(set(saved)) == len(saved):
        return _match(path, meta, saved, wanted, model, "path")
    if len(records) == len(variables) and all(
            r["shape"] == list(v.shape) for r, v in zip(records, variables)):
        warnings.warn(
            f"{path!r} ({_FORMAT_1}: process-wide variable paths, which differ from "
            f"model '{model.name}''s) loaded by position: its {len(records)} variables' "
            "order and shapes agree with the model's; save it again to store "
            "structural keys.", UserWarning, stacklevel=3)
        return list(range(len(records)))
    return _match(path, meta, saved, wanted, model,
                  f"path without the model's name ({_FORMAT_1} file; by position "
                  f"the count or a shape differs too)")


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
