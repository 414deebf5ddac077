"""Shared by the tests of auto's check on the model's own step (tf_mixed.policy.model_check)."""

import keras

import tf_mixed

HALF = "mixed_bfloat16"


def checked_model(name="checked"):
    """Dense "hidden", Dense "logits", a float32 head "head"."""
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    x = keras.layers.Dense(3, name="logits")(x)
    outputs = tf_mixed.Float32Output(name="head")(x)
    return keras.Model(inputs, outputs, name=name)
