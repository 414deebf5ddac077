"""What `python -m tf_mixed check` runs; the modules beside this file."""

from tf_mixed._internal import moved as _moved

__all__: list[str] = []

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "CHECKS": "tf_mixed.tools.check.scenarios",
    "CheckResult": "tf_mixed.tools.check.scenarios",
    "DEFECTS": "tf_mixed.tools.check.upstream_defects",
    "Defect": "tf_mixed.tools.check.upstream_defects",
    "DefectSpec": "tf_mixed.tools.check.upstream_defects",
    "check": "tf_mixed.tools.check.upstream_defects",
    "run": "tf_mixed.tools.check.upstream_defects",
    "run_check": "tf_mixed.tools.check.scenarios",
})
