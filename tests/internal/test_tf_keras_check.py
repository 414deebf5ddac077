"""Issue 16, case 10: under tf-keras every entry point says so at once.

The variable is faked (monkeypatched) in-process; one canary runs TensorFlow's
own ``tf.keras`` resolution in a fresh process when tf-keras is installed
(it is not a dependency of tf_mixed).
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import repo_paths

import tf_mixed
from tf_mixed import training
from tf_mixed._internal import tf_keras_check

ROOT = str(repo_paths.ROOT)


@pytest.fixture
def legacy(monkeypatch):
    """tf.keras is tf-keras in this test: the variable set, tf-keras installed."""
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    monkeypatch.setattr(tf_keras_check, "_tf_keras_installed", lambda: True)
    monkeypatch.setattr(tf_keras_check, "_tf_keras_version", lambda: "2.21.0")


def _fake_tf_keras(kind):
    """An instance of a class defined in a tf_keras module (no tf-keras needed)."""
    cls = type(kind, (), {"__module__": f"tf_keras.src.{kind.lower()}"})
    return cls()


CHOICES = ("unset TF_USE_LEGACY_KERAS", "tf.keras.mixed_precision.set_global_policy",
           "tf.keras.mixed_precision.LossScaleOptimizer")


@pytest.mark.slow
@pytest.mark.parametrize(
    "value, installed, expected",
    [("1", True, "TF_USE_LEGACY_KERAS=1 with tf-keras 2.21.0 installed"),
     ("true", True, "TF_USE_LEGACY_KERAS=true with tf-keras 2.21.0 installed"),
     ("True", True, "TF_USE_LEGACY_KERAS=True with tf-keras 2.21.0 installed"),
     ("1", False, ""),        # TF falls back to Keras 3 without the package
     ("yes", True, ""),       # not a value TF accepts
     ("TRUE", True, ""),
     ("0", True, ""),
     (None, True, "")],
)
def test_detection_follows_tensorflows_rule(monkeypatch, value, installed, expected):
    if value is None:
        monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    else:
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", value)
    monkeypatch.setattr(tf_keras_check, "_tf_keras_installed", lambda: installed)
    monkeypatch.setattr(tf_keras_check, "_tf_keras_version", lambda: "2.21.0")
    assert tf_keras_check.legacy_keras() == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    "call",
    [lambda: tf_mixed.enable("auto", measure=False),
     lambda: tf_mixed.enable("mixed_bfloat16"),
     lambda: tf_mixed.policy_scope("mixed_float16").__enter__()],
    ids=["enable-auto", "enable-bf16", "policy_scope"],
)
def test_global_entry_points_refuse_under_tf_keras(legacy, call):
    keras.config.set_dtype_policy("float32")
    with pytest.raises(tf_keras_check.TfKerasError) as caught:
        call()
    message = str(caught.value)
    assert "detected tf-keras (Keras 2)" in message
    assert "TF_USE_LEGACY_KERAS=1 with tf-keras 2.21.0 installed" in message
    for choice in CHOICES:
        assert choice in message
    # Nothing was set: no policy is reported that tf.keras layers would not read.
    assert keras.config.dtype_policy().name == "float32"
    assert tf_mixed.policy.global_policy.current() == "float32"


@pytest.mark.slow
def test_keras3_objects_still_work_when_the_variable_is_set(legacy):
    """The object says which Keras it is: a Keras 3 model built with
    ``import keras`` keeps tf_mixed's layers, optimizer and monitor."""
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5), force=True)
    assert isinstance(optimizer, tf_mixed.LossScaleOptimizer)
    inputs = keras.Input((3,))
    outputs = tf_mixed.OutputActivation("softmax")(
        tf_mixed.Float32Output()(keras.layers.Dense(2)(inputs)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=optimizer, loss=tf_mixed.float32_loss("mse"))
    model.fit(np.ones((2, 3), "float32"), np.ones((2, 2), "float32"), verbose=0,
              callbacks=[tf_mixed.LossScaleMonitor()])
    assert tf_mixed.audit(model).policy == "float32"


def _tiny_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


@pytest.mark.slow
@pytest.mark.parametrize(
    "entry, call",
    [("tf_mixed.wrap_optimizer", lambda obj: tf_mixed.wrap_optimizer(obj)),
     ("tf_mixed.LossScaleOptimizer", lambda obj: tf_mixed.LossScaleOptimizer(obj)),
     ("tf_mixed.audit", lambda obj: tf_mixed.audit(obj)),
     ("tf_mixed.convert", lambda obj: tf_mixed.convert(obj, "mixed_bfloat16")),
     ("tf_mixed.probe", lambda obj: tf_mixed.probe(obj, np.ones((2, 3)))),
     ("tf_mixed.training.make_train_step",
      lambda obj: training.make_train_step(obj, keras.losses.MeanSquaredError(),
                                           keras.optimizers.SGD())),
     ("tf_mixed.training.make_train_step",
      lambda obj: training.make_train_step(_tiny_model(), keras.losses.MeanSquaredError(),
                                           obj)),
     ("tf_mixed.Float32Loss", lambda obj: tf_mixed.float32_loss(obj)),
     ("tf_mixed.Float32Output", lambda obj: tf_mixed.Float32Output()(obj)),
     ("tf_mixed.OutputActivation", lambda obj: tf_mixed.OutputActivation()(obj))],
    ids=["wrap_optimizer", "LossScaleOptimizer", "audit", "convert", "probe",
         "make_train_step-model", "make_train_step-optimizer", "float32_loss",
         "Float32Output", "OutputActivation"],
)
def test_a_tf_keras_object_is_named_whatever_the_variable_says(monkeypatch, entry, call):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    obj = _fake_tf_keras("Thing")
    with pytest.raises(tf_keras_check.TfKerasError) as caught:
        call(obj)
    message = str(caught.value)
    assert message.startswith(f"{entry}: detected tf-keras (Keras 2): ")
    assert "=tf_keras.src.thing.Thing (a tf-keras object)" in message
    for choice in CHOICES:
        assert choice in message


def test_the_monitor_refuses_a_tf_keras_model():
    monitor = tf_mixed.LossScaleMonitor()
    monitor.set_model(_fake_tf_keras("Model"))
    with pytest.raises(tf_keras_check.TfKerasError,
                       match=r"^tf_mixed.LossScaleMonitor: detected tf-keras .* model="):
        monitor.on_train_begin()


def test_real_tf_keras_objects_are_refused():
    tf_keras = pytest.importorskip("tf_keras")
    with pytest.raises(tf_keras_check.TfKerasError, match="optimizer=tf_keras.src"):
        tf_mixed.wrap_optimizer(tf_keras.optimizers.Adam())
    # Without the check tf-keras traces the cast into its own graph as a
    # TFOpLambda and the layer silently disappears from the model.
    with pytest.raises(tf_keras_check.TfKerasError, match="inputs=tf_keras.src"):
        tf_mixed.Float32Output()(tf_keras.Input((3,)))


def test_canary_tensorflow_resolves_tf_keras_as_detected():
    """The rule in tf_keras_check matches TensorFlow's lazy tf.keras loader."""
    pytest.importorskip("tf_keras")
    code = textwrap.dedent("""
        import tensorflow as tf
        from tf_mixed._internal import tf_keras_check
        print(tf.keras.layers.Dense.__module__.split(".")[0])
        print(tf_keras_check.legacy_keras())
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3",
                       "TF_USE_LEGACY_KERAS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    package, detected = result.stdout.strip().splitlines()[-2:]
    assert package == "tf_keras"
    assert detected.startswith("TF_USE_LEGACY_KERAS=1 with tf-keras ")
