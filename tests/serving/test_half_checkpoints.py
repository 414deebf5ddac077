"""Half-size weight checkpoints: size, exact rounding, both ways between policies."""

import json
import os
import stat
import subprocess
import sys
import warnings

import keras
import ml_dtypes
import numpy as np
import pytest
from repo_paths import ROOT

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


@pytest.mark.slow
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


def _assert_refused_unchanged(model, path, message, case="") -> None:
    """``load_weights(model, path)`` raises a ValueError matching ``message``
    and leaves every weight of ``model`` as it was."""
    before = model.get_weights()
    with pytest.raises(ValueError, match=message):
        tf_mixed.serving.load_weights(model, path)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b, err_msg=case)


def test_load_refuses_values_half_variables_cannot_hold(tmp_path):
    saved, loaded = _model("float32", 0), _model("float16", 1)
    kernel = saved.get_layer("out").kernel
    kernel.assign(np.full(kernel.shape, 1e6, np.float32))
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    _assert_refused_unchanged(loaded, tmp_path / "w.npz",
                              r"out/kernel \(max \|value\| 1e\+06\).*unchanged")


def test_mismatched_architecture_is_refused_and_model_unchanged(tmp_path):
    tf_mixed.serving.save_weights(_model("float32"), tmp_path / "w.npz")
    other = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, name="wide"),
                              keras.layers.BatchNormalization(name="norm"),
                              keras.layers.Dense(11, name="out")])
    _assert_refused_unchanged(other, tmp_path / "w.npz", (
        r"does not match model '.*': layers/dense_1/vars/0 is \[256, 10\] in the file, "
        r"\[256, 11\] in the model; layers/dense_1/vars/1 is \[10\] in the file, "
        r"\[11\] in the model\. The model is unchanged"))


def _two_dense(first: str, second: str, name: str) -> keras.Model:
    keras.utils.set_random_seed(len(name))
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name=first),
                             keras.layers.Dense(4, name=second)], name=name)


def _plain(widths, seed=0, extra=()) -> keras.Model:
    """A Sequential model of unnamed Dense layers: Keras numbers them per process."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,))]
                            + [keras.layers.Dense(w) for w in widths] + list(extra))


def _nested(seed=0) -> keras.Model:
    """A functional model around a Sequential one, all layers unnamed."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization()])
    outputs = keras.layers.Dense(2)(keras.layers.Dense(3)(inner(inputs)))
    return keras.Model(inputs, outputs)


def _assert_same_weights(have: keras.Model, want: keras.Model) -> None:
    assert len(have.weights) == len(want.weights)
    for h, w in zip(have.weights, want.weights):
        np.testing.assert_array_equal(h.numpy(), w.numpy(), err_msg=h.path)


@pytest.mark.slow
@pytest.mark.parametrize("build", [lambda seed: _plain([8, 5], seed), _nested])
def test_the_same_architecture_built_again_loads_by_default(tmp_path, build):
    saved = build(1)
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    again = build(2)  # its layers have other numbers (dense_2 for dense), another name
    assert [v.path for v in again.weights] != [v.path for v in saved.weights]
    tf_mixed.serving.load_weights(again, tmp_path / "w.npz")
    _assert_same_weights(again, saved)


def test_a_changed_architecture_is_refused_naming_keys_and_model_unchanged(tmp_path):
    tf_mixed.serving.save_weights(_plain([8, 5]), tmp_path / "w.npz", dtype="float32")
    cases = {
        # A layer added: keys the file lacks.
        "added": (_plain([8, 5, 5]), (
            r"by each variable's key \(its place in the model, as Keras's save_weights "
            r"names it\): model '.*' has layers/dense_2/vars/0, layers/dense_2/vars/1, "
            r"which the file lacks\. The model is unchanged")),
        # A layer removed: keys the model lacks.
        "removed": (_plain([8]), (
            r"the file \(model '.*'\) has layers/dense_1/vars/0, layers/dense_1/vars/1, "
            r"which the model lacks")),
        "another class": (_plain([8], extra=[keras.layers.LayerNormalization()]), (
            r"has layers/layer_normalization/vars/0, layers/layer_normalization/vars/1, "
            r"which the file lacks; the file \(model '.*'\) has layers/dense_1/vars/0, "
            r"layers/dense_1/vars/1, which the model lacks")),
        "width changed": (_plain([8, 6]), (
            r"layers/dense_1/vars/0 is \[8, 5\] in the file, \[8, 6\] in the model; "
            r"layers/dense_1/vars/1 is \[5\] in the file, \[6\] in the model\. The "
            r"model is unchanged")),
        "swapped": (_plain([5, 8]), (
            r"layers/dense/vars/0 is \[4, 8\] in the file, \[4, 5\] in the model; "
            r"layers/dense/vars/1 is \[8\] in the file, \[5\] in the model; "
            r"layers/dense_1/vars/0 is \[8, 5\] in the file, \[5, 8\] in the model")),
    }
    for case, (model, message) in cases.items():
        _assert_refused_unchanged(model, tmp_path / "w.npz", message, case)


def test_a_subclassed_model_matches_by_attribute(tmp_path):
    class Two(keras.Model):
        def __init__(self, first, second, **kwargs):
            super().__init__(**kwargs)
            self.encoder = keras.layers.Dense(first)
            self.head = keras.layers.Dense(second)

        def call(self, x):
            return self.head(self.encoder(x))

    def build(first, second, seed):
        keras.utils.set_random_seed(seed)
        model = Two(first, second)
        model(np.zeros((1, 4), np.float32))
        return model

    saved = build(3, 2, 1)
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    again = build(3, 2, 2)
    tf_mixed.serving.load_weights(again, tmp_path / "w.npz")
    _assert_same_weights(again, saved)
    with pytest.raises(ValueError, match=r"encoder/vars/0 is \[4, 3\] in the file, \[4, 5\]"):
        tf_mixed.serving.load_weights(build(5, 2, 3), tmp_path / "w.npz")


def _as_version_1(path) -> None:
    """Rewrites a file as format version 1 wrote it: process-wide paths, no keys."""
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(bytes(arrays["__meta__"]).decode())
    meta["format"] = "tf_mixed.weights/1"
    meta["variables"] = [{k: r[k] for k in ("path", "shape", "dtype")} for r in meta["variables"]]
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)


def test_a_version_1_file_still_loads(tmp_path):
    saved = _two_dense("a", "b", "saved")
    tf_mixed.serving.save_weights(saved, tmp_path / "w.npz", dtype="float32")
    _as_version_1(tmp_path / "w.npz")
    # By path where the paths match (the model's name removed): a to a, b to b,
    # though the model holds them in the other order.
    swapped = _two_dense("b", "a", "swapped")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        tf_mixed.serving.load_weights(swapped, tmp_path / "w.npz")
    for layer in ("a", "b"):
        for want, have in zip(saved.get_layer(layer).get_weights(),
                              swapped.get_layer(layer).get_weights()):
            np.testing.assert_array_equal(have, want)
    # Else by position where count, order and shapes agree, said in one line.
    renumbered = _two_dense("c", "d", "renumbered")
    with pytest.warns(UserWarning, match=(
            r"^'.*w\.npz' \(tf_mixed\.weights/1: process-wide variable paths, which "
            r"differ from model 'renumbered''s\) loaded by position: its 4 variables' "
            r"order and shapes agree with the model's; save it again to store "
            r"structural keys\.$")):
        tf_mixed.serving.load_weights(renumbered, tmp_path / "w.npz")
    _assert_same_weights(renumbered, saved)
    # A changed architecture is refused, naming the paths each side lacks.
    wider = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="a"),
                              keras.layers.Dense(5, name="e")], name="wider")
    _assert_refused_unchanged(wider, tmp_path / "w.npz", (
        r"by each variable's path without the model's name \(tf_mixed\.weights/1 "
        r"file; by position the count or a shape differs too\): model 'wider' has "
        r"e/kernel, e/bias, which the file lacks; the file \(model 'saved'\) has "
        r"b/kernel, b/bias, which the model lacks\. The model is unchanged"))


_SAVE_IN_A_FRESH_PROCESS = """
import sys
import keras
import numpy as np
import tf_mixed
keras.utils.set_random_seed(7)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(5)])
tf_mixed.serving.save_weights(model, sys.argv[1], dtype="float32")
np.savez(sys.argv[2], *[v.numpy() for v in model.weights])
"""


@pytest.mark.slow
def test_a_file_saved_in_another_process_loads_after_other_models(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", _SAVE_IN_A_FRESH_PROCESS, str(tmp_path / "w.npz"),
                    str(tmp_path / "want.npz")], check=True, env=env, timeout=300)
    _plain([3]), _nested()  # this process numbered other layers first
    model = _plain([8, 5], seed=9)
    assert model.layers[0].name != "dense"
    tf_mixed.serving.load_weights(model, tmp_path / "w.npz")
    with np.load(tmp_path / "want.npz") as want:
        assert len(want.files) == len(model.weights) == 4
        for i, variable in enumerate(model.weights):
            np.testing.assert_array_equal(variable.numpy(), want[f"arr_{i}"])


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
    with pytest.raises(ValueError,
                       match="not a weights file written by tf_mixed.serving.save_weights"):
        tf_mixed.serving.load_weights(model, tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="not a weights file"):
        tf_mixed.serving.load_weights(model, tmp_path / "missing.npz")
    unbuilt = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="has no weights yet"):
        tf_mixed.serving.save_weights(unbuilt, tmp_path / "u.npz")
    assert sorted(os.listdir(tmp_path)) == ["junk.npz"]


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_missing_monitor_warns_and_saves_as_keras(tmp_path):
    callback = tf_mixed.ModelCheckpoint(str(tmp_path / "e{epoch}.npz"), save_best_only=True)
    with pytest.warns(UserWarning, match="Can save best model only with val_loss available"):
        _fit(_model("float32"), callback, validation=False)
    assert sorted(os.listdir(tmp_path)) == ["e1.npz", "e2.npz"]


@pytest.mark.slow
def test_checkpoint_creates_its_directory_and_saves_per_batches(tmp_path):
    callback = tf_mixed.ModelCheckpoint(
        str(tmp_path / "ckpt" / "deep" / "e{epoch:02d}b{batch}.npz"), save_freq=2)
    _fit(_model("float32"), callback, epochs=2, validation=False)  # 2 batches an epoch
    assert sorted(os.listdir(tmp_path / "ckpt" / "deep")) == ["e01b2.npz", "e02b2.npz"]
    mode = stat.S_IMODE(os.stat(tmp_path / "ckpt" / "deep" / "e01b2.npz").st_mode)
    assert mode == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_variables_keras_does_not_store_as_themselves_keep_their_path(tmp_path):
    # A LoRA-enabled Dense hands Keras's saving its merged kernel, not a variable.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d")], name="lora")
    model.layers[0].enable_lora(2)
    tf_mixed.serving.save_weights(model, tmp_path / "w.npz", dtype="float32")
    with np.load(tmp_path / "w.npz") as archive:
        meta = json.loads(bytes(archive["__meta__"]).decode())
    assert sorted(r["key"] for r in meta["variables"]) == [
        "d/kernel", "d/lora_kernel_a", "d/lora_kernel_b", "layers/dense/vars/1"]
    want = [v.numpy() for v in model.weights]
    for variable in model.weights:
        variable.assign(keras.ops.zeros_like(variable))
    tf_mixed.serving.load_weights(model, tmp_path / "w.npz")
    for variable, value in zip(model.weights, want):
        np.testing.assert_array_equal(variable.numpy(), value)
