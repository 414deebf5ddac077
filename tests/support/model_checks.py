"""Shared by the tests of auto's check on the model's own step (tf_mixed.policy.model_check)."""

import keras
import pytest

import tf_mixed
from tf_mixed._internal import measuring
from tf_mixed.policy import global_policy, model_check

HALF = "mixed_bfloat16"


@pytest.fixture
def check_on(monkeypatch, tmp_path):
    """The check turned on, its cache in a fresh directory, auto's host choice bfloat16."""
    monkeypatch.setenv(model_check.ENV, "1")
    monkeypatch.setenv("TF_MIXED_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(global_policy, "resolve_auto",
                        lambda info=None, measure=None: (HALF, "host probe (faked)"))
    monkeypatch.setattr(measuring, "machine_load", lambda: (0.0, 2))  # an idle host
    model_check._WARNED.clear()
    return tmp_path


def checked_model(name="checked"):
    """Dense "hidden", Dense "logits", a float32 head "head"."""
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    x = keras.layers.Dense(3, name="logits")(x)
    outputs = tf_mixed.Float32Output(name="head")(x)
    return keras.Model(inputs, outputs, name=name)
