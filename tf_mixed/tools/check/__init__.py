"""`python -m tf_mixed check`: the scenarios and the upstream defects it checks.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.tools.check.scenarios import (  # noqa: F401
    CHECKS,
    CheckResult,
    run_check,
)
from tf_mixed.tools.check.upstream_defects import (  # noqa: F401
    DEFECTS,
    Defect,
    DefectSpec,
    check,
    run,
)

__all__ = [
    "CHECKS",
    "CheckResult",
    "DEFECTS",
    "Defect",
    "DefectSpec",
    "check",
    "run",
    "run_check",
]
