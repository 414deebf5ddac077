"""tf_mixed: mixed-precision training for Keras 3 on TensorFlow, on in one line.

    import tf_mixed
    tf_mixed.enable()          # picks the policy for this hardware and says why
    model = build_model()      # layers now compute in float16 / bfloat16
    model.compile(optimizer=tf_mixed.wrap_optimizer("adam"), loss=...)
    model.fit(ds, callbacks=[tf_mixed.callbacks.LossScaleMonitor()])

The names below are imported on first use (PEP 562), so ``import tf_mixed``
does not import TensorFlow: the command line sets TensorFlow's log level
before anything loads it.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

# name -> (module, attribute); attribute None: the submodule itself.
_EXPORTS = {
    "callbacks": ("tf_mixed.callbacks", None),
    "hardware": ("tf_mixed.hardware", None),
    "layers": ("tf_mixed.layers", None),
    "training": ("tf_mixed.training", None),
    "AuditReport": ("tf_mixed.audit", "AuditReport"),
    "audit": ("tf_mixed.audit", "audit"),
    "convert": ("tf_mixed.convert", "convert"),
    "Float32Output": ("tf_mixed.layers", "Float32Output"),
    "OutputActivation": ("tf_mixed.layers", "OutputActivation"),
    "float32_loss": ("tf_mixed.layers", "float32_loss"),
    "LossScaleOptimizer": ("tf_mixed.loss_scale", "LossScaleOptimizer"),
    "wrap_optimizer": ("tf_mixed.loss_scale", "wrap_optimizer"),
    "POLICY_NAMES": ("tf_mixed.policy", "POLICY_NAMES"),
    "Enabled": ("tf_mixed.policy", "Enabled"),
    "disable": ("tf_mixed.policy", "disable"),
    "enable": ("tf_mixed.policy", "enable"),
    "policy_scope": ("tf_mixed.policy", "policy_scope"),
}

__all__ = sorted(["__version__", *_EXPORTS])


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tf_mixed' has no attribute {name!r}")
    module_name, attribute = _EXPORTS[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    setattr(sys.modules[__name__], name, value)
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """Keeps `tf_mixed.audit` / `tf_mixed.convert` the functions.

    Loading a submodule binds it to the package attribute of the same name,
    which would replace the functions of the same name; until those modules
    are renamed, a submodule bound under an exported function's name is
    replaced by that function.
    """

    def __setattr__(self, name, value):
        export = _EXPORTS.get(name)
        if export and export[1] == name and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
