"""Half-size weight checkpoints: size, exact rounding, both ways between policies."""

import os
import stat
import warnings

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
    other = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, name="wide"),
                              keras.layers.BatchNormalization(name="norm"),
                              keras.layers.Dense(11, name="out")])
    before = other.get_weights()
    with pytest.raises(ValueError, match=r"shape \[256, 10\] but the model's variable .* \[256, 11\]"):
        tf_mixed.serving.load_weights(other, tmp_path / "w.npz")
    for a, b in zip(before, other.get_weights()):
        np.testing.assert_array_equal(a, b)
    fewer = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    with pytest.raises(ValueError, match="holds 8 variables .* has 2"):
        tf_mixed.serving.load_weights(fewer, tmp_path / "w.npz", by="order")


def _two_dense(first: str, second: str, name: str) -> keras.Model:
    keras.utils.set_random_seed(len(name))
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name=first),
                             keras.layers.Dense(4, name=second)], name=name)


def test_load_matches_by_path_whatever_the_order(tmp_path):
    saved = _two_dense("a", "b", "saved")
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    # The same layers in the other order: by order they would swap silently.
    swapped = _two_dense("b", "a", "swapped")
    tf_mixed.serving.load_weights(swapped, tmp_path / "w.npz")
    for layer in ("a", "b"):
        for want, have in zip(saved.get_layer(layer).get_weights(),
                              swapped.get_layer(layer).get_weights()):
            np.testing.assert_array_equal(have, want)


def test_load_refuses_other_paths_naming_them_and_model_unchanged(tmp_path):
    tf_mixed.serving.save_weights(_two_dense("a", "b", "saved"), tmp_path / "w.npz")
    changed = _two_dense("a", "c", "changed")  # same shapes, another layer
    before = changed.get_weights()
    with pytest.raises(ValueError, match=(
            r"does not match model 'changed' by variable path .*: model 'changed' has "
            r"c/kernel, c/bias, which the file lacks; the file \(model 'saved'\) has "
            r"b/kernel, b/bias, which the model lacks\. The model is unchanged.*by='order'")):
        tf_mixed.serving.load_weights(changed, tmp_path / "w.npz")
    for a, b in zip(before, changed.get_weights()):
        np.testing.assert_array_equal(a, b)
    # by="order" is the explicit way to pair by position (the old behaviour).
    tf_mixed.serving.load_weights(changed, tmp_path / "w.npz", by="order")
    with pytest.raises(ValueError, match=r"by one of 'path', 'order'\. Received: by='name'"):
        tf_mixed.serving.load_weights(changed, tmp_path / "w.npz", by="name")


def test_a_functional_model_loads_a_sequential_file_by_path(tmp_path):
    saved = _two_dense("a", "b", "saved")
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(4, name="b")(keras.layers.Dense(4, name="a")(inputs))
    functional = keras.Model(inputs, outputs, name="f")  # paths "a/kernel", no model name
    tf_mixed.serving.load_weights(functional, tmp_path / "w.npz")
    for want, have in zip(saved.get_weights(), functional.get_weights()):
        np.testing.assert_array_equal(have, want)


def test_tiny_values_that_flush_to_zero_are_reported(tmp_path):
    model = _two_dense("a", "b", "tiny")
    kernel = model.get_layer("a").kernel
    values = np.full(kernel.shape, 1e-8, np.float32)  # a variable at the scale of 1e-8
    values[0, 1] = -2e-8  # below half of float16's smallest subnormal (5.96e-8): 0
    values[1, 0] = 5e-8  # rounds to the smallest subnormal: kept
    kernel.assign(values)
    with pytest.warns(UserWarning, match=(
            r"dtype='float16'\) of model 'tiny' stores as 0 nonzero values too small for "
            r"float16 \(below 2\.98e-08\): tiny/a/kernel \(15 of 16, largest \|value\| "
            r"2e-08\)\. Save with dtype='float32'")):
        tf_mixed.serving.save_weights(model, tmp_path / "w.npz", dtype="float16")
    loaded = _two_dense("a", "b", "loaded")
    tf_mixed.serving.load_weights(loaded, tmp_path / "w.npz")
    got = loaded.get_layer("a").kernel.numpy()
    assert np.count_nonzero(got) == 1
    assert got[1, 0] == np.float32(np.float16(5e-8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        # bfloat16 and float32 hold 1e-8.
        tf_mixed.serving.save_weights(model, tmp_path / "b.npz", dtype="bfloat16")
        tf_mixed.serving.save_weights(model, tmp_path / "f.npz", dtype="float32")
        # Beside values of 0.5, a lost 1e-8 is below the rounding of the rest
        # (0.5 * eps / 2 = 2.4e-4): not reported.
        values = np.full(kernel.shape, 0.5, np.float32)
        values[0, :2] = [1e-8, -2e-8]
        kernel.assign(values)
        tf_mixed.serving.save_weights(model, tmp_path / "w.npz", dtype="float16")


def test_files_get_the_mode_of_any_new_file(tmp_path):
    umask = os.umask(0o022)
    try:
        tf_mixed.serving.save_weights(_model("float32"), tmp_path / "w.npz")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "w.npz").st_mode) == 0o644


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


def _fit(model, callback=None, epochs=2, validation=True):
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse",
                  metrics=[keras.metrics.AUC(name="auc")])
    rng = np.random.RandomState(0)
    x = rng.randn(32, 64).astype("float32")
    y = (rng.rand(32, 10) > 0.5).astype("float32")
    model.fit(x, y, epochs=epochs, batch_size=16, verbose=0,
              callbacks=[callback] if callback is not None else [],
              validation_data=(x, y) if validation else None)


def _recording_saves(monkeypatch):
    saved = []
    import tf_mixed.callbacks.checkpoint as module

    monkeypatch.setattr(module.checkpoints, "save_weights",
                        lambda model, path, dtype: saved.append(path))
    return saved


def test_checkpoint_callback_best_only(monkeypatch):
    saved = _recording_saves(monkeypatch)
    callback = tf_mixed.ModelCheckpoint("unused-{epoch}.npz", monitor="val_loss",
                                        save_best_only=True)
    callback.set_model(_model("float32"))
    for epoch, loss in enumerate([3.0, 2.0, 2.5, float("nan"), 1.0]):
        callback.on_epoch_end(epoch, {"val_loss": loss})
    assert saved == ["unused-1.npz", "unused-2.npz", "unused-5.npz"]
    assert isinstance(callback, keras.callbacks.ModelCheckpoint)
    with pytest.raises(ValueError, match="save_dtype must be one of"):
        tf_mixed.ModelCheckpoint("x", save_dtype="half")
    with pytest.warns(UserWarning, match="mode 'best' is unknown, fallback to auto"):
        assert tf_mixed.ModelCheckpoint("x", mode="best").mode == "auto"


def test_auto_mode_takes_the_metric_direction_as_keras(monkeypatch, tmp_path):
    # AUC goes up: "auto" maximises val_auc (a name with no "acc" in it).
    saved = _recording_saves(monkeypatch)
    callback = tf_mixed.ModelCheckpoint("e{epoch}.npz", monitor="val_auc",
                                        save_best_only=True)
    model = _model("float32")
    _fit(model, epochs=1)  # builds the AUC metric, whose direction Keras reads
    callback.set_model(model)
    for epoch, auc in enumerate([0.5, 0.7, 0.6, 0.9]):
        callback.on_epoch_end(epoch, {"val_auc": auc})
    assert saved == ["e1.npz", "e2.npz", "e4.npz"]
    keras_callback = keras.callbacks.ModelCheckpoint(str(tmp_path / "k.keras"), monitor="val_auc")
    keras_callback.set_model(model)
    keras_callback.on_epoch_end(0, {})  # sets its monitor_op
    assert callback.monitor_op is keras_callback.monitor_op is keras.ops.greater
    unknown = tf_mixed.ModelCheckpoint("u.npz", monitor="val_mystery", save_best_only=True)
    unknown.set_model(model)
    with pytest.raises(ValueError, match="isn't able to automatically determine"):
        unknown.on_epoch_end(0, {"val_mystery": 1.0})


def test_missing_monitor_warns_and_saves_as_keras(tmp_path):
    callback = tf_mixed.ModelCheckpoint(str(tmp_path / "e{epoch}.npz"), save_best_only=True)
    with pytest.warns(UserWarning, match="Can save best model only with val_loss available"):
        _fit(_model("float32"), callback, validation=False)
    assert sorted(os.listdir(tmp_path)) == ["e1.npz", "e2.npz"]


def test_checkpoint_creates_its_directory_and_saves_per_batches(tmp_path):
    callback = tf_mixed.ModelCheckpoint(str(tmp_path / "ckpt" / "deep" / "e{epoch:02d}b{batch}.npz"),
                                        save_freq=2)
    _fit(_model("float32"), callback, epochs=2, validation=False)  # 2 batches an epoch
    assert sorted(os.listdir(tmp_path / "ckpt" / "deep")) == ["e01b2.npz", "e02b2.npz"]
    mode = stat.S_IMODE(os.stat(tmp_path / "ckpt" / "deep" / "e01b2.npz").st_mode)
    assert mode == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
