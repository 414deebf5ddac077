"""Helpers for hand-written ``tf.GradientTape`` loops with loss scaling."""

# ``apply_scaled_gradients`` is the one call a loop needs between the forward
# pass and the next batch; ``make_train_step`` builds a whole step, optionally
# distributed with ``strategy.run``. (Its cost against Keras's own loss scaling
# is measured by ``python -m tf_mixed bench --suite=overhead``.)
#
# Example (single device)::
#
#     opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.1), force=True)
#     with tf.GradientTape() as tape:
#         loss = loss_fn(y, model(x, training=True))
#     applied = tf_mixed.training.apply_scaled_gradients(
#         tape, loss, model.trainable_variables, opt)

from __future__ import annotations

import math
from typing import Callable

import keras
import tensorflow as tf

from tf_mixed._internal import tf_keras_check
from tf_mixed._internal import validate as _validate
from tf_mixed.scaling import optimizer as loss_scale_module
from tf_mixed.scaling import unscaled_loop

__all__ = [
    "apply_scaled_gradients",
    "current_scale",
    "heal_layers",
    "make_train_step",
    "shared_mirrored_strategy",
]

# One MirroredStrategy per device set per process; see shared_mirrored_strategy.
_MIRRORED_STRATEGIES: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def current_scale(optimizer) -> tf.Tensor:
    """The loss scale ``optimizer`` multiplies losses by, as a float32 tensor.

    For use inside a training step (a tensor, no host read); outside it,
    ``tf_mixed.loss_scale_state(optimizer).scale`` gives a Python float.

    Args:
        optimizer: ``tf_mixed.LossScaleOptimizer``,
            ``keras.optimizers.LossScaleOptimizer`` (both: ``dynamic_scale``
            once built, else ``initial_scale``) or any other Keras optimizer
            (its ``loss_scale_factor``, or 1).

    Returns:
        A scalar float32 tensor.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if optimizer.built:
            return tf.cast(tf.convert_to_tensor(optimizer.dynamic_scale),
                           tf.float32)
        return tf.constant(optimizer.initial_scale, tf.float32)
    factor = optimizer.loss_scale_factor
    return tf.constant(1.0 if factor is None else factor, tf.float32)


def _check_clip_norm(clip_norm, owner: str) -> float | None:
    """``clip_norm`` as a float, or None; a bool is refused, not read as 1.0."""
    if clip_norm is None:
        return None
    return _validate.number(clip_norm, "clip_norm", owner=owner,
                            valid="a positive finite number or None",
                            rule=lambda v: 0 < v < math.inf)


def _check_step_arguments(loss_fn, optimizer) -> None:
    """``make_train_step``'s loss and optimizer, refused by name when they are not.

    Its order is (model, loss_fn, optimizer); ``model.compile``'s is
    (optimizer, loss), so the two are easily swapped, which failed inside the
    first trace with TensorFlow's "'Adam' object is not callable".
    """
    swapped = isinstance(loss_fn, keras.optimizers.Optimizer)
    if swapped or not isinstance(optimizer, keras.optimizers.Optimizer):
        fix = ("pass them in the order (model, loss_fn, optimizer), or by name: "
               "make_train_step(model, loss_fn=..., optimizer=...)" if swapped else
               "pass a Keras optimizer, e.g. tf_mixed.LossScaleOptimizer("
               "keras.optimizers.Adam())")
        raise TypeError(
            "make_train_step() argument `optimizer` must be a Keras optimizer and "
            "`loss_fn` a loss. Received: loss_fn="
            f"{type(loss_fn).__name__}, optimizer={type(optimizer).__name__}. "
            f"Fix: {fix} (model.compile takes the optimizer first; make_train_step "
            "takes the loss first).")


def apply_scaled_gradients(
    tape: tf.GradientTape,
    loss,
    variables,
    optimizer,
    clip_norm: float | None = None,
):
    """Scales ``loss``, differentiates it and applies the step (or skips it).

    ``loss`` must have been computed under ``tape``; the scaling is recorded
    on the same tape here, so call this before ``tape.gradient`` was used.

    Gradient clipping, if asked, clips the *unscaled* global norm to
    ``clip_norm``. It is done in scaled space (clip to ``clip_norm * scale``),
    which is the same thing without a second unscaling pass, and leaves a
    non-finite gradient non-finite so the step is still skipped. Under a
    strategy the norm is that of each replica's local gradients, before the
    all-reduce (as plain Keras clips). Clipping set on the *inner* optimizer
    (``clipnorm``, ``global_clipnorm``) differs: tf_mixed hands it the
    gradients already summed over all replicas, so it clips the global sum.

    Args:
        tape: The ``tf.GradientTape`` that recorded the forward pass.
        loss: Scalar loss. Under a strategy, divide a per-replica mean by
            ``num_replicas_in_sync`` first (gradients are summed).
        variables: The variables to differentiate and update.
        optimizer: Any Keras optimizer; a ``tf_mixed.LossScaleOptimizer``
            makes the step skip on overflow. One that does not scale the
            loss while the model computes in float16 gets a
            `MixedPrecisionWarning` once (`tf_mixed.scaling.unscaled_loop`).
        clip_norm: Optional positive float, the global-norm clip threshold.

    Returns:
        A scalar bool tensor, True when the step was applied. Always True for
        an optimizer whose ``apply`` returns nothing (plain Keras optimizers,
        and ``keras.optimizers.LossScaleOptimizer``, which gives no skip
        signal).

    Raises:
        ValueError: if ``clip_norm`` is not a positive finite number; a bool
            or another non-number raises
            `tf_mixed._internal.validate.ArgumentTypeError` (both a
            TypeError and a ValueError).
    """
    clip_norm = _check_clip_norm(clip_norm, "apply_scaled_gradients()")
    variables = list(variables)
    if unscaled_loop.untold(optimizer):  # a forgotten wrapper, said once
        unscaled_loop.check(optimizer, "apply_scaled_gradients",
                            unscaled_loop.float16_in_step(variables, optimizer),
                            variables)
    with tape:
        scaled_loss = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled_loss, variables)
    if clip_norm is not None:
        limit = current_scale(optimizer) * clip_norm
        # Variables Keras overwrites with their "gradient" (float8 scales
        # and amax histories) are new values, not gradients: not clipped,
        # not counted in the norm.
        clip = [g is not None and not getattr(v, "overwrite_with_gradient", False)
                for g, v in zip(grads, variables)]
        clipped, _ = tf.clip_by_global_norm(
            [g for g, c in zip(grads, clip) if c], limit)
        clipped = iter(clipped)
        grads = [next(clipped) if c else g for g, c in zip(grads, clip)]
    applied = optimizer.apply(grads, variables)
    if applied is None:  # A plain Keras optimizer returns nothing.
        return tf.constant(True)
    return applied


def make_train_step(
    model: keras.Model,
    loss_fn: Callable,
    optimizer,
    *,
    strategy: tf.distribute.Strategy | None = None,
    clip_norm: float | None = None,
    jit_compile: bool = False,
    heal=None,
):
    """Builds a ``tf.function`` training step for a GradientTape loop.

    The step takes ``(x, y)`` (a distributed batch under ``strategy``), runs
    the forward pass on every replica, scales the loss, and applies or skips
    the update with ``apply_scaled_gradients``.

    Args:
        model: The Keras model to train.
        loss_fn: ``loss_fn(y_true, y_pred) -> scalar`` mean over the local
            batch (a Keras loss object works); or, as ``model.compile``
            takes it, a Keras loss name or a list (one per output) or dict
            (keyed by output name) of losses, whose means are summed.
        optimizer: The optimizer, normally a ``tf_mixed.LossScaleOptimizer``;
            one that does not scale the loss while a layer of ``model``
            computes in float16 gets a `MixedPrecisionWarning` once.
            Under ``strategy`` create and build it in ``strategy.scope()``.
        strategy: Optional ``tf.distribute`` strategy; defaults to the current
            one (``tf.distribute.get_strategy()``).
        clip_norm: Optional global-norm clip threshold, see
            ``apply_scaled_gradients``.
        jit_compile: Compile the step with XLA. Refused under a strategy with
            more than one replica (XLA fails there in TensorFlow 2.21).
        heal: None (default), True or a `tf_mixed.scaling.HealRule`:
            heal as `tf_mixed.callbacks.Heal` does in ``fit`` (docs/healing.md).
            After every step the rule reads the optimizer's attribution
            state (one scalar read while nothing is attributed); a layer it
            moves to float32 makes the step retrace itself before the next
            call, and ``healed_layers`` joins the returned dict. Past the
            rule's limit the step raises `tf_mixed.scaling.HealingLimit`.
            Needs a built model and a ``tf_mixed.LossScaleOptimizer``.
            A healing step's policy is not checked against float32 (below).

    The first calls check the model's half policy against float32 on this
    very step (`tf_mixed.policy.model_check`): each is a real training step,
    in one policy or the other, and then the model keeps the half policy,
    or, where auto chose it and float32 is faster, moves to float32; an
    explicit policy slower than float32 is kept with one warning
    (docs/policies.md; ``TF_MIXED_MODEL_CHECK=0`` turns it off).

    Returns:
        A function ``step(x, y) -> {"loss": float32 tensor, "applied": bool
        tensor}``; ``loss`` is the mean over replicas. With a
        ``tf_mixed.LossScaleOptimizer`` the model's forward state is handed
        to it (``track_forward_state``), so a skipped step also rolls back
        BatchNormalization statistics; a model not built yet (no
        ``keras.Input``) is first built by an inference call on the first
        batch.

    Raises:
        ValueError: if ``jit_compile`` is True under a multi-replica strategy,
            or ``clip_norm`` is not a positive finite number (a bool is
            refused, see ``apply_scaled_gradients``).
        TypeError: if ``optimizer`` is not a Keras optimizer, or ``loss_fn``
            is one (the two swapped, in ``model.compile``'s order).
    """
    tf_keras_check.check_objects(
        "tf_mixed.training.make_train_step", model=model, optimizer=optimizer)
    _check_step_arguments(loss_fn, optimizer)
    clip_norm = _check_clip_norm(clip_norm, "make_train_step()")
    if isinstance(loss_fn, (str, list, tuple, dict)):
        from tf_mixed._internal import losses as _losses

        loss_fn = _losses.resolve(loss_fn, model, "make_train_step()")
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    if jit_compile and replicas > 1:
        raise ValueError(loss_scale_module._JIT_UNDER_STRATEGY_ERROR.format(
            strategy=type(strategy).__name__, replicas=replicas,
            version=tf.__version__,
        ))
    unscaled_loop.check(optimizer, "make_train_step",
                        unscaled_loop.float16_in_model(model), model.trainable_variables)
    ours = isinstance(optimizer, loss_scale_module.LossScaleOptimizer)
    if ours and model.built:
        with strategy.scope():
            optimizer.track_forward_state(model)
    healer = _healer(model, optimizer, heal, strategy)

    def replica_step(x, y):
        if ours:  # non-finite inputs: a skip's reason is "input" (bad data)
            loss_scale_module.step_guard(optimizer).note_inputs((x, y))
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = tf.cast(loss_fn(y, pred), tf.float32)
            # Gradients are summed over replicas, so each replica
            # contributes its share of the mean.
            share = loss / replicas
        applied = apply_scaled_gradients(
            tape, share, model.trainable_variables, optimizer,
            clip_norm=clip_norm,
        )
        return share, applied

    def distributed_step(x, y):
        share, applied = strategy.run(replica_step, args=(x, y))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, share, axis=None)
        # `applied` is identical on every replica (all-reduced verdict).
        applied = strategy.experimental_local_results(applied)[0]
        return {"loss": loss, "applied": applied}

    def build():
        return _traced_again_after_healing(
            model, lambda: tf.function(distributed_step, jit_compile=jit_compile), optimizer)

    step = build()
    if healer is not None:
        return _healing_step(healer, step)
    if not ours or model.built:
        return _checking_step(model, optimizer, strategy, build, step)

    def first_step(x, y):
        """A model built by its first call (no keras.Input) has no forward
        state to track yet: build it with an inference call (training=False
        writes no statistics), hand it over, then train."""
        if not handed_over:
            with strategy.scope():
                if not model.built:
                    model(tf.nest.map_structure(
                        lambda v: strategy.experimental_local_results(v)[0], x),
                        training=False)
                optimizer.track_forward_state(model)
            handed_over.append(True)
        return step(x, y)

    handed_over: list[bool] = []

    return _checking_step(model, optimizer, strategy, build, first_step)


def _traced_again_after_healing(model, trace, optimizer=None):
    """``trace()``'s function, made again at the next call after healing moved layers.

    A restored checkpoint or weights file moves the healed layers at once
    (`tf_mixed.scaling.healed_set.apply_restored`); a function traced before
    would compute them in their old precision. A healed set restored with the
    optimizer alone moves ``model``'s layers at creation and at each call
    (`tf_mixed.scaling.attribution.AttributionSlot.claim`).
    """
    from tf_mixed.scaling import healed_set

    state = loss_scale_module.step_state_of(optimizer)

    def claim():
        if state is not None:
            state.attribution.claim(model)

    claim()
    current, seen = [trace()], [healed_set.moves(model)]

    def step(x, y):
        claim()
        now = healed_set.moves(model)
        if now != seen[0]:
            current[0], seen[0] = trace(), now
        return current[0](x, y)

    return step


def _checking_step(model, optimizer, strategy, build, first):
    """The step, whose first calls check the model's half policy against float32.

    `tf_mixed.policy.model_check.Check` runs its rounds on these calls (each
    a real step, in one policy or the other; each policy's step traced once
    by ``build``) and keeps the verdict's policy (docs/policies.md). A model
    not built yet is checked from its second call.
    """
    from tf_mixed.policy import model_check

    if not model_check.enabled():
        return first
    current = [first]
    functions: dict = {}
    checks: list = []

    def switch(name: str) -> None:
        if name not in functions:
            functions[name] = build()
        current[0] = functions[name]

    def on_verdict(verdict) -> None:
        if verdict.action == "moved":
            loss_scale_module.float32_on_purpose(optimizer)

    def step(x, y):
        if not checks and model.built:
            local = tf.nest.map_structure(
                lambda v: strategy.experimental_local_results(v)[0], x)
            check = model_check.Check(
                model, "make_train_step's first calls", switch, strategy=strategy,
                batch=local, on_verdict=on_verdict)
            if check.active:
                functions[check.half] = current[0]
            checks.append(check)
        check = checks[0] if checks else None
        if check is None or check.next_policy() is None:
            return current[0](x, y)
        start = model_check.clock()
        out = current[0](x, y)
        float(out["loss"])  # waits for the step
        check.record(model_check.since(start))
        return out

    step.model_check = checks  # the Check, once made (tests, tools)
    return step


def _healer(model, optimizer, heal, strategy):
    """The `Healer` ``make_train_step(heal=...)`` asks for, or None."""
    from tf_mixed.scaling import healing

    if heal is None or heal is False:
        return None
    if heal is not True and not isinstance(heal, healing.HealRule):
        raise ValueError(
            "make_train_step() argument `heal` must be None, True or a "
            f"tf_mixed.scaling.HealRule. Received: heal={heal!r} (of type "
            f"{type(heal).__name__}).")
    if not model.built:
        raise ValueError(
            f"make_train_step(heal=...) needs a built model. Received: model "
            f"'{model.name}' not built. Build it first (keras.Input, or call it on "
            "a batch under the strategy's scope).")
    with strategy.scope():
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        healer = healing.Healer(model, optimizer, None if heal is True else heal)
    healer.reapply()
    return healer


def _healing_step(healer, first):
    """A step that applies the healing rule after each call and retraces on a move."""
    from tf_mixed.scaling import healing

    def step(x, y):
        # `first` traces itself again after any move (`_traced_again_after_healing`).
        out = dict(first(x, y))
        decision = healer.check()
        if decision.stop is not None:
            raise healing.HealingLimit(decision.stop)
        if decision.move:
            from absl import logging

            logging.warning(healer.message(decision))
        out["healed_layers"] = tf.constant(float(len(healer.healed)))
        return out

    return step


def heal_layers(model, names, optimizer=None) -> list:
    """Moves the named layers (and their sublayers) to float32 compute.

    The call for a hand-written ``tf.function`` loop: the layers to move come
    from `tf_mixed.scaling.Healer.check` (or your own reading of the
    attribution); after this call, **retrace** your step (create the
    ``tf.function`` again) so the next step computes them in float32. With
    ``optimizer`` (a ``tf_mixed.LossScaleOptimizer`` with attribution
    attached) the healed set is written into its state, so checkpoints keep it.

    Args:
        model: The model.
        names: Layer names as `tf_mixed.scaling.attributed_layers`
            gives them (``outer/inner`` inside nested models).
        optimizer: Optional optimizer whose attribution state records them.

    Returns:
        The layers whose dtype policy changed.

    Raises:
        ValueError: for a name the model does not have (the valid ones listed).
    """
    from tf_mixed.policy import precision_map
    from tf_mixed.scaling import attribution, healing

    layers = dict(attribution.attributed_layers(model))
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise ValueError(
            f"heal_layers() got names model '{model.name}' does not have: {unknown}. "
            f"Valid names: {', '.join(layers)}.")
    state = loss_scale_module.step_state_of(optimizer)
    if state is not None:  # a healed set restored with the optimizer alone moves too
        state.attribution.claim(model)
    change = healing.healed_map(model, names)  # rule 6 of the model's precision map
    changed = precision_map.move(model, change)
    attached = None if state is None else state.attribution.attached
    if attached is not None:
        attached.mark_healed(list(names))
    return changed


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
