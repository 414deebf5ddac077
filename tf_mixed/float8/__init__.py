"""Float8 training: quantize, lowering, readiness, reading and the monitor.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.float8.quantization import (  # noqa: F401
    Float8Choice,
    Float8Plan,
    quantize,
)
from tf_mixed.float8.lowering import (  # noqa: F401
    FLOAT8_GEMM_TARGET,
    Gemm,
    LayerLowering,
    LoweringReport,
    attribute,
    lowering_report,
    parse_gemms,
)
from tf_mixed.float8.monitor import (  # noqa: F401
    Float8Monitor,
    Float8Saturation,
    read,
    saturation_verdict,
)
from tf_mixed.float8.readiness import (  # noqa: F401
    FLOAT8_CLASSES,
    LayerCheck,
    REASONS,
    check_layers,
    findings,
    flop_share,
    is_float8,
)
from tf_mixed.float8.reading import (  # noqa: F401
    Float8State,
    TensorState,
    fractions,
    state,
)
from tf_mixed.scaling.float8_sync import (  # noqa: F401  re-exported: float8's knobs
    ALGORITHMS,
    Float8Scaling,
)

__all__ = [
    "ALGORITHMS",
    "Float8Scaling",
    "FLOAT8_CLASSES",
    "FLOAT8_GEMM_TARGET",
    "Float8Choice",
    "Float8Monitor",
    "Float8Plan",
    "Float8Saturation",
    "Float8State",
    "Gemm",
    "LayerCheck",
    "LayerLowering",
    "LoweringReport",
    "REASONS",
    "TensorState",
    "attribute",
    "check_layers",
    "findings",
    "flop_share",
    "fractions",
    "is_float8",
    "lowering_report",
    "parse_gemms",
    "quantize",
    "read",
    "saturation_verdict",
    "state",
]
