"""Float8 training: `quantize`, `state`, `lowering_report` and `Float8Monitor`."""

from tf_mixed._internal import moved as _moved
from tf_mixed.float8.lowering import lowering_report  # noqa: F401
from tf_mixed.float8.monitor import Float8Monitor  # noqa: F401
from tf_mixed.float8.quantization import quantize  # noqa: F401
from tf_mixed.float8.reading import state  # noqa: F401

__all__ = [
    "Float8Monitor",
    "lowering_report",
    "quantize",
    "state",
]

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "ALGORITHMS": "tf_mixed.scaling.float8_sync",
    "FLOAT8_CLASSES": "tf_mixed.float8.readiness",
    "FLOAT8_GEMM_TARGET": "tf_mixed.float8.lowering",
    "Float8Choice": "tf_mixed.float8.quantization",
    "Float8Plan": "tf_mixed.float8.quantization",
    "Float8Saturation": "tf_mixed.float8.monitor",
    "Float8Scaling": "tf_mixed.scaling.float8_sync",
    "Float8State": "tf_mixed.float8.reading",
    "Gemm": "tf_mixed.float8.lowering",
    "LayerCheck": "tf_mixed.float8.readiness",
    "LayerLowering": "tf_mixed.float8.lowering",
    "LoweringReport": "tf_mixed.float8.lowering",
    "REASONS": "tf_mixed.float8.readiness",
    "TensorState": "tf_mixed.float8.reading",
    "attribute": "tf_mixed.float8.lowering",
    "check_layers": "tf_mixed.float8.readiness",
    "findings": "tf_mixed.float8.readiness",
    "flop_share": "tf_mixed.float8.readiness",
    "fractions": "tf_mixed.float8.reading",
    "is_float8": "tf_mixed.float8.readiness",
    "parse_gemms": "tf_mixed.float8.lowering",
    "read": "tf_mixed.float8.monitor",
    "saturation_verdict": "tf_mixed.float8.monitor",
})
