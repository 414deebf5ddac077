"""tf_mixed: mixed-precision training for Keras 3 on TensorFlow, on in one line."""

#     import tf_mixed
#     tf_mixed.enable()          # picks the policy for this hardware and says why
#     model = build_model()      # layers now compute in float16 / bfloat16
#     model.compile(optimizer=tf_mixed.wrap_optimizer("adam"), loss=...)
#     model.fit(ds, callbacks=[tf_mixed.LossScaleMonitor()])
#
# ``import tf_mixed`` does not import TensorFlow: each public name is imported
# from its module the first time it is used (PEP 562), so a program (the command
# line) can configure TensorFlow's logging before TensorFlow loads. It is still
# enough for ``keras.models.load_model`` to load a ``.keras`` file that uses
# tf_mixed's layers or optimizer: `tf_mixed.layers` and `tf_mixed.scaling.optimizer`,
# which register them, are imported as soon as Keras is (`tf_mixed._internal.on_keras_import`).

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tf_mixed._internal import moved as _moved
from tf_mixed._internal import on_keras_import as _on_keras_import

__version__ = "0.2.0"

# Public name -> the module defining it. A name equal to its module's last part
# is that module itself (Keras-style: tf_mixed.callbacks, tf_mixed.float8, ...).
_EXPORTS = {
    "Enabled": "policy.global_policy",
    "Float32Loss": "layers",
    "Float32Output": "layers",
    "LossScaleMonitor": "callbacks.monitor",
    "LossScaleOptimizer": "scaling.optimizer",
    "ModelCheckpoint": "callbacks.checkpoint",
    "OutputActivation": "layers",
    "audit": "tools.auditing",
    "callbacks": "callbacks",
    "catalog": "tools.catalog.cataloging",
    "census": "tools.census.step_census",
    "convert": "models.conversion",
    "disable": "policy.global_policy",
    "distribute": "distribute",
    "enable": "policy.global_policy",
    "export": "serving.exporting",
    "float32_loss": "layers",
    "float8": "float8",
    "layers": "layers",
    "loss_scale_state": "scaling.optimizer",
    "models": "models",
    "plan": "tools.planning.planner",
    "policy": "policy",
    "policy_scope": "policy.global_policy",
    "probe": "tools.probing",
    "scaling": "scaling",
    "serving": "serving",
    "tools": "tools",
    "training": "training",
    "wrap_optimizer": "scaling.optimizer",
}

# Names that moved in 0.2.0 -> (where they live now, the attribute or None for a
# module). Still importable, with a DeprecationWarning, until 0.3.0.
_MOVED = {
    "AuditReport": ("tools.auditing", "AuditReport"),
    "CensusReport": ("tools.census.step_census", "CensusReport"),
    "CompensationConfig": ("scaling.compensated", "CompensationConfig"),
    "ConversionNote": ("models", "ConversionNote"),
    "ExportReport": ("serving.export_report", "ExportReport"),
    "Finding": ("tools.auditing", "Finding"),
    "LossScaleConfig": ("scaling", "LossScaleConfig"),
    "LossScaleFailure": ("callbacks", "LossScaleFailure"),
    "LossScaleState": ("scaling.scale_state", "LossScaleState"),
    "MemoryReport": ("tools.memory", "MemoryReport"),
    "MixedPrecisionWarning": ("callbacks", "MixedPrecisionWarning"),
    "POLICY_NAMES": ("policy", "POLICY_NAMES"),
    "ProbeReport": ("tools.probe_report", "ProbeReport"),
    "accumulation": ("scaling.accumulation", None),
    "allreduce": ("scaling.allreduce", None),
    "auditing": ("tools.auditing", None),
    "autotune": ("policy.autotune", None),
    "census_findings": ("tools.census.findings", None),
    "checkpoint_callback": ("callbacks.checkpoint", None),
    "checkpoints": ("serving.half_checkpoints", None),
    "compensate": ("scaling", "compensate"),
    "compensated": ("scaling.compensated", None),
    "conversion": ("models.conversion", None),
    "export_report": ("serving.export_report", None),
    "exporting": ("serving.exporting", None),
    "float8_lowering": ("float8.lowering", None),
    "float8_monitor": ("float8.monitor", None),
    "float8_readiness": ("float8.readiness", None),
    "float8_reading": ("float8.reading", None),
    "float8_sync": ("scaling.float8_sync", None),
    "hardware": ("policy.hardware", None),
    "hlo_ops": ("tools.census.hlo_ops", None),
    "keep_float32": ("policy.keep_float32", None),
    "keras_compat": ("scaling.keras_compat", None),
    "launch": ("distribute.workers", None),
    "load_weights": ("serving", "load_weights"),
    "loss_scale": ("scaling.optimizer", None),
    "loss_tally": ("scaling.loss_tally", None),
    "memory": ("tools.memory", None),
    "memory_report": ("tools", "memory_report"),
    "padding": ("models.padding", None),
    "policy_state": ("policy.state", None),
    "probe_report": ("tools.probe_report", None),
    "probing": ("tools.probing", None),
    "rebuild": ("models.conversion", None),
    "replicas": ("scaling.replicas", None),
    "rollback": ("scaling.rollback", None),
    "save_weights": ("serving", "save_weights"),
    "scale_state": ("scaling.scale_state", None),
    "selfcheck": ("tools.check.scenarios", None),
    "step_census": ("tools.census.step_census", None),
    "step_ops": ("tools.census.step_ops", None),
    "stop_rules": ("callbacks.stop_rules", None),
    "tf_keras_check": ("_internal.tf_keras_check", None),
    "upstream_defects": ("tools.check.upstream_defects", None),
}

# Modules whose import registers Keras-serialisable classes (see docstring).
# Imported right after Keras loads: the first two register tf_mixed's Keras
# objects for loading; the third arms the keras-team/keras#20585 fix for a
# MultiWorkerMirroredStrategy built by hand (`keras_fix_20585.watch`); the
# fourth pins float16 layers' CPU kernels however they were made (issue 27).
_REGISTERING = ("layers", "scaling.optimizer", "distribute.keras_fix_20585",
                "policy.half_kernels")
_on_keras_import.register_when_keras_loads([f"tf_mixed.{name}" for name in _REGISTERING])

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # explicit imports for type checkers and IDEs
    from tf_mixed import (
        callbacks,
        distribute,
        float8,
        layers,
        models,
        policy,
        scaling,
        serving,
        tools,
        training,
    )
    from tf_mixed.callbacks.checkpoint import ModelCheckpoint
    from tf_mixed.callbacks.monitor import LossScaleMonitor
    from tf_mixed.layers import Float32Loss, Float32Output, OutputActivation, float32_loss
    from tf_mixed.models.conversion import convert
    from tf_mixed.policy.global_policy import Enabled, disable, enable, policy_scope
    from tf_mixed.scaling.optimizer import LossScaleOptimizer, loss_scale_state, wrap_optimizer
    from tf_mixed.serving.exporting import export
    from tf_mixed.tools.auditing import audit
    from tf_mixed.tools.catalog.cataloging import catalog
    from tf_mixed.tools.census.step_census import census
    from tf_mixed.tools.planning.planner import plan
    from tf_mixed.tools.probing import probe


def __getattr__(name: str) -> Any:
    """Imports a public name from its module on first use (PEP 562).

    A name that moved (`_MOVED`) still resolves, with a DeprecationWarning
    that names its new home.
    """
    moved = _MOVED.get(name)
    if moved is not None:
        where, attribute = moved
        return _moved.resolve(f"tf_mixed.{name}", f"tf_mixed.{where}", attribute)
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tf_mixed' has no attribute {name!r}")
    module = importlib.import_module(f"tf_mixed.{module_name}")
    if name == module_name.rpartition(".")[2]:  # a submodule alias: import only that module
        value = module
    else:
        for registering in _REGISTERING:
            importlib.import_module(f"tf_mixed.{registering}")
        value = getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return list(__all__)
