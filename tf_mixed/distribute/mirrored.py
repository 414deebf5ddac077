"""The process's one ``MirroredStrategy`` per device set (TF 2.21's collectives clash otherwise)."""

from __future__ import annotations

import tensorflow as tf

__all__ = ["shared_mirrored_strategy"]

# One MirroredStrategy per device set per process; see shared_mirrored_strategy.
_MIRRORED_STRATEGIES: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def shared_mirrored_strategy(devices=None) -> tf.distribute.MirroredStrategy:
    """The process's one ``MirroredStrategy`` over ``devices``.

    In TF 2.21 every ``MirroredStrategy`` object numbers its collective
    all-reduces from the same keys. A second strategy over the same devices in
    one process therefore reuses the first one's collective instances, and as
    soon as a tensor shape differs (another model) TF aborts every collective
    in the process: "Shape mismatch in the collective instance 100 ... Restart
    your program". Sharing one strategy per device set avoids it; the bench
    and the tests use this.

    Args:
        devices: Device names such as ``["CPU:0", "CPU:1"]``, one device name
            such as ``"GPU:0"``, or None for all GPUs (TF's default).

    Returns:
        A ``tf.distribute.MirroredStrategy``, the same object for the same
        devices however they are spelled.
    """
    if isinstance(devices, str):  # one device, not its characters
        devices = [devices]
    key: tuple[str, ...] = ()
    if devices is not None:
        specs = [tf.DeviceSpec.from_string(d) for d in devices]
        key = tuple(f"{s.device_type}:{s.device_index}" for s in specs)
    if key not in _MIRRORED_STRATEGIES:
        _MIRRORED_STRATEGIES[key] = tf.distribute.MirroredStrategy(
            list(devices) if devices is not None else None
        )
    return _MIRRORED_STRATEGIES[key]
