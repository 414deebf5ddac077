"""Updates of bfloat16 weights that small steps cannot round away."""

# A bfloat16 number keeps 8 significant bits: next to 1.0 the nearest other
# values are 1 - 2**-8 and 1 + 2**-7. A plain ``w -= lr * update`` whose step is
# smaller than half that spacing rounds back to ``w``, every step, for ever: a
# pure-bfloat16 model with a small learning rate stops learning
# (keras-team/keras-hub#2629). Two known cures, both here:
#
# * ``"kahan"``: compensated summation with a 16-bit buffer. Each bfloat16
#   weight gets an int16 buffer; weight and buffer are the upper and lower
#   halves of a float32 running sum of the updates, and the weight is that
#   sum rounded to bfloat16. So the weight stays within half a bfloat16 ulp
#   of a float32 sum of the updates, whose own rounding is 2**-24 relative
#   per step at most: within one bfloat16 ulp of the float64 sum over 10,000
#   steps of SGD and Adam (tested), at 2 more bytes per parameter. Not exact:
#   bounded. (A bfloat16 buffer, as optimi's ``kahan_sum`` keeps and
#   tf_mixed kept before, rounds the compensation itself to 8 bits each step
#   and drifts without bound; DeepSpeed's ``bf16_master_weights`` keep 4 bytes.)
# * ``"stochastic"``: stochastic rounding. ``w + update`` is computed in float32
#   and rounded up or down at random with the probabilities that make the
#   result right *on average* (unbiased); no extra memory. The random bits come from a
#   stateless generator keyed by ``(seed, variable index, iterations)``, so
#   every replica and worker rounds the same way (their weights stay equal)
#   and a resumed run rounds as the original did.
#
# `compensate` installs one of them on a Keras optimizer: its ``assign``,
# ``assign_add`` and ``assign_sub`` (the methods Keras's ``update_step``
# writes variables through, meant for backends to override) apply the
# compensated update to every bfloat16 trainable variable; everything else is
# Keras's own. ``state_dtype`` chooses the dtype of the slots the optimizer
# creates for those variables (Adam's moments, SGD's momentum). `kahan_add` (with
# `kahan_sum`) and `stochastic_round` are the two rules as pure tensor functions.
#
# ``tf_mixed.wrap_optimizer`` calls `compensate` under the pure ``"bfloat16"``
# policy (`tf_mixed.enable("bfloat16")`).

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import keras
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed._internal import validate as _validate

__all__ = [
    "METHODS",
    "STATE_DTYPES",
    "CompensationConfig",
    "compensate",
    "compensate_if_asked",
    "compensation_buffers",
    "compensation_config",
    "compensation_of",
    "config_from_arguments",
    "wrapper_rule",
    "kahan_add",
    "kahan_sum",
    "stochastic_round",
]

# method -> what it costs and does (the error messages are built from it).
METHODS = {
    "kahan": ("a 16-bit compensation buffer per weight (2 bytes/parameter): the "
              "weight follows a float32 sum of the updates"),
    "stochastic": "stochastic rounding, no extra memory, unbiased (right on average)",
    "none": "plain rounding: Keras's own update (small steps are lost)",
}
# Measured on the digits benchmark (BUILD_NOTES.md, "Accumulation and pure bfloat16").
DEFAULT_METHOD = "kahan"

STATE_DTYPES = ("float32", "bfloat16")
# Adam's second moment moves by (1 - beta_2) = 0.1% of its error per step,
# below bfloat16's resolution (0.4%): in bfloat16 it stalls like the weights.
DEFAULT_STATE_DTYPE = "float32"

_ATTRIBUTE = "_tf_mixed_compensation"


@dataclasses.dataclass(frozen=True)
class CompensationConfig:
    """How bfloat16 weights are updated (a value; see `compensate`).

    Attributes:
        method: One of `METHODS`: "kahan", "stochastic" or "none".
        state_dtype: The dtype of the optimizer's slots for bfloat16 weights:
            "float32" or "bfloat16".
        seed: Seeds stochastic rounding (ignored by the other methods).
    """

    method: str = DEFAULT_METHOD
    state_dtype: str = DEFAULT_STATE_DTYPE
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.method, str) or self.method not in METHODS:
            choices = "; ".join(f"{k!r}: {v}" for k, v in METHODS.items())
            raise ValueError(
                f"`compensation` must be one of {', '.join(map(repr, METHODS))}. "
                f"Received: compensation={self.method!r}. The choices: {choices}.")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"`state_dtype` must be one of {', '.join(map(repr, STATE_DTYPES))}. "
                f"Received: state_dtype={self.state_dtype!r}. 'float32' keeps "
                "Adam's moments accurate (4 bytes per value); 'bfloat16' halves "
                "their memory.")
        _validate.number(self.seed, "seed", valid="an integer in [0, 2**31)",
                         rule=lambda n: 0 <= n < 2**31, integer=True,
                         owner="compensate()")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ------------------------------------------------------------ pure rules


def kahan_add(weight, compensation, update):
    """Adds ``update`` to ``weight`` with a 16-bit compensation buffer.

    The weight (bfloat16, the upper 16 bits of a float32) and its buffer
    (int16) are the two halves of one float32 running sum ``s``: the weight
    is ``s`` rounded to bfloat16 (to nearest, ties away from zero) and the
    buffer the signed distance, in float32 units in the last place, from
    the weight's bit pattern to ``s``'s (`kahan_sum` reads ``s`` back). Each
    update is added to ``s`` in float32, so the weight stays within half a
    bfloat16 ulp of a float32 sum of the updates; only float32's own
    rounding of that sum (``2**-24`` relative per step at most) separates it
    from the exact sum. A bfloat16 buffer rounds the compensation itself to
    8 bits every step, and its error grows without bound.

    Args:
        weight: The bfloat16 weight tensor.
        compensation: Its int16 buffer.
        update: What to add (any float dtype), same shape.

    Returns:
        ``(new_weight, new_compensation)``: bfloat16 and int16.
    """
    total = kahan_sum(weight, compensation) + tf.cast(update, tf.float32)
    return _split(total)


def kahan_sum(weight, compensation):
    """The float32 running sum a bfloat16 weight and its buffer hold.

    Args:
        weight: The bfloat16 weight tensor.
        compensation: Its int16 buffer (`kahan_add`).

    Returns:
        A float32 tensor: exactly ``weight`` when the buffer is 0.
    """
    bits = tf.bitcast(tf.cast(weight, tf.float32), tf.int32)
    # Bit patterns order floats by magnitude (the sign bit apart), so the
    # signed low half moves the pattern down or up within float32.
    low = tf.cast(tf.cast(compensation, tf.int16), tf.int32)
    return tf.bitcast(bits + low, tf.float32)


def _split(total):
    """``total`` (float32) as (bfloat16 rounded to nearest, int16 rest)."""
    bits = tf.bitcast(total, tf.int32)
    # Adding half of bfloat16's unit then truncating rounds the magnitude to
    # nearest (ties away from zero); a carry moves into the exponent.
    upper = tf.bitwise.bitwise_and(bits + (1 << 15), tf.constant(-(1 << 16)))
    finite = tf.math.is_finite(total)
    upper = tf.where(finite, upper, bits)  # inf and NaN keep their pattern
    rest = tf.where(finite, bits - upper, tf.zeros_like(bits))
    # bfloat16 keeps float32's upper 16 bits: the cast of `upper` is exact.
    return (tf.cast(tf.bitcast(upper, tf.float32), tf.bfloat16),
            tf.cast(rest, tf.int16))


def stochastic_round(value, seed):
    """Rounds float32 values to bfloat16 up or down at random, unbiased.

    A value between two bfloat16 neighbours becomes the upper one with
    probability equal to its distance from the lower one over their spacing,
    so the expected result is the value itself. Representable values and
    non-finite ones are returned unchanged.

    Args:
        value: A float tensor (computed in float32).
        seed: A stateless seed, a shape [2] integer tensor: equal seeds give
            equal roundings (on every replica).

    Returns:
        A bfloat16 tensor of the same shape.
    """
    value = tf.cast(value, tf.float32)
    bits = tf.bitcast(value, tf.int32)
    # float32 keeps bfloat16's 16 bits on top: adding uniform noise below
    # them and truncating rounds the magnitude up with the right probability
    # (a carry moves into the exponent correctly; the sign bit is untouched).
    noise = tf.random.stateless_uniform(
        tf.shape(value), seed=seed, minval=0, maxval=1 << 16, dtype=tf.int32)
    truncated = tf.bitwise.bitwise_and(bits + noise, tf.constant(-(1 << 16)))
    rounded = tf.bitcast(truncated, tf.float32)
    return tf.cast(tf.where(tf.math.is_finite(value), rounded, value),
                   tf.bfloat16)


# ------------------------------------------------------- the installation


def compensate(optimizer, compensation: str | CompensationConfig | None = None,
               *, state_dtype: str | None = None, seed: int = 0):
    """Makes ``optimizer`` update its bfloat16 variables without losing steps.

    Call it before the optimizer is built (before its first ``apply`` or
    ``model.fit``). Variables of other dtypes are updated as before.

    Example:

    >>> opt = tf_mixed.scaling.compensate(keras.optimizers.Adam(1e-4))
    >>> v = keras.Variable(1.0, dtype="bfloat16")
    >>> opt.apply([tf.constant(1.0, "bfloat16")], [v])

    Args:
        optimizer: A ``keras.optimizers.Optimizer`` (not a loss-scale
            wrapper: give its ``inner_optimizer``).
        compensation: One of `METHODS` or a `CompensationConfig`; None for
            `DEFAULT_METHOD`.
        state_dtype: One of `STATE_DTYPES`; None for `DEFAULT_STATE_DTYPE`.
        seed: Seed of stochastic rounding.

    Returns:
        ``optimizer`` itself.

    Raises:
        TypeError: if ``optimizer`` is not a Keras optimizer.
        ValueError: for an unknown method or dtype, an optimizer that is
            already built, a loss-scale wrapper, or one already compensated
            with different settings.
    """
    config = _config(compensation, state_dtype, seed)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            "compensate() needs the optimizer that updates the variables, not "
            f"a loss-scale wrapper. Received: {type(optimizer).__name__}. Pass "
            "its `inner_optimizer`, or give `compensation=` to "
            "tf_mixed.wrap_optimizer().")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "compensate() needs a keras.optimizers.Optimizer. Received: "
            f"optimizer={optimizer!r:.80} (of type {type(optimizer).__name__}).")
    if _to_install(compensation_of(optimizer), config) is not None:
        _install(optimizer, config)
    return optimizer


def _to_install(current: CompensationConfig | None,
                config: CompensationConfig) -> CompensationConfig | None:
    """``config`` unless ``current`` already is it; refuses another one."""
    if current is None:
        return config
    if current != config:
        raise ValueError(
            f"The optimizer already updates bfloat16 weights with {current}. "
            f"Received: {config}. Use a new optimizer for other settings.")
    return None


def _install(optimizer, config: CompensationConfig) -> None:
    if optimizer.built:
        raise ValueError(
            "compensate() must be called before the optimizer is built: its "
            "slots and compensation buffers are created at build. Received: "
            f"a built {type(optimizer).__name__}. Call it on a fresh optimizer.")
    installed = _Installed(optimizer, config)
    if config.method != "none" or config.state_dtype != "bfloat16":
        installed.install()
    setattr(optimizer, _ATTRIBUTE, installed)


def config_from_arguments(compensation, state_dtype) -> CompensationConfig | None:
    """`LossScaleOptimizer`'s arguments as a config (None: nothing asked).

    ``compensation`` may be a method name, a `CompensationConfig`, or the
    dict ``get_config`` wrote. Validates; changes nothing.
    """
    if isinstance(compensation, dict):
        compensation = CompensationConfig(**compensation)
    if compensation is None and state_dtype is None:
        return None
    return _config(compensation, state_dtype, 0)


def wrapper_rule(optimizer, compensation, state_dtype) -> CompensationConfig | None:
    """What a wrapper around ``optimizer`` must install (None: nothing).

    Validates the wrapper's arguments and looks the installed rule up once;
    changes nothing (`compensate_if_asked` installs).

    Args:
        optimizer: The inner optimizer.
        compensation: As `config_from_arguments`, or ``"auto"``
            (`wrap_optimizer` under a pure bfloat16 policy): `DEFAULT_METHOD`
            unless ``optimizer`` already has a rule, which is kept.
        state_dtype: As `config_from_arguments`.

    Raises:
        ValueError: an invalid argument, or ``optimizer`` already compensated
            with other settings.
    """
    current = compensation_of(optimizer)
    if isinstance(compensation, str) and compensation == "auto":
        compensation = DEFAULT_METHOD if current is None else None
    config = config_from_arguments(compensation, state_dtype)
    return None if config is None else _to_install(current, config)


def compensate_if_asked(optimizer, config: CompensationConfig | None) -> None:
    """Installs ``config`` (from `wrapper_rule`), unless it is None."""
    if config is not None:
        _install(optimizer, config)


def compensation_config(optimizer) -> dict | None:
    """The installed config as a dict (for ``get_config``), or None."""
    config = compensation_of(optimizer)
    return None if config is None else config.to_dict()


def compensation_of(optimizer) -> CompensationConfig | None:
    """The `CompensationConfig` installed on ``optimizer``, or None."""
    installed = getattr(optimizer, _ATTRIBUTE, None)
    return None if installed is None else installed.config


def compensation_buffers(optimizer) -> list:
    """The Kahan buffers `compensate` created on ``optimizer`` (built), or []."""
    installed = getattr(optimizer, _ATTRIBUTE, None)
    if installed is None:
        return []
    return [b for b in installed.buffers if b is not None]


def _config(compensation, state_dtype, seed) -> CompensationConfig:
    if isinstance(compensation, CompensationConfig):
        if state_dtype is not None and state_dtype != compensation.state_dtype:
            raise ValueError(
                "compensate() received a CompensationConfig and a different "
                f"state_dtype={state_dtype!r}. Set it in the config.")
        return compensation
    return CompensationConfig(
        method=DEFAULT_METHOD if compensation is None else compensation,
        state_dtype=DEFAULT_STATE_DTYPE if state_dtype is None else state_dtype,
        seed=seed)


def _is_bfloat16(variable) -> bool:
    return keras.backend.standardize_dtype(variable.dtype) == "bfloat16"


class _Installed:
    """The per-optimizer hooks; state lives in optimizer variables."""

    def __init__(self, optimizer, config: CompensationConfig):
        self.optimizer = optimizer
        self.config = config
        self.buffers: list = []  # per trainable variable: bfloat16 buffer or None
        self.original: dict[str, Any] = {}
        # The graph being traced and, per device, the last weight write in it.
        self._graph = None
        self._last_write: dict = {}

    @_internals.no_automatic_dependency_tracking
    def install(self):
        opt = self.optimizer
        for name in ("build", "add_variable_from_reference", "update_step",
                     "assign", "assign_add", "assign_sub"):
            self.original[name] = getattr(opt, name)
        opt.build = self.build
        opt.update_step = self.update_step
        opt.add_variable_from_reference = self.add_variable_from_reference
        opt.assign = self.assign
        opt.assign_add = self.assign_add
        opt.assign_sub = self.assign_sub
        _internals.route_weight_decay_through_assign(opt)

    # Slots of bfloat16 weights in state_dtype.
    def add_variable_from_reference(self, reference_variable, name=None,
                                    initializer="zeros"):
        if (not _is_bfloat16(reference_variable)
                or self.config.state_dtype == "bfloat16"):
            return self.original["add_variable_from_reference"](
                reference_variable, name=name, initializer=initializer)
        return self._slot(reference_variable, name, self.config.state_dtype,
                          initializer)

    def _slot(self, reference_variable, name, dtype, initializer="zeros"):
        # Keras's own method with another dtype: same name, same colocation.
        path = getattr(reference_variable, "path", reference_variable.name)
        colocate = (reference_variable.value
                    if isinstance(reference_variable, keras.Variable)
                    else reference_variable)
        strategy = tf.distribute.get_strategy()
        with strategy.extended.colocate_vars_with(colocate):
            return self.optimizer.add_variable(
                shape=reference_variable.shape, initializer=initializer,
                dtype=dtype,
                name=f"{path.replace('/', '_')}_{name or 'var'}")

    def build(self, variables):
        self.original["build"](variables)
        if self.config.method != "kahan":
            return
        self.buffers = [
            self._slot(v, "kahan", "int16") if _is_bfloat16(v) else None
            for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        # Keras computes an update in the variable's dtype: in bfloat16,
        # Adam's beta_2 = 0.999 rounds to 1.0, its bias correction
        # sqrt(1 - beta_2**t) to 0, and every update to exactly 0. The
        # update is computed in float32 instead (then written below).
        if not _is_bfloat16(variable):
            return self.original["update_step"](gradient, variable, learning_rate)
        # In a graph, one variable's update runs after the previous one's
        # write on the same device: the float32 temporaries of one variable
        # at a time, not of all at once (measured: 14-18 bytes per parameter
        # of the whole model otherwise, more than the bfloat16 state saves).
        with tf.control_dependencies(self._previous_write(variable)):
            return self.original["update_step"](
                gradient, _Float32View(variable), learning_rate)

    def _order_key(self, variable):
        if tf.executing_eagerly():
            return None
        graph = tf.compat.v1.get_default_graph()
        if self._graph is None or self._graph() is not graph:
            self._graph, self._last_write = weakref.ref(graph), {}
        target = variable.value if isinstance(variable, keras.Variable) else variable
        return target.device

    def _previous_write(self, variable) -> list:
        key = self._order_key(variable)
        previous = None if key is None else self._last_write.get(key)
        return [] if previous is None else [previous]

    # The writes of model variables.
    def assign(self, variable, value):
        self._write(variable, value, "assign")

    def assign_add(self, variable, value):
        self._write(variable, value, "assign_add")

    def assign_sub(self, variable, value):
        self._write(variable, value, "assign_sub")

    def _write(self, variable, value, how):
        if isinstance(variable, _Float32View):
            variable = variable.variable
        index = (_internals.optimizer_variable_index(self.optimizer, variable)
                 if _is_bfloat16(variable) else None)
        if index is None or self.config.method == "none":
            self.original[how](variable, value)
            return
        target = variable.value if isinstance(variable, keras.Variable) else variable
        if isinstance(value, tf.IndexedSlices):  # rows only: densify
            value = tf.convert_to_tensor(value)
        value = tf.cast(value, tf.float32)
        current = tf.cast(target, tf.float32)
        update = {"assign": lambda: value - current,
                  "assign_add": lambda: value,
                  "assign_sub": lambda: -value}[how]()
        writes = []
        if self.config.method == "kahan":
            buffer = self.buffers[index]
            new_weight, new_buffer = kahan_add(target, buffer, update)
            writes.append(buffer.assign(new_buffer))
        else:
            seed = tf.stack([
                tf.constant(self.config.seed * 1_000_003 + index, tf.int64),
                tf.cast(self.optimizer.iterations, tf.int64)])
            new_weight = stochastic_round(current + update, seed)
        writes.append(target.assign(new_weight))
        key = self._order_key(target)
        if key is not None:
            self._last_write[key] = tf.group(writes)


class _Float32View:
    """A bfloat16 variable seen as float32 by ``update_step`` (read-only).

    Keras finds the slots through the variable (``_var_key`` reads its
    ``_unique_id`` or distributed container: forwarded); reading it as a
    tensor gives its float32 value; writes go through the optimizer's
    ``assign*`` methods, which unwrap it.
    """

    dtype = "float32"

    def __init__(self, variable):
        self.variable = variable

    @property
    def shape(self):
        return self.variable.shape

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.cast(self.variable, dtype or tf.float32, name=name)

    def __getattr__(self, name):
        return getattr(self.variable, name)
