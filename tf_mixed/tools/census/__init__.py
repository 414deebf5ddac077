"""`census`: the ops a training step runs, their dtypes, and the findings.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.tools.census.findings import (  # noqa: F401
    CODES,
    Finding,
    find,
)
from tf_mixed.tools.census.hlo_ops import (  # noqa: F401
    HLO_DTYPES,
    read_hlo,
)
from tf_mixed.tools.census.step_census import (  # noqa: F401
    CastRow,
    CensusReport,
    Island,
    Misfit,
    census,
)
from tf_mixed.tools.census.step_ops import (  # noqa: F401
    COMPUTE_KINDS,
    OpRecord,
    itemsize,
    read_graph,
)

__all__ = [
    "CODES",
    "COMPUTE_KINDS",
    "CastRow",
    "CensusReport",
    "Finding",
    "HLO_DTYPES",
    "Island",
    "Misfit",
    "OpRecord",
    "census",
    "find",
    "itemsize",
    "read_graph",
    "read_hlo",
]
