"""Re-creating a model in another dtype: cloning, `convert`, `rebuild`, padding.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.models.cloning import (  # noqa: F401
    Clone,
    clone,
    copy_weights,
    model_input,
    recreate,
)
from tf_mixed.models.conversion import (  # noqa: F401
    ConversionNote,
    compute_dtype,
    convert,
    is_graph_model,
    rebuild,
)
from tf_mixed.models.padding import (  # noqa: F401
    copy_padded,
    plan,
)

__all__ = [
    "Clone",
    "ConversionNote",
    "clone",
    "compute_dtype",
    "convert",
    "copy_padded",
    "copy_weights",
    "is_graph_model",
    "model_input",
    "plan",
    "rebuild",
    "recreate",
]
