"""`ModelCheckpoint`: Keras's checkpoint callback, saving half-size weights."""

#     model.fit(ds, validation_data=val, callbacks=[tf_mixed.ModelCheckpoint(
#         "ckpt/epoch{epoch:02d}.npz", save_dtype="float16",
#         monitor="val_loss", save_best_only=True)])
#
# A subclass of ``keras.callbacks.ModelCheckpoint`` that changes one thing:
# what it writes. Each save is a `tf_mixed.serving.save_weights` file (load it
# with `tf_mixed.serving.load_weights` into a model of any policy) instead of
# ``model.save`` / ``model.save_weights``. Everything else is Keras's own code,
# so the arguments mean what they mean there: the file name formatted from
# ``{epoch}``, ``{batch}`` and ``logs``; ``save_freq`` ("epoch" or every N
# batches); ``mode="auto"`` taking the direction from the monitored metric
# (``val_auc`` is maximised, ``val_loss`` minimised; a name Keras cannot
# place raises ``ValueError`` at the first epoch end); with
# ``save_best_only=True`` and the monitored value missing from ``logs`` (no
# validation data, say) Keras's warning "Can save best model only with ...
# available." and a save every time; ``initial_value_threshold``;
# ``verbose=1`` messages. The file's directory is created when missing, and
# the file gets the permissions any new file gets (``0o666`` less the umask),
# as Keras's files do.
#
# A save that would overflow `save_dtype` raises, naming the variables, and
# writes nothing; values that flush to zero in `save_dtype` are warned about
# (see `tf_mixed.serving.save_weights`).

from __future__ import annotations

import os

import keras

from tf_mixed._internal import shims as _internals
from tf_mixed.serving import half_checkpoints as checkpoints

__all__ = ["ModelCheckpoint"]

# Keras's constructor accepts only its own file names; this one passes its
# checks and is replaced by the real file path at once.
_KERAS_NAME = "checkpoint.weights.h5"


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint`` writing weights in `save_dtype`.

    Args:
      filepath: Where to save; may hold ``{epoch}``, ``{batch}`` and names
        from ``logs`` (``"w{epoch:02d}-{val_loss:.3f}.npz"``), formatted as
        Keras does. Any file name (the name is kept as given); its directory
        is created if missing.
      save_dtype: "float16" (default), "bfloat16" or "float32".
      monitor: The ``logs`` key compared with `save_best_only`.
      verbose: 0 (silent) or 1 (a message per decision), as Keras.
      save_best_only: Save only when `monitor` improved. When `monitor` is
        not in ``logs`` Keras warns and saves.
      mode: "min", "max", or "auto" (the direction of the metric named by
        `monitor`, as Keras decides it; "loss" and "val_loss" are minimised).
        An unknown mode warns and falls back to "auto", as in Keras.
      save_freq: "epoch" or an integer number of batches, as Keras.
      initial_value_threshold: The "best" value to beat first, as Keras.

    Raises:
      ValueError: An unknown `save_dtype` or `save_freq` (at construction);
        a `monitor` whose direction "auto" cannot find (at the first
        epoch end); a value `save_dtype` cannot hold (at a save).
    """

    def __init__(self, filepath: str | os.PathLike, save_dtype: str = "float16", *,
                 monitor: str = "val_loss", verbose: int = 0,
                 save_best_only: bool = False, mode: str = "auto",
                 save_freq: str | int = "epoch",
                 initial_value_threshold: float | None = None):
        if save_dtype not in checkpoints.SAVE_DTYPES:
            raise ValueError(
                f"save_dtype must be one of {', '.join(checkpoints.SAVE_DTYPES)}. "
                f"Received: save_dtype={save_dtype!r}")
        super().__init__(_KERAS_NAME, monitor=monitor, verbose=verbose,
                         save_best_only=save_best_only, save_weights_only=True,
                         mode=mode, save_freq=save_freq,
                         initial_value_threshold=initial_value_threshold)
        self.filepath = os.fspath(filepath)
        self.save_dtype = save_dtype

    def _save_model(self, epoch, batch, logs):
        # Keras's hook for one save (keras/src/callbacks/model_checkpoint.py,
        # 3.15.1): Keras decides, this writes. See shims.keras_checkpoint_target.
        logs = logs if logs is not None else {}
        filepath = _internals.keras_checkpoint_target(self, epoch, batch, logs)
        if filepath is None:
            return
        if os.path.isdir(filepath):
            raise IsADirectoryError(
                "Please specify a non-directory filepath for ModelCheckpoint. "
                f"Filepath used is an existing directory: {filepath}")
        directory = os.path.dirname(filepath)
        if directory:
            os.makedirs(directory, exist_ok=True)
        checkpoints.save_weights(self.model, filepath, dtype=self.save_dtype)
        if self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished saving model to {filepath}")
