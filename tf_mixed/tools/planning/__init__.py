"""`tf_mixed.plan`'s value (`Plan`, `LayerChoice`) and timings (`Measurement`, `LayerTiming`)."""

from tf_mixed.tools.planning.layer_timing import (  # noqa: F401
    LayerTiming,
    Measurement,
)
from tf_mixed.tools.planning.plan_table import (  # noqa: F401
    LayerChoice,
    Plan,
)

__all__ = [
    "LayerChoice",
    "LayerTiming",
    "Measurement",
    "Plan",
]
