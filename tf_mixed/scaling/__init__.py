"""Loss scaling: `LossScaleOptimizer` and its parts (scale state and rule, all-reduce, rollback, loss tally, replicas, accumulation, Kahan compensation, float8 scale agreement, Keras/tf-keras compatibility).

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.scaling.accumulation import (  # noqa: F401
    Accumulator,
    steps_to_take_over,
    take_over,
    validate_steps,
)
from tf_mixed.scaling.allreduce import (  # noqa: F401
    COMMUNICATION_DTYPES,
    reduce_gradients,
    validate_communication_dtype,
    wire_bytes,
)
from tf_mixed.scaling.compensated import (  # noqa: F401
    CompensationConfig,
    METHODS,
    STATE_DTYPES,
    compensate,
    compensate_if_asked,
    compensation_buffers,
    compensation_config,
    compensation_of,
    config_from_arguments,
    kahan_add,
    kahan_sum,
    stochastic_round,
)
from tf_mixed.scaling.float8_sync import (  # noqa: F401
    ALGORITHMS,
    FORMATS,
    Float8Scaling,
    Float8Sync,
    KINDS,
    Slot,
    find_slots,
    next_scale,
    scaling_of,
    set_scaling,
)
from tf_mixed.scaling.formats import (  # noqa: F401
    EXTRA_STATE,
)
from tf_mixed.scaling.keras_compat import (  # noqa: F401
    KerasCompat,
)
from tf_mixed.scaling.optimizer import (  # noqa: F401
    LossScaleOptimizer,
    loss_scale_state,
    read_keras_state,
    refresh_forward_state,
    wrap_optimizer,
)
from tf_mixed.scaling.loss_tally import (  # noqa: F401
    LossTally,
    LossTotals,
)
from tf_mixed.scaling.replicas import (  # noqa: F401
    all_copies_finite,
    local_copies,
)
from tf_mixed.scaling.rollback import (  # noqa: F401
    ForwardState,
    forward_variables,
)
from tf_mixed.scaling.scale_state import (  # noqa: F401
    LossScaleConfig,
    LossScaleState,
    initial_state,
    next_state,
    validate_knob,
)

__all__ = [
    "ALGORITHMS",
    "Accumulator",
    "COMMUNICATION_DTYPES",
    "CompensationConfig",
    "EXTRA_STATE",
    "FORMATS",
    "Float8Scaling",
    "Float8Sync",
    "ForwardState",
    "KINDS",
    "KerasCompat",
    "LossScaleConfig",
    "LossScaleOptimizer",
    "LossScaleState",
    "LossTally",
    "LossTotals",
    "METHODS",
    "STATE_DTYPES",
    "Slot",
    "all_copies_finite",
    "compensate",
    "compensate_if_asked",
    "compensation_buffers",
    "compensation_config",
    "compensation_of",
    "config_from_arguments",
    "find_slots",
    "forward_variables",
    "initial_state",
    "kahan_add",
    "kahan_sum",
    "local_copies",
    "loss_scale_state",
    "next_scale",
    "next_state",
    "read_keras_state",
    "reduce_gradients",
    "refresh_forward_state",
    "scaling_of",
    "set_scaling",
    "steps_to_take_over",
    "stochastic_round",
    "take_over",
    "validate_communication_dtype",
    "validate_knob",
    "validate_steps",
    "wire_bytes",
    "wrap_optimizer",
]
