"""``python -m tf_mixed probe MODEL.keras [--dataset=SPEC] [flags]``: the numerics probe."""

# Loads a saved model, takes a few batches of the bench's data (or ``npz:PATH``
# with ``x`` and ``y`` arrays), runs `tf_mixed.probe`, prints the table and
# writes ``probe.json`` and ``probe.png`` to ``--output_dir``. Every file is
# written only after the probe succeeded; bad input prints one line naming
# the value and exits with status 2, with nothing written.

from __future__ import annotations

import json
import os
import shlex
import sys
import time

from absl import flags

from tf_mixed._internal import progress
from tf_mixed.cli import model_command
from tf_mixed.commands.png import png_or_none

_HALF_GRADIENTS = {"auto": None, "measured": True, "predicted": False}

USAGE = """usage: python -m tf_mixed probe MODEL.keras [--dataset=SPEC] [--batch_size=32]
       [--batches=1] [--policy=mixed_float16] [--loss=NAME[,NAME...]] [--output_dir=DIR]
       [--custom_modules=MODULE,...] [--safe_mode=false]

Runs the model on a few batches in half precision and in float32 with the
same weights and reports, per layer, the headroom to overflow, inf/NaN,
flushed and subnormal outputs and the error against float32; per variable,
the gradient magnitudes and what float16 loses of them; the first layer that
goes non-finite with the keep_float32 fix; and a recommended loss scale.
"""


def _define_flags(fv: flags.FlagValues) -> None:
    from tf_mixed.cli import model_file
    from tf_mixed.commands import names

    flags.DEFINE_string("dataset", "shapes", f"Data: {names.DATA_ACCEPTED}, or npz:PATH "
                        "with arrays x and y (several inputs or outputs: x0, x1, ... "
                        "and y0, y1, ...).",
                        flag_values=fv)
    model_file.define_flags(fv)
    flags.DEFINE_string("data_dir", "", "TFDS data directory (default: TFDS's own).",
                        flag_values=fv)
    flags.DEFINE_integer("batch_size", 32, "Examples per batch.", flag_values=fv)
    flags.DEFINE_integer("batches", 1, "Batches to measure.", flag_values=fv)
    flags.DEFINE_string("policy", "", "mixed_float16 or mixed_bfloat16 (default: the model's own "
                        "half dtype, else mixed_float16).", flag_values=fv)
    flags.DEFINE_list("loss", [], "Keras loss name, one per output for several outputs (default: "
                      "the saved model's compiled loss, else sparse_categorical_crossentropy "
                      "for a classifier's output; required otherwise).",
                      flag_values=fv)
    flags.DEFINE_string("output_dir", "tf_mixed_probe", "Directory for probe.json and probe.png.",
                        flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Seed for generated data.", flag_values=fv)
    flags.DEFINE_enum("half_gradients", "auto", list(_HALF_GRADIENTS),
                      "Output gradients at the current loss scale: measured in a half-precision "
                      "backward pass, or predicted from float32 (auto: predicted for float16 on "
                      "a host without a GPU, whose float16 conv filter gradient is very slow).",
                      flag_values=fv)


def _error(message: str) -> int:
    return model_command.error("probe", message)


def _batches(fv, model):
    """``(x, y)`` for `tf_mixed.probe`: arrays, or a dataset of batches."""
    import tensorflow as tf

    from tf_mixed.cli import npz_data
    from tf_mixed.commands import data

    n = fv.batch_size * fv.batches
    spec = fv.dataset.strip()
    if spec.lower().startswith(npz_data.PREFIX):
        return npz_data.load(spec, model, need_y=True, limit=n)
    if len(model.inputs) != 1:
        raise data.UsageError("dataset", spec, f"model '{model.name}' takes {len(model.inputs)} "
                              "inputs; generated data sets have one", npz_data.ACCEPTED_XY)
    shape = tuple(model.inputs[0].shape[1:])
    problem = generated_problem(spec, model, shape)
    if problem:
        raise data.UsageError("dataset", spec, problem, fix=_OWN_DATA)
    side = shape[0] if len(shape) == 3 and shape[0] == shape[1] and shape[0] else 0
    bench = data.load(spec, seed=fv.seed, image_size=side or 0, train_size=n,
                      val_size=1, data_dir=fv.data_dir or None, download=False)
    classes = output_classes(model)
    if classes is not None and classes < bench.num_classes:
        if classes < 2:
            raise data.UsageError(
                "dataset", spec, f"model '{model.name}' has 1 output unit; the {spec} set has "
                f"{bench.num_classes} classes", fix=_OWN_DATA)
        # The probe compares numerics, not accuracy: labels folded into the model's
        # classes keep every label valid for its loss (said once on stderr).
        print(f"tf_mixed: note: the {spec} data has {bench.num_classes} classes and model "
              f"'{model.name}' outputs {classes}: labels folded into {classes} classes (label "
              f"% {classes}); --dataset=npz:PATH measures on your own data.",
              file=sys.stderr, flush=True)
        return bench.train.batch(fv.batch_size).map(
            lambda x, y: (tf.cast(x, "float32"), y % classes)), None
    return bench.train.batch(fv.batch_size).map(
        lambda x, y: (tf.cast(x, "float32"), y)), None


_OWN_DATA = ("Pass your own data: --dataset=npz:PATH with arrays x and y "
             "(numpy.savez(PATH, x=..., y=...)).")


def output_classes(model) -> int | None:
    """The class count of a single-output classifier (its output's last width), else None."""
    outputs = list(getattr(model, "outputs", None) or [])
    if len(outputs) != 1 or len(outputs[0].shape) != 2 or outputs[0].shape[-1] is None:
        return None
    return int(outputs[0].shape[-1])


def generated_problem(spec: str, model, shape: tuple) -> str:
    """Why a generated set (shapes: RGB images; tokens: token ids) cannot feed
    ``model``'s one input of ``shape`` (without the batch), in
    `tf_mixed.cli.npz_data.input_problem`'s words; "" when it can."""
    from tf_mixed.cli import npz_data
    from tf_mixed.commands import data, names

    kind = names.parse_spec(spec)[0]
    if kind == names.SHAPES:
        side = shape[0] if len(shape) == 3 and shape[0] == shape[1] and shape[0] else 0
        side = side or names.DEFAULT_SHAPES_SIZE
        given = [None, side, side, 3]
    elif kind == names.TOKENS:
        given = [None, data.DEFAULT_TOKENS_LENGTH]
    else:
        return ""
    return npz_data.input_problem(model, ["x"], [tuple(given)]) or ""



def main(argv: list[str]) -> int:
    """Runs ``python -m tf_mixed probe``.

    Args:
        argv: ``sys.argv``-style list: the program name, then arguments.

    Returns:
        The exit status: 0 success, 2 bad input.
    """
    fv = flags.FlagValues()
    _define_flags(fv)
    parsed = model_command.parse("probe", argv, fv, USAGE, ("batch_size", "batches"),
                                 (model_command.check_dataset,
                                  model_command.check_half_policy))
    if isinstance(parsed, int):
        return parsed
    model_path = parsed

    import tf_mixed
    from tf_mixed._internal.cli_errors import UsageError
    from tf_mixed.cli import model_file

    start = time.perf_counter()
    try:
        model_command.check_output_dir(fv.output_dir)  # before the work, not after it
        progress.update(f"step 1/3: loading {model_path} and its data")
        model = model_file.load(model_path, fv.safe_mode, fv.custom_modules)
        x, y = _batches(fv, model)
    except (UsageError, ValueError, TypeError) as error:
        return _error(model_file.first_line(error))
    compiled = getattr(model, "loss", None) if getattr(model, "compiled", False) else None
    loss = (fv.loss if len(fv.loss) > 1 else fv.loss[0]) if fv.loss else compiled
    default = loss is None
    if default:
        units = [t.shape[-1] for t in model.outputs]
        if any(u is None or u < 2 for u in units):
            return _error(f"model {model.name!r} is not compiled, so the loss must be given, and "
                          f"its output{'s' if len(units) > 1 else ''} ({units} units) "
                          "is not a classifier's, for which the default "
                          "sparse_categorical_crossentropy is meant: pass --loss=NAME "
                          "(e.g. --loss=mse).")
        loss = "sparse_categorical_crossentropy"
    progress.update(f"step 2/3: running {model.name}'s layers in float32 and in half precision")
    try:
        report = tf_mixed.probe(model, x, y, loss=loss, policy=fv.policy or None,
                                batches=fv.batches,
                                half_gradients=_HALF_GRADIENTS[fv.half_gradients])
    except (UsageError, ValueError, TypeError) as error:
        return _error(model_file.first_line(error) + (_LOSS_HINT if default else ""))
    except Exception as error:  # TF's own report of a model/loss/data mismatch
        return _error(f"model {model.name!r}, loss {_loss_text(loss)} and the data do not fit "
                      f"together ({type(error).__name__}: {model_file.first_line(error)})"
                      + (_LOSS_HINT if default else ""))
    seconds = time.perf_counter() - start
    progress.update("step 3/3: writing probe.json and probe.png")

    record = {
        "command": "python -m tf_mixed probe " + " ".join(shlex.quote(a) for a in argv[1:]),
        "model_path": model_path,
        "dataset": fv.dataset,
        "batch_size": fv.batch_size,
        "loss": _loss_text(loss),
        "seconds": round(seconds, 2),
        "report": report.to_dict(),
    }
    text = json.dumps(record, indent=2)
    png = png_or_none("probe", "probe.png", report.plot)
    # Everything is computed: only now touch the output directory.
    try:
        os.makedirs(fv.output_dir, exist_ok=True)
        model_command.write_atomically(os.path.join(fv.output_dir, "probe.json"), text.encode())
        if png is not None:
            model_command.write_atomically(os.path.join(fv.output_dir, "probe.png"), png)
    except OSError as error:  # it was writable before the work
        return _error(f"--output_dir={fv.output_dir!r}: cannot write ({error.strerror or error})")
    print(report)
    print(f"\nProbed in {seconds:.1f} s; wrote {fv.output_dir}/probe.json"
          + (" and probe.png" if png is not None else ""))
    return 0


_LOSS_HINT = ("; the model is not compiled, so the loss was the default "
              "sparse_categorical_crossentropy: pass --loss=NAME (e.g. --loss=mse)")


def _loss_text(loss) -> str:
    if isinstance(loss, str):
        return loss
    if isinstance(loss, (list, tuple)):
        return ",".join(_loss_text(each) for each in loss)
    return getattr(loss, "name", None) or type(loss).__name__
