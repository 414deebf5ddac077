"""Keras callbacks: `LossScaleMonitor` and what it raises and warns; `Heal`; the skip contract."""

from tf_mixed._internal import moved as _moved
from tf_mixed.callbacks.heal import (  # noqa: F401
    Heal,
)
from tf_mixed.callbacks.monitor import (  # noqa: F401
    DEFAULT_CHECK_EVERY_N_BATCHES,
    LossScaleFailure,
    LossScaleMonitor,
    MixedPrecisionWarning,
)
from tf_mixed.callbacks.skip_contract import (  # noqa: F401
    install as install_skip_contract,
)

__all__ = [
    "DEFAULT_CHECK_EVERY_N_BATCHES",
    "Heal",
    "LossScaleFailure",
    "LossScaleMonitor",
    "MixedPrecisionWarning",
    "install_skip_contract",
]

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "Kind": "tf_mixed.callbacks.stop_rules",
    "ModelCheckpoint": "tf_mixed",
    "Progress": "tf_mixed.callbacks.stop_rules",
    "Reading": "tf_mixed.callbacks.stop_rules",
    "Snapshot": "tf_mixed.callbacks.stop_rules",
    "StopRules": "tf_mixed.callbacks.stop_rules",
    "advance": "tf_mixed.callbacks.stop_rules",
    "decide": "tf_mixed.callbacks.stop_rules",
    "keras_streak": "tf_mixed.callbacks.stop_rules",
    "loss_problem": "tf_mixed.callbacks.stop_rules",
    "model_setup_problems": "tf_mixed.callbacks.monitor",
    "start_epoch": "tf_mixed.callbacks.stop_rules",
    "wire_cause": "tf_mixed.callbacks.stop_rules",
})
