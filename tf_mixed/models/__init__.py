"""Re-creating a model in another dtype: cloning, `convert`, padding.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.models.cloning import (  # noqa: F401
    FlatClone,
    flat_clone,
    model_input,
    recreate,
)
from tf_mixed.models.conversion import (  # noqa: F401
    ConversionNote,
    convert,
)
from tf_mixed.models.padding import (  # noqa: F401
    copy_padded,
    plan,
)
from tf_mixed.models.rebuilding import (  # noqa: F401
    compute_dtype,
    is_graph_model,
    rebuild,
)

__all__ = [
    "ConversionNote",
    "FlatClone",
    "compute_dtype",
    "convert",
    "copy_padded",
    "flat_clone",
    "is_graph_model",
    "model_input",
    "plan",
    "rebuild",
    "recreate",
]
