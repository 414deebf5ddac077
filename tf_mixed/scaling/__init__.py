"""Loss scaling (`tf_mixed.LossScaleOptimizer`): its config, loss tally, compensation, healing."""

from tf_mixed._internal import moved as _moved
from tf_mixed.scaling.attribution import attributed_layers  # noqa: F401
from tf_mixed.scaling.compensated import compensate  # noqa: F401
from tf_mixed.scaling.healing import Healer, HealingLimit, HealRule  # noqa: F401
from tf_mixed.scaling.loss_tally import LossTally  # noqa: F401
from tf_mixed.scaling.optimizer import guard_spikes, refresh_forward_state  # noqa: F401
from tf_mixed.scaling.scale_state import LossScaleConfig  # noqa: F401
from tf_mixed.scaling.spike import SpikeRule  # noqa: F401

__all__ = [
    "HealRule",
    "Healer",
    "HealingLimit",
    "LossScaleConfig",
    "LossTally",
    "SpikeRule",
    "attributed_layers",
    "compensate",
    "guard_spikes",
    "refresh_forward_state",
]

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "ALGORITHMS": "tf_mixed.scaling.float8_sync",
    "Accumulator": "tf_mixed.scaling.accumulation",
    "COMMUNICATION_DTYPES": "tf_mixed.scaling.allreduce",
    "CompensationConfig": "tf_mixed.scaling.compensated",
    "EXTRA_STATE": "tf_mixed.scaling.formats",
    "FORMATS": "tf_mixed.scaling.float8_sync",
    "Float8Scaling": "tf_mixed.scaling.float8_sync",
    "Float8Sync": "tf_mixed.scaling.float8_sync",
    "ForwardState": "tf_mixed.scaling.rollback",
    "KINDS": "tf_mixed.scaling.float8_sync",
    "KerasCompat": "tf_mixed.scaling.keras_compat",
    "LossScaleOptimizer": "tf_mixed",
    "LossScaleState": "tf_mixed.scaling.scale_state",
    "LossTotals": "tf_mixed.scaling.loss_tally",
    "METHODS": "tf_mixed.scaling.compensated",
    "STATE_DTYPES": "tf_mixed.scaling.compensated",
    "Slot": "tf_mixed.scaling.float8_sync",
    "all_copies_finite": "tf_mixed.scaling.replicas",
    "compensate_if_asked": "tf_mixed.scaling.compensated",
    "compensation_buffers": "tf_mixed.scaling.compensated",
    "compensation_config": "tf_mixed.scaling.compensated",
    "compensation_of": "tf_mixed.scaling.compensated",
    "config_from_arguments": "tf_mixed.scaling.compensated",
    "find_slots": "tf_mixed.scaling.float8_sync",
    "forward_variables": "tf_mixed.scaling.rollback",
    "initial_state": "tf_mixed.scaling.scale_state",
    "kahan_add": "tf_mixed.scaling.compensated",
    "kahan_sum": "tf_mixed.scaling.compensated",
    "local_copies": "tf_mixed.scaling.replicas",
    "loss_scale_state": "tf_mixed",
    "next_scale": "tf_mixed.scaling.float8_sync",
    "next_state": "tf_mixed.scaling.scale_state",
    "read_keras_state": "tf_mixed.scaling.optimizer",
    "reduce_gradients": "tf_mixed.scaling.allreduce",
    "scaling_of": "tf_mixed.scaling.float8_sync",
    "set_scaling": "tf_mixed.scaling.float8_sync",
    "steps_to_take_over": "tf_mixed.scaling.accumulation",
    "stochastic_round": "tf_mixed.scaling.compensated",
    "take_over": "tf_mixed.scaling.accumulation",
    "validate_communication_dtype": "tf_mixed.scaling.allreduce",
    "validate_knob": "tf_mixed.scaling.scale_state",
    "validate_steps": "tf_mixed.scaling.accumulation",
    "wire_bytes": "tf_mixed.scaling.allreduce",
    "wrap_optimizer": "tf_mixed",
})
