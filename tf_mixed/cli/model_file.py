"""Loading the MODEL argument of ``python -m tf_mixed probe|audit``, with one-line errors."""

# Shared by the commands that take a saved model: the file must exist and load
# as a `keras.Model`. Two things a user's model may need, each a flag:
#
# * ``--custom_modules=pkg.layers,...``: modules to import first, so custom
#   layers and functions they register (``register_keras_serializable``) are
#   found (Keras imports only packages named ``keras*`` by itself); their
#   top-level classes and functions are also passed as ``custom_objects``, so
#   an unregistered ``def`` in a Lambda layer is found by its name;
# * ``--safe_mode=false``: a ``Lambda`` layer holding a Python lambda is code,
#   which Keras loads only with safe mode off, for files the user trusts.
#
# Every failure is a `ValueError` whose message is one line naming the file,
# what went wrong and the flag that fixes it.

from __future__ import annotations

import importlib
import os

from absl import flags

__all__ = ["define_flags", "first_line", "load", "missing"]


def define_flags(fv: flags.FlagValues) -> None:
    """Defines ``--safe_mode`` and ``--custom_modules`` on ``fv``."""
    flags.DEFINE_boolean(
        "safe_mode", True, "Keras safe mode for loading: false lets a Lambda layer's Python "
        "lambda load (only for files you trust).", flag_values=fv)
    flags.DEFINE_list(
        "custom_modules", [], "Python modules to import before loading, which register the "
        "model's custom layers and functions.", flag_values=fv)


def first_line(error: BaseException) -> str:
    """One line saying what ``error`` is about (the useful line of TF's reports).

    TensorFlow's errors start with a header ("in user code:", "Graph
    execution error:") and put the cause on the last line; Keras's start
    with the cause.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[-1] if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return line[:500]


def missing(path: str) -> str | None:
    """The one-line error for a MODEL path that is not a file, else None."""
    if os.path.isfile(path):
        return None
    return f"MODEL={path!r}: no such file. Pass the path of a saved .keras model."


def load(path: str, safe_mode: bool = True, custom_modules=()):
    """Loads the model saved at ``path``.

    Args:
        path: A ``.keras`` file.
        safe_mode: Passed to `keras.saving.load_model`.
        custom_modules: Module names to import first; their public classes
            and functions are passed as ``custom_objects``.

    Returns:
        The `keras.Model`, compiled if the file holds a compiled state that
        loads (else uncompiled).

    Raises:
        ValueError: No such file, a module that does not import, a file
            that does not load (with the fix when it is a known cause), or
            a file holding something other than a model.
    """
    import keras

    import tf_mixed.layers  # noqa: F401  registers tf_mixed's layers for loading

    problem = missing(path)
    if problem:
        raise ValueError(problem)
    custom_objects: dict[str, object] = {}
    for name in custom_modules:
        try:
            module = importlib.import_module(name)
        except Exception as error:  # any import failure is bad input here
            raise ValueError(
                f"--custom_modules: cannot import {name!r} ({type(error).__name__}: "
                f"{first_line(error)}); it must be importable from this directory or "
                "PYTHONPATH.") from None
        custom_objects.update((key, value) for key, value in vars(module).items()
                              if callable(value) and not key.startswith("_"))
    try:
        model = keras.saving.load_model(path, custom_objects=custom_objects,
                                        safe_mode=safe_mode)
    except Exception:  # a compiled state that does not load: the weights may
        try:
            model = keras.saving.load_model(path, custom_objects=custom_objects,
                                            compile=False, safe_mode=safe_mode)
        except Exception as error:  # any load failure is bad input here
            raise ValueError(_load_failure(path, error)) from None
    if not isinstance(model, keras.Model):
        raise ValueError(f"MODEL={path!r} holds a {type(model).__name__}, not a Keras model.")
    return model


def _load_failure(path: str, error: BaseException) -> str:
    text = str(error)
    if "Lambda" in text and "safe_mode" in text:
        return (f"MODEL={path!r} has a Lambda layer holding a Python lambda, which Keras "
                "loads only with safe mode off: pass --safe_mode=false if you trust the file.")
    if "Could not locate" in text:
        return (f"MODEL={path!r} uses a custom layer or function Keras cannot find "
                f"({first_line(error)}): pass --custom_modules=MODULE, the module that "
                "registers it with keras.saving.register_keras_serializable.")
    return (f"MODEL={path!r} cannot be loaded as a Keras model "
            f"({type(error).__name__}: {first_line(error)})")
