"""Policy state with Keras's own scoping (issue 10's reproductions).

Keras keeps the dtype policy per thread, Grappler's remapping option is per
process, and `keras.backend.clear_session()` resets every thread's policy.
Each test here was a reproduced bug: threads undoing each
other, remapping turned back on under another thread's float16 training,
asyncio tasks building layers under each other's policy, a silent reset.
"""

import asyncio
import logging
import threading

import keras
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.policy import global_policy as policy
from tf_mixed.policy import hardware


def remapping():
    return tf.config.optimizer.get_experimental_options().get("remapping", True)


@pytest.fixture(autouse=True)
def cpu_host(monkeypatch):
    """float16 on a host with no GPU, whatever this machine has."""
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo(cpu_model="Test CPU"))


class Steps:
    """Runs two threads' steps in a fixed interleaving, one step at a time."""

    def __init__(self):
        self._turn = threading.Condition()
        self._next = 0
        self.seen = {}
        self.errors = []

    def thread(self, schedule):
        """schedule: [(turn, callable)], turns counted across both threads."""

        def run():
            try:
                for turn, step in schedule:
                    with self._turn:
                        assert self._turn.wait_for(lambda turn=turn: self._next == turn, timeout=30)
                    try:
                        step()
                    finally:
                        with self._turn:
                            self._next += 1
                            self._turn.notify_all()
            except BaseException as error:  # reported by the test
                self.errors.append(error)
                with self._turn:
                    self._next = 10**6
                    self._turn.notify_all()

        return threading.Thread(target=run)


def run_threads(*threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()


def test_one_threads_disable_leaves_the_other_thread_enabled():
    steps = Steps()
    record = steps.seen
    a = steps.thread([
        (0, lambda: tf_mixed.enable("mixed_float16", quiet=True)),
        (2, tf_mixed.disable),
        (3, lambda: record.update(a_after=(tf_mixed.policy.global_policy.current(), remapping()))),
    ])
    b = steps.thread([
        (1, lambda: tf_mixed.enable("mixed_float16", quiet=True)),
        (4, lambda: record.update(b_after_a=(tf_mixed.policy.global_policy.current(), remapping(),
                                             policy.status().remapping_holders))),
        (5, tf_mixed.disable),
        (6, lambda: record.update(b_after=(tf_mixed.policy.global_policy.current(), remapping()))),
    ])
    run_threads(a, b)
    assert not steps.errors, steps.errors
    # A is back to float32, but remapping stays off: B still trains in float16.
    assert record["a_after"] == ("float32", False)
    assert record["b_after_a"] == ("mixed_float16", False, 1)
    # B's own disable works (it did nothing before: one process-wide state).
    assert record["b_after"] == ("float32", True)
    assert policy.status().remapping_holders == 0


def test_enable_in_a_thread_leaves_the_main_thread_alone():
    keras.config.set_dtype_policy("mixed_bfloat16")
    seen = {}

    def worker():
        seen["start"] = tf_mixed.policy.global_policy.current()  # Keras's default in a new thread
        tf_mixed.enable("mixed_float16", quiet=True)
        seen["enabled"] = tf_mixed.policy.global_policy.current()

    t = threading.Thread(target=worker)
    t.start()
    t.join(timeout=60)
    assert seen == {"start": "float32", "enabled": "mixed_float16"}
    assert tf_mixed.policy.global_policy.current() == "mixed_bfloat16"
    # The worker ended without disable(): its hold is still counted.
    assert remapping() is False and policy.status().remapping_holders == 1
    tf_mixed.disable()  # not enabled in this thread: changes nothing
    assert tf_mixed.policy.global_policy.current() == "mixed_bfloat16"


def test_remapping_returns_to_an_explicit_user_setting_after_the_last_hold():
    tf.config.optimizer.set_experimental_options({"remapping": False})
    tf_mixed.enable("fp16", quiet=True)
    with tf_mixed.policy_scope("fp16"):
        assert policy.status().remapping_holders == 1  # one per thread, not per call
    tf_mixed.disable()
    assert remapping() is False  # what the user had set


# --- asyncio ------------------------------------------------------------------


def test_overlapping_scopes_in_asyncio_tasks_are_refused():
    keras.config.set_dtype_policy("float32")
    built = {}

    async def task_a(opened, release):
        with tf_mixed.policy_scope("mixed_float16"):
            opened.set()
            await release.wait()
            built["a"] = keras.layers.Dense(2).compute_dtype

    async def task_b(opened, release):
        await opened.wait()
        try:
            with tf_mixed.policy_scope("mixed_bfloat16"):
                built["b"] = keras.layers.Dense(2).compute_dtype  # pragma: no cover
        except RuntimeError as error:
            built["b_error"] = str(error)
        finally:
            release.set()

    async def main():
        opened, release = asyncio.Event(), asyncio.Event()
        await asyncio.gather(task_a(opened, release), task_b(opened, release))

    asyncio.run(main())
    assert built["a"] == "float16"  # not B's bfloat16
    assert "b" not in built
    assert "another asyncio task" in built["b_error"]
    assert "asyncio.to_thread" in built["b_error"]
    assert tf_mixed.policy.global_policy.current() == "float32"


def test_scopes_leaving_out_of_order_raise_and_restore():
    keras.config.set_dtype_policy("float32")
    outcome = {}

    async def child(opened, release):
        with tf_mixed.policy_scope("mixed_bfloat16"):
            opened.set()
            await release.wait()

    async def main():
        opened, release = asyncio.Event(), asyncio.Event()
        try:
            with tf_mixed.policy_scope("mixed_float16"):
                # A task created inside the scope inherits its context.
                task = asyncio.create_task(child(opened, release))
                await opened.wait()
        except RuntimeError as error:
            outcome["error"] = str(error)
        outcome["after"] = tf_mixed.policy.global_policy.current()
        release.set()
        await task
        outcome["end"] = tf_mixed.policy.global_policy.current()

    asyncio.run(main())
    assert "left while a scope opened after it is still open" in outcome["error"]
    assert outcome["after"] == "float32"
    assert outcome["end"] == "float32"
    assert remapping() is True and policy.status().remapping_holders == 0


def test_scopes_in_tasks_one_after_another_are_fine():
    async def build(name):
        with tf_mixed.policy_scope(name):
            await asyncio.sleep(0)
            return keras.layers.Dense(2).compute_dtype

    async def main():
        return [await build("bf16"), await build("fp16"), await build("fp32")]

    assert asyncio.run(main()) == ["bfloat16", "float16", "float32"]
    assert remapping() is True


# --- clear_session --------------------------------------------------------------


def test_clear_session_after_enable_is_reported(caplog):
    tf_mixed.enable("mixed_bfloat16", quiet=True)
    assert not policy.status().reset_since_enable
    keras.backend.clear_session()
    status = policy.status()
    assert status.reset_since_enable
    assert (status.keras_policy, status.enabled) == ("float32", "mixed_bfloat16")
    assert "clear_session" in str(status)
    with caplog.at_level(logging.WARNING):
        tf_mixed.enable("mixed_bfloat16", quiet=True)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 1
    assert "tf_mixed.enable(): Keras's dtype policy in this thread is 'float32'" in messages[0]
    assert "clear_session()" in messages[0]
    # Not advice to do what this very call does (it read "Call tf_mixed.enable() again").
    assert "enable() again" not in messages[0]
    assert messages[0].endswith("compute in float32; this call sets the policy again.")
    assert not policy.status().reset_since_enable  # enabled again


@pytest.mark.slow
def test_disable_after_clear_session_says_so_and_still_releases(caplog):
    tf_mixed.enable("mixed_float16", quiet=True)
    keras.backend.clear_session()
    with caplog.at_level(logging.WARNING):
        tf_mixed.disable()
    assert any("tf_mixed.disable()" in r.getMessage() and "clear_session" in r.getMessage()
               for r in caplog.records)
    assert remapping() is True
    assert policy.status().enabled is None


# --------------------------------------------------------- one owner, one reset


def test_reset_forgets_this_threads_state_and_every_remapping_hold():
    from tf_mixed.policy import state as policy_state

    tf_mixed.enable("mixed_float16", quiet=True, keep_float32=["head"])
    state = policy_state.thread_state()
    assert state.active == "mixed_float16" and state.holds_remapping
    assert policy_state.remapping_holders() == 1 and remapping() is False
    assert policy_state.keep_rules()[0].names == ("head",)
    policy_state.reset()
    assert policy_state.thread_state() == policy_state.ThreadState()
    assert policy_state.remapping_holders() == 0
    assert policy_state.keep_rules() == (None, None)
    # The reset leaves Keras's policy and TF's option alone (the caller's).
    assert keras.config.dtype_policy().name == "mixed_float16"
    assert remapping() is False
    tf_mixed.disable()  # nothing to undo any more
    assert keras.config.dtype_policy().name == "mixed_float16"


@pytest.mark.slow
def test_hidden_policy_state_has_one_owner():
    """Thread-locals, context variables and reset hooks live in policy_state only."""
    import ast
    import pathlib

    package = pathlib.Path(tf_mixed.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == "policy/state.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, ast.Call) else ""
            if text.startswith(("threading.local(", "contextvars.ContextVar(")):
                offenders.append(f"{path.name}:{node.lineno} {text}")
            if isinstance(node, ast.FunctionDef) and "for_test" in node.name:
                offenders.append(f"{path.name}:{node.lineno} def {node.name}")
    assert not offenders, offenders
