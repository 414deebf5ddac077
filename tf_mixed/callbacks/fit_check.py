"""The model's own `fit` steps check auto's choice, for `LossScaleMonitor`."""

# `attach(callback)` is the monitor's one call (at ``on_train_begin``, after
# Keras made the train function and the monitor prepared the optimizer). It
# hands `tf_mixed.policy.model_check.Check` a `switch` that swaps
# ``model.train_function`` (Keras 3.15's TF trainer reads it at every step:
# each policy's function traced once, then swapped), and wraps the
# callback's batch hooks to time each step (the time between them: the step
# and the conversion of its logs to floats, which waits for it). Once the
# verdict is in, the hooks are put back and, where the model moved, the test
# and predict functions are retraced too (as `tf_mixed.callbacks.Heal` does).

from __future__ import annotations

from tf_mixed.policy import model_check
from tf_mixed.scaling import optimizer as loss_scale_module
from tf_mixed.tools.planning import step_candidate

__all__ = ["attach"]


def attach(callback) -> model_check.Check | None:
    """Starts the check of ``callback.model`` for this ``fit``; None if not checked.

    Args:
        callback: A Keras callback in ``fit`` (its ``model`` and ``params``).

    Returns:
        The running (or, from the cache, finished) `Check`, or None when the
        model is not checked (see the `Check`'s ``skipped``, logged).
    """
    model = callback.model
    functions: dict = {}

    def switch(name: str) -> None:
        function = functions.get(name)
        if function is None:
            model.make_train_function(force=True)  # Keras 3.15 returns None here
            functions[name] = model.train_function
        else:
            model.train_function = function

    def on_verdict(verdict) -> None:
        if verdict.action == "moved":
            loss_scale_module.float32_on_purpose(getattr(model, "optimizer", None))
        if verdict.action in ("moved", "planned"):
            model.make_test_function(force=True)
            model.make_predict_function(force=True)

    params = callback.params or {}
    steps, epochs = params.get("steps"), params.get("epochs") or 1
    seen: list = []  # fit's element spec, for the plan's per-layer timing
    check = model_check.Check(
        model, "fit's first steps", switch, strategy=model.distribute_strategy,
        planned_steps=steps * epochs if steps else None, on_verdict=on_verdict,
        plan_source=step_candidate.plan_source(seen))
    if not check.active:
        return check if check.verdict is not None else None
    assert check.rounds is not None
    if model.train_function is None:
        model.make_train_function()
    functions[check.half] = model.train_function = _noting_spec(model.train_function, seen)
    _time_batches(callback, check)
    return check


def _noting_spec(function, seen: list):
    """``function`` (a train function), noting its iterator's element spec in
    ``seen`` at its first call."""

    def train_function(iterator):
        if not seen:
            seen.append(getattr(iterator, "element_spec", None))
        return function(iterator)

    return train_function


def _time_batches(callback, check: model_check.Check) -> None:
    """Wraps the callback's batch hooks (instance attributes) while the check runs."""
    begin, end = callback.on_train_batch_begin, callback.on_train_batch_end
    train_end = callback.on_train_end
    started: list = [None]

    def put_back():
        callback.on_train_batch_begin, callback.on_train_batch_end = begin, end
        callback.on_train_end = train_end

    def timed_begin(batch, logs=None):
        if check.next_policy() is not None:
            started[0] = model_check.clock()
        begin(batch, logs)

    def timed_end(batch, logs=None):
        if check.active and started[0]:
            check.record(model_check.since(started[0]))
            started[0] = None
        if not check.active:
            put_back()
        end(batch, logs)

    def timed_train_end(logs=None):
        # fit ended (stopped early) inside the rounds: back to the policy it began in.
        check.abandon("fit ended before the check's last round")
        put_back()
        train_end(logs)

    callback.on_train_batch_begin, callback.on_train_batch_end = timed_begin, timed_end
    callback.on_train_end = timed_train_end
