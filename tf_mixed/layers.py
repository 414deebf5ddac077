"""Keep in float32 what must stay float32: output activations and the loss."""

# A softmax computed in float16 underflows to 0 for large negative logits, and
# once cast to float32 Keras can no longer see the logits to take its exact
# cross-entropy shortcut (for logits [0, 30, -30] and label 2 the loss is
# clipped to 16.12 instead of 60.0). `OutputActivation` computes the activation
# in float32 from the half-precision logits, which keeps the shortcut.
#
# Both heads save as Keras's own layers (`OutputActivation` as an
# ``Activation``, `Float32Output` as an ``Identity``, each with
# ``dtype="float32"``): a ``.keras`` file of a model trained with tf_mixed
# loads with ``keras.models.load_model`` in a process that never imported
# tf_mixed, and a load gives back those Keras layers.

from __future__ import annotations

from typing import Any, Callable

import keras
import tensorflow as tf

from tf_mixed._internal import portable_loss, tf_keras_check
from tf_mixed._internal import shims as _internals

_PACKAGE = "tf_mixed"
_NOT_ACTIVATIONS = frozenset({"get", "serialize", "deserialize"})


def _activation_names() -> list[str]:
    """Names of Keras's built-in activations, from its public namespace."""
    return sorted(
        name
        for name in dir(keras.activations)
        if not name.startswith("_")
        and name not in _NOT_ACTIVATIONS
        and callable(getattr(keras.activations, name))
    )


def _get_activation(activation: str | Callable | None) -> Callable:
    if activation is None:
        return keras.activations.linear
    if callable(activation):
        return activation
    if isinstance(activation, str):
        names = _activation_names()
        if activation not in names:
            raise ValueError(
                f"Unknown activation {activation!r}. Use a callable or one of "
                f"Keras's activation names: {', '.join(names)}."
            )
        return keras.activations.get(activation)
    if isinstance(activation, dict):  # serialized form, from get_config
        return keras.activations.deserialize(activation)
    raise TypeError(
        "activation must be a Keras activation name such as 'softmax' or a "
        f"callable. Received: activation={activation!r} "
        f"(of type {type(activation).__name__})."
    )


def _check_float32(dtype: Any, layer: str) -> None:
    """Accepts float32 in every spelling a Keras layer's ``dtype`` takes.

    The value is read as Keras reads a layer's ``dtype`` (its
    ``keras.dtype_policies.get``): "float32", ``np.float32``, ``tf.float32``,
    ``keras.DTypePolicy("float32")`` and its serialised dict are the same
    float32 policy, and a no-op here. Anything else (another dtype, a mixed
    or quantized policy) is refused with the policy Keras would make of it.
    """
    if dtype is None:
        return
    try:
        policy = keras.dtype_policies.get(dtype)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{layer} always computes in float32; it does not take a dtype. "
            f"Received: dtype={dtype!r}, which Keras does not read as a dtype "
            f"({error}). Remove the dtype argument."
        ) from None
    mode = getattr(policy, "quantization_mode", None)
    if policy.compute_dtype != "float32" or policy.variable_dtype != "float32" or mode:
        raise ValueError(
            f"{layer} always computes in float32; it does not take another "
            f"dtype. Received: dtype={dtype!r}, which Keras reads as the policy "
            f"{policy.name!r} (compute {policy.compute_dtype}, variables "
            f"{policy.variable_dtype}{', quantized ' + str(mode) if mode else ''}). "
            "Remove the dtype argument (float32 is the only one it accepts)."
        )


def _cast_floats(structure: Any) -> Any:
    def cast(x):
        if x is None:
            return x
        x = tf.convert_to_tensor(x) if not isinstance(x, tf.Tensor) else x
        return tf.cast(x, tf.float32) if x.dtype.is_floating else x

    return keras.tree.map_structure(cast, structure)


class _Keras3Inputs(keras.layers.Layer):
    """Refuses tf-keras symbolic inputs: tf-keras would otherwise trace the
    layer's ops into its own graph and keep no trace of the layer."""

    def __call__(self, *args, **kwargs):
        tf_keras_check.check_objects(
            f"tf_mixed.{type(self).__name__}", inputs=args[0] if args else kwargs.get("inputs"))
        return super().__call__(*args, **kwargs)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class OutputActivation(_Keras3Inputs):
    """Applies an activation in float32 and returns float32.

    Put it at the end of a mixed-precision model in place of the last layer's
    activation: ``Dense(10)`` then ``OutputActivation("softmax")``.

    Args:
        activation: A Keras activation name ("softmax", "sigmoid", ...) or a
            callable. Defaults to "softmax".
        **kwargs: Standard layer arguments (``name``, ...). ``dtype`` may only
            be float32, in any spelling Keras takes ("float32", ``np.float32``,
            ``tf.float32``, ``keras.DTypePolicy("float32")``): a no-op.

    Raises:
        ValueError: If the activation name is unknown (the message lists the
            valid names) or a dtype other than float32 is given.
        TypeError: If `activation` is neither a string nor a callable.

    Example:

        >>> tf_mixed.enable("mixed_float16")
        >>> head = tf_mixed.OutputActivation("softmax")
        >>> head(tf.constant([[0.0, 30.0, -30.0]], "float16")).dtype
        tf.float32
    """

    def __init__(self, activation: str | Callable = "softmax", **kwargs):
        _check_float32(kwargs.pop("dtype", None), type(self).__name__)
        self.activation = _get_activation(activation)
        super().__init__(dtype="float32", **kwargs)
        self.supports_masking = True

    def call(self, inputs):
        return self.activation(tf.cast(inputs, tf.float32))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        # Keras's own Activation config (dtype float32 included): the layer
        # saves as ``keras.layers.Activation(activation, dtype="float32")``,
        # which computes the same (Keras casts its inputs to float32) and
        # loads without tf_mixed (Keras imports only its own packages by name).
        config = super().get_config()
        config["activation"] = keras.activations.serialize(self.activation)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Float32Output(_Keras3Inputs):
    """Casts every floating tensor of its input (any nesting) to float32.

    Integer and boolean tensors pass through unchanged, so indices and masks
    keep their type.

    Args:
        **kwargs: Standard layer arguments (``name``, ...). ``dtype`` may only
            be float32, in any spelling Keras takes (a no-op).

    Raises:
        ValueError: If a dtype other than float32 is given.
    """

    def __init__(self, **kwargs):
        _check_float32(kwargs.pop("dtype", None), type(self).__name__)
        super().__init__(dtype="float32", **kwargs)
        self.supports_masking = True
        # call() casts every nested float itself; Keras's own cast is off.
        _internals.disable_input_casting(self)

    def call(self, inputs):
        return _cast_floats(inputs)

    def compute_output_spec(self, inputs):
        def spec(x):
            dtype = x.dtype if not keras.backend.is_float_dtype(x.dtype) else "float32"
            return keras.KerasTensor(x.shape, dtype=dtype)

        return keras.tree.map_structure(spec, inputs)

    def get_config(self) -> dict:
        # Keras's own Identity config: it saves as ``keras.layers.Identity(
        # dtype="float32")``, which Keras casts every nested float of into
        # float32 and passes the rest through, as here.
        return super().get_config()


# Saved as the Keras layers they are in all but name, so a trained model's
# ``.keras`` file loads where tf_mixed was never imported.
_internals.serialize_as_keras_class(OutputActivation, "keras.layers.Activation")
_internals.serialize_as_keras_class(Float32Output, "keras.layers.Identity")


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Float32Loss(keras.losses.Loss):
    """A loss whose ``y_true`` and ``y_pred`` are cast to float32 first.

    Build it with `float32_loss`. Reduction and name come from the wrapped
    loss when it is a Keras `Loss`. It saves as Keras's own loss function
    wrapper with ``dtype="float32"``, so a compiled model's ``.keras`` file
    loads compiled where tf_mixed was never imported (docs/serving.md).

    Args:
        loss: A Keras loss object, a Keras loss name, or a callable
            ``fn(y_true, y_pred)`` returning per-sample losses.
        name: Optional name; defaults to the wrapped loss's name.
        reduction: Optional reduction; defaults to the wrapped loss's.
    """

    def __init__(
        self,
        loss: str | keras.losses.Loss | Callable,
        name: str | None = None,
        reduction: str | None = "sum_over_batch_size",
        **kwargs,
    ):
        tf_keras_check.check_objects("tf_mixed.Float32Loss", loss=loss)
        kwargs.pop("dtype", None)
        self.loss = _get_loss(loss)
        inner_name = getattr(self.loss, "name", None) or getattr(
            self.loss, "__name__", None
        )
        if isinstance(self.loss, keras.losses.Loss):
            reduction = self.loss.reduction
        super().__init__(
            name=name or inner_name, reduction=reduction, dtype="float32", **kwargs
        )

    def call(self, y_true, y_pred):
        y_true, y_pred = _cast_floats(y_true), _cast_floats(y_pred)
        if isinstance(self.loss, keras.losses.Loss):
            return self.loss.call(y_true, y_pred)
        return self.loss(y_true, y_pred)

    def get_config(self) -> dict:
        # Keras's loss function wrapper's config with dtype="float32", the
        # wrapped loss riding in its function's entry: a file loads with Keras
        # alone (`tf_mixed._internal.portable_loss`).
        flat = {**super().get_config(),
                "loss": keras.saving.serialize_keras_object(self.loss)}
        return portable_loss.portable_config(self.name, self.reduction, self.loss, flat)

    @classmethod
    def from_config(cls, config):
        own = portable_loss.own_config(config)
        own["loss"] = portable_loss.restore_arguments(
            keras.saving.deserialize_keras_object(own["loss"]), config)
        return cls(**own)


# Saved as Keras's loss function wrapper (which Keras alone loads); that name,
# while tf_mixed is imported, gives a Float32Loss back for its own configs.
_internals.serialize_as_keras_class(Float32Loss, portable_loss.KERAS_NAME)
_internals.resolve_keras_name(portable_loss.KERAS_NAME,
                              portable_loss.keras_name_loader(Float32Loss))


def _get_loss(loss: Any):
    if isinstance(loss, Float32Loss):
        return loss.loss
    if isinstance(loss, keras.losses.Loss):
        return loss
    if isinstance(loss, (str, dict)):
        try:
            return keras.losses.get(loss)
        except ValueError as error:
            raise ValueError(
                f"Unknown loss {loss!r}. Use a keras.losses.Loss object, a "
                "callable fn(y_true, y_pred), or a Keras loss name such as "
                "'sparse_categorical_crossentropy'."
            ) from error
    if callable(loss):
        return loss
    raise TypeError(
        "loss must be a keras.losses.Loss, a Keras loss name or a callable "
        f"fn(y_true, y_pred). Received: loss={loss!r} "
        f"(of type {type(loss).__name__})."
    )


def float32_loss(loss: str | keras.losses.Loss | Callable) -> Float32Loss:
    """Wraps a loss so that ``y_true`` and ``y_pred`` reach it as float32.

    Args:
        loss: A Keras loss object, a Keras loss name, or a callable
            ``fn(y_true, y_pred)``. Wrapping a wrapped loss does not nest.

    Returns:
        A `Float32Loss`, usable in ``model.compile(loss=...)`` and in custom
        loops, serialisable with the model.

    Raises:
        ValueError: If `loss` is an unknown loss name.
        TypeError: If `loss` is not a loss, name or callable.
    """
    return Float32Loss(loss)
