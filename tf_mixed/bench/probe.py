"""``python -m tf_mixed probe MODEL.keras [--dataset=SPEC] [flags]``: the numerics probe.

Loads a saved model, takes a few batches of the bench's data (or ``npz:PATH``
with ``x`` and ``y`` arrays), runs `tf_mixed.probe`, prints the table and
writes ``probe.json`` and ``probe.png`` to ``--output_dir``. Every file is
written only after the probe succeeded; bad input prints one line naming
the value and exits with status 2, with nothing written.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

from absl import flags

from tf_mixed.bench import model_command

_HALF_GRADIENTS = {"auto": None, "measured": True, "predicted": False}

USAGE = """usage: python -m tf_mixed probe MODEL.keras [--dataset=SPEC] [--batch_size=32]
       [--batches=1] [--policy=mixed_float16] [--loss=NAME] [--output_dir=DIR]

Runs the model on a few batches in half precision and in float32 with the
same weights and reports, per layer, the headroom to overflow, inf/NaN,
flushed and subnormal outputs and the error against float32; per variable,
the gradient magnitudes and what float16 loses of them; the first layer that
goes non-finite with the keep_float32 fix; and a recommended loss scale.
"""


def _define_flags(fv: flags.FlagValues) -> None:
    model_command.define_data_flags(fv, 1, "Batches to measure.")
    flags.DEFINE_string("policy", "", "mixed_float16 or mixed_bfloat16 (default: the model's own "
                        "half dtype, else mixed_float16).", flag_values=fv)
    flags.DEFINE_string("output_dir", "tf_mixed_probe", "Directory for probe.json and probe.png.",
                        flag_values=fv)
    flags.DEFINE_enum("half_gradients", "auto", list(_HALF_GRADIENTS),
                      "Output gradients at the current loss scale: measured in a half-precision "
                      "backward pass, or predicted from float32 (auto: predicted for float16 on "
                      "a host without a GPU, whose float16 conv filter gradient is very slow).",
                      flag_values=fv)


def _error(message: str) -> int:
    return model_command.error("probe", message)


def load_model(path: str):
    """A saved .keras model, with tf_mixed's layers registered (also for doctor).

    Raises:
        ValueError: No such file, or it does not load as a Keras model.
    """
    import keras

    import tf_mixed.layers  # noqa: F401  registers tf_mixed's layers for loading

    if not os.path.isfile(path):
        raise ValueError(f"MODEL={path!r}: no such file. Pass the path of a saved .keras model.")
    try:
        model = keras.saving.load_model(path)
    except Exception:  # a compiled state that does not load: the weights may
        try:
            model = keras.saving.load_model(path, compile=False)
        except Exception as error:  # any load failure is bad input here
            raise ValueError(
                f"MODEL={path!r} cannot be loaded as a Keras model "
                f"({type(error).__name__}: {model_command.first_line(error)})") from None
    if not isinstance(model, keras.Model):
        raise ValueError(f"MODEL={path!r} holds a {type(model).__name__}, not a Keras model.")
    return model


def batches(fv, model):
    """``(x, y)`` for `tf_mixed.probe` (and doctor): arrays, or a dataset of batches.

    Reads ``fv.dataset``, ``fv.batch_size``, ``fv.batches``, ``fv.seed`` and
    ``fv.data_dir``.
    """
    import numpy as np
    import tensorflow as tf

    from tf_mixed.bench import data

    n = fv.batch_size * fv.batches
    spec = fv.dataset.strip()
    if spec.lower().startswith("npz:"):
        path = spec[4:]
        try:
            arrays = np.load(path)
        except Exception as error:  # missing or not an npz file
            raise data.UsageError("dataset", spec, f"cannot read {path!r} as .npz "
                                  f"({type(error).__name__}: {model_command.first_line(error)})",
                                  "npz:PATH with arrays x and y") from None
        missing = [k for k in ("x", "y") if k not in arrays.files]
        if missing:
            raise data.UsageError("dataset", spec, f"the file has no {' or '.join(missing)} array "
                                  f"(it has {', '.join(arrays.files) or 'none'})",
                                  "npz:PATH with arrays x and y")
        return arrays["x"][:n], arrays["y"][:n]
    shape = tuple(model.inputs[0].shape[1:])
    side = shape[0] if len(shape) == 3 and shape[0] == shape[1] and shape[0] else 0
    bench = data.load(spec, seed=fv.seed, image_size=side or 0, train_size=n,
                      val_size=1, data_dir=fv.data_dir or None, download=False)
    return bench.train.batch(fv.batch_size).map(
        lambda x, y: (tf.cast(x, "float32"), y)), None


def main(argv: list[str]) -> int:
    """Runs ``python -m tf_mixed probe``.

    Args:
        argv: ``sys.argv``-style list: the program name, then arguments.

    Returns:
        The exit status: 0 success, 2 bad input.
    """
    fv = flags.FlagValues()
    _define_flags(fv)
    parsed = model_command.parse("probe", argv, fv, USAGE, ("batch_size", "batches"))
    if isinstance(parsed, int):
        return parsed
    positionals = [parsed]

    import tf_mixed
    from tf_mixed.bench.errors import UsageError

    start = time.perf_counter()
    try:
        model = load_model(positionals[0])
        x, y = batches(fv, model)
        loss = fv.loss or (getattr(model, "loss", None) if getattr(model, "compiled", False)
                           else None) or "sparse_categorical_crossentropy"
        report = tf_mixed.probe(model, x, y, loss=loss, policy=fv.policy or None,
                                batches=fv.batches,
                                half_gradients=_HALF_GRADIENTS[fv.half_gradients])
    except (UsageError, ValueError, TypeError) as error:
        return _error(model_command.first_line(error))
    seconds = time.perf_counter() - start

    record = {
        "command": "python -m tf_mixed probe " + " ".join(shlex.quote(a) for a in argv[1:]),
        "model_path": positionals[0],
        "dataset": fv.dataset,
        "batch_size": fv.batch_size,
        "loss": loss if isinstance(loss, str) else type(loss).__name__,
        "seconds": round(seconds, 2),
        "report": report.to_dict(),
    }
    text = json.dumps(record, indent=2)
    try:
        png = report.plot()
    except ImportError:
        png = None
        print("tf_mixed probe: matplotlib is not installed: probe.png not written "
              "(pip install matplotlib)", file=sys.stderr)
    # Everything is computed: only now touch the output directory.
    os.makedirs(fv.output_dir, exist_ok=True)
    model_command.write_atomically(os.path.join(fv.output_dir, "probe.json"), text.encode())
    if png is not None:
        model_command.write_atomically(os.path.join(fv.output_dir, "probe.png"), png)
    print(report)
    print(f"\nProbed in {seconds:.1f} s; wrote {fv.output_dir}/probe.json"
          + (" and probe.png" if png is not None else ""))
    return 0
