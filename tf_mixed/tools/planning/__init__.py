"""`plan`: a precision for each layer, timed on this host; its value `Plan`.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.tools.planning.choosing import (  # noqa: F401
    Choice,
    choose,
)
from tf_mixed.tools.planning.layer_timing import (  # noqa: F401
    LayerTiming,
    Measurement,
    time_layers,
)
from tf_mixed.tools.planning.plan_table import (  # noqa: F401
    LayerChoice,
    Plan,
)
from tf_mixed.tools.planning.planner import (  # noqa: F401
    plan,
)

__all__ = [
    "Choice",
    "LayerChoice",
    "LayerTiming",
    "Measurement",
    "Plan",
    "choose",
    "plan",
    "time_layers",
]
