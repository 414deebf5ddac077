"""Grappler's "remapping" option, shared by every thread that needs it off.

TensorFlow keeps graph-optimizer options per process, while Keras keeps the
dtype policy per thread (design.md fact 12). float16 on a CPU needs remapping
off (its fused float16 MatMul+BiasAdd CPU kernel is >1000x slower than the
plain matmul), so each thread or probe that needs it off takes a hold; the
option goes back to what it was before the first hold only when the last hold
is released. One thread's `disable()` can then never turn remapping back on
under another thread's float16 training.
"""

from __future__ import annotations

import threading

import tensorflow as tf

_lock = threading.Lock()
_holders = 0
_before: bool | None = None  # the option before the first hold; None: TF's default


def _option() -> bool | None:
    return tf.config.optimizer.get_experimental_options().get("remapping")


def hold() -> None:
    """Turns remapping off (if it is not already held off) and counts the hold."""
    global _holders, _before
    with _lock:
        if _holders == 0:
            _before = _option()
            tf.config.optimizer.set_experimental_options({"remapping": False})
        _holders += 1


def release() -> None:
    """Drops one hold; the last one puts the option back as it was.

    Releasing with no hold outstanding does nothing.
    """
    global _holders, _before
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            # An option that was unset goes back to TF's default (on).
            remapping = True if _before is None else _before
            tf.config.optimizer.set_experimental_options({"remapping": remapping})
            _before = None


def holders() -> int:
    """How many holds are outstanding (threads or probes needing remapping off)."""
    with _lock:
        return _holders


def _reset_for_tests() -> None:
    """Forgets every hold without touching the option (the fixture restores it)."""
    global _holders, _before
    with _lock:
        _holders, _before = 0, None
