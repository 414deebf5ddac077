"""The plan's last check: the whole model's step, timed as float32, whole-model half and plan."""

# Per-layer times leave out what sits between layers (layers without weights,
# the loss, dispatch) and what the graph fuses; so, where the plan differs
# from both whole-model policies, `time_steps` times the whole model's
# forward+backward step in all three (each a `tf_mixed.convert` copy of the
# model, in `tf_mixed._internal.measuring.interleaved_rounds`: each candidate
# leads a round in turn; `tf_mixed.policy.autotune`'s helpers), and
# `confirm` (pure) keeps the plan only when it is faster than the faster
# whole-model policy in three rounds of four (the third quartile of the
# per-round ratio plan / best below 1). Otherwise the faster whole-model
# policy wins: the half one when float32 / half has its first quartile above
# 1, else float32.

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence

import keras

from tf_mixed._internal import measuring, progress
from tf_mixed._internal.facts import FLOAT32_HEADS
from tf_mixed.policy import autotune

__all__ = ["check", "confirm", "time_steps"]

StepRounds = Mapping[str, Sequence[float]]
"""Seconds of one whole-model step by candidate ("float32", the half dtype,
"plan"), one figure per interleaved round."""


def confirm(rounds: StepRounds, half: str) -> tuple[str, str]:
    """Which candidate the whole-step timings support, and why.

    Args:
        rounds: `StepRounds` with "float32", `half` and "plan".
        half: The half dtype's name.

    Returns:
        ``(winner, sentence)``: "plan", `half` or "float32".
    """
    f32, hal, pla = (list(rounds[k]) for k in ("float32", half, "plan"))
    n = min(len(f32), len(hal), len(pla))
    low, ratio, _ = measuring.quartiles([a / b for a, b in zip(f32[:n], hal[:n])])
    best_name = half if low > 1.0 else "float32"
    best = hal if best_name == half else f32
    _, median, high = measuring.quartiles([p / b for p, b in zip(pla[:n], best[:n])])
    ms = {k: 1e3 * measuring.quartiles(list(v)[:n])[1] for k, v in rounds.items()}
    figures = (f"whole step, median of {n} rounds: plan {ms['plan']:.1f} ms, float32 "
               f"{ms['float32']:.1f} ms, {half} {ms[half]:.1f} ms")
    if high < 1.0:
        return "plan", f"{figures}: the plan is {1 / median:.2f}x the faster whole model"
    return best_name, (f"{figures}: the plan is not faster than whole-model {best_name} "
                       f"beyond the rounds' spread, so whole-model {best_name}")


def check(candidates: Mapping[str, Sequence[Any]],
          copies: Callable[[], Mapping[str, keras.Model]], blocked: Mapping[str, str],
          half_policy: str, x, y, loss,
          step_timer: Callable[[Mapping[str, tuple[str, tuple[str, ...]]]], StepRounds]
          | None = None) -> tuple[str, list, str]:
    """The candidate the whole-step timings support, its rows, and why.

    Args:
        candidates: Candidate -> its rows
            (`tf_mixed.tools.planning.plan_rows.candidates`): "plan" alone
            (nothing to time: its rows are kept), or "plan" with "float32"
            and the half dtype.
        copies: Builds candidate -> the copy timed: the one applying the
            map its rows decide builds (`tf_mixed.tools.planning.plan_table.planned`,
            then `tf_mixed.models.conversion.apply_surveyed`). Called only
            when there is something to time, and ``step_timer`` is None.
        blocked: Timed layer -> why it stays float32 (its row keeps that why).
        half_policy: "mixed_float16" or "mixed_bfloat16".
        x, y: The plan's batch (an array structure or a `tf.data` data set)
            and targets.
        loss: The plan's loss, resolved at its first call (`planner`'s ``plan_loss``).
        step_timer: ``step_timer({name: (policy, keep_float32)}) -> StepRounds``
            replacing `time_steps` (a test's figures).

    Returns:
        ``(winner, rows, sentence)``: the winning candidate's name, its rows
        (each timed layer's why the sentence, `confirm`, when a whole model
        won), and the sentence ("" when nothing was timed).

    Raises:
        ValueError: Something to time and no targets: ``y`` is None, or
            ``x`` is a data set of inputs alone.
    """
    import tensorflow as tf

    if len(candidates) == 1:
        return "plan", list(candidates["plan"]), ""
    half = keras.DTypePolicy(half_policy).compute_dtype
    bx, by, received = x, y, "y=None"
    if step_timer is None and isinstance(x, tf.data.Dataset):
        element = next(iter(x))  # a data set's first batch
        paired = isinstance(element, (tuple, list)) and len(element) > 1
        bx, by = element[:2] if paired else (element, None)
        received = f"`x`, a tf.data dataset of {type(element).__name__} elements (inputs alone)"
    if step_timer is None and by is None:
        raise ValueError(
            "tf_mixed.plan()'s whole-step check steps the model with its loss, so it needs "
            f"targets. Received: {received}. Pass `y` (or a data set of (x, y) batches), or "
            "step_check=False.")
    step_rounds = (step_timer({name: _carrier(rows, half_policy)
                               for name, rows in candidates.items()})
                   if step_timer is not None
                   else time_steps(copies(), bx, by, loss(), half_policy=half_policy))
    winner, sentence = confirm(step_rounds, half)
    if winner == "plan":
        return winner, list(candidates["plan"]), sentence
    return winner, [dataclasses.replace(row, why=sentence)
                    if row.seconds and row.name not in blocked
                    else row for row in candidates[winner]], sentence


def _carrier(rows, half_policy: str) -> tuple[str, tuple[str, ...]]:
    """(policy, keep_float32 names) that carry these rows' choices (a ``step_timer``'s view)."""
    if all(row.choice == "float32" for row in rows):
        return "float32", ()
    return half_policy, tuple(row.name for row in rows if row.choice == "float32"
                              and row.class_name not in FLOAT32_HEADS)


def time_steps(copies: Mapping[str, keras.Model], x, y, loss_fn: Callable,
               *, half_policy: str, rounds: int = 3) -> dict[str, list[float]]:
    """Times the whole model's forward+backward step for each candidate.

    Args:
        copies: Candidate ("float32", the half dtype, "plan") -> its copy
            of the planned model (the one `tf_mixed.convert` builds from its
            map, uncompiled: `tf_mixed.models.conversion.apply_surveyed`; a
            float8 layer in its half policy, unquantized).
        x, y: One batch and its targets.
        loss_fn: The plan's loss, resolved once for the probe and this
            check (``loss_fn(y_true, y_pred) -> float32 scalar``).
        half_policy: The plan's half policy. Under mixed_float16 every
            candidate but "float32" is traced with Grappler's remapping
            off, as `enable("mixed_float16")` runs a model on a CPU.
        rounds: Interleaved rounds (one step each).

    Returns:
        `StepRounds`.
    """
    import tensorflow as tf

    inputs = keras.tree.map_structure(tf.convert_to_tensor, x)
    targets = keras.tree.map_structure(tf.convert_to_tensor, y)
    steps: dict[str, Callable[..., Any]] = {}
    for name, copy in copies.items():
        progress.update(f"plan: tracing the whole step as {name}")
        steps[name] = _step(copy, loss_fn)
        autotune.first_call(steps[name], (inputs, targets),
                            remapping_off=half_policy == "mixed_float16" and name != "float32")
    return _timed_rounds(steps, (inputs, targets), rounds)


def _timed_rounds(steps: Mapping[str, Callable[..., Any]], batch: tuple,
                  rounds: int) -> dict[str, list[float]]:
    """One step of each candidate a round, in `measuring.interleaved_rounds` (rotated) order."""
    return measuring.interleaved_rounds(
        {name: functools.partial(autotune.time_steps, step, batch, 1)
         for name, step in steps.items()},
        rounds, on_round=lambda r: progress.update(
            f"plan: whole-step check, round {r + 1}/{rounds}"))


def _step(model, loss_fn):
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = tf.cast(loss_fn(y, model(x, training=True)), "float32")
        grads = tape.gradient(value, model.trainable_variables)
        picked = [tf.cast(tf.reshape(g, [-1])[0], "float32") for g in grads
                  if g is not None and not isinstance(g, tf.IndexedSlices)]
        return tf.add_n(picked) if picked else value

    return step
