"""tf_mixed: mixed-precision training for Keras 3 on TensorFlow, on in one line.

    import tf_mixed
    tf_mixed.enable()          # picks the policy for this hardware and says why
    model = build_model()      # layers now compute in float16 / bfloat16
    model.compile(optimizer=tf_mixed.wrap_optimizer("adam"), loss=...)
    model.fit(ds, callbacks=[tf_mixed.callbacks.LossScaleMonitor()])
"""

__version__ = "0.1.0"

from tf_mixed import callbacks
from tf_mixed import distribute
from tf_mixed import hardware
from tf_mixed import launch
from tf_mixed import layers
from tf_mixed import training
from tf_mixed.audit import AuditReport
from tf_mixed.audit import audit
from tf_mixed.convert import convert
from tf_mixed.layers import Float32Output
from tf_mixed.layers import OutputActivation
from tf_mixed.layers import float32_loss
from tf_mixed.loss_scale import LossScaleOptimizer
from tf_mixed.loss_scale import wrap_optimizer
from tf_mixed.policy import POLICY_NAMES
from tf_mixed.policy import Enabled
from tf_mixed.policy import disable
from tf_mixed.policy import enable
from tf_mixed.policy import policy_scope

__all__ = [
    "AuditReport",
    "Enabled",
    "Float32Output",
    "LossScaleOptimizer",
    "OutputActivation",
    "POLICY_NAMES",
    "__version__",
    "audit",
    "callbacks",
    "convert",
    "disable",
    "distribute",
    "enable",
    "float32_loss",
    "hardware",
    "launch",
    "layers",
    "policy_scope",
    "training",
    "wrap_optimizer",
]
