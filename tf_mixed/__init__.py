"""tf_mixed: mixed-precision training for Keras 3 on TensorFlow, on in one line.

    import tf_mixed
    tf_mixed.enable()          # picks the policy for this hardware and says why
    model = build_model()      # layers now compute in float16 / bfloat16
    model.compile(optimizer=tf_mixed.wrap_optimizer("adam"), loss=...)
    model.fit(ds, callbacks=[tf_mixed.LossScaleMonitor()])

``import tf_mixed`` does not import TensorFlow: each public name is imported
from its module the first time it is used (PEP 562), so a program (the command
line) can configure TensorFlow's logging before TensorFlow loads. It is still
enough for ``keras.models.load_model`` to load a ``.keras`` file that uses
tf_mixed's layers or optimizer: `tf_mixed.layers` and `tf_mixed.loss_scale`,
which register them, are imported as soon as Keras is (`tf_mixed._on_keras_import`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tf_mixed import _on_keras_import

__version__ = "0.1.0"

# Public name -> the submodule defining it. A name equal to its module's name
# is the submodule itself (Keras-style aliases: tf_mixed.callbacks, ...).
_EXPORTS = {
    "AuditReport": "auditing",
    "CensusReport": "step_census",
    "CompensationConfig": "compensated",
    "ConversionNote": "conversion",
    "Enabled": "policy",
    "ExportReport": "export_report",
    "Finding": "auditing",
    "Float32Loss": "layers",
    "Float32Output": "layers",
    "LossScaleConfig": "scale_state",
    "LossScaleFailure": "callbacks",
    "LossScaleMonitor": "callbacks",
    "LossScaleOptimizer": "loss_scale",
    "LossScaleState": "scale_state",
    "MemoryReport": "memory",
    "MixedPrecisionWarning": "callbacks",
    "ModelCheckpoint": "checkpoint_callback",
    "OutputActivation": "layers",
    "POLICY_NAMES": "policy",
    "ProbeReport": "probe_report",
    "audit": "auditing",
    "callbacks": "callbacks",
    "census": "step_census",
    "compensate": "compensated",
    "compensated": "compensated",
    "convert": "conversion",
    "disable": "policy",
    "distribute": "distribute",
    "enable": "policy",
    "export": "exporting",
    "float32_loss": "layers",
    "float8": "float8",
    "hardware": "hardware",
    "launch": "launch",
    "load_weights": "checkpoints",
    "layers": "layers",
    "loss_scale_state": "loss_scale",
    "memory_report": "memory",
    "policy_scope": "policy",
    "probe": "probing",
    "save_weights": "checkpoints",
    "scale_state": "scale_state",
    "training": "training",
    "wrap_optimizer": "loss_scale",
}

# Modules whose import registers Keras-serialisable classes (see docstring).
_REGISTERING = ("layers", "loss_scale")
_on_keras_import.register_when_keras_loads([f"tf_mixed.{name}" for name in _REGISTERING])

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # explicit imports for type checkers and IDEs
    from tf_mixed import callbacks
    from tf_mixed import compensated
    from tf_mixed import distribute
    from tf_mixed import float8
    from tf_mixed import hardware
    from tf_mixed import launch
    from tf_mixed import layers
    from tf_mixed import scale_state
    from tf_mixed import training
    from tf_mixed.auditing import AuditReport
    from tf_mixed.auditing import Finding
    from tf_mixed.auditing import audit
    from tf_mixed.callbacks import LossScaleFailure
    from tf_mixed.callbacks import LossScaleMonitor
    from tf_mixed.callbacks import MixedPrecisionWarning
    from tf_mixed.compensated import CompensationConfig
    from tf_mixed.compensated import compensate
    from tf_mixed.conversion import ConversionNote
    from tf_mixed.checkpoint_callback import ModelCheckpoint
    from tf_mixed.checkpoints import load_weights
    from tf_mixed.checkpoints import save_weights
    from tf_mixed.conversion import convert
    from tf_mixed.export_report import ExportReport
    from tf_mixed.exporting import export
    from tf_mixed.layers import Float32Loss
    from tf_mixed.layers import Float32Output
    from tf_mixed.layers import OutputActivation
    from tf_mixed.layers import float32_loss
    from tf_mixed.loss_scale import LossScaleOptimizer
    from tf_mixed.loss_scale import loss_scale_state
    from tf_mixed.loss_scale import wrap_optimizer
    from tf_mixed.memory import MemoryReport
    from tf_mixed.memory import memory_report
    from tf_mixed.policy import POLICY_NAMES
    from tf_mixed.policy import Enabled
    from tf_mixed.policy import disable
    from tf_mixed.policy import enable
    from tf_mixed.policy import policy_scope
    from tf_mixed.probing import probe
    from tf_mixed.probe_report import ProbeReport
    from tf_mixed.scale_state import LossScaleConfig
    from tf_mixed.scale_state import LossScaleState
    from tf_mixed.step_census import CensusReport
    from tf_mixed.step_census import census


def __getattr__(name: str) -> Any:
    """Imports a public name from its module on first use (PEP 562)."""
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tf_mixed' has no attribute {name!r}")
    module = importlib.import_module(f"tf_mixed.{module_name}")
    if name == module_name:  # a submodule alias: import only that module
        value = module
    else:
        for registering in _REGISTERING:
            importlib.import_module(f"tf_mixed.{registering}")
        value = getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return list(__all__)
