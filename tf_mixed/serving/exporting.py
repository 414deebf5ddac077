"""Export a (mixed-precision) trained model to a serving artifact, checked."""

#     report = tf_mixed.export(model, "model.tflite", format="litert",
#                              precision="float16_weights", sample=x[:32])
#     print(report)          # sizes, dtypes, and the error against the model
#
# What goes wrong without it (TF 2.21, Keras 3.15): ``model.export(...,
# format="litert")`` of a ``mixed_float16`` model writes a file only the Flex
# delegate runs, and a SavedModel of a model without a float32 head returns
# float16. `export`:
#
# 1. rebuilds the model in the precision asked for, with the trained weights
#    and what Keras's saving carries besides (`tf_mixed.models.conversion.rebuild`:
#    float32 layers of a mixed model, and tf_mixed's float32 heads, stay
#    float32), without the optimizer; ``precision="as_trained"`` resolving to
#    the dtype the model computes in serves the model itself, with no copy;
# 2. writes a SavedModel whose ``serve`` endpoint takes the model's input
#    dtypes and returns float32, and for LiteRT converts it with LiteRT's
#    builtin ops (float16 weights for ``"float16_weights"``), refusing a file
#    that needs TensorFlow's Select ops unless ``allow_select_ops=True``;
# 3. loads the artifact back and runs it in its own runtime
#    (``tf.saved_model.load``, fed the inputs' structure; the
#    ``ai_edge_litert`` interpreter, which has no Flex delegate, fed each
#    input by its name and read each output by its signature key) on `sample`
#    (or on a batch of zeros, to prove it runs) and compares it with the model
#    in memory;
# 4. only then renames it to `path`, replacing only what an export writes
#    there (a file for LiteRT, a SavedModel or an empty directory): a
#    directory of other files is refused before any work, and a failed
#    export leaves `path` as it was.
#
# Precisions (`PRECISIONS`) and the default tolerance of each: the error of
# an artifact against the model comes from rounding to the coarser of the two
# dtypes involved, the one the model computes in and the one the artifact
# rounds to, so the default tolerance is `TOLERANCE_ULPS` machine epsilons of
# that dtype (``tf_mixed._internal.facts.EPSILON``), as a relative error: per output,
# max|artifact - model| / max|model|.

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate
from tf_mixed._internal.facts import (
    EPSILON,
    EXPORT_FORMATS,
    EXPORT_PRECISIONS,
    check_model_kind,
    export_precision_problem,
)
from tf_mixed.models import conversion as rebuild_module
from tf_mixed.serving.export_report import ExportReport

__all__ = ["export"]  # FORMATS, PRECISIONS, default_tolerance: module-level reference

# format -> the precisions it can write: one table, TensorFlow-free, that the
# command line also checks its flags against (`tf_mixed._internal.facts`).
FORMATS = EXPORT_FORMATS
PRECISIONS = EXPORT_PRECISIONS

# precision -> (dtype the rebuilt model computes in, dtype the artifact rounds to)
_DTYPES = {
    "float32": ("float32", "float32"),
    "float16_weights": ("float32", "float16"),
    "float16": ("float16", "float16"),
    "bfloat16": ("bfloat16", "bfloat16"),
}

def as_trained(format: str, trained_dtype: str) -> str:
    """The precision "as_trained" means for `format` and the model's compute dtype.

    A SavedModel computes in the trained dtype; LiteRT's builtin ops compute
    in float32, so a half-precision model's nearest LiteRT file is float32
    compute with float16 weights.
    """
    if format == "litert" and trained_dtype != "float32":
        return "float16_weights"
    return trained_dtype

# Default tolerance, in machine epsilons of the coarser dtype: rounding to
# that dtype costs eps/2 per operation; 16 eps (4 bits of its mantissa)
# allows the errors of a few layers to add up, and is not a fitted number.
TOLERANCE_ULPS = 16


def default_tolerance(precision: str, trained_dtype: str) -> float:
    """The relative error `export` accepts by default.

    Args:
      precision: A resolved precision ("float32", "float16_weights",
        "float16" or "bfloat16").
      trained_dtype: The dtype the model in memory computes in.

    Returns:
      ``TOLERANCE_ULPS * eps`` of the coarser of the artifact's rounding
      dtype and `trained_dtype`: float32 1.9e-6, float16 0.0156, bfloat16
      0.125.
    """
    rounding = _DTYPES[precision][1]
    return TOLERANCE_ULPS * max(EPSILON[rounding], EPSILON[trained_dtype])


def export(model: keras.Model, path: str | os.PathLike, *, format: str = "saved_model",
           precision: str = "float32", sample: Any = None, tolerance: float | None = None,
           allow_select_ops: bool = False) -> ExportReport:
    """Writes a serving artifact of `model` and checks it against the model.

    Args:
      model: A built Sequential or functional `keras.Model`, trained under
        any policy (a subclassed one with ``precision="as_trained"`` when it
        computes in float32, or as a SavedModel). Not modified; its
        optimizer is not exported.
      path: Where to write: a directory for "saved_model", a file (say
        ``model.tflite``) for "litert"; its parent directory is created if
        needed. What export writes is replaced (a file for "litert"; a
        directory holding a SavedModel, or an empty one, for
        "saved_model"); anything else there (a directory of other files, a
        directory where a file goes, a symbolic link) is refused.
      format: "saved_model" or "litert".
      precision: "float32" (float32 compute and I/O whatever the training
        policy), "float16_weights" (LiteRT: weights stored in float16,
        float32 compute and I/O), "float16" or "bfloat16" (SavedModel
        computing and storing weights in half precision, float32 outputs),
        or "as_trained" (see `PRECISIONS`; LiteRT of a half-precision model
        gives "float16_weights"). Layers that are float32 in a mixed model
        stay float32 in every precision.
      sample: Optional inputs for one batch, as ``model(sample)`` takes them
        (an array, or a list/dict of arrays). The artifact's outputs on it
        are compared with the model's.
      tolerance: The largest relative error accepted (per output,
        max|artifact - model| / max|model|); None for
        `default_tolerance(precision, trained dtype)`.
      allow_select_ops: LiteRT only: accept a file that needs TensorFlow
        Select ops (the Flex delegate); by default such a file is refused.

    Returns:
      An `ExportReport`.

    Raises:
      TypeError: `model` is not a Keras model, or a kind this precision
        cannot be rebuilt from (the message names the kind).
      ValueError: An unknown format or precision, a precision the format
        cannot write, a bad tolerance, a sample that does not fit the
        model, a `path` export may not replace (see `path`; checked before
        any work), a LiteRT file needing Select ops (naming them), or an
        artifact whose error exceeds `tolerance` (naming the worst output).
        What was at `path` is left as it was in every case.
    """
    check_model_kind(model, "export()", traced=False)
    if format not in FORMATS:
        raise ValueError(
            f"Unknown export format {format!r}. Use one of: {', '.join(FORMATS)}. "
            f"Received: format={format!r}")
    hint = export_precision_problem(format, precision)
    if hint:
        raise ValueError(
            f"format={format!r} cannot write precision={precision!r} ({hint}). "
            f"Use one of: {', '.join(PRECISIONS[format])}.")
    if tolerance is not None:
        tolerance = _validate.number(
            tolerance, "tolerance", owner="export()", rule=lambda t: 0 < t < float("inf"),
            valid="a positive finite number (a relative error, such as 1e-3) or None "
                  "for the default")
    _validate.boolean(allow_select_ops, "allow_select_ops", owner="export()")
    path = os.fspath(path)
    _check_destination(path, format)

    trained = rebuild_module.compute_dtype(model)
    resolved = as_trained(format, trained) if precision == "as_trained" else precision
    tolerance = (default_tolerance(resolved, trained) if tolerance is None
                 else float(tolerance))
    serving = _serving_model(model, resolved, trained, precision)
    specs = _input_specs(model, serving, sample)
    reference = None
    if sample is not None:
        sample = _as_inputs(sample, specs)
        reference = _outputs_of(model, sample)

    parent = os.path.dirname(os.path.abspath(path))
    created = _make_dirs(parent)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        artifact, select_ops, runtime, got = _write_and_run(
            serving, specs, staging, format, resolved, model.name, sample, allow_select_ops)
        errors = (None, None, None) if reference is None else _compare(
            reference, got, _output_names(model, len(reference)), tolerance, format, resolved)
        size = _size(artifact)
        _move(artifact, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for directory in reversed(created):
            _remove_if_empty(directory)
        raise
    shutil.rmtree(staging, ignore_errors=True)

    flat_specs = keras.tree.flatten(specs)
    outputs = keras.tree.flatten(serving.outputs) if rebuild_module.is_graph_model(serving) else got
    return ExportReport(
        path=path, format=format, precision=resolved, trained_dtype=trained,
        input_names=tuple(s.name for s in flat_specs),
        input_dtypes=tuple(s.dtype.name for s in flat_specs),
        input_shapes=tuple(tuple(s.shape) for s in flat_specs),
        output_names=_output_names(model, len(outputs)),
        output_dtypes=tuple("float32" if _is_float(o.dtype) else _dtype_name(o.dtype)
                            for o in outputs),
        output_shapes=tuple((None,) + tuple(o.shape[1:]) for o in outputs),
        bytes=size, select_ops=select_ops, runtime=runtime, tolerance=tolerance,
        max_abs_error=errors[0], max_rel_error=errors[1], worst_output=errors[2])


# --------------------------------------------------------------- the model


def _serving_model(model, resolved: str, trained: str, requested: str):
    compute = _DTYPES[resolved][0]
    if requested == "as_trained" and compute == trained:
        return model  # served as it computes: no copy to make
    if rebuild_module.is_graph_model(model):
        return rebuild_module.rebuild(model, compute)
    return rebuild_module.rebuild(model, compute)  # raises, naming the kind


def _input_specs(model, serving, sample):
    """The ``serve`` endpoint's input signature, in the model's structure."""
    if rebuild_module.is_graph_model(serving):
        def spec(tensor):
            name = getattr(_internals.keras_history(tensor), "operation", None)
            return tf.TensorSpec((None,) + tuple(tensor.shape[1:]), tensor.dtype,
                                 name=getattr(name, "name", None))

        # A Sequential model's ``input`` raises until it is called.
        structure = model.inputs[0] if isinstance(model, keras.Sequential) else model.input
        return keras.tree.map_structure(spec, structure)
    if sample is None:
        raise ValueError(
            f"export() of the subclassed model '{model.name}' needs sample=...: "
            "it has no declared inputs to take the input signature from.")
    # Each input needs its own name: it is its key in the signature.
    count = len(keras.tree.flatten(sample))
    names = iter(["input"] if count == 1 else [f"input_{i}" for i in range(count)])
    return keras.tree.map_structure(
        lambda x: tf.TensorSpec((None,) + tuple(np.shape(x)[1:]),
                                tf.as_dtype(getattr(x, "dtype", "float32")),
                                name=next(names)), sample)


def _as_inputs(sample, specs):
    """`sample` as arrays of the signature's dtypes, checked against it."""
    try:
        keras.tree.assert_same_structure(sample, specs)
    except (ValueError, TypeError):
        raise ValueError(
            "sample does not have the structure of the model's inputs "
            f"({_describe(specs)}). Received: sample of type "
            f"{type(sample).__name__}") from None

    def convert(x, spec):
        array = np.asarray(x)
        fits = array.ndim == len(spec.shape) and all(
            want is None or want == got for got, want in zip(array.shape[1:], spec.shape[1:]))
        if not fits:
            raise ValueError(
                f"sample has shape {array.shape} where the model's input "
                f"'{spec.name}' takes {tuple(spec.shape)} (None: any size, such as the "
                "batch or a sequence length). Pass one batch of the model's inputs.")
        return tf.constant(array, dtype=spec.dtype)

    return keras.tree.map_structure(convert, sample, specs)


def _describe(specs) -> str:
    return ", ".join(f"{s.name} {s.dtype.name}{tuple(s.shape)}" for s in keras.tree.flatten(specs))


def _outputs_of(model, inputs) -> list[np.ndarray]:
    outputs = model(inputs, training=False)
    return [np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(o, "float32"))
                       if _is_float(o.dtype) else keras.ops.convert_to_numpy(o))
            for o in keras.tree.flatten(outputs)]


def _is_float(dtype) -> bool:
    return keras.backend.is_float_dtype(_dtype_name(dtype))


def _dtype_name(dtype) -> str:
    return getattr(dtype, "name", None) or str(dtype)


def _output_names(model, count: int) -> tuple[str, ...]:
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != count:
        names = [f"output_{i}" for i in range(count)]
    return tuple(names)


def _zeros(specs):
    return keras.tree.map_structure(
        lambda s: tf.zeros((1,) + tuple(d or 1 for d in s.shape[1:]), s.dtype), specs)


# ------------------------------------------------------------- the artifact


def _write_and_run(serving, specs, staging: str, format: str, precision: str, name: str,
                   sample, allow_select_ops: bool):
    """Writes the artifact into `staging` and runs it in its own runtime.

    Returns:
      ``(artifact path, select ops, runtime name, outputs)``: the outputs on
      `sample` (on a batch of zeros without one; [] for a file no runtime
      here can run).
    """
    saved_model = os.path.join(staging, "saved_model")
    structure = _write_saved_model(serving, specs, saved_model)
    if format == "saved_model":
        run, runtime = _saved_model_runner(saved_model)
        return saved_model, (), runtime, run(sample if sample is not None else _zeros(specs))
    artifact = os.path.join(staging, "model.tflite")
    content = _convert(saved_model, precision == "float16_weights", name)
    select_ops = _select_ops(content)
    if select_ops and not allow_select_ops:
        raise ValueError(
            f"The LiteRT file of model '{name}' needs TensorFlow Select ops, which the "
            f"builtin LiteRT interpreter cannot run: {', '.join(select_ops)}. Pass "
            "allow_select_ops=True to write it anyway (it then needs the Flex "
            "delegate), or replace the layers that produce these ops.")
    with open(artifact, "wb") as f:
        f.write(content)
    litert_run, runtime = _litert_runner(
        artifact, bool(select_ops), [spec.name for spec in keras.tree.flatten(specs)],
        _signature_output_keys(structure))
    if litert_run is None:
        if sample is not None:
            raise ValueError(
                "export() cannot check a LiteRT file with Select ops against sample "
                f"({', '.join(select_ops)}): no Python LiteRT runtime here links the "
                "Flex delegate. Export without sample to write it unchecked, or "
                "replace the layers that produce these ops.")
        return artifact, select_ops, runtime, []
    return artifact, select_ops, runtime, litert_run(
        sample if sample is not None else _zeros(specs))


def _write_saved_model(serving, specs, directory: str) -> Any:
    """Writes the SavedModel; returns the ``serve`` endpoint's output structure."""
    traced: list = []

    def serve(inputs):
        outputs = serving(inputs, training=False)
        outputs = keras.tree.map_structure(
            lambda o: tf.cast(o, tf.float32) if o.dtype.is_floating else o, outputs)
        traced[:] = [outputs]
        return outputs

    archive = keras.export.ExportArchive()
    archive.track(serving)
    archive.add_endpoint("serve", serve, input_signature=[specs])
    archive.write_out(directory, verbose=False)
    return traced[0]


def _signature_output_keys(structure) -> list[str]:
    """The signature key of each output, in ``keras.tree.flatten`` order.

    TensorFlow names a signature's outputs as ``_normalize_outputs``
    (tensorflow/python/saved_model/signature_serialization.py) does: a dict
    keeps its keys, a namedtuple its field names, a list or tuple gets
    ``output_0, output_1, ...`` by position, one tensor ``output_0``; LiteRT
    keeps those keys. Flattening the structure with each output replaced by
    its key gives the keys in the order the model's outputs are compared in
    (``keras.tree.flatten`` orders a dict by key, so ``score_10`` comes
    before ``score_2``).
    """
    if isinstance(structure, dict):
        named = {key: key for key in structure}
    elif hasattr(structure, "_asdict"):
        named = {key: key for key in structure._asdict()}
    elif isinstance(structure, (list, tuple)):
        named = [f"output_{i}" for i in range(len(structure))]  # type: ignore[assignment]
    else:
        return ["output_0"]
    return [str(key) for key in keras.tree.flatten(named)]


def _convert(saved_model: str, float16_weights: bool, name: str) -> bytes:
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    # Select ops are allowed here only to name them: a file that has any
    # is refused unless the caller allowed them.
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    if float16_weights:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    try:
        return converter.convert()
    except Exception as error:  # noqa: BLE001 - the converter raises its own types
        text = str(error)
        found = re.search(r"Custom ops: ([^\n]+)", text)
        problem = (f"ops that are neither LiteRT builtins nor TensorFlow Select "
                   f"ops: {found.group(1).strip()}" if found
                   else text.strip().splitlines()[0][:300] if text.strip()
                   else type(error).__name__)
        raise ValueError(
            f"LiteRT cannot convert model '{name}' ({problem}). Replace the layers "
            "that produce these ops, or export format='saved_model'.") from None


def _select_ops(content: bytes) -> tuple[str, ...]:
    """The TensorFlow ops a LiteRT flatbuffer runs through Flex, sorted."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(content, 0)
    names = set()
    for code in model.operatorCodes or []:
        custom = code.customCode.decode() if code.customCode else ""
        if custom.startswith("Flex"):
            names.add(custom[len("Flex"):])
    return tuple(sorted(names))


def _litert_runner(path: str, flex: bool, input_keys: list[str], output_keys: list[str]):
    """A function running the file in LiteRT, and the runtime's name.

    ai_edge_litert's interpreter (the builtin ops, no Flex delegate) runs a
    file without Select ops. For one with them there is no runner (None):
    neither it nor TensorFlow 2.21's deprecated ``tf.lite.Interpreter``
    links the Flex delegate (measured: both refuse a FlexCumprod file).

    The runner feeds each input by its signature key (the input's name,
    `input_keys` in ``keras.tree.flatten`` order) and reads each output by
    its key (`output_keys`, same order), so no structure depends on how
    keys sort.
    """
    if flex:
        return None, "not run (needs the Flex delegate)"
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path)
    runtime = "ai_edge_litert"
    runner = interpreter.get_signature_runner()  # the only one: serving_default
    takes = sorted(runner.get_input_details())
    gives = sorted(runner.get_output_details())
    if takes != sorted(input_keys) or gives != sorted(output_keys):
        raise RuntimeError(
            f"the LiteRT file's signature takes {takes} and gives {gives}; the model's "
            f"inputs are {sorted(input_keys)} and its outputs {sorted(output_keys)}")

    def run(inputs):
        flat = keras.tree.flatten(inputs)
        outputs = runner(**{key: np.asarray(value) for key, value in zip(input_keys, flat)})
        return [np.asarray(outputs[key]) for key in output_keys]

    return run, runtime


def _saved_model_runner(path: str):
    loaded = tf.saved_model.load(path)

    def run(inputs):
        return [np.asarray(o) for o in keras.tree.flatten(loaded.serve(inputs))]

    return run, "tf.saved_model"


def _compare(reference, got, names, tolerance, format, precision):
    if len(reference) != len(got):
        raise RuntimeError(f"the artifact returned {len(got)} outputs, the model {len(reference)}")
    worst = (0.0, 0.0, names[0] if names else None)
    max_abs = 0.0
    for name, want, have in zip(names, reference, got):
        want = np.asarray(want, np.float64)
        have = np.asarray(have, np.float64)
        if not np.all(np.isfinite(want)):
            raise ValueError(
                f"The model itself returns non-finite values for output '{name}' on "
                "sample: there is nothing to compare the artifact with. Pass a "
                "sample the model computes finite outputs for.")
        if want.shape != have.shape:
            raise RuntimeError(f"output '{name}': the artifact returned shape "
                               f"{have.shape}, the model {want.shape}")
        diff = np.abs(have - want)
        abs_error = float(np.max(diff)) if diff.size else 0.0
        if not np.all(np.isfinite(have)):
            abs_error = float("inf")
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        rel_error = abs_error / scale if scale > 0 else abs_error
        max_abs = max(max_abs, abs_error)
        if rel_error > worst[1] or worst[2] is None:
            worst = (abs_error, rel_error, name)
    if worst[1] > tolerance:
        raise ValueError(
            f"The {format} artifact ({precision}) differs from the model on sample: "
            f"output '{worst[2]}' has relative error {worst[1]:.3g} (max abs "
            f"{worst[0]:.3g}), above tolerance={tolerance:.3g}. Export in a wider "
            "precision, check the model's numerics with tf_mixed.probe, or pass a "
            "larger tolerance if this error is acceptable.")
    return max_abs, worst[1], worst[2]


# ------------------------------------------------------------------ files


def _make_dirs(directory: str) -> list[str]:
    """Creates `directory` and missing parents; returns the ones created."""
    missing = []
    while directory and not os.path.exists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for d in reversed(missing):
        os.mkdir(d)
    return list(reversed(missing))


def _remove_if_empty(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)


def _check_destination(path: str, format: str) -> None:
    """Refuses a `path` export would have to delete something else to take.

    What `export` replaces is only what it writes: a LiteRT file (any file
    at `path`), or a SavedModel directory (one holding ``saved_model.pb``)
    or an empty directory. Anything else, a directory of other files above
    all, is refused before any work.
    """
    if os.path.islink(path):
        raise ValueError(
            f"export() does not write through the symbolic link {path!r}. Pass the "
            "path it points to, or another path.")
    if format == "litert" and os.path.isdir(path):
        raise ValueError(
            f"export(format='litert') writes a file, and {path!r} is a directory; it "
            "is left as it is. Pass a file path such as "
            f"{os.path.join(path, 'model.tflite')!r}.")
    if format == "saved_model" and os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(
                f"export(format='saved_model') writes a directory, and {path!r} is a "
                "file; it is left as it is. Pass another path, or remove the file.")
        entries = os.listdir(path)
        if entries and "saved_model.pb" not in entries:
            shown = ", ".join(sorted(entries)[:5]) + (", ..." if len(entries) > 5 else "")
            raise ValueError(
                f"export() replaces a directory only when it holds a SavedModel "
                f"(saved_model.pb) or nothing; {path!r} holds {shown} and is left as "
                "it is. Pass a new or empty directory, or remove this one first.")


def _move(artifact: str, path: str) -> None:
    """Renames the checked artifact to `path`, replacing a SavedModel or file there.

    `_check_destination` has refused every other kind of `path` before.
    """
    if os.path.isdir(path):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-",
                               dir=os.path.dirname(os.path.abspath(path)))
        os.rename(path, os.path.join(old, "x"))
        os.rename(artifact, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(artifact, path)
