"""Re-creating a model in another dtype (`tf_mixed.convert`) and what it says it could not carry."""

from tf_mixed._internal import moved as _moved
from tf_mixed.models.cloning import CopyRefused  # noqa: F401
from tf_mixed.models.conversion import ConversionNote  # noqa: F401

__all__ = ["ConversionNote", "CopyRefused"]

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "Clone": "tf_mixed.models.cloning",
    "clone": "tf_mixed.models.cloning",
    "compute_dtype": "tf_mixed.models.conversion",
    "convert": "tf_mixed",
    "copy_padded": "tf_mixed.models.padding",
    "copy_weights": "tf_mixed.models.cloning",
    "is_graph_model": "tf_mixed.models.conversion",
    "model_input": "tf_mixed.models.cloning",
    "plan": "tf_mixed.models.padding",
    "rebuild": "tf_mixed.models.conversion",
    "recreate": "tf_mixed.models.cloning",
})
