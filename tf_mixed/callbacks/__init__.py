"""Keras callbacks: `LossScaleMonitor` over its pure stop rules, `Heal`, and `ModelCheckpoint`.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.callbacks.monitor import (  # noqa: F401
    DEFAULT_CHECK_EVERY_N_BATCHES,
    LossScaleFailure,
    LossScaleMonitor,
    MixedPrecisionWarning,
    model_setup_problems,
)
from tf_mixed.callbacks.checkpoint import (  # noqa: F401
    ModelCheckpoint,
)
from tf_mixed.callbacks.heal import (  # noqa: F401
    Heal,
)
from tf_mixed.callbacks.stop_rules import (  # noqa: F401
    Kind,
    Progress,
    Reading,
    Snapshot,
    StopRules,
    advance,
    decide,
    keras_streak,
    loss_problem,
    start_epoch,
    wire_cause,
)

__all__ = [
    "DEFAULT_CHECK_EVERY_N_BATCHES",
    "Heal",
    "Kind",
    "LossScaleFailure",
    "LossScaleMonitor",
    "MixedPrecisionWarning",
    "ModelCheckpoint",
    "Progress",
    "Reading",
    "Snapshot",
    "StopRules",
    "advance",
    "decide",
    "keras_streak",
    "loss_problem",
    "model_setup_problems",
    "start_epoch",
    "wire_cause",
]
