"""Half-size weight checkpoints: size, exact rounding, both ways between policies."""

import os

import keras
import ml_dtypes
import numpy as np
import pytest

import tf_mixed


def _model(policy: str, seed: int = 0) -> keras.Model:
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(seed)
        return keras.Sequential([
            keras.Input((64,)), keras.layers.Dense(256, name="wide"),
            keras.layers.BatchNormalization(name="norm"), keras.layers.Dense(10, name="out"),
        ], name=f"m_{policy}")
    finally:
        keras.config.set_dtype_policy("float32")


def _rounded(values, dtype):
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    return [np.asarray(v, np.float32).astype(np_dtype).astype(np.float32) for v in values]


def test_half_checkpoint_is_about_half_the_bytes(tmp_path):
    model = _model("mixed_float16")
    full = tf_mixed.serving.save_weights(model, tmp_path / "full.npz", dtype="float32")
    for dtype in ("float16", "bfloat16"):
        half = tf_mixed.serving.save_weights(model, tmp_path / f"{dtype}.npz", dtype=dtype)
        assert half == os.path.getsize(tmp_path / f"{dtype}.npz")
        assert 0.48 < half / full < 0.53, (dtype, half, full)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("source,target", [("mixed_float16", "float32"),
                                           ("float32", "mixed_float16"),
                                           ("mixed_bfloat16", "float32")])
def test_round_trip_between_policies_is_the_dtypes_rounding(tmp_path, dtype, source, target):
    saved = _model(source, seed=0)
    loaded = _model(target, seed=1)  # other initial weights
    path = tmp_path / "w.npz"
    tf_mixed.serving.save_weights(saved, path, dtype=dtype)
    tf_mixed.serving.load_weights(loaded, path)
    expected = _rounded(saved.get_weights(), dtype)
    for want, variable in zip(expected, loaded.weights):
        assert variable.dtype == "float32"
        np.testing.assert_array_equal(np.asarray(variable.value), want)


def test_float32_checkpoint_is_exact(tmp_path):
    saved, loaded = _model("mixed_float16", 0), _model("float32", 1)
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    tf_mixed.serving.load_weights(loaded, tmp_path / "w.npz")
    for a, b in zip(saved.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_load_into_half_variables(tmp_path):
    saved, loaded = _model("float32", 0), _model("float16", 1)  # float16 variables
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    tf_mixed.serving.load_weights(loaded, tmp_path / "w.npz")
    for want, variable in zip(_rounded(saved.get_weights(), "float16"), loaded.weights):
        assert variable.dtype == "float16"
        np.testing.assert_array_equal(np.asarray(variable.value, np.float32), want)


def test_out_of_float16_range_is_refused_naming_variables_and_nothing_written(tmp_path):
    model = _model("mixed_float16")
    kernel = model.get_layer("wide").kernel
    values = np.asarray(kernel.value).copy()
    values[3, 4] = -70000.0
    kernel.assign(values)
    path = tmp_path / "w.npz"
    with pytest.raises(ValueError, match=r"in float16: values beyond .*65504.*"
                                         r"m_mixed_float16/wide/kernel \(max \|value\| 70000\)"):
        tf_mixed.serving.save_weights(model, path, dtype="float16")
    assert os.listdir(tmp_path) == []
    # 65504 (float16's largest) fits; bfloat16 holds 70000 (rounded).
    values[3, 4] = 65504.0
    kernel.assign(values)
    tf_mixed.serving.save_weights(model, path, dtype="float16")
    values[3, 4] = -70000.0
    kernel.assign(values)
    tf_mixed.serving.save_weights(model, path, dtype="bfloat16")


def test_load_refuses_values_half_variables_cannot_hold(tmp_path):
    saved, loaded = _model("float32", 0), _model("float16", 1)
    kernel = saved.get_layer("out").kernel
    kernel.assign(np.full(kernel.shape, 1e6, np.float32))
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    before = loaded.get_weights()
    with pytest.raises(ValueError, match=r"out/kernel \(max \|value\| 1e\+06\).*unchanged"):
        tf_mixed.serving.load_weights(loaded, tmp_path / "w.npz")
    for a, b in zip(before, loaded.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_mismatched_architecture_is_refused_and_model_unchanged(tmp_path):
    tf_mixed.serving.save_weights(_model("float32"), tmp_path / "w.npz")
    other = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                              keras.layers.BatchNormalization(), keras.layers.Dense(11)])
    before = other.get_weights()
    with pytest.raises(ValueError, match=r"shape \[256, 10\] but the model's variable .* \[256, 11\]"):
        tf_mixed.serving.load_weights(other, tmp_path / "w.npz")
    for a, b in zip(before, other.get_weights()):
        np.testing.assert_array_equal(a, b)
    fewer = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    with pytest.raises(ValueError, match="holds 8 variables .* has 2"):
        tf_mixed.serving.load_weights(fewer, tmp_path / "w.npz")


def test_bad_arguments(tmp_path):
    model = _model("float32")
    with pytest.raises(ValueError, match=r"float16, bfloat16, float32\. Received: dtype='int8'"):
        tf_mixed.serving.save_weights(model, tmp_path / "w.npz", dtype="int8")
    with pytest.raises(TypeError, match="needs a keras.Model"):
        tf_mixed.serving.save_weights("model", tmp_path / "w.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a weights file written by tf_mixed.serving.save_weights"):
        tf_mixed.serving.load_weights(model, tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="not a weights file"):
        tf_mixed.serving.load_weights(model, tmp_path / "missing.npz")
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="has no weights yet"):
        tf_mixed.serving.save_weights(unbuilt, tmp_path / "u.npz")
    assert sorted(os.listdir(tmp_path)) == ["junk.npz"]


def test_checkpoint_callback_saves_half_weights_per_epoch(tmp_path):
    model = _model("mixed_float16")
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01), force=True),
                  loss="mse")
    x = np.random.RandomState(0).randn(32, 64).astype("float32")
    y = np.zeros((32, 10), "float32")
    callback = tf_mixed.ModelCheckpoint(str(tmp_path / "e{epoch:02d}.npz"))
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])
    assert sorted(os.listdir(tmp_path)) == ["e01.npz", "e02.npz"]
    fresh = _model("float32", seed=3)
    tf_mixed.serving.load_weights(fresh, tmp_path / "e02.npz")
    for want, have in zip(_rounded(model.get_weights(), "float16"), fresh.get_weights()):
        np.testing.assert_array_equal(have, want)


def test_checkpoint_callback_best_only():
    callback = tf_mixed.ModelCheckpoint("unused-{epoch}.npz", monitor="val_loss",
                                        save_best_only=True)
    saved = []
    callback.set_model(_model("float32"))
    import tf_mixed.callbacks.checkpoint as module

    real = module.checkpoints.save_weights
    module.checkpoints.save_weights = lambda model, path, dtype: saved.append(path)
    try:
        for epoch, loss in enumerate([3.0, 2.0, 2.5, float("nan"), 1.0]):
            callback.on_epoch_end(epoch, {"val_loss": loss})
    finally:
        module.checkpoints.save_weights = real
    assert saved == ["unused-1.npz", "unused-2.npz", "unused-5.npz"]
    assert tf_mixed.ModelCheckpoint("x", monitor="val_accuracy").mode == "max"
    with pytest.raises(ValueError, match="save_dtype must be one of"):
        tf_mixed.ModelCheckpoint("x", save_dtype="half")
    with pytest.raises(ValueError, match="mode must be one of"):
        tf_mixed.ModelCheckpoint("x", mode="best")
