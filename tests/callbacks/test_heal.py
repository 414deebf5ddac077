"""`tf_mixed.callbacks.Heal`: a layer that keeps overflowing moves to float32 in fit."""

import contextlib

import keras
import numpy as np
import pytest

import tf_mixed


@keras.saving.register_keras_serializable(package="test_heal")
class SquaredGate(keras.layers.Layer):
    """x^2 / (1 + x^2): bounded, but NaN in float16 once |x| > 256 (inf / inf)."""

    def call(self, x):
        squared = x * x
        return squared / (1.0 + squared)


@keras.saving.register_keras_serializable(package="test_heal")
class Square(keras.layers.Layer):
    def call(self, x):
        return x * x


def _model(*middle, name="heal_model"):
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4, name="d1", kernel_initializer="ones")]
        + list(middle) + [keras.layers.Dense(2, name="d2")], name=name)
    model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
    return model


def _data(n=64):
    x = np.full((n, 4), 0.1, "float32")
    x[::8] = 100.0                    # one row per batch of 8: d1 gives 400
    return x, np.zeros((n, 2), "float32")


@pytest.mark.slow
def test_fit_heals_the_culprit_at_its_fifth_skip_and_goes_on(caplog):
    tf_mixed.enable("mixed_float16")
    model = _model(SquaredGate(name="gate"))
    heal = tf_mixed.callbacks.Heal()
    x, y = _data()
    assert np.isnan(model.evaluate(x, y, batch_size=8, verbose=0))     # traced in float16
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[heal])
    assert np.isfinite(model.evaluate(x, y, batch_size=8, verbose=0))  # retraced healed
    gate = model.get_layer("gate")
    assert gate.compute_dtype == "float32"
    assert model.get_layer("d2").compute_dtype == "float16"
    assert model.optimizer.loss_scale_state().skipped_steps == 5   # then none
    assert heal.healed_layers == ("gate",)
    assert history.history["healed_layers"] == [1.0]
    assert heal.healings == [
        "tf_mixed healing at step 5: moved to float32 compute: 'gate': 5 skipped steps "
        "(steps 1, 2, 3, 4, 5; forward output). Healed layers now: ['gate']. The step is "
        "retraced."]
    assert heal.healings[0] in caplog.text


def test_without_heal_every_step_is_skipped():
    tf_mixed.enable("mixed_float16")
    model = _model(SquaredGate(name="gate"))
    model.fit(*_data(), batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert model.optimizer.loss_scale_state().skipped_steps == 8


@pytest.mark.slow
def test_past_the_limit_the_run_stops_with_the_evidence():
    tf_mixed.enable("mixed_float16")
    # Healing sq1 sends its float32 output (1.6e5) into sq2's float16 input:
    # sq2 is the next culprit, and a second layer of four is past the limit.
    model = _model(Square(name="sq1"), Square(name="sq2"))
    heal = tf_mixed.callbacks.Heal(skips=1)
    model.fit(*_data(), batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[heal])
    assert heal.healed_layers == ("sq1",)
    assert model.get_layer("sq2").compute_dtype == "float16"
    assert heal.stopped == (
        "at step 2 healing would move 2 of 4 layers to float32, past the limit of 1 "
        "(max_fraction=0.25); already moved: ['sq1']; culprits now: 'sq2': 1 skipped "
        "steps (steps 2; forward output)")
    with pytest.raises(tf_mixed.callbacks.LossScaleFailure, match="past the limit"):
        _model(Square(name="sq1"), Square(name="sq2"), name="again").fit(
            *_data(), batch_size=8, verbose=0, shuffle=False,
            callbacks=[tf_mixed.callbacks.Heal(skips=1, raise_on_failure=True)])


@pytest.mark.slow
def test_a_keras_file_keeps_the_healed_layer_and_audit_says_so(tmp_path):
    tf_mixed.enable("mixed_float16")
    model = _model(SquaredGate(name="gate"))
    model.fit(*_data(), batch_size=8, verbose=0, shuffle=False,
              callbacks=[tf_mixed.callbacks.Heal()])
    path = str(tmp_path / "healed.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_layer("gate").compute_dtype == "float32"
    assert loaded.get_layer("d2").compute_dtype == "float16"
    assert loaded.optimizer.step_state.attribution.pending_healed() == ("gate",)
    healed = tf_mixed.audit(loaded).by_code("healed")
    assert [f.layer for f in healed] == ["gate"]
    # Training the loaded model goes on healed: nothing is skipped.
    heal = tf_mixed.callbacks.Heal()
    loaded.fit(*_data(), batch_size=8, verbose=0, shuffle=False, callbacks=[heal])
    assert heal.healed_layers == ("gate",)
    assert loaded.optimizer.loss_scale_state().skipped_steps == 5   # the saved count


@pytest.mark.slow
def test_backup_and_restore_resumes_healed_before_the_first_step(tmp_path):
    tf_mixed.enable("mixed_float16")
    backup = str(tmp_path / "backup")
    model = _model(SquaredGate(name="gate"))
    model.fit(*_data(), batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[
        tf_mixed.callbacks.Heal(),
        keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    # A fresh process would build the model again as written: gate in float16.
    fresh = _model(SquaredGate(name="gate"))
    assert fresh.get_layer("gate").compute_dtype == "float16"
    heal = tf_mixed.callbacks.Heal()
    fresh.fit(*_data(), batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[
        heal, keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)])
    assert fresh.get_layer("gate").compute_dtype == "float32"
    assert heal.healed_layers == ("gate",)
    # The restored count is 5 and the resumed epoch skipped nothing.
    assert fresh.optimizer.loss_scale_state().skipped_steps == 5


def test_heal_knobs_are_checked():
    with pytest.raises(ValueError, match="check_every_n_batches"):
        tf_mixed.callbacks.Heal(check_every_n_batches=0)
    with pytest.raises(ValueError, match="skips"):
        tf_mixed.callbacks.Heal(skips=0)
    assert tf_mixed.callbacks.Heal(window=200).get_config()["window"] == 200


@keras.saving.register_keras_serializable(package="test_heal")
class Block(keras.layers.Layer):
    """A layer that holds layers, made with the block's policy (docs/healing.md)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(4, name="inner", dtype=self.dtype_policy)
        self.outer = keras.layers.Dense(4, name="outer", dtype=self.dtype_policy)

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build(tuple(input_shape[:-1]) + (4,))

    def call(self, x):
        return x + self.outer(self.inner(x))


def test_a_healed_block_loads_with_float32_sublayers(tmp_path):
    from tf_mixed.scaling.healing import move_to_float32

    tf_mixed.enable("mixed_float16")
    model = _model(Block(name="block"))
    moved = move_to_float32(model.get_layer("block"))
    assert [layer.name for layer in moved] == ["block", "inner", "outer"]
    path = str(tmp_path / "block.keras")
    model.save(path)
    block = keras.models.load_model(path, compile=False).get_layer("block")  # never trained
    assert [layer.compute_dtype for layer in (block, block.inner, block.outer)] \
        == ["float32"] * 3


def _scope(strategy):
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def _healed_and_saved(tmp_path, strategy=None):
    """A model healed in fit, saved by Keras's ModelCheckpoint as .keras and weights-only."""
    with _scope(strategy):
        model = _model(SquaredGate(name="gate"))
    whole, weights = str(tmp_path / "whole.keras"), str(tmp_path / "only.weights.h5")
    model.fit(*_data(), batch_size=8, verbose=0, shuffle=False, callbacks=[
        tf_mixed.callbacks.Heal(), keras.callbacks.ModelCheckpoint(whole),
        keras.callbacks.ModelCheckpoint(weights, save_weights_only=True)])
    assert model.get_layer("gate").compute_dtype == "float32"
    return model, whole, weights


def _check_checkpoints(model, whole, weights, strategy=None):
    from tf_mixed.scaling.healing import Healer

    x = _data()[0]
    served = model.predict(x, verbose=0)
    assert np.isfinite(served).all()
    # .keras: the file's config holds the healed policy.
    with _scope(strategy):
        loaded = keras.models.load_model(whole)
    assert loaded.get_layer("gate").dtype_policy.name == "float32"
    assert loaded.get_layer("d2").compute_dtype == "float16"
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), served)
    # Weights only: the model built again as written computes gate in float16
    # until the healed set, read from the optimizer's saved state, moves it:
    # at the load, with healing attached or not.
    for attach in (True, False):
        with _scope(strategy):
            fresh = _model(SquaredGate(name="gate"), name="fresh")
            fresh.optimizer.build(fresh.trainable_variables)
        healer = Healer(fresh, fresh.optimizer) if attach else None
        assert fresh.get_layer("gate").compute_dtype == "float16"
        fresh.load_weights(weights)
        assert fresh.get_layer("gate").dtype_policy.name == "float32"
        assert fresh.get_layer("d2").compute_dtype == "float16"
        if healer is not None:
            assert healer.reapply() == ()
            assert healer.healed == ("gate",)
        np.testing.assert_array_equal(fresh.predict(x, verbose=0), served)


@pytest.mark.slow
def test_model_checkpoint_and_export_keep_the_healed_layer(tmp_path):
    import tensorflow as tf

    tf_mixed.enable("mixed_float16")
    model, whole, weights = _healed_and_saved(tmp_path)
    _check_checkpoints(model, whole, weights)
    # export: served as trained, and rebuilt in float16, the healed layer
    # stays float32 (export's parity check on rows that overflow float16 in
    # gate fails otherwise), and the SavedModel serves the model's outputs.
    x = _data()[0]
    served = model.predict(x, verbose=0)
    for precision in ("as_trained", "float16"):
        path = str(tmp_path / precision)
        report = tf_mixed.export(model, path, precision=precision, sample=x)
        assert report.trained_dtype == "float16" and report.max_rel_error is not None
        artifact = tf.saved_model.load(path)
        out = keras.tree.flatten(artifact.serve(tf.constant(x)))[0]
        np.testing.assert_allclose(np.asarray(out), served, rtol=0, atol=0.05)


@pytest.mark.slow
def test_model_checkpoint_keeps_the_healed_layer_under_two_replicas(tmp_path, mirrored):
    tf_mixed.enable("mixed_float16")
    model, whole, weights = _healed_and_saved(tmp_path, mirrored)
    _check_checkpoints(model, whole, weights, mirrored)
