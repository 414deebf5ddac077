"""The census of a training step (`tf_mixed.census`); the modules beside this file."""

from tf_mixed._internal import moved as _moved

__all__: list[str] = []

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "CODES": "tf_mixed.tools.census.findings",
    "COMPUTE_KINDS": "tf_mixed.tools.census.step_ops",
    "CastRow": "tf_mixed.tools.census.step_census",
    "CensusReport": "tf_mixed.tools.census.step_census",
    "Finding": "tf_mixed.tools.census.findings",
    "HLO_DTYPES": "tf_mixed.tools.census.hlo_ops",
    "Island": "tf_mixed.tools.census.step_census",
    "Misfit": "tf_mixed.tools.census.step_census",
    "OpRecord": "tf_mixed.tools.census.step_ops",
    "census": "tf_mixed",
    "find": "tf_mixed.tools.census.findings",
    "itemsize": "tf_mixed.tools.census.step_ops",
    "read_graph": "tf_mixed.tools.census.step_ops",
    "read_hlo": "tf_mixed.tools.census.hlo_ops",
})
