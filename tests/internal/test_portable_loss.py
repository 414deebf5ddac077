"""Float32Loss's config in the shape Keras's own loss function wrapper loads
(tf_mixed/_internal/portable_loss.py): the shape, the arithmetic Keras alone gets,
and the loads with tf_mixed imported (as before, older flat files too). The load in
a process without tf_mixed: tests/integration/test_float32_loss_without_tf_mixed.py."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed._internal import portable_loss
from tf_mixed._internal import shims as _internals
from tf_mixed.layers import Float32Loss

WRAPPER = _internals.loss_function_wrapper()


@keras.saving.register_keras_serializable(package="tf_mixed_test")
class OwnCall(keras.losses.Loss):
    """A Loss with its own ``call``: Keras's wrapper cannot express it."""

    def call(self, y_true, y_pred):
        return keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1)


def _keras_alone(loss):
    """What Keras alone builds from a Float32Loss's file entry: the class its
    public name resolves to without tf_mixed, from the saved config."""
    entry = keras.saving.serialize_keras_object(loss)
    assert (entry["module"], entry["class_name"], entry["registered_name"]) == (
        "keras.src.losses.losses", "LossFunctionWrapper", None)
    return WRAPPER.from_config(entry["config"])


def test_a_wrapped_loss_saves_as_kerass_wrapper_with_dtype_float32():
    scce = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    config = tf_mixed.float32_loss(scce).get_config()
    section = config["fn"].pop(portable_loss.SECTION)
    assert config == {"name": "sparse_categorical_crossentropy", "reduction": "sum",
                      "dtype": "float32", "fn": keras.saving.serialize_keras_object(
                          keras.losses.sparse_categorical_crossentropy),
                      "from_logits": True, "ignore_class": None, "axis": -1}
    assert section == {"loss": keras.saving.serialize_keras_object(scce)}
    named = tf_mixed.float32_loss("mse").get_config()
    assert named["fn"][portable_loss.SECTION] == {
        "loss": keras.saving.serialize_keras_object(keras.losses.mean_squared_error)}
    assert set(named) == {"name", "reduction", "dtype", "fn"}


LOSSES = [
    ("mse", np.float32),
    (keras.losses.MeanAbsoluteError(reduction="sum"), np.float32),
    (keras.losses.SparseCategoricalCrossentropy(from_logits=True), "sparse"),
    ("sparse_categorical_crossentropy", "sparse_probs"),
    (keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1), "onehot"),
    (keras.losses.BinaryCrossentropy(from_logits=True), "binary"),
    (keras.losses.Huber(delta=0.5), np.float32),
    (keras.losses.KLDivergence(), "probs"),
    (keras.losses.CosineSimilarity(axis=-1), np.float32),
]


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_kerass_wrapper_gives_the_float32_losss_value_exactly(half):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 4)).astype("float32") * 3
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    targets = {np.float32: rng.normal(size=(8, 4)), "sparse": rng.integers(0, 4, 8),
               "sparse_probs": rng.integers(0, 4, 8), "binary": rng.integers(0, 2, (8, 4)),
               "onehot": np.eye(4)[rng.integers(0, 4, 8)], "probs": probs}
    weights = rng.random(8).astype("float32")
    for inner, kind in LOSSES:
        y_pred = tf.cast(probs if kind in ("sparse_probs", "probs") else logits, half)
        y_true = np.asarray(targets[kind])
        ours, theirs = tf_mixed.float32_loss(inner), _keras_alone(tf_mixed.float32_loss(inner))
        assert (theirs.dtype, theirs.reduction, theirs.name) == (
            "float32", ours.reduction, ours.name)
        for sample_weight in (None, weights):
            expected = ours(y_true, y_pred, sample_weight=sample_weight)
            got = theirs(y_true, y_pred, sample_weight=sample_weight)
            assert got.dtype == expected.dtype == tf.float32
            assert float(got) == float(expected), (inner, half, sample_weight)


def test_with_tf_mixed_the_file_entry_loads_as_float32_loss_as_before():
    # Keras 3.15.1's configs of Huber, CosineSimilarity and SparseCategoricalCrossentropy
    # drop delta/axis; the file's arguments carry them (as for Keras alone).
    for inner in ["mse", keras.losses.Huber(delta=0.5, reduction="sum"),
                  keras.losses.CosineSimilarity(axis=0), OwnCall(name="own"),
                  keras.losses.SparseCategoricalCrossentropy(axis=0)]:
        loss = tf_mixed.float32_loss(inner)
        back = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
        assert type(back) is Float32Loss and back.get_config() == loss.get_config()
        assert (back.name, back.reduction, type(back.loss)) == (
            loss.name, loss.reduction, type(loss.loss))
        if not isinstance(inner, (str, OwnCall)):
            assert _internals.loss_function_parts(back.loss) == (
                _internals.loss_function_parts(inner))
    # Keras's own wrapper's entries still load as Keras's wrapper.
    plain = WRAPPER(keras.losses.huber, name="h", delta=0.5)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(plain))
    assert type(again) is WRAPPER and again.get_config() == plain.get_config()


def test_older_flat_files_still_load_with_tf_mixed():
    flat = {"module": "tf_mixed.layers", "class_name": "Float32Loss",
            "registered_name": "tf_mixed>Float32Loss",
            "config": {"name": "cce", "reduction": "sum", "loss": {
                "module": "keras.losses", "class_name": "CategoricalCrossentropy",
                "config": {"name": "cce", "reduction": "sum", "from_logits": True,
                           "label_smoothing": 0.0, "axis": -1}, "registered_name": None}}}
    back = keras.saving.deserialize_keras_object(flat)
    assert type(back) is Float32Loss and (back.name, back.reduction) == ("cce", "sum")
    assert type(back.loss) is keras.losses.CategoricalCrossentropy
    assert back.loss.get_config()["from_logits"] is True


def test_a_loss_kerass_wrapper_cannot_express_is_written_as_tf_mixeds_own_entry():
    loss = tf_mixed.float32_loss(OwnCall(name="own"))
    fn = loss.get_config()["fn"]
    assert (fn["module"], fn["class_name"], fn["registered_name"]) == (
        "tf_mixed.layers", "Float32Loss", "tf_mixed>Float32Loss")
    assert fn[portable_loss.SECTION]["loss"]["registered_name"] == "tf_mixed_test>OwnCall"
    # Keras alone fails on that entry (no class registered as tf_mixed>Float32Loss).
    without = {**fn, "registered_name": "tf_mixed_test>NotRegistered"}
    with pytest.raises(TypeError, match="Float32Loss"):
        keras.saving.deserialize_keras_object(without)


def test_a_compiled_models_losses_save_so_and_its_metrics_do_not_change():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, {"a": keras.layers.Dense(3)(inputs),
                                 "b": keras.layers.Dense(1)(inputs)})
    metrics = {"a": ["accuracy"], "b": ["mae"]}
    model.compile(loss={"a": tf_mixed.float32_loss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True)), "b": "mse"},
        metrics=metrics)
    config = model.get_compile_config()
    assert config["loss"]["b"] == "mse"
    assert config["loss"]["a"]["class_name"] == "LossFunctionWrapper"
    assert config["loss"]["a"]["config"]["dtype"] == "float32"
    model.compile(loss={"a": "sparse_categorical_crossentropy", "b": "mse"}, metrics=metrics)
    assert model.get_compile_config()["metrics"] == config["metrics"]
    listed = keras.Model(inputs, [keras.layers.Dense(1)(inputs)] * 2)
    listed.compile(loss=[tf_mixed.float32_loss("mse"), "mae"])
    saved = listed.get_compile_config()["loss"]
    assert [type(entry).__name__ for entry in saved] == ["dict", "str"]
    assert portable_loss.is_portable(saved[0]["config"])
