"""`ModelCheckpoint`: Keras's checkpoint callback, saving half-size weights.

    model.fit(ds, callbacks=[tf_mixed.ModelCheckpoint(
        "ckpt/epoch{epoch:02d}.npz", save_dtype="float16",
        monitor="val_loss", save_best_only=True)])

Each save is a `tf_mixed.serving.save_weights` file (load it with
`tf_mixed.serving.load_weights` into a model of any policy). The arguments mean
what they mean for ``keras.callbacks.ModelCheckpoint`` (epoch ends only).
A save that would overflow `save_dtype` raises, naming the variables, and
writes nothing.
"""

from __future__ import annotations

import math

import keras

from tf_mixed.serving import half_checkpoints as checkpoints

__all__ = ["ModelCheckpoint"]

_MODES = ("auto", "min", "max")


class ModelCheckpoint(keras.callbacks.Callback):
    """Saves the model's weights in `save_dtype` at the end of epochs.

    Args:
      filepath: Where to save; may hold ``{epoch}`` and names from ``logs``
        (``"w{epoch:02d}-{val_loss:.3f}.npz"``), formatted as Keras does.
      save_dtype: "float16" (default), "bfloat16" or "float32".
      monitor: The ``logs`` key compared with `save_best_only`.
      save_best_only: Save only when `monitor` improved.
      mode: "min", "max", or "auto" ("max" for names containing "acc",
        else "min").

    Raises:
      ValueError: An unknown `save_dtype` or `mode` (at construction).
    """

    def __init__(self, filepath: str, save_dtype: str = "float16", *,
                 monitor: str = "val_loss", save_best_only: bool = False,
                 mode: str = "auto"):
        super().__init__()
        if save_dtype not in checkpoints.SAVE_DTYPES:
            raise ValueError(
                f"save_dtype must be one of {', '.join(checkpoints.SAVE_DTYPES)}. "
                f"Received: save_dtype={save_dtype!r}")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}. Received: mode={mode!r}")
        self.filepath = str(filepath)
        self.save_dtype = save_dtype
        self.monitor = monitor
        self.save_best_only = save_best_only
        self.mode = ("max" if "acc" in monitor else "min") if mode == "auto" else mode
        self.best: float | None = None

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.mode == "min" else value > self.best

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        if self.save_best_only:
            value = logs.get(self.monitor)
            if value is None or not math.isfinite(float(value)):
                return  # nothing to compare: Keras warns and skips too
            if not self._improved(float(value)):
                return
            self.best = float(value)
        path = self.filepath.format(epoch=epoch + 1, **logs)
        checkpoints.save_weights(self.model, path, dtype=self.save_dtype)
