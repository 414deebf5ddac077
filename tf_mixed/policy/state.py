"""Every piece of hidden state behind `tf_mixed.enable`, owned here, with one reset."""

# jmp keeps no global state; tf_mixed has to, because Keras and TensorFlow do:
# Keras keeps the dtype policy per thread, and Grappler's "remapping" option
# is per process. All of it lives in this
# module, with the scope each piece really has:
#
# * **per thread** (`ThreadState`): the policy `enable` saved and set, this
#   thread's hold on remapping, its open `policy_scope` blocks, and its
#   ``keep_float32`` rules with the policy object they are bound to;
# * **per asyncio context**: which `policy_scope` the running code is inside
#   (a context variable: two tasks sharing a thread, and so a Keras policy,
#   must not interleave scopes);
# * **per process**: the count of remapping holds (the option is turned off
#   at the first hold and put back at the last release, so one thread's
#   `disable` never turns it back on under another thread's float16 training),
#   the hold taken for float16 layers made without `enable`
#   (`hold_remapping_for_half_layers`, see `tf_mixed.policy.half_kernels`),
#   the ``Layer.__init__`` hook that applies the keep_float32 rules
#   (installed once, through `tf_mixed._internal.shims.add_layer_init_hook`),
#   and the layers whose keep_float32 predicates wait for the layer's first
#   call, with the rules they were created under (`defer_predicates`).
#
# `reset` forgets all of it at once.

from __future__ import annotations

import contextvars
import dataclasses
import threading
import weakref
from typing import Any, Callable

import tensorflow as tf

from tf_mixed._internal import shims as _internals

__all__ = [
    "ThreadState", "defer_predicates", "half_layers_hold", "hold_remapping",
    "hold_remapping_for_half_layers", "keep_rules", "release_remapping",
    "remapping_holders", "reset", "scope_marker", "set_keep_rules",
    "set_remapping_hold", "take_deferred", "thread_state",
]


@dataclasses.dataclass
class ThreadState:
    """What tf_mixed changed in this thread, to undo it.

    Attributes:
        saved_policy: Keras's policy before the first `enable` (None: no
            `enable` in effect).
        active: The policy name `enable` set, to notice a reset since.
        holds_remapping: Whether this thread holds remapping off.
        scopes: The open `policy_scope` blocks, innermost last.
        keep: This thread's ``keep_float32`` rules (a
            `tf_mixed.policy.keep_float32.KeepFloat32`), or None.
        keep_bound: The Keras policy object the rules apply under.
        requested: The name `enable` was given ("auto" or a policy), canonical;
            None without `enable` (`tf_mixed.policy.model_check` reads it).
    """

    saved_policy: Any = None
    active: str | None = None
    holds_remapping: bool = False
    scopes: list = dataclasses.field(default_factory=list)
    keep: Any = None
    keep_bound: Any = None
    requested: str | None = None


_threads = threading.local()

scope_marker: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "tf_mixed_policy_scope", default=None)
"""Which `policy_scope` the running code is inside (per asyncio context)."""

_lock = threading.Lock()
_holders = 0
_before: bool | None = None  # the option before the first hold; None: TF's default
_half_layers_hold = False  # hold_remapping_for_half_layers took its one hold


def thread_state() -> ThreadState:
    """This thread's `ThreadState` (created on first use)."""
    state = getattr(_threads, "state", None)
    if state is None:
        state = _threads.state = ThreadState()
    return state


def set_keep_rules(rules: Any, bound: Any,
                   hook: Callable[[Any, object], None],
                   container_hook: Callable[[Any], None] | None = None,
                   install: bool = False) -> None:
    """Stores this thread's keep_float32 rules; installs the hooks if any.

    Args:
        rules: A `tf_mixed.policy.keep_float32.KeepFloat32` (falsy: no rules).
        bound: The Keras policy object the rules apply under.
        hook: Called as ``hook(layer, dtype)`` at the end of every
            ``Layer.__init__`` once installed (installed once per process).
        container_hook: Called as ``container_hook(model)`` once a model
            knows its layers (`tf_mixed._internal.shims.add_container_hook`).
        install: Install the hooks even without rules (`enable` with a half
            policy: a layer taking token ids as floats is kept in float32).
    """
    state = thread_state()
    state.keep, state.keep_bound = rules, bound
    if rules or install:
        _internals.add_layer_init_hook(hook)
        if container_hook is not None:
            _internals.add_container_hook(container_hook)


def keep_rules() -> tuple[Any, Any]:
    """``(rules, bound policy)`` of this thread, as `set_keep_rules` stored them."""
    state = thread_state()
    return state.keep, state.keep_bound


# Layer -> the keep_float32 rules whose predicates it waits for (per
# process: a layer created in one thread may first be called in another).
_deferred: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def defer_predicates(layer: Any, rules: Any,
                     call_hook: Callable[[Any, tuple, dict], None]) -> None:
    """Keeps ``rules`` for ``layer`` until its first call; installs ``call_hook``.

    Args:
        layer: A layer just created under ``rules``.
        rules: Its `tf_mixed.policy.keep_float32.KeepFloat32`.
        call_hook: Called as ``call_hook(layer, args, kwargs)`` at the start
            of every ``Layer.__call__`` once installed
            (`tf_mixed._internal.shims.add_layer_call_hook`, once per process).
    """
    _internals.add_layer_call_hook(call_hook)
    with _lock:
        _deferred[layer] = rules


def take_deferred(layer: Any) -> Any:
    """The rules `defer_predicates` kept for ``layer``, forgotten; None if none."""
    if not _deferred:  # every call of every layer comes here: no lock when empty
        return None
    with _lock:
        return _deferred.pop(layer, None)


def _option() -> bool | None:
    return tf.config.optimizer.get_experimental_options().get("remapping")


def hold_remapping() -> None:
    """Turns remapping off (if it is not already held off) and counts the hold."""
    global _holders, _before
    with _lock:
        if _holders == 0:
            _before = _option()
            tf.config.optimizer.set_experimental_options({"remapping": False})
        _holders += 1


def release_remapping() -> None:
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


def hold_remapping_for_half_layers() -> bool:
    """Holds remapping off for the process, once, for float16 layers made without `enable`.

    Takes no hold while another is outstanding (an `enable` already holds
    it off) or after this one was taken; never released but by `reset`.

    Returns:
        Whether this call took the hold.
    """
    global _half_layers_hold
    with _lock:
        if _half_layers_hold or _holders:
            return False
        _half_layers_hold = True
    hold_remapping()
    return True


def half_layers_hold() -> bool:
    """Whether `hold_remapping_for_half_layers` holds remapping off now."""
    with _lock:
        return _half_layers_hold


def remapping_holders() -> int:
    """How many holds are outstanding (threads or probes needing remapping off)."""
    with _lock:
        return _holders


def set_remapping_hold(state: ThreadState, hold: bool) -> None:
    """Makes ``state``'s thread hold remapping off, or not."""
    if hold and not state.holds_remapping:
        hold_remapping()
    elif not hold and state.holds_remapping:
        release_remapping()
    state.holds_remapping = hold


def reset() -> None:
    """Forgets tf_mixed's policy state: this thread's and every remapping hold.

    It does not touch Keras's dtype policy nor TensorFlow's remapping option:
    set those yourself. For a process that reuses a thread for unrelated
    work after an error left `enable` state behind, and for test fixtures
    (tests/conftest.py) that restore Keras's policy and the option around
    each test. Other threads' states are not reachable from here; a reset
    thread starts as if `enable` had never run in it. Layers still waiting for
    their first call to run keep_float32 predicates (`defer_predicates`)
    are forgotten too: they keep the policy they have.
    """
    global _holders, _before, _half_layers_hold
    _threads.state = ThreadState()
    with _lock:
        _holders, _before, _half_layers_hold = 0, None, False
        _deferred.clear()
