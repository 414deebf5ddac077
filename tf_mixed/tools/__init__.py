"""Tools that look at a model: `audit`, `probe`, `memory_report`; `census/`, `check/` and `planning/` below.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.tools.auditing import (  # noqa: F401
    AuditReport,
    Finding,
    LayerRow,
    MemoryEstimate,
    audit,
)
from tf_mixed.tools.memory import (  # noqa: F401
    MemoryReport,
    memory_report,
)
from tf_mixed.tools.planning import (  # noqa: F401
    Plan,
    plan,
)
from tf_mixed.tools.probe_report import (  # noqa: F401
    DTYPE_LIMITS,
    LayerStats,
    ProbeReport,
    VariableStats,
)
from tf_mixed.tools.probing import (  # noqa: F401
    probe,
)

__all__ = [
    "AuditReport",
    "DTYPE_LIMITS",
    "Finding",
    "LayerRow",
    "LayerStats",
    "MemoryEstimate",
    "MemoryReport",
    "Plan",
    "ProbeReport",
    "VariableStats",
    "audit",
    "memory_report",
    "plan",
    "probe",
]
