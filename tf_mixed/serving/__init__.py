"""Serving what was trained: `export` with parity checks, half-precision checkpoints.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.serving.half_checkpoints import (  # noqa: F401
    load_weights,
    save_weights,
)
from tf_mixed.serving.export_report import (  # noqa: F401
    ExportReport,
)
from tf_mixed.serving.exporting import (  # noqa: F401
    export,
)

__all__ = [
    "ExportReport",
    "export",
    "load_weights",
    "save_weights",
]
