"""Serving what was trained: half-precision checkpoints (`tf_mixed.export` exports)."""

from tf_mixed._internal import moved as _moved
from tf_mixed.serving.half_checkpoints import load_weights, save_weights  # noqa: F401

__all__ = [
    "load_weights",
    "save_weights",
]

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "ExportReport": "tf_mixed.serving.export_report",
    "export": "tf_mixed",
})
