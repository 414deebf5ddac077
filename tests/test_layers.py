"""Tests for tf_mixed.layers: float32 heads, Float32Output, float32_loss."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.layers import Float32Loss

LOGITS = [[0.0, 30.0, -30.0]]
LABEL = [2]


def identity_logits_model(head):
    """A model whose float16 Dense reproduces its input, then `head`."""
    inputs = keras.Input((3,))
    dense = keras.layers.Dense(3, kernel_initializer="identity", use_bias=False)
    outputs = head(dense(inputs))
    return keras.Model(inputs, outputs)


def test_output_activation_keeps_the_exact_cross_entropy():
    tf_mixed.enable("mixed_float16")
    loss = keras.losses.SparseCategoricalCrossentropy()
    half_logits = tf.constant(LOGITS, tf.float16)
    probs = tf_mixed.OutputActivation("softmax")(half_logits)
    assert probs.dtype == tf.float32
    assert float(loss(tf.constant(LABEL), probs)) == 60.0
    # The float16 softmax loses it: -log(1e-7) after clipping.
    half_probs = tf.cast(keras.activations.softmax(half_logits), tf.float32)
    assert float(loss(tf.constant(LABEL), half_probs)) == pytest.approx(16.118, abs=1e-3)


@pytest.mark.slow
def test_output_activation_in_a_compiled_model_gives_60():
    tf_mixed.enable("mixed_float16")
    x, y = np.array(LOGITS, "float32"), np.array(LABEL)
    model = identity_logits_model(tf_mixed.OutputActivation("softmax"))
    model.compile(loss="sparse_categorical_crossentropy")
    assert model.evaluate(x, y, verbose=0) == 60.0
    assert model.predict(x, verbose=0).dtype == np.float32
    # Same model with Keras's float16 softmax: the clipped value.
    plain = identity_logits_model(keras.layers.Activation("softmax"))
    plain.compile(loss="sparse_categorical_crossentropy")
    assert plain.evaluate(x, y, verbose=0) == pytest.approx(16.118, abs=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "activation, expected",
    [
        ("sigmoid", tf.math.sigmoid),
        ("softmax", tf.nn.softmax),
        ("relu", tf.nn.relu),
        (tf.math.tanh, tf.math.tanh),
    ],
)
def test_output_activation_computes_in_float32(activation, expected):
    tf_mixed.enable("mixed_bfloat16")
    x = tf.constant([[0.1, -2.5, 3.3]], tf.bfloat16)
    layer = tf_mixed.OutputActivation(activation)
    out = layer(x)
    assert layer.compute_dtype == "float32"
    assert out.dtype == tf.float32
    np.testing.assert_array_equal(out.numpy(), expected(tf.cast(x, tf.float32)).numpy())


def test_output_activation_unknown_name_lists_choices_and_keeps_policy():
    tf_mixed.enable("mixed_float16")
    with pytest.raises(ValueError) as info:
        tf_mixed.OutputActivation("no_such_activation")
    message = str(info.value)
    assert "'no_such_activation'" in message
    assert "softmax" in message and "sigmoid" in message
    assert keras.config.dtype_policy().name == "mixed_float16"


def test_output_activation_rejects_bad_types_and_dtypes():
    with pytest.raises(TypeError, match="activation=3"):
        tf_mixed.OutputActivation(3)
    with pytest.raises(ValueError, match="always computes in float32"):
        tf_mixed.OutputActivation("softmax", dtype="float16")
    assert tf_mixed.OutputActivation("softmax", dtype="float32").dtype == "float32"


FLOAT32_SPELLINGS = {
    "str": "float32", "numpy": np.float32, "numpy dtype": np.dtype("float32"),
    "tf": tf.float32, "policy": keras.DTypePolicy("float32"),
    "serialised policy": {"module": "keras", "class_name": "DTypePolicy",
                          "config": {"name": "float32"}},
}


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["OutputActivation", "Float32Output"])
@pytest.mark.parametrize("spelling", list(FLOAT32_SPELLINGS))
def test_float32_heads_take_float32_in_every_keras_spelling(layer, spelling):
    # Issue 27: dtype=np.float32 was refused as if it were another dtype.
    tf_mixed.enable("mixed_float16")
    head = getattr(tf_mixed, layer)(dtype=FLOAT32_SPELLINGS[spelling])
    assert head.dtype_policy.name == "float32"
    assert head(tf.constant(LOGITS, tf.float16)).dtype == tf.float32


@pytest.mark.slow
@pytest.mark.parametrize("dtype, reads_as", [
    (np.float16, "'float16'"), (tf.bfloat16, "'bfloat16'"), ("float64", "'float64'"),
    ("mixed_float16", "'mixed_float16' (compute float16, variables float32)"),
    (keras.DTypePolicy("mixed_bfloat16"), "'mixed_bfloat16'"),
    ("float8_from_float32", "quantized float8"),
])
def test_float32_heads_refuse_other_dtypes_with_the_reason(dtype, reads_as):
    with pytest.raises(ValueError, match="always computes in float32") as info:
        tf_mixed.OutputActivation("softmax", dtype=dtype)
    assert f"dtype={dtype!r}" in str(info.value)
    assert reads_as in str(info.value)
    assert "Remove the dtype argument" in str(info.value)


def test_float32_heads_refuse_what_keras_cannot_read_as_a_dtype():
    with pytest.raises(ValueError, match=r"Received: dtype='no_such_dtype', which Keras "
                                         "does not read as a dtype"):
        tf_mixed.Float32Output(dtype="no_such_dtype")


def test_float32_output_casts_nested_floats_and_keeps_ints():
    tf_mixed.enable("mixed_float16")
    layer = tf_mixed.Float32Output()
    out = layer({"a": tf.ones((2,), tf.float16), "b": [tf.ones((1,), tf.bfloat16),
                                                     tf.constant([3])]})
    assert out["a"].dtype == tf.float32
    assert out["b"][0].dtype == tf.float32
    assert out["b"][1].dtype == tf.int32
    with pytest.raises(ValueError, match="dtype='bfloat16'"):
        tf_mixed.Float32Output(dtype="bfloat16")


def test_float32_output_in_functional_model_with_two_outputs():
    tf_mixed.enable("mixed_float16")
    inputs = keras.Input((4,))
    a = keras.layers.Dense(2)(inputs)
    b = keras.layers.Dense(3)(inputs)
    outputs = tf_mixed.Float32Output()([a, b])
    model = keras.Model(inputs, outputs)
    assert [o.dtype for o in model.outputs] == ["float32", "float32"]
    results = model(tf.ones((1, 4)))
    assert [r.dtype for r in results] == [tf.float32, tf.float32]


def test_float32_loss_casts_inputs_for_every_kind_of_loss():
    y_true = tf.constant([[1.0, 0.0]], tf.float16)
    y_pred = tf.constant([[0.25, 0.5]], tf.float16)
    seen = []

    def raw(t, p):
        seen.append((t.dtype, p.dtype))
        return tf.reduce_mean(tf.square(t - p), axis=-1)

    for loss in ["mse", keras.losses.MeanSquaredError(), raw]:
        wrapped = tf_mixed.float32_loss(loss)
        value = wrapped(y_true, y_pred)
        assert value.dtype == tf.float32
        assert float(value) == (0.75**2 + 0.5**2) / 2
    assert seen == [(tf.float32, tf.float32)]


def test_float32_loss_keeps_name_reduction_and_does_not_nest():
    inner = keras.losses.MeanAbsoluteError(reduction="sum", name="my_mae")
    wrapped = tf_mixed.float32_loss(inner)
    assert wrapped.name == "my_mae"
    assert wrapped.reduction == "sum"
    twice = tf_mixed.float32_loss(wrapped)
    assert twice.loss is inner


def test_float32_loss_bad_input():
    with pytest.raises(ValueError, match="'no_such_loss'"):
        tf_mixed.float32_loss("no_such_loss")
    with pytest.raises(TypeError, match="loss=5"):
        tf_mixed.float32_loss(5)


@pytest.mark.slow
def test_keras_round_trip_of_every_helper(tmp_path):
    tf_mixed.enable("mixed_float16")
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    probs = tf_mixed.OutputActivation("softmax", name="probs")(keras.layers.Dense(3)(hidden))
    scores = tf_mixed.Float32Output(name="scores")(keras.layers.Dense(2)(hidden))
    gate = tf_mixed.OutputActivation("sigmoid", name="gate")(keras.layers.Dense(1)(hidden))
    model = keras.Model(inputs, {"probs": probs, "scores": scores, "gate": gate})
    model.compile(
        optimizer="sgd",
        loss={
            "probs": tf_mixed.float32_loss("sparse_categorical_crossentropy"),
            "scores": tf_mixed.float32_loss(keras.losses.MeanSquaredError()),
            "gate": tf_mixed.float32_loss("binary_crossentropy"),
        },
    )
    rng = np.random.default_rng(1)
    x = rng.random((5, 6), dtype=np.float32)
    targets = {"probs": rng.integers(0, 3, 5), "scores": rng.random((5, 2)),
               "gate": rng.integers(0, 2, (5, 1)).astype("float32")}
    model.fit(x, targets, verbose=0)  # builds the optimizer, so it saves whole
    path = tmp_path / "model.keras"
    model.save(path)

    loaded = keras.models.load_model(path)  # no custom_objects
    before, after = model.predict(x, verbose=0), loaded.predict(x, verbose=0)
    for key in before:
        assert after[key].dtype == np.float32
        np.testing.assert_array_equal(before[key], after[key])
    # The heads load as the Keras layers they save as (no tf_mixed needed), float32.
    assert type(loaded.get_layer("probs")) is keras.layers.Activation
    assert type(loaded.get_layer("scores")) is keras.layers.Identity
    assert {loaded.get_layer(n).dtype_policy.name for n in ("probs", "scores", "gate")} == {
        "float32"}
    assert loaded.get_layer("gate").activation is keras.activations.sigmoid
    assert all(isinstance(l, Float32Loss) for l in loaded.loss.values())
    assert loaded.layers[1].compute_dtype == "float16"
