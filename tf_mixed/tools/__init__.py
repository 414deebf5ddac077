"""Tools that look at a model (`tf_mixed.audit`, `tf_mixed.probe`): `memory_report`, `planning`."""

from tf_mixed._internal import moved as _moved
from tf_mixed.tools import planning  # noqa: F401
from tf_mixed.tools.memory import memory_report  # noqa: F401

__all__ = [
    "memory_report",
    "planning",
]

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "AuditReport": "tf_mixed.tools.auditing",
    "DTYPE_LIMITS": "tf_mixed.tools.probe_report",
    "Finding": "tf_mixed.tools.auditing",
    "LayerRow": "tf_mixed.tools.auditing",
    "LayerStats": "tf_mixed.tools.probe_report",
    "MemoryEstimate": "tf_mixed.tools.auditing",
    "MemoryReport": "tf_mixed.tools.memory",
    "ProbeReport": "tf_mixed.tools.probe_report",
    "VariableStats": "tf_mixed.tools.probe_report",
    "audit": "tf_mixed",
    "probe": "tf_mixed",
})
