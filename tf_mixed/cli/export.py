"""``python -m tf_mixed export MODEL.keras [flags]``: write a serving artifact, checked."""

# Loads a saved model, takes one batch of ``--dataset`` (the bench's data, or
# ``npz:PATH`` with an ``x`` array) as the sample, runs `tf_mixed.export`,
# writes the artifact (``model.tflite`` or ``saved_model/``) and
# ``export.json`` (the report) into ``--output_dir`` and prints the report.
# Bad input (no such file, unknown format or precision, a model that does not
# load, data whose shape does not fit, an unwritable directory) prints one
# line and exits with status 2, leaving nothing behind.

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time

from absl import flags

from tf_mixed._internal import progress
from tf_mixed.cli import model_command, model_file
from tf_mixed.commands.output_dir import check_output_dir, remove_if_created

USAGE = """usage: python -m tf_mixed export MODEL.keras [--format=saved_model|litert]
       [--precision=float32|float16_weights|float16|bfloat16|as_trained]
       [--dataset=SPEC] [--batch_size=32] [--tolerance=X] [--allow_select_ops]
       [--output_dir=DIR]

Rebuilds the model in the precision asked for with its trained weights,
writes it as a SavedModel or a LiteRT file, runs the file in its own
runtime on one batch of --dataset and checks it computes what the model
computes. Without --dataset the file is run on zeros and not compared.
"""

ARTIFACT_NAMES = {"saved_model": "saved_model", "litert": "model.tflite"}
REPORT_NAME = "export.json"


def _define_flags(fv: flags.FlagValues) -> None:
    from tf_mixed._internal.facts import EXPORT_FORMATS, EXPORT_PRECISIONS
    from tf_mixed.commands import names

    flags.DEFINE_string("format", "litert", " or ".join(EXPORT_FORMATS) + ".", flag_values=fv)
    flags.DEFINE_string("precision", "float32", "; ".join(
        f"{fmt}: {', '.join(names)}" for fmt, names in EXPORT_PRECISIONS.items()) + ".",
        flag_values=fv)
    flags.DEFINE_string("dataset", "", f"Sample data: {names.DATA_ACCEPTED}, or npz:PATH "
                        "with an array x. Empty: no parity check.", flag_values=fv)
    flags.DEFINE_string("data_dir", "", "TFDS data directory (default: TFDS's own).",
                        flag_values=fv)
    flags.DEFINE_integer("batch_size", 32, "Examples in the sample batch.", flag_values=fv)
    flags.DEFINE_float("tolerance", 0.0, "Largest relative error accepted; 0: the precision's "
                       "default.", flag_values=fv)
    flags.DEFINE_boolean("allow_select_ops", False, "LiteRT: accept TensorFlow Select ops.",
                         flag_values=fv)
    flags.DEFINE_string("output_dir", "tf_mixed_export", "Directory for the artifact and "
                        "export.json.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed for generated data.", flag_values=fv)
    model_file.define_flags(fv)


def _error(message: str) -> int:
    return model_command.error("export", message)


def _check_flags(fv) -> None:
    """The flags checked before TensorFlow loads: --tolerance, --format, --precision
    (against `tf_mixed.export`'s own table, `tf_mixed._internal.facts.EXPORT_PRECISIONS`).

    Raises:
        UsageError: Naming the flag.
    """
    from tf_mixed._internal.cli_errors import UsageError, below_minimum
    from tf_mixed._internal.facts import (
        EXPORT_FORMATS,
        EXPORT_PRECISIONS,
        export_precision_problem,
    )

    if fv.tolerance < 0:
        raise below_minimum("tolerance", fv.tolerance, 0, "0 picks the precision's default.")
    fmt, precision = fv.format.strip().lower(), fv.precision.strip().lower()
    if fmt not in EXPORT_FORMATS:
        raise UsageError("format", fv.format, "unknown format", ", ".join(EXPORT_FORMATS))
    problem = export_precision_problem(fmt, precision)
    if problem:
        if any(precision in names for names in EXPORT_PRECISIONS.values()):
            raise UsageError("precision", fv.precision,
                             f"--format={fmt} cannot write it ({problem})",
                             ", ".join(EXPORT_PRECISIONS[fmt]))
        raise UsageError("precision", fv.precision, "unknown precision", "; ".join(
            f"with --format={f}: {', '.join(EXPORT_PRECISIONS[f])}"
            for f in sorted(EXPORT_PRECISIONS, key=lambda f: f != fmt)))


def _sample(fv, model):
    """One batch of inputs for the parity check, or None without --dataset."""
    import numpy as np

    from tf_mixed.cli import npz_data
    from tf_mixed.commands import data

    spec = fv.dataset.strip()
    if not spec:
        return None
    if spec.lower().startswith(npz_data.PREFIX):
        return npz_data.load(spec, model, need_y=False, limit=fv.batch_size)[0]
    shape = tuple(model.inputs[0].shape[1:]) if getattr(model, "inputs", None) else ()
    side = shape[0] if len(shape) == 3 and shape[0] == shape[1] and shape[0] else 0
    bench = data.load(spec, seed=fv.seed, image_size=side, train_size=1,
                      val_size=fv.batch_size, data_dir=fv.data_dir or None, download=False)
    images = [x for x, _ in bench.val.take(fv.batch_size).as_numpy_iterator()]
    return np.stack(images).astype("float32")


def main(argv: list[str]) -> int:
    """Runs ``python -m tf_mixed export``.

    Args:
        argv: ``sys.argv``-style list: the program name, then arguments.

    Returns:
        The exit status: 0 success, 1 the artifact failed its check, 2 bad input.
    """
    fv = flags.FlagValues()
    _define_flags(fv)
    parsed = model_command.parse("export", argv, fv, USAGE, ("batch_size",),
                                 (_check_flags, model_command.check_dataset))
    if isinstance(parsed, int):
        return parsed
    model_path = parsed

    import tf_mixed
    from tf_mixed._internal.cli_errors import UsageError

    fmt, precision = fv.format.strip().lower(), fv.precision.strip().lower()
    start = time.perf_counter()
    created = False
    try:
        progress.update(stage(1, model_path, fmt, precision, bool(fv.dataset.strip())))
        model = model_file.load(model_path, fv.safe_mode, fv.custom_modules)
        sample = _sample(fv, model)
        created = check_output_dir(fv.output_dir)
        artifact = os.path.join(fv.output_dir, ARTIFACT_NAMES[fmt])
        progress.update(stage(2, model_path, fmt, precision, sample is not None))
        report = tf_mixed.export(model, artifact, format=fmt, precision=precision,
                                 sample=sample, tolerance=fv.tolerance or None,
                                 allow_select_ops=fv.allow_select_ops)
    except (UsageError, ValueError, TypeError) as error:
        remove_if_created(fv.output_dir, created)
        message = model_file.first_line(error)
        if "differs from the model on sample" in message:
            print(f"tf_mixed export: {message}", file=sys.stderr)
            return 1
        return _error(message)
    seconds = time.perf_counter() - start
    record = {
        "command": "python -m tf_mixed export " + " ".join(shlex.quote(a) for a in argv[1:]),
        "model_path": model_path,
        "dataset": fv.dataset,
        "batch_size": fv.batch_size if sample is not None else 0,
        "seconds": round(seconds, 2),
        "report": report.to_dict(),
    }
    try:
        model_command.write_atomically(os.path.join(fv.output_dir, REPORT_NAME),
                                       json.dumps(record, indent=2).encode())
    except OSError as error:
        _remove(artifact)
        remove_if_created(fv.output_dir, created)
        return _error(f"--output_dir={fv.output_dir!r}: cannot write {REPORT_NAME} ({error})")
    print(report)
    print(f"\nExported in {seconds:.1f} s; wrote {artifact} and "
          f"{os.path.join(fv.output_dir, REPORT_NAME)}")
    return 0


def stage(step: int, model_path: str, fmt: str, precision: str, with_sample: bool) -> str:
    """The progress line of step 1 (loading) or 2 (exporting): a check is named only
    when there is a sample to check on."""
    if step == 1:
        return f"step 1/2: loading {model_path}" + (" and its sample" if with_sample else "")
    return (f"step 2/2: exporting {fmt} ({precision})"
            + (" and checking it on the sample" if with_sample
               else " (no sample: no parity check)"))


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)
