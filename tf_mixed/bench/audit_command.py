"""``python -m tf_mixed audit PATH``: the audit of a saved Keras model."""

from __future__ import annotations

import os
import sys


def run(path: str, batch_size: int | None = None) -> int:
    """Prints `tf_mixed.audit` of the model saved at ``path``.

    Args:
        path: A ``.keras`` file (or anything `keras.saving.load_model` reads).
        batch_size: Optional batch size for the checks and the memory estimate.

    Returns:
        0 after printing the report; 2 (with a one-line error on stderr) when
        the file is missing or cannot be loaded as a Keras model.
    """
    import keras

    import tf_mixed
    import tf_mixed.layers  # noqa: F401  registers tf_mixed's layers for loading

    if not os.path.exists(path):
        print(f"tf_mixed audit: error: no such file: {path}", file=sys.stderr)
        return 2
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as error:  # any load failure is a user-facing error
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(f"tf_mixed audit: error: cannot load {path} as a Keras model: "
              f"{type(error).__name__}: {detail}"[:500], file=sys.stderr)
        return 2
    if not isinstance(model, keras.Model):
        print(f"tf_mixed audit: error: {path} holds a {type(model).__name__}, not a "
              "Keras model", file=sys.stderr)
        return 2
    print(tf_mixed.audit(model, batch_size=batch_size, check_global_policy=False))
    return 0
