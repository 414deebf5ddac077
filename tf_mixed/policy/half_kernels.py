"""Float16 layers on a host without a GPU run the kernels `enable` pins, however they were made."""

# `tf_mixed.enable("mixed_float16")` on a host without a GPU holds
# TensorFlow's Grappler "remapping" pass off (per process; see
# `tf_mixed.policy.global_policy`). A model loaded from a ``.keras`` file in a
# fresh process that only imported tf_mixed has the same float16 layers (their
# policies are in the file) but no `enable`, so remapping was on there (issue
# 27). Where oneDNN computes float16 on the CPU (TensorFlow's
# ``IsDataTypeSupportedByOneDNNOnThisCPU(DT_HALF)``: AVX512-BW with
# AVX512-FP16 or AMX-FP16, e.g. an Intel Xeon with AMX), the remapper then
# fuses each float16 Dense's MatMul + BiasAdd (+ activation) into one oneDNN
# ``_FusedMatMul``, which rounds to float16 once where the separate ops round
# twice: the resumed run drifted from the uninterrupted one in the last bits,
# and ran the slow fused kernel besides. Where oneDNN has no float16 (AVX2
# only, or AMD Zen 4: TensorFlow logs "oneDNN supports DT_HALF only on
# platforms with AVX-512", falling back to Eigen) nothing is fused in float16,
# and the option changed nothing: host luck.
#
# So the hold follows the layers, not the call: importing this module (tf_mixed
# does, right after Keras loads) adds a ``Layer.__init__`` hook
# (`tf_mixed._internal.shims.add_layer_init_hook`); the first layer made with
# float16 compute on a host without a GPU, while no `enable` holds remapping
# off, takes one hold for the process
# (`tf_mixed.policy.state.hold_remapping_for_half_layers`; dropped only by
# `tf_mixed.policy.state.reset`). A float16 model then runs the same kernels
# whether its policy came from `enable`, from ``keras.mixed_precision`` or from
# a file.

from __future__ import annotations

import functools

import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed.policy import state as _state

__all__ = ["on_layer_init"]


@functools.lru_cache(maxsize=1)
def _has_gpu() -> bool:
    # Listing physical devices does not initialise the runtime's logical
    # devices (a later set_logical_device_configuration still works).
    return bool(tf.config.list_physical_devices("GPU"))


def on_layer_init(layer, dtype=None) -> None:
    """Holds remapping off the first time a float16 layer is made without a GPU.

    Args:
        layer: The layer `Layer.__init__` just initialised.
        dtype: The ``dtype`` argument it was made with (unused: the layer's
            policy says what it computes in, whatever set it).
    """
    del dtype
    policy = getattr(layer, "dtype_policy", None)
    if getattr(policy, "compute_dtype", None) != "float16" or _state.half_layers_hold():
        return
    if not _has_gpu():
        _state.hold_remapping_for_half_layers()


_internals.add_layer_init_hook(on_layer_init)
