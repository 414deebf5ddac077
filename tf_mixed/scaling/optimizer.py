"""Dynamic loss scaling that takes the same skip decision on every replica."""

# ``LossScaleOptimizer`` wraps a Keras optimizer. The loss is multiplied by a
# scale before differentiation (``scale_loss``) so small float16 gradients do not
# flush to zero; ``apply`` divides the gradients by the scale again and hands
# them to the inner optimizer, unless any gradient on any replica or worker is
# NaN or infinite, in which case the whole step is skipped everywhere and the
# scale is lowered. A skipped step changes nothing in the model: weights, slots
# and ``iterations`` are untouched, and the forward state handed over with
# ``track_forward_state`` (BatchNormalization's moving statistics) is rolled
# back (`tf_mixed.scaling.rollback`).
#
# Why not ``keras.optimizers.LossScaleOptimizer``: under ``MirroredStrategy`` it
# takes the finite check from the first replica's *local* gradients, so an
# overflow on any other replica is applied to the weights (they become
# ``-inf``), and under ``MultiWorkerMirroredStrategy`` workers that disagree can
# hang in the all-reduce. Here the gradients are all-reduced first, once
# (optionally in float16/bfloat16: ``communication_dtype``), and the verdict is
# taken from the reduced gradients (``_reduce``, `tf_mixed.scaling.allreduce`); the
# inner optimizer then applies them without a second all-reduce. It also adds
# the knobs the Keras class lacks (growth and backoff factors, minimum and
# maximum scale, hysteresis, a fixed scale), the counters a monitor needs, and
# a pass-through mode for float32/bfloat16.
#
# It is a drop-in for Keras's class (its method names: `tf_mixed.scaling.keras_compat`):
# same constructor names (``dynamic_growth_steps``), same configs, and the same
# variables (``step_counter``, ``dynamic_scale``, same dtypes, same order) so
# checkpoints and ``.keras`` files written with Keras's wrapper load into it
# (the layouts: `tf_mixed.scaling.formats`). The constructor checks each concern
# once, before anything changes; `wrap_optimizer` only chooses a config. The
# rule the scale follows is `tf_mixed.scaling.scale_state.next_state`, a pure
# function.

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import tf_keras_check
from tf_mixed._internal import validate as _validate
from tf_mixed.scaling import (
    accumulation,
    allreduce,
    compensated,
    formats,
    misuse,
    pipeline,
    portable,
    scale_state,
    spike,
)
from tf_mixed.scaling.float8_sync import Float8Sync
from tf_mixed.scaling.keras_compat import KerasCompat
from tf_mixed.scaling.loss_tally import LossTally
from tf_mixed.scaling.scale_state import LossScaleConfig, LossScaleState
from tf_mixed.scaling.spike import SpikeGuard, SpikeRule
from tf_mixed.scaling.step_state import StepState
from tf_mixed.scaling.write_guard import SkipReasons, StepGuard

__all__ = ["LossScaleOptimizer", "float32_on_purpose", "float8_sync_of", "guard_spikes",
           "loss_scale_state", "read_keras_state", "refresh_forward_state", "step_guard",
           "step_state_of", "wrap_optimizer"]

_REPLICA_CONTEXT_ERROR = (
    "LossScaleOptimizer.apply() must be called in a replica context. You "
    "called it in the cross-replica context of {strategy}. Call it inside "
    "`strategy.run(step_fn, ...)`, not directly under `strategy.scope()`."
)

_JIT_UNDER_STRATEGY_ERROR = (
    "jit_compile=True is not supported together with a tf.distribute "
    "strategy ({strategy}, {replicas} replicas) in TensorFlow {version}: XLA "
    "fails with a resource-device error. Received: a jit-compiled training "
    "step. Use `model.compile(..., jit_compile=False)` (or the default "
    "'auto', which turns XLA off under a strategy), or drop `jit_compile=True` "
    "from the tf.function around your step."
)


@keras.saving.register_keras_serializable(package="tf_mixed")
class LossScaleOptimizer(KerasCompat, keras.optimizers.LossScaleOptimizer):
    """An optimizer wrapper that applies dynamic loss scaling safely.

    On every ``apply``:

    * if all gradients on all replicas are finite, they are divided by the
      current scale and applied by ``inner_optimizer``; after
      ``growth_interval`` finite steps in a row the scale is multiplied by
      ``growth_factor`` (capped at ``max_scale``);
    * otherwise the step is skipped on every replica (weights, slots and
      ``iterations`` are untouched; tracked forward state is rolled back),
      ``skipped_steps`` grows by one, and after ``hysteresis`` non-finite
      steps in a row the scale is multiplied by ``backoff_factor`` (floored
      at ``min_scale``).

    The rule is `tf_mixed.scaling.scale_state.next_state`; read the state with
    ``loss_scale_state()``. What a step carries besides (forward state,
    tally, float8 agreement, attribution, misuse ledger) is one record,
    ``step_state`` (`tf_mixed.scaling.step_state.StepState`).

    Example:

    >>> opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=8.0)
    >>> v = keras.Variable(1.0)
    >>> _ = opt.apply([tf.constant(8.0)], [v])   # unscaled gradient is 1.0
    >>> float(v.numpy())
    0.5

    Args:
        inner_optimizer: The ``keras.optimizers.Optimizer`` that applies the
            unscaled gradients. Must not itself be a loss-scale optimizer.
        initial_scale: First loss scale, a finite number > 0 between
            ``min_scale`` and ``max_scale``. Powers of two keep the unscaling
            exact.
        dynamic_growth_steps: Consecutive finite steps before the scale grows
            (Keras's name). Default 2000.
        name: Optional name of the optimizer.
        growth_interval: Same as ``dynamic_growth_steps`` (give one of them).
        growth_factor: Multiplier applied when the scale grows, ``> 1``.
        backoff_factor: Multiplier applied when the scale backs off, in
            ``(0, 1)``.
        min_scale, max_scale: Lowest scale backoff can reach (positive),
            highest growth can reach (finite).
        hysteresis: Consecutive non-finite steps needed before the scale
            backs off (every one of them is still skipped). ``1`` backs off
            on every overflow, as Keras does.
        dynamic: False keeps ``initial_scale`` fixed (tf-keras's); non-finite
            steps are still skipped.
        config: The knobs above as one `tf_mixed.scaling.LossScaleConfig`
            (instead of giving them one by one; `wrap_optimizer` passes the
            config it chose).
        communication_dtype: The dtype gradients travel in when they are
            all-reduced across replicas: None (float32, as Keras),
            ``"float16"`` or ``"bfloat16"`` (half the bytes; see
            `tf_mixed.scaling.allreduce`). Either way the gradients are reduced in
            ONE collective and the skip verdict is taken from the reduced
            gradients. No effect with a single replica.
        gradient_accumulation_steps, compensation, state_dtype: `tf_mixed.scaling.accumulation`,
            `tf_mixed.scaling.compensated` (``compensation="auto"``: Kahan unless the
            inner optimizer already has a rule, which is kept).
        **kwargs: Only the defaults of the base optimizer arguments are
            accepted (for compatibility with Keras deserialisation); clipping,
            weight decay and the like belong on ``inner_optimizer``.

    Raises:
        TypeError: if ``inner_optimizer`` is not a Keras optimizer or is
            already a loss-scale optimizer (tf-keras's error).
        ValueError: if a knob is not a number or breaks its rule (the
            message names the argument, the value and the rule), or
            ``config`` is given together with knobs.
    """

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        initial_scale: float = 2.0**15,
        dynamic_growth_steps: int | None = None,
        name: str | None = None,
        *,
        growth_interval: int | None = None,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        hysteresis: int = 1,
        dynamic: bool = True,
        config: LossScaleConfig | None = None,
        communication_dtype: str | None = None,
        gradient_accumulation_steps: int | None = None,
        compensation: Any = None,
        state_dtype: str | None = None,
        **kwargs: Any,
    ):
        # One pass: each concern is checked once, before anything changes.
        _check_inner(inner_optimizer)
        config = _scale_config(
            config, initial_scale=initial_scale, dynamic_growth_steps=dynamic_growth_steps,
            growth_interval=growth_interval, growth_factor=growth_factor,
            backoff_factor=backoff_factor, min_scale=min_scale, max_scale=max_scale,
            hysteresis=hysteresis, dynamic=dynamic)
        communication_dtype = allreduce.validate_communication_dtype(communication_dtype)
        steps = accumulation.steps_to_take_over(inner_optimizer, gradient_accumulation_steps)
        update_rule = compensated.wrapper_rule(inner_optimizer, compensation, state_dtype)
        super().__init__(inner_optimizer, initial_scale=config.initial_scale,
                         dynamic_growth_steps=config.growth_interval, name=name, **kwargs)
        self._step_state = StepState.new()  # not a Trackable: Keras's layout stays
        self.config = config
        self.communication_dtype = communication_dtype
        compensated.compensate_if_asked(inner_optimizer, update_rule)
        self.accumulator = accumulation.take_over(inner_optimizer, steps)  # None: off
        misuse.note_wrapper(self)

    # The knobs, read from the frozen config (one source of truth).
    growth_interval = property(lambda self: self.config.growth_interval)
    growth_factor = property(lambda self: self.config.growth_factor)
    backoff_factor = property(lambda self: self.config.backoff_factor)
    min_scale = property(lambda self: self.config.min_scale)
    max_scale = property(lambda self: self.config.max_scale)
    hysteresis = property(lambda self: self.config.hysteresis)
    dynamic = property(lambda self: self.config.dynamic)

    # ------------------------------------------------------------------ state

    @_internals.no_automatic_dependency_tracking
    def build(self, var_list):
        """Creates the loss-scale state and builds the inner optimizer.

        Keras's state variables first (``step_counter`` int64, ``dynamic_scale``
        float32), then the counters Keras lacks (`tf_mixed.scaling.formats.EXTRA_STATE`).
        Under a strategy call this (or let ``model.fit`` do it) inside
        ``strategy.scope()``, before the first ``strategy.run``.

        Args:
            var_list: The trainable variables the optimizer will update.
        """
        # aggregation="none": every replica computes the same new values from
        # the same all-reduced verdict, and writes its own copy (no merge_call).
        def state(name, dtype, value):
            return self.add_variable(shape=(), dtype=dtype, aggregation="none", name=name,
                                     initializer=keras.initializers.Constant(value))

        self.step_counter = state("step_counter", "int64", 0)
        self.dynamic_scale = state("dynamic_scale", "float32", self.config.initial_scale)
        self.overflow_streak = state("overflow_streak", "int64", 0)
        self.skipped_steps = state("skipped_steps", "int64", 0)
        self.last_step_skipped = state("last_step_skipped", "int64", 0)
        self.min_scale_skips = state("min_scale_skips", "int64", 0)
        float8 = Float8Sync.for_variables(
            var_list, None if self.accumulator is None else self.accumulator.steps)
        self._step_state = self._step_state.with_parts(float8=float8)
        if float8 is not None and self.inner_optimizer.use_ema:
            # Keras's TF optimizer would write None over the float8 pairs.
            _internals.overwrite_only_averaged_variables(self.inner_optimizer)
        if self.accumulator is not None:
            self.accumulator.build(self, var_list)
        self._step_state.guard.build(self, self.accumulator is not None)
        self._step_state.calibration.build(self)
        self.inner_optimizer.build(var_list)
        # Skip keras.optimizers.LossScaleOptimizer.build: it would create a
        # second pair of state variables.
        keras.optimizers.Optimizer.build(self, var_list)

    def loss_scale_state(self) -> LossScaleState:
        """The current state in plain Python numbers (one host read).

        The same on every replica and worker (the variables follow the
        all-reduced verdict). Returns a `tf_mixed.scaling.scale_state.LossScaleState`;
        before the optimizer is built, the initial state.
        """
        reasons = self._step_state.guard.read()
        calibration = self._step_state.calibration.read()
        if not self.built:
            return scale_state.initial_state(self.config)._replace(
                skip_reasons=reasons, calibration_skips=calibration)
        return scale_state.from_values(
            [v.numpy() for v in pipeline.state_variables(self) if v is not None], reasons,
            calibration)

    @property
    def step_state(self) -> StepState:
        """The record of this optimizer's optional riders (`tf_mixed.scaling.step_state`)."""
        return self._step_state

    # ------------------------------------------- passengers: their own modules

    @_internals.no_automatic_dependency_tracking
    def track_forward_state(self, model_or_variables, *, roll_back: bool = True) -> int:
        """Restores these variables after every skipped step; returns how many.

        `tf_mixed.scaling.rollback.ForwardState.track` says what is tracked, what
        ``roll_back=False`` declares and when it raises. ``LossScaleMonitor`` calls
        this for ``fit``; a custom loop calls it once, under the strategy's scope,
        before its first step. Calling it again replaces the tracked set.
        """
        return self._step_state.forward.track(model_or_variables, roll_back=roll_back)

    @property
    def tracked_forward_variables(self) -> tuple:
        """The variables ``track_forward_state`` tracks or declared (a tuple)."""
        return self._step_state.forward.variables or self._step_state.forward.declined

    @_internals.no_automatic_dependency_tracking
    def attach_loss_tally(self, tally: LossTally) -> None:
        """Shows ``tally`` every step's loss and verdict (builds it here; under the
        strategy's scope). ``LossScaleMonitor`` attaches one (`tf_mixed.scaling.loss_tally`);
        a step traced before does not feed it."""
        tally.build()
        self._step_state = self._step_state.with_parts(tally=tally)

    @property
    def loss_tally(self) -> LossTally | None:
        """The attached `tf_mixed.scaling.LossTally`, or None."""
        return self._step_state.tally

    # ---------------------------------------------------------- scaling API

    def scale_loss(self, loss):
        """Multiplies ``loss`` by the current loss scale.

        A float16 or bfloat16 loss is cast to float32 first, so the scaled
        value cannot overflow half precision. An attached loss tally
        (`attach_loss_tally`) is shown the unscaled loss.

        Args:
            loss: A scalar floating-point loss tensor.

        Returns:
            ``loss * scale`` as a float32 (or wider) tensor.

        Raises:
            ValueError: if ``loss`` is not a floating-point scalar.
        """
        return self._scale_tensor(loss, scalar=True)

    def _scale_tensor(self, loss, *, scalar: bool):
        """``scale_loss``, or tf-keras's elementwise ``get_scaled_loss`` (`_scaled`)."""
        return _scaled(self, self._step_state, loss, scalar)

    def unscale_gradients(self, grads):
        """Returns the gradients divided by the current loss scale.

        To clip or inspect the true gradients; then tell ``apply`` which you
        pass (``unscaled=True``, or ``unscaled=False`` after only looking): it
        raises rather than guess. The arithmetic never depends on this call;
        non-finite values stay non-finite (an overflow is still skipped)::

            grads = opt.unscale_gradients(tape.gradient(scaled, variables))
            grads, _ = tf.clip_by_global_norm(grads, 1.0)
            opt.apply(grads, variables, unscaled=True)

        Args:
            grads: A list of gradient tensors, ``tf.IndexedSlices`` or None.

        Returns:
            A new list of the unscaled gradients.
        """
        scale = self.dynamic_scale if self.built else self.config.initial_scale
        misuse.note_unscaled(self._step_state.ledger)
        return [pipeline.divide(g, scale) for g in _checked_grads(grads)]

    # ----------------------------------------------------------- the update

    @tf.autograph.experimental.do_not_convert  # as fit runs it (docs/custom-loops.md)
    def apply(self, grads, trainable_variables=None, *,
              unscaled: bool | None = None):
        """Unscales and applies gradients, or skips the step everywhere.

        Works eagerly, inside ``tf.function``, and in the replica context of
        ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy`` (``strategy.run``
        or ``model.fit``).

        Args:
            grads: One gradient per variable (None allowed), of the *scaled*
                loss unless ``unscaled=True``.
            trainable_variables: The variables to update. May be omitted once
                the optimizer is built.
            unscaled: True when ``grads`` were already divided by the scale;
                None (default) is False, but a ValueError right after
                ``unscale_gradients`` (say which).

        Returns:
            A scalar bool tensor, the same on every replica and worker: False
            when the step was skipped (accumulating: on the last micro-step of
            a discarded window only), else True.

        Raises:
            ValueError: before anything is built or changed, if ``grads`` is
                None or not one per variable, if no variables are given to an
                unbuilt optimizer, if ``unscaled`` is not said as above, if called
                in a cross-replica context, or under a strategy with jit.
        """
        grads, trainable_variables, unscaled = _checked_apply_args(
            self, grads, trainable_variables, unscaled)
        self._step_state.attribution.refuse_unapplied()  # a healed set no model took
        _ready_to_step(self, trainable_variables)
        with keras.name_scope(self.name, caller=self):
            return pipeline.step(self, self._step_state, grads, trainable_variables, unscaled)

    def finalize_variable_values(self, var_list) -> None:
        """At the end of ``fit``: drops an unfinished accumulation window (a warning)."""
        if self.accumulator is not None:
            self.accumulator.end_of_fit()
        super().finalize_variable_values(var_list)

    # ------------------------------------------------- its files and config

    def save_own_variables(self, store) -> None:
        """Saves the wrapper's own state only (``.keras`` files;
        `tf_mixed.scaling.formats.save_own`), its step state's parts included."""
        formats.save_own(self, store, self._step_state)

    def load_own_variables(self, store) -> None:
        """Loads a ``.keras`` file's optimizer state, older layouts and Keras's
        wrapper's included (`tf_mixed.scaling.formats.load_own`)."""
        formats.load_own(self, store, super().load_own_variables, self._step_state)

    def get_config(self):
        """A config Keras's wrapper and this class both load (`_config`)."""
        return _config(self)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuilds the optimizer from ``get_config()`` output (or an older
        layout's, or Keras's wrapper's)."""
        config = portable.constructor_args(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)

    @classmethod
    def from_keras(cls, optimizer: keras.optimizers.Optimizer,
                   **knobs: Any) -> "LossScaleOptimizer":
        """A new wrapper (with ``knobs``) around a Keras optimizer, sharing it.

        A ``keras.optimizers.LossScaleOptimizer`` is replaced: the new wrapper
        goes around its inner optimizer, keeps its initial scale and growth
        steps (unless ``knobs`` override them) and, if it is built, its
        current scale and step counter (the new one is built then), so
        training continues from where it stands.
        """
        return _from_keras(cls, optimizer, knobs)


# Files name it as Keras's own wrapper, so a process without tf_mixed loads
# them with Keras's; with tf_mixed imported the name gives this class back for
# its own configs (`tf_mixed.scaling.portable`).
_internals.serialize_as_keras_class(LossScaleOptimizer, portable.KERAS_NAME)
_internals.resolve_keras_name(portable.KERAS_NAME,
                              portable.keras_name_loader(LossScaleOptimizer))


def _config(optimizer: LossScaleOptimizer) -> dict:
    """`LossScaleOptimizer.get_config`: Keras's wrapper's arguments at the top
    (``initial_scale``: the scale reached, once built), every constructor
    argument of tf_mixed's under the inner optimizer's entry
    (`tf_mixed.scaling.portable`).
    """
    knobs = optimizer.config.to_dict()
    own = {
        "initial_scale": knobs.pop("initial_scale"),
        "dynamic_growth_steps": knobs.pop("growth_interval"),
        **knobs,
        "communication_dtype": optimizer.communication_dtype,
        "gradient_accumulation_steps": (
            None if optimizer.accumulator is None else optimizer.accumulator.steps),
        "compensation": compensated.compensation_config(optimizer.inner_optimizer),
    }
    return portable.portable_config(
        optimizer.name, keras.saving.serialize_keras_object(optimizer.inner_optimizer), own,
        float(optimizer.dynamic_scale.numpy()) if optimizer.built else None)


def _from_keras(cls, optimizer, knobs: dict) -> LossScaleOptimizer:
    """`LossScaleOptimizer.from_keras`."""
    keras_wrapper, saved = None, None
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        keras_wrapper, optimizer = optimizer, optimizer.inner_optimizer
        knobs.setdefault("initial_scale", float(keras_wrapper.initial_scale))
        if "growth_interval" not in knobs:
            knobs.setdefault("dynamic_growth_steps", int(keras_wrapper.dynamic_growth_steps))
        if keras_wrapper.built:
            saved = read_keras_state(keras_wrapper)
    wrapper = cls(optimizer, **knobs)
    if saved is not None:
        wrapper.build(_internals.optimizer_trainable_variables(keras_wrapper))
        wrapper.dynamic_scale.assign(saved.scale)
        wrapper.step_counter.assign(saved.good_steps)
    return wrapper


def _scaled(optimizer, state: StepState, loss, scalar: bool):
    """``scale_loss`` of a scalar, or (``scalar=False``, tf-keras's
    ``get_scaled_loss``) of a floating tensor of any shape, elementwise."""
    loss = _checked_loss(loss, scalar=scalar)
    if loss.dtype in (tf.float16, tf.bfloat16):
        loss = tf.cast(loss, tf.float32)
    misuse.note_scaled(state.ledger)
    if not optimizer.built:
        return loss * tf.cast(optimizer.config.initial_scale, loss.dtype)
    if state.tally is not None and loss.shape.rank == 0:
        state.tally.observe(loss)
    return loss * tf.cast(optimizer.dynamic_scale, loss.dtype)


def _ready_to_step(optimizer, trainable_variables) -> None:
    """``apply``'s checks of where it runs; builds the optimizer if it is not.

    Raises:
        ValueError: in a cross-replica context, or jit-compiled under a strategy.
    """
    strategy = tf.distribute.get_strategy()
    if tf.distribute.in_cross_replica_context():
        raise ValueError(_REPLICA_CONTEXT_ERROR.format(strategy=strategy))
    _refuse_jit_under_strategy(strategy)
    if not optimizer.built:
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(trainable_variables)
    _check_variables_in_scope(optimizer, strategy)


def step_guard(optimizer: LossScaleOptimizer) -> StepGuard:
    """The `tf_mixed.scaling.write_guard.StepGuard` ``optimizer`` owns.

    The train steps that see a batch note its inputs there
    (``step_guard(opt).note_inputs(data)``); `tf_mixed.callbacks.skip_contract`
    reads its ``last_reason``.
    """
    return optimizer.step_state.guard


def step_state_of(optimizer) -> StepState | None:
    """The `tf_mixed.scaling.step_state.StepState` of a ``tf_mixed.LossScaleOptimizer``.

    Any other optimizer (a plain Keras one, Keras's wrapper, None): None.
    """
    return optimizer.step_state if isinstance(optimizer, LossScaleOptimizer) else None


def float32_on_purpose(optimizer) -> None:
    """Notes that the model ``optimizer`` trains computes in float32 on purpose.

    Auto's check on the model's own step moved it there
    (`tf_mixed.policy.model_check`): the warning of a model built before
    ``enable`` is not said for it (`tf_mixed.scaling.misuse`). Any other
    optimizer: nothing to note.
    """
    state = step_state_of(optimizer)
    if state is not None:
        misuse.float32_on_purpose(state.ledger)


def guard_spikes(optimizer: LossScaleOptimizer, rule: SpikeRule | None = None) -> SpikeGuard:
    """Turns on the spike guard of ``optimizer`` (off by default).

    A step whose gradient norm leaps above its recent history is skipped,
    reason "spike" (`tf_mixed.scaling.spike`: the rule, its state). Call it
    once, under the strategy's scope, before the first step is traced (for
    ``fit``: before ``fit``). A history read from a file before this call is
    taken over.

    Args:
        optimizer: A ``tf_mixed.LossScaleOptimizer``.
        rule: A `tf_mixed.scaling.SpikeRule`; None: ``SpikeRule()`` (window
            100, threshold 6).

    Returns:
        The `tf_mixed.scaling.spike.SpikeGuard` now in the optimizer's write guard.

    Raises:
        TypeError: ``optimizer`` is not a ``tf_mixed.LossScaleOptimizer`` or
            ``rule`` not a ``SpikeRule``.
        ValueError: a history read from a file has another window.
    """
    if not isinstance(optimizer, LossScaleOptimizer):
        raise TypeError(
            "guard_spikes() needs a tf_mixed.LossScaleOptimizer. Received: "
            f"optimizer={optimizer!r:.80} (of type {type(optimizer).__name__}). "
            "Wrap it first: tf_mixed.wrap_optimizer(optimizer).")
    return spike.turn_on(optimizer.step_state.guard, rule)


def refresh_forward_state(optimizer: LossScaleOptimizer) -> None:
    """Re-copies the forward state `optimizer` tracks, after a write between steps.

    A skipped step restores the copy taken after the last applied step.
    After anything outside a step wrote the tracked variables (a restore, a
    resumed ``fit``, an assignment in a custom loop), call this eagerly so
    the copy holds the state the next step starts from (`tf_mixed.scaling.rollback`).
    ``LossScaleMonitor`` calls it before the first step of every epoch.

    Args:
        optimizer: A ``tf_mixed.LossScaleOptimizer``.
    """
    optimizer.step_state.forward.refresh()


# A tf.train.Checkpoint of the wrapper has the inner optimizer's layout plus
# its own state and its step state's saving parts
# (`tf_mixed.scaling.formats.checkpoint_children`). The hook is set on the
# class, once: TensorFlow asks an object for its children through the
# private ``Trackable._trackable_children`` of its type (no public per-object
# hook; an instance attribute would be tracked by Keras's ``__setattr__``), and
# the function it calls reads everything per wrapper, from its record.
_internals.set_checkpoint_children(
    LossScaleOptimizer,
    lambda wrapper, default: formats.checkpoint_children(wrapper, default,
                                                         wrapper.step_state))


def loss_scale_state(optimizer) -> LossScaleState:
    """The loss-scale state of any Keras optimizer, in Python numbers.

    * ``tf_mixed.LossScaleOptimizer``: its ``loss_scale_state()``;
    * ``keras.optimizers.LossScaleOptimizer``: the scale and step counter it
      keeps, the other fields None (see `read_keras_state`);
    * any other optimizer: it never skips; the scale is its
      ``loss_scale_factor`` or 1.

    Args:
        optimizer: A Keras optimizer.

    Returns:
        A `tf_mixed.scaling.scale_state.LossScaleState`.

    Raises:
        TypeError: if ``optimizer`` is not a Keras optimizer.
    """
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer.loss_scale_state()
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return read_keras_state(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "loss_scale_state() needs a Keras optimizer. Received: "
            f"optimizer={optimizer!r} (of type {type(optimizer).__name__}).")
    factor = optimizer.loss_scale_factor
    return LossScaleState(
        scale=1.0 if factor is None else float(factor), good_steps=0,
        overflow_streak=0, skipped_steps=0, last_step_skipped=False,
        min_scale_skips=0, skip_reasons=SkipReasons(0, 0, 0, 0, 0), calibration_skips=0)


def read_keras_state(optimizer: keras.optimizers.LossScaleOptimizer) -> LossScaleState:
    """`LossScaleState` of a ``keras.optimizers.LossScaleOptimizer``.

    Keras keeps only the scale (``dynamic_scale``) and the consecutive
    finite steps (``step_counter``); the counters it does not keep are None.

    Args:
        optimizer: A Keras loss-scale optimizer, built or not.

    Returns:
        The state, in Python numbers.
    """
    if optimizer.built:
        scale = float(optimizer.dynamic_scale.numpy())
        good = int(optimizer.step_counter.numpy())
    else:
        scale, good = float(optimizer.initial_scale), 0
    return LossScaleState(scale=scale, good_steps=good, overflow_streak=None,
                          skipped_steps=None, last_step_skipped=None,
                          min_scale_skips=None)


def wrap_optimizer(optimizer, *, force: bool = False, **knobs: Any):
    """Wraps ``optimizer`` in a ``tf_mixed.LossScaleOptimizer`` for the policy.

    * Global policy ``mixed_float16`` (or ``force=True``): dynamic loss
      scaling with ``knobs``.
    * Any other policy (float32, mixed_bfloat16, bfloat16): a pass-through
      wrapper (scale 1, fixed), which skips only steps with non-finite
      gradients, so the same loop and the same ``fit`` set-up run under
      every policy. ``knobs`` are still validated, so a typo shows up on any
      machine.
    * Pure ``bfloat16`` (variables in bfloat16 too): the inner optimizer
      also updates the weights with compensation (`tf_mixed.scaling.compensated`:
      ``compensation="kahan"`` unless given, slots in ``state_dtype``,
      float32 unless given), so small updates are not rounded away.

    ``gradient_accumulation_steps``, ``communication_dtype``,
    ``compensation`` and ``state_dtype`` apply under every policy.

    Passing an optimizer that already is a ``tf_mixed.LossScaleOptimizer``
    returns it unchanged (no double scaling). A
    ``keras.optimizers.LossScaleOptimizer`` becomes a tf_mixed one around the
    same inner optimizer, keeping its scale (`LossScaleOptimizer.from_keras`),
    whatever the policy: loss scaling was asked for explicitly.

    Args:
        optimizer: A ``keras.optimizers.Optimizer`` or a name Keras knows,
            such as ``"adam"``.
        force: Scale dynamically even when the policy does not need it.
        **knobs: ``LossScaleOptimizer`` arguments (``initial_scale``,
            ``dynamic_growth_steps``, ...).

    Returns:
        The optimizer to pass to ``model.compile`` or to use in a loop.

    Raises:
        TypeError: if ``optimizer`` is neither an optimizer nor a name.
        ValueError: if ``optimizer`` is an unknown name (the message lists the
            known ones), is already a ``tf_mixed`` wrapper and ``knobs`` ask
            for different settings, or a knob is invalid.
    """
    # Chooses a config; `LossScaleOptimizer.from_keras` calls the constructor,
    # which checks everything once.
    if isinstance(optimizer, str):
        optimizer = _optimizer_by_name(optimizer)
    if isinstance(optimizer, LossScaleOptimizer):
        return _unchanged(optimizer, knobs)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        # A Keras wrapper keeps its knobs whatever the policy: loss scaling
        # was asked for explicitly.
        if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            policy = keras.config.dtype_policy().name
            if policy == "bfloat16":
                knobs.setdefault("compensation", "auto")
            if not (force or policy == "mixed_float16"):
                knobs = _pass_through(knobs)
        return LossScaleOptimizer.from_keras(optimizer, **knobs)
    tf_keras_check.check_objects("tf_mixed.wrap_optimizer", optimizer=optimizer)
    raise TypeError(
        "wrap_optimizer() needs a keras.optimizers.Optimizer or its name, "
        f"such as 'adam'. Received: optimizer={optimizer!r} (of type "
        f"{type(optimizer).__name__})."
    )


# Constructor arguments that are not loss-scale knobs (valid in every mode).
_WRAPPER_ARGS = ("communication_dtype", "gradient_accumulation_steps",
                 "compensation", "state_dtype")


# --------------------------------------------------------------- helpers


def _unchanged(optimizer, knobs):
    """A tf_mixed wrapper given to `wrap_optimizer`: itself, if ``knobs`` agree."""
    if "communication_dtype" in knobs:  # "float32" means None, everywhere
        knobs["communication_dtype"] = allreduce.validate_communication_dtype(
            knobs["communication_dtype"])
    differing = {k: v for k, v in knobs.items()
                 if getattr(optimizer, k, object()) != v}
    if differing:
        raise ValueError(
            "wrap_optimizer() received a tf_mixed.LossScaleOptimizer "
            f"together with different settings {differing}. Pass the "
            "inner optimizer instead: "
            "wrap_optimizer(opt.inner_optimizer, ...)."
        )
    return optimizer


def _pass_through(knobs: dict) -> dict:
    """`wrap_optimizer`'s arguments when the policy needs no loss scaling.

    The loss-scale knobs are still validated (a typo shows up on any
    machine) and then replaced by a fixed scale of 1; a float16 wire still
    needs a scale it can back off (bfloat16 has float32's range).
    """
    wrapper_args = {k: knobs.pop(k) for k in _WRAPPER_ARGS if k in knobs}
    unknown = sorted(set(knobs) - set(LossScaleConfig.__dataclass_fields__)
                     - {"dynamic_growth_steps"})
    if unknown:
        other_knobs = sorted(set(LossScaleConfig.__dataclass_fields__)
                             - {"initial_scale", "growth_interval"})
        raise ValueError(
            f"wrap_optimizer() got unknown arguments {unknown}. Valid: "
            "initial_scale, dynamic_growth_steps (or growth_interval), "
            f"{', '.join(other_knobs)}, "
            f"{', '.join(_WRAPPER_ARGS)}."
        )
    _scale_config(None, **knobs)
    wire = wrapper_args.get("communication_dtype") == "float16"
    return {"config": _WIRE if wire else _PASS_THROUGH, **wrapper_args}


# The two configs `wrap_optimizer` chooses when no loss scaling is needed.
_PASS_THROUGH = LossScaleConfig.pass_through()
_WIRE = LossScaleConfig.wire()


def _scale_config(config: LossScaleConfig | None, dynamic_growth_steps=None,
                  growth_interval=None, **knobs) -> LossScaleConfig:
    """The frozen config: ``config`` itself, or the knobs validated into one."""
    if config is None:
        return LossScaleConfig(
            growth_interval=_growth_steps(dynamic_growth_steps, growth_interval),
            **knobs)
    if not isinstance(config, LossScaleConfig):
        raise TypeError(
            "LossScaleOptimizer argument `config` must be a "
            "tf_mixed.scaling.LossScaleConfig or None. Received: "
            f"config={config!r:.80} (of type {type(config).__name__}).")
    fields = LossScaleConfig.__dataclass_fields__
    given = {name: value for name, value in knobs.items()
             if value != fields[name].default}
    if dynamic_growth_steps is not None or growth_interval is not None:
        given["growth_interval"] = _growth_steps(dynamic_growth_steps, growth_interval)
    if given:
        raise ValueError(
            "LossScaleOptimizer got both `config` and knobs it holds. "
            f"Received: config={config} and {given}. Give one of them.")
    return config


def _optimizer_names() -> list[str]:
    names = []
    for attr in dir(keras.optimizers):
        obj = getattr(keras.optimizers, attr)
        if (isinstance(obj, type) and issubclass(obj, keras.optimizers.Optimizer)
                and obj not in (keras.optimizers.Optimizer,
                                keras.optimizers.LossScaleOptimizer)):
            names.append(attr.lower())
    return sorted(names)


def _optimizer_by_name(name: str):
    names = _optimizer_names()
    if name.lower() not in names:
        raise ValueError(
            "wrap_optimizer() does not know the optimizer name. Received: "
            f"optimizer={name!r}. Valid names: {', '.join(names)}; or pass a "
            "keras.optimizers.Optimizer instance."
        )
    return keras.optimizers.get(name)


def _growth_steps(dynamic_growth_steps, growth_interval):
    """One growth interval from Keras's name or ours (default 2000)."""
    if dynamic_growth_steps is None:
        return 2000 if growth_interval is None else growth_interval
    if growth_interval is not None and growth_interval != dynamic_growth_steps:
        raise ValueError(
            "LossScaleOptimizer got both `dynamic_growth_steps` and "
            "`growth_interval` (the same knob) with different values. "
            f"Received: dynamic_growth_steps={dynamic_growth_steps!r}, "
            f"growth_interval={growth_interval!r}. Give one of them.")
    return dynamic_growth_steps


def _checked_grads(grads) -> list:
    if grads is None or tf.is_tensor(grads) or isinstance(
            grads, (tf.IndexedSlices, str, bytes)):
        raise ValueError(
            "LossScaleOptimizer needs `grads` as a list with one gradient "
            "(or None) per variable. Received: grads="
            f"{grads!r:.80} (of type {type(grads).__name__}).")
    try:
        return list(grads)
    except TypeError:
        raise ValueError(
            "LossScaleOptimizer needs `grads` as a list with one gradient "
            "(or None) per variable. Received: grads="
            f"{grads!r:.80} (of type {type(grads).__name__}).") from None


def _checked_apply_args(optimizer, grads, trainable_variables, unscaled):
    """``apply``'s arguments checked: (gradients, variables, unscaled)."""
    grads = _checked_grads(grads)
    if unscaled is not None:
        _validate.boolean(unscaled, "unscaled", owner="LossScaleOptimizer.apply()")
    if trainable_variables is None:
        if not optimizer.built:
            raise ValueError(
                "LossScaleOptimizer.apply() needs `trainable_variables` "
                "until the optimizer is built. Received: "
                "trainable_variables=None. Pass the variables or call "
                "`optimizer.build(variables)` first."
            )
        trainable_variables = _internals.optimizer_trainable_variables(
            optimizer)
    trainable_variables = list(trainable_variables)
    if len(grads) != len(trainable_variables):
        raise ValueError(
            "LossScaleOptimizer.apply() needs one gradient per variable. "
            f"Received: {len(grads)} gradients for "
            f"{len(trainable_variables)} variables."
        )
    ledger = optimizer.step_state.ledger
    unscaled = misuse.take_unscaled(ledger, unscaled)
    misuse.check_step(optimizer, ledger, trainable_variables, unscaled)
    return grads, trainable_variables, unscaled


def _checked_loss(loss, scalar: bool = True):
    try:
        tensor = tf.convert_to_tensor(loss)
    except (TypeError, ValueError):
        tensor = None
    if tensor is None or not tensor.dtype.is_floating:
        raise ValueError(
            "scale_loss() argument `loss` must be a floating-point scalar "
            f"tensor. Received: loss={loss!r:.80} (dtype "
            f"{getattr(tensor, 'dtype', type(loss).__name__)}). Cast it, "
            "e.g. tf.cast(loss, 'float32').")
    if not scalar:
        return tensor
    if tensor.shape.rank is not None and tensor.shape.num_elements() != 1:
        raise ValueError(
            "scale_loss() argument `loss` must be a scalar (reduce it with "
            f"a mean first). Received: loss of shape {tensor.shape}.")
    if tensor.shape.rank:
        tensor = tf.reshape(tensor, ())
    return tensor


def _refuse_jit_under_strategy(strategy):
    """Raises a clear error instead of XLA's resource-device error.

    jit_compile=True with a strategy fails in TF 2.21 (BUILD_NOTES.md,
    "Known limits").
    """
    if strategy.num_replicas_in_sync <= 1 or not tf.distribute.has_strategy():
        return
    if tf.executing_eagerly():
        return
    if _internals.in_xla_context(tf.compat.v1.get_default_graph()):
        raise ValueError(_JIT_UNDER_STRATEGY_ERROR.format(
            strategy=type(strategy).__name__,
            replicas=strategy.num_replicas_in_sync,
            version=tf.__version__,
        ))


def _check_inner(inner_optimizer) -> None:
    """The wrapped optimizer's one check: Keras 3, an optimizer, not a wrapper.

    Args:
        inner_optimizer: What the constructor received.

    Raises:
        TfKerasError: a tf-keras object.
        TypeError: not a Keras optimizer, or a loss-scale optimizer (as
            tf-keras; it is also a ValueError, as tf_mixed raised before).
    """
    tf_keras_check.check_objects("tf_mixed.LossScaleOptimizer",
                                 inner_optimizer=inner_optimizer)
    if isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer):
        raise _validate.ArgumentTypeError(
            "LossScaleOptimizer cannot wrap another loss-scale optimizer "
            f"(received inner_optimizer={type(inner_optimizer).__name__}); "
            "the gradients would be scaled twice. Wrap its "
            "`inner_optimizer`, or use tf_mixed.wrap_optimizer(), which does "
            "this for you."
        )
    if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "LossScaleOptimizer needs a keras.optimizers.Optimizer instance "
            f"as inner_optimizer. Received: inner_optimizer={inner_optimizer!r}"
            f" (of type {type(inner_optimizer).__name__}). Pass e.g. "
            "keras.optimizers.Adam(), or a name through "
            "tf_mixed.wrap_optimizer('adam')."
        )


# ------------------------------------------------- the update, step by step


def float8_sync_of(optimizer) -> Float8Sync | None:
    """The `tf_mixed.scaling.float8_sync.Float8Sync` of ``optimizer``, or None.

    A ``tf_mixed.LossScaleOptimizer`` creates one at ``build`` when the
    variables hold Keras float8 scale and amax-history pairs; `apply` hands
    their "gradients" to it instead of the inner optimizer, so every replica
    and worker writes the same agreed values. `tf_mixed.float8.state` and
    `tf_mixed.float8.Float8Monitor` read its counters. Any other optimizer:
    None (it keeps Keras's per-replica float8 writes).
    """
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer.step_state.float8
    return None


def _check_variables_in_scope(optimizer, strategy):
    """Refuses state created outside the strategy's scope.

    An inner optimizer made before ``strategy.scope()`` holds plain
    variables: every replica would then bump ``iterations`` (and slots)
    once per step instead of once in total.
    """
    if strategy.num_replicas_in_sync <= 1:
        return
    for variable in optimizer.variables:
        if not strategy.extended.variable_created_in_scope(
                getattr(variable, "value", variable)):
            raise ValueError(
                f"Optimizer variable '{variable.path}' was created "
                f"outside the scope of {type(strategy).__name__}, so "
                "replicas would each update their own copy. Create the "
                "inner optimizer and the LossScaleOptimizer inside "
                "`with strategy.scope():` and build it there "
                "(`optimizer.build(model.trainable_variables)`)."
            )
