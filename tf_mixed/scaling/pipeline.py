"""One optimizer step as an ordered pipeline, each stage a function with one job."""

# `tf_mixed.LossScaleOptimizer.apply` checks its arguments,
# builds what must be built, then hands the step here (`step`), with its
# step state (`tf_mixed.scaling.step_state.StepState`), which every stage
# below takes as an argument. A step without accumulation is a window of one
# micro-step (`tf_mixed.scaling.accumulation.WindowOfOne`): the same stages
# run, and what a longer window adds (buffers, a cond on its last
# micro-step) costs no operation there.
#
# 1. **scale**: the gradients arrive scaled by the loss scale (or already
#    unscaled, ``unscaled=True``); the scale of this step is read once;
# 2. **collect** (with ``gradient_accumulation_steps``): the unscaled
#    gradients join the window's buffers; the stages below count on the
#    window's last micro-step only (a window of one: every step);
# 3. **reduce** (`reduce_with_flags`): ONE all-reduce across replicas and
#    workers, in the communication dtype, float8 amaxes riding along;
# 4. **verdict**: all reduced gradients (and gathered float8 amaxes) finite,
#    the same bytes everywhere, so the same decision everywhere
#    (BUILD_NOTES.md, "Loss scaling"); and every write of the step would be
#    finite: the batch's inputs and the forward state (each replica's flags
#    riding the same all-reduce), the update within its bound, the optional
#    spike rule (`tf_mixed.scaling.write_guard`: one reason code per step);
# 5. **apply or roll back** (`apply_unscaled`, `roll_back`): the inner
#    optimizer applies the unscaled gradients (divided by the scale inside
#    that branch, unless layer attribution needed them unscaled before the
#    verdict; a window's mean), or the step is skipped and the
#    tracked forward state restored; then the scale state advances
#    (`advance_state`, `tf_mixed.scaling.scale_state.next_state`) and the
#    agreed float8 scales are written (`finish_float8`).

from __future__ import annotations

import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed.scaling import allreduce, misuse, scale_state, write_guard
from tf_mixed.scaling.accumulation import WindowOfOne
from tf_mixed.scaling.scale_state import LossScaleState

__all__ = ["advance_state", "apply_unscaled", "bound_factor", "divide", "divide_all",
           "finish_float8", "multiply", "reduce", "reduce_with_flags", "roll_back",
           "state_variables", "step"]

_ONE = WindowOfOne()


def step(optimizer, state, grads, trainable_variables, unscaled):
    """Runs the stages on one built optimizer; returns the global verdict.

    Args:
        optimizer: The built ``tf_mixed.LossScaleOptimizer`` (its variables,
            config, inner optimizer, accumulator).
        state: Its `tf_mixed.scaling.step_state.StepState`: the write guard's
            input and forward flags ride the all-reduce and the verdict is its
            reason code (applied: 0); with several replicas layer
            attribution's per-layer forward flags ride too.
        grads, trainable_variables, unscaled: ``apply``'s, checked.

    Returns:
        A scalar bool tensor, the same on every replica and worker: True when
        the step was applied (accumulating: unless the window was discarded,
        on its last micro-step only).
    """
    window = optimizer.accumulator or _ONE
    guard = state.guard
    scale = tf.convert_to_tensor(optimizer.dynamic_scale.value)
    grads, unscaled, is_last = window.collect(
        grads, None if unscaled else lambda g: divide_all(g, trainable_variables, scale))
    # The write guard's per-replica [input, forward] flags (None: nothing
    # to check) ride the one all-reduce; so, with several replicas, do
    # layer attribution's per-layer forward flags (`tf_mixed.scaling.attribution`;
    # refused with accumulation).
    guarded = guard.local_flags()
    riders = [] if guarded is None else [guarded]
    attributing = state.attribution.attached
    records = None
    if attributing is not None:
        records = attributing.local_outputs()
        if _several_replicas():
            riders.append(attributing.forward_flags(records))
    # Without attribution (which reads the unscaled gradients) the division
    # of a single step waits for the applied branch, as in Keras's wrapper:
    # a skipped step does not divide at all. A window's sums arrive unscaled
    # (and travel scaled again on a half-precision wire): `bound_factor`.
    grads, trainable_variables, within, gathered, riders, divisor = reduce_with_flags(
        grads, trainable_variables, scale, unscaled,
        optimizer.communication_dtype, state.float8,
        when=None if is_last is True else is_last,
        flags=tf.concat(riders, 0) if riders else None,
        defer_division=attributing is None and window.steps == 1,
        inner=optimizer.inner_optimizer, window_steps=window.steps)
    if window.steps > 1:  # the window's mean
        grads = [None if g is None else g / float(window.steps) for g in grads]
    flags = None if guarded is None else riders[:2]
    applied = guard.applied(within, flags, grads, divisor)
    if attributing is not None:
        code = tf.where(applied, tf.constant(write_guard.APPLIED, tf.int64),
                        guard.skip_code(flags, grads, within))
        forward = riders[0 if guarded is None else 2:] if _several_replicas() else None
        attributing.record(write_guard.attributable(code), grads, trainable_variables,
                           forward if forward is not None
                           else lambda: attributing.forward_flags(records))
    apply_unscaled(optimizer.inner_optimizer,
                   applied if is_last is True else tf.logical_and(is_last, applied),
                   grads, trainable_variables, divisor=divisor)

    def end_window():
        roll_back(optimizer, state, applied)
        advance_state(optimizer, state, applied, scale,
                      _skip_writes(optimizer, state, scale, flags, grads, within))
        finish_float8(optimizer, state, gathered, applied, scale)
        guard.end_window()

    if is_last is True:
        end_window()
        return applied
    tf.cond(is_last, end_window, lambda: None)
    window.end_micro_step(is_last)
    return tf.logical_or(tf.logical_not(is_last), applied)


def advance_state(optimizer, state, finite, scale=None, also=None):
    """Writes `next_state` of the global verdict into the variables.

    One branch per verdict, each `next_state` of that verdict as a Python
    bool: a step runs only its own branch's few operations (the applied
    one: count a good step, maybe grow) and writes only the fields that
    branch changes, instead of computing and writing both outcomes.
    ``scale``: the scale this step already read, if any. ``also``: the
    write guard's ``(on_applied, on_skipped)`` writes
    (`tf_mixed.scaling.write_guard.StepGuard.branches`), run in the same
    branches (no cond of their own). ``state``: the optimizer's step state
    (an attached loss tally settles on the verdict).
    """
    variables = state_variables(optimizer)

    def write(verdict):
        def branch():
            # The variables themselves: a field is read where the rule uses it.
            before = LossScaleState(*(
                scale if name == "scale" and scale is not None else v.value
                for name, v in zip(LossScaleState._fields[:scale_state.RULE_FIELDS],
                                   variables)))
            after = scale_state.next_state(optimizer.config, before, verdict)
            for variable, old, new in zip(variables, before, after):
                if new is not old:
                    variable.assign(tf.cast(new, variable.dtype) if tf.is_tensor(new)
                                    else tf.constant(new, variable.dtype))
            if also is not None:
                also[0 if verdict else 1]()
        return branch

    tf.cond(finite, write(True), write(False))
    if state.tally is not None:
        state.tally.settle(finite)


def _skip_writes(optimizer, state, scale, flags, grads, within) -> tuple:
    """The verdict branches' writes beside the scale state: ``(on_applied, on_skipped)``.

    The write guard's (`tf_mixed.scaling.write_guard.StepGuard.branches`);
    a skipped step also counts itself as calibration when it was
    (`tf_mixed.scaling.calibration`, from the reason the guard just wrote).
    """
    guard = state.guard
    on_applied, on_skipped = guard.branches(flags, grads, within)

    def skipped():
        on_skipped()
        state.calibration.count(optimizer, scale, guard.last_reason.read_value())

    return on_applied, skipped


def state_variables(optimizer) -> LossScaleState:
    """The built optimizer's loss-scale state variables, as a `LossScaleState`."""
    return LossScaleState(
        scale=optimizer.dynamic_scale, good_steps=optimizer.step_counter,
        overflow_streak=optimizer.overflow_streak, skipped_steps=optimizer.skipped_steps,
        last_step_skipped=optimizer.last_step_skipped,
        min_scale_skips=optimizer.min_scale_skips)


def _several_replicas() -> bool:
    context = tf.distribute.get_replica_context()
    return context is not None and context.num_replicas_in_sync > 1


def reduce(grads, trainable_variables, scale, unscaled, communication_dtype,
            float8=None, when=None):
    """`reduce_with_flags` without riders: ``(unscaled, variables, finite, gathered)``."""
    return reduce_with_flags(grads, trainable_variables, scale, unscaled,
                             communication_dtype, float8, when)[:4]


def reduce_with_flags(grads, trainable_variables, scale, unscaled, communication_dtype,
                      float8=None, when=None, flags=None, defer_division=False,
                      inner=None, window_steps=1):
    """(a) Sums the gradients over all replicas once, unscales them; the verdict.

    Each replica's own gradients can differ (its batch shard overflowed,
    another's did not). They are all-reduced here, once, in
    ``communication_dtype`` (`tf_mixed.scaling.allreduce.reduce_gradients`), and
    the verdict is taken from the *reduced* gradients, which are the same
    bytes on every replica and worker: every replica then takes the same
    branch, no replica applies a step another one skips, no worker waits
    in a collective its peers never enter, and an overflow of the
    half-precision sum itself is caught too. No separate flag collective.

    In half precision the gradients travel *scaled* so that small ones
    do not flush to zero: gradients the caller already unscaled are
    multiplied by the scale again (exact for power-of-two scales). A
    variable Keras overwrites with its gradient (float8 scales) is only
    checked, not summed (Keras does not sum it either).

    A ``float8`` sync (`tf_mixed.scaling.float8_sync`) first takes the float8
    scale/history pairs out of the lists; their amaxes ride the same buffer
    as one more float32 piece when the gradients travel in float32 (a SUM
    of one-hot slots is an exact all-gather); in float16/bfloat16 they take
    one small float32 collective of their own, so they are never rounded.
    A non-finite amax (-1 in the gathered bytes) makes the verdict
    non-finite: the casts saturate, so the gradients would not show it.

    ``flags`` (a float32 vector, layer attribution's forward flags) ride
    the same buffer, summed, when there are several replicas.

    ``defer_division=True`` leaves the division to the caller: the gradients
    come back as reduced, with the scale to divide them by (`divide_all`).

    ``inner`` (the inner optimizer): the verdict also requires every reduced
    gradient within the update bound of its variable
    (`tf_mixed.scaling.write_guard.update_bound`), checked in the same pass
    as finiteness, times what the reduced values carry over the gradient
    the inner optimizer will apply (`bound_factor`: ``window_steps``, the
    micro-steps a window's sums add up, times the loss scale when they
    travel scaled).

    Returns:
        ``(unscaled, variables, finite, gathered, flags, divisor)``: the
        reduced gradients divided by the loss scale (``defer_division``:
        still scaled where ``divisor`` is not None) and their variables
        (float8 pairs taken out); ``gathered`` is the all-reduced float8
        payload (None without float8 layers); ``flags`` summed over
        replicas (as given with one replica); ``divisor`` the scale still to
        divide by, or None.
    """
    float8_step = None
    if float8 is not None:
        grads, trainable_variables, float8_step = float8.split(
            grads, trainable_variables, scale, divided=unscaled)
    local = [getattr(v, "overwrite_with_gradient", False)
             for v in trainable_variables]
    scaled = not unscaled
    context = tf.distribute.get_replica_context()
    several = context is not None and context.num_replicas_in_sync > 1
    if unscaled and several and communication_dtype is not None:
        grads = [g if keep else multiply(g, scale)
                 for g, keep in zip(grads, local)]
        scaled = True
    gathered = None
    if float8_step is not None and several and communication_dtype is None:
        grads = grads + [float8.payload(float8_step, context)]
        local = local + [False]
    elif float8_step is not None:
        gathered = float8.gather(float8_step, context)
    bounds = bound_scale = None
    if inner is not None:
        bounds = write_guard.StepGuard.bounds(inner, trainable_variables)
        bounds += [None] * (len(grads) - len(bounds))  # float8 payload
        bound_scale = bound_factor(window_steps, scale if scaled else None)
    riding = flags is not None and several
    if riding:
        grads = grads + [flags]
        local = local + [False]
        bounds = None if bounds is None else bounds + [None]
    reduced, finite = allreduce.reduce_gradients(
        grads, communication_dtype, context, local=local, when=when,
        bounds=bounds, bound_scale=bound_scale)
    if riding:
        reduced, flags = reduced[:-1], reduced[-1]
    if float8_step is not None and gathered is None:
        reduced, gathered = reduced[:-1], reduced[-1]
    if float8_step is not None:
        # A non-finite amax is an overflow the float8 casts saturated away.
        finite = tf.logical_and(finite, float8.finite(gathered))
    if scaled and not defer_division:
        reduced, scaled = divide_all(reduced, trainable_variables, scale), False
    return reduced, trainable_variables, finite, gathered, flags, scale if scaled else None


def bound_factor(window_steps, scale=None):
    """What the reduced gradients carry over the gradients the update takes.

    The one source of the factor the update bounds are multiplied by
    before the verdict compares them with the reduced gradients
    (`tf_mixed.scaling.allreduce.reduce_gradients`'s ``bound_scale``).
    The inner optimizer applies ``reduced / scale / window_steps`` (the
    window's mean, unscaled), so a reduced value is within its bound when
    ``|reduced| <= bound * window_steps * scale``: a window of 4 sums 4
    micro-steps, and gradients all-reduced on a float16/bfloat16 wire carry
    the loss scale again (multiplied back so small ones do not flush to zero).

    Args:
        window_steps: The micro-steps the reduced values sum (1 without
            gradient accumulation).
        scale: The loss scale the reduced values still carry (a scalar
            tensor), or None when they arrive unscaled.

    Returns:
        None (a factor of 1: nothing to multiply), or a scalar float32 tensor.
    """
    if scale is None:
        return None if window_steps == 1 else tf.constant(float(window_steps))
    scale = tf.cast(scale, tf.float32)
    return scale if window_steps == 1 else scale * float(window_steps)


def divide_all(grads, trainable_variables, scale):
    """Every gradient divided by ``scale``, but those Keras overwrites a variable with."""
    return [g if getattr(v, "overwrite_with_gradient", False) else divide(g, scale)
            for g, v in zip(grads, trainable_variables)]

def apply_unscaled(inner, finite, grads, trainable_variables, divisor=None):
    """(b) Hands the gradients, unscaled, to the inner optimizer when ``finite``.

    ``finite`` is already global and the gradients already reduced, so
    the inner optimizer applies them without its own all-reduce
    (`tf_mixed._internal.shims.apply_reduced_gradients`). With a
    ``divisor`` (the loss scale) the gradients arrive scaled and are
    divided inside the applied branch only.
    """

    def apply_inner():
        _apply_inner(inner, grads, trainable_variables, divisor)

    if _internals.strategy_supports_no_merge_call():
        # No merge_call in the inner update (XLA on GPUs): the cond can
        # stay in the replica context. All replicas take the same branch
        # because `finite` comes from all-reduced gradients; the branch
        # holds no collective (the gradients are already reduced).
        tf.cond(finite, apply_inner, lambda: None)
        return

    def cross_replica(strategy, finite, grads, trainable_variables, divisor):
        # The inner update calls merge_call, which cannot sit in a cond
        # branch built in the replica context, so the cond is built here.
        # `finite` was computed from all-reduced gradients before the
        # merge_call, so every local copy holds the global verdict: taking
        # the first is safe here (unlike keras.optimizers.LossScaleOptimizer, which takes the
        # first replica's *local* check).
        verdict = strategy.experimental_local_results(finite)[0]

        def apply_all():
            strategy.extended.call_for_each_replica(
                _apply_inner, args=(inner, grads, trainable_variables, divisor),
            )

        tf.cond(verdict, apply_all, lambda: None)

    tf.distribute.get_replica_context().merge_call(
        cross_replica, args=(finite, grads, trainable_variables, divisor)
    )

def _apply_inner(inner, grads, trainable_variables, divisor=None):
    """The inner update without its own (second) gradient all-reduce."""
    if divisor is not None:
        grads = divide_all(grads, trainable_variables, divisor)
    _internals.apply_reduced_gradients(inner, grads, trainable_variables)

def roll_back(optimizer, state, finite):
    """Rolls tracked forward state back on a skip; refuses untracked state."""
    misuse.forward_state_guard(optimizer, state, finite)
    state.forward.roll_back(finite)

def finish_float8(optimizer, state, gathered, finite, scale):
    """(c) Writes the agreed float8 state after the verdict and the new scale."""
    sync = state.float8
    if sync is not None:
        sync.finish(gathered, finite, scale, optimizer.dynamic_scale.value)

def divide(grad, scale):
    return rescale(grad, scale, tf.math.divide)

def multiply(grad, scale):
    return rescale(grad, scale, tf.math.multiply)

def rescale(grad, scale, op):
    """``op(grad, scale)`` for a dense or sparse gradient; None stays None."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            rescale(grad.values, scale, op), grad.indices, grad.dense_shape
        )
    grad = tf.convert_to_tensor(grad)
    return op(grad, tf.cast(scale, grad.dtype))
