"""``python -m tf_mixed audit PATH``: the audit of a saved Keras model."""

from __future__ import annotations

import sys


def run(path: str, batch_size: int | None = None, *, safe_mode: bool = True,
        custom_modules=()) -> int:
    """Prints `tf_mixed.audit` of the model saved at ``path``.

    Args:
        path: A ``.keras`` file (or anything `keras.saving.load_model` reads).
        batch_size: Optional batch size for the checks and the memory estimate.
        safe_mode: Keras safe mode for loading (False loads a Lambda
            layer's Python lambda).
        custom_modules: Modules to import first (see
            `tf_mixed.cli.model_file`).

    Returns:
        0 after printing the report; 2 (with a one-line error on stderr) when
        the file is missing or cannot be loaded as a Keras model.
    """
    import tf_mixed
    from tf_mixed.cli import model_file

    try:  # a missing file: model_file.load's wording, as every model command says it
        model = model_file.load(path, safe_mode, custom_modules)
    except ValueError as error:
        print(f"tf_mixed audit: error: {error}", file=sys.stderr)
        return 2
    try:
        report = tf_mixed.audit(model, batch_size=batch_size, check_global_policy=False)
    except (TypeError, ValueError) as error:  # a model audit cannot read: one line
        print(f"tf_mixed audit: error: {model_file.first_line(error)}", file=sys.stderr)
        return 2
    print(report)
    return 0
