"""A restored checkpoint applies the healed map it holds, however the model trains:
``fit``, ``make_train_step``, a hand-written loop; before or after its step is built.
The same for a ``tf.train.Checkpoint`` of the optimizer, a ``.weights.h5`` and a
``.keras`` file loaded with ``model.load_weights`` (``RESTORES``)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.policy import precision_map
from tf_mixed.scaling.healed_set import moves
from tf_mixed.scaling.healing import Healer, heal, healed_map


@keras.saving.register_keras_serializable(package="test_healing_restore")
class Gate(keras.layers.Layer):
    """x^2 / (1 + x^2): bounded, but NaN in float16 once |x| > 256 (inf / inf)."""

    def call(self, x):
        squared = x * x
        return squared / (1.0 + squared)


def _model():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4, name="d1", kernel_initializer="ones"),
         Gate(name="gate"), keras.layers.Dense(2, name="d2")], name="restore_model")
    model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _data():
    x = np.full((8, 4), 0.1, "float32")
    x[0] = 100.0                    # d1 gives 400: the gate overflows float16
    return x, np.zeros((8, 2), "float32")


# How a model and its optimizer are saved and restored: a tf.train.Checkpoint;
# Keras's weights-only file (ModelCheckpoint(save_weights_only=True)); a .keras
# file read by load_weights. Each holds the healed set in the optimizer's state.
RESTORES = ("checkpoint", ".weights.h5", ".keras")
FILES = RESTORES[1:]


def _saved_healed(tmp_path, restore="checkpoint") -> str:
    """A saved model whose 'gate' was healed (``restore``: one of `RESTORES`)."""
    tf_mixed.enable("mixed_float16")
    model = _model()
    Healer(model, model.optimizer)
    tf_mixed.training.heal_layers(model, ["gate"], model.optimizer)
    assert model.get_layer("gate").compute_dtype == "float32"
    return _save(model, tmp_path / "healed", restore)


def _save(model, stem, restore) -> str:
    """Saves ``model`` and its optimizer as ``restore`` says; returns the path."""
    if restore == "checkpoint":
        return tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(stem))
    path = f"{stem}{restore}"
    if restore == ".keras":
        model.save(path)
    else:
        model.save_weights(path)
    return path


def _restore(model, path) -> None:
    if path.endswith((".weights.h5", ".keras")):
        model.load_weights(path)
    else:
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(path).expect_partial()


def _hand_written_step(model):
    opt = model.optimizer

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            pred = tf.cast(model(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.square(pred - y))
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, model.trainable_variables, opt)

    return step


def test_the_healed_set_is_rule_six_of_the_live_map():
    tf_mixed.enable("mixed_float16")
    model = _model()
    live = precision_map.observed(model)
    assert live.target == "mixed_float16"
    assert live.layers == {"d1": "mixed_float16", "gate": "mixed_float16",
                           "d2": "mixed_float16"}
    change = healed_map(model, ["gate"])
    assert change.layers["gate"] == "float32" and change.reasons["gate"] == "healed"
    # The same as the decision with the healed set (rule 6, applied last).
    decided = precision_map.decide(model, "mixed_float16", healed=["gate"], outputs=False)
    assert change.layers == decided.layers
    assert heal(model, ["gate"]) == ("gate",)
    assert heal(model, ["gate"]) == ()                     # moved once
    assert precision_map.observed(model).layers == change.layers
    with pytest.raises(ValueError, match=r"Received: \['nope'\]"):
        healed_map(model, ["nope"])


@keras.saving.register_keras_serializable(package="test_healing_restore")
class _Block(keras.layers.Layer):
    """A block whose sublayer is made under the global policy."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(2, name="inner")

    def call(self, x):
        return self.inner(x)


def test_healing_a_block_float32_itself_moves_its_half_sublayers():
    # A .keras file holds the block's policy, not its sublayers' (docs/healing.md).
    tf_mixed.enable("mixed_float16")
    block = _Block(name="block")
    model = keras.Sequential([keras.Input((2,)), block])
    block.dtype_policy = keras.DTypePolicy("float32")
    assert block.inner.compute_dtype == "float16"
    assert heal(model, ["block"]) == ("block",)
    assert block.inner.compute_dtype == "float32"
    # The live map read as it is moves nothing.
    assert precision_map.move(model, precision_map.observed(model)) == []


def test_move_refuses_a_pure_half_layer_and_moves_nothing():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="a"),
                              keras.layers.Dense(2, name="b", dtype="float16")], name="s")
    with pytest.raises(ValueError, match="'b' keeps its variables in float16"):
        precision_map.move(model, {"s/a": "mixed_float16", "s/b": "float32"})
    assert model.get_layer("a").dtype_policy.name == "float32"   # nothing half-written
    with pytest.raises(ValueError, match="cannot be moved to float8 in place"):
        precision_map.move(model, precision_map.PrecisionMap(
            "float32", {"a": "float8_from_float32"}))


@pytest.mark.slow  # its step traces the whole pipeline: about 6 s of CPU
@pytest.mark.parametrize("restore", RESTORES[:2])
def test_a_hand_written_loop_restored_before_its_first_trace_computes_healed(
        tmp_path, restore):
    path = _saved_healed(tmp_path, restore)
    fresh = _model()
    Healer(fresh, fresh.optimizer)             # attach, as docs/healing.md says
    step = _hand_written_step(fresh)
    assert fresh.get_layer("gate").compute_dtype == "float16"
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float32"     # at once
    assert fresh.get_layer("d2").compute_dtype == "float16"
    assert fresh.optimizer.step_state.attribution.attached.read().healed == ("gate",)
    assert bool(step(*_data()))                                   # applied: no overflow


@pytest.mark.slow  # 6.8 s of CPU: it traces the whole step twice
@pytest.mark.parametrize("restore, heal", [
    ("checkpoint", True), ("checkpoint", None), (".weights.h5", True), (".weights.h5", None)])
def test_make_train_step_built_before_the_restore_retraces_healed(tmp_path, restore, heal):
    path = _saved_healed(tmp_path, restore)
    fresh = _model()
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer, heal=heal)
    assert not bool(step(*_data())["applied"])                   # traced in float16
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float32"     # at once
    out = step(*_data())
    assert bool(out["applied"])                                   # traced again
    assert float(out.get("healed_layers", 1.0)) == 1.0


@pytest.mark.parametrize("restore", RESTORES)
def test_make_train_step_built_after_the_restore_computes_healed(tmp_path, restore):
    path = _saved_healed(tmp_path, restore)
    fresh = _model()
    Healer(fresh, fresh.optimizer)
    _restore(fresh, path)
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer, heal=True)
    assert bool(step(*_data())["applied"])


@pytest.mark.parametrize("restore, heal_callback", [
    ("checkpoint", True), (".weights.h5", False),
    # about 4 s of CPU each: the rest in the slow tier
    *(pytest.param(*p, marks=pytest.mark.slow)
      for p in ((".weights.h5", True), (".keras", True), ("checkpoint", False)))])
def test_fit_after_a_restore_runs_healed_though_its_functions_were_traced(
        tmp_path, restore, heal_callback):
    path = _saved_healed(tmp_path, restore)
    fresh = _model()
    x, y = _data()
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[tf_mixed.callbacks.Heal()] if heal_callback else [])
    assert np.isnan(fresh.evaluate(x, y, verbose=0))             # traced in float16
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float32"
    assert np.isfinite(fresh.evaluate(x, y, verbose=0))          # retraced healed
    assert np.isfinite(fresh.predict(x, verbose=0)).all()
    skipped = fresh.optimizer.loss_scale_state().skipped_steps
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0)            # no Heal callback needed
    assert fresh.optimizer.loss_scale_state().skipped_steps == skipped


def test_a_checkpoint_restored_before_healing_is_attached_hands_it_its_counters(tmp_path):
    # The healed map moves the layer at the restore; the attribution's
    # counters wait until healing is attached, and are then its own.
    tf_mixed.enable("mixed_float16")
    model = _model()
    healer = Healer(model, model.optimizer)
    healer.attribution.state.counts.assign(np.array([0, 3, 0], np.int64))
    tf_mixed.training.heal_layers(model, ["gate"], model.optimizer)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "ckpt"))
    fresh = _model()
    _restore(fresh, path)                       # nothing attached
    assert fresh.get_layer("gate").compute_dtype == "float32"
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer, heal=True)
    reading = fresh.optimizer.step_state.attribution.attached.read()
    assert reading.healed == ("gate",) and reading.counts == {"gate": 3}
    assert bool(step(*_data())["applied"])


@pytest.mark.parametrize("restore", RESTORES)
def test_a_restore_with_nothing_attached_heals_at_once(tmp_path, restore, caplog):
    # No Heal, no Healer, no make_train_step(heal=...): the restore moves the
    # layer itself (the model restored into owns the optimizer).
    path = _saved_healed(tmp_path, restore)
    fresh = _model()
    assert fresh.get_layer("gate").compute_dtype == "float16"
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float32"
    assert fresh.get_layer("d2").compute_dtype == "float16"
    assert precision_map.observed(fresh).layers == healed_map(_model(), ["gate"]).layers
    assert "moved layers ['gate'] to float32 compute" in caplog.text
    assert "a step function of your own traced before the restore must be created" in caplog.text
    assert moves(fresh) == 1
    # A healer attached later reads the healed set; nothing moves again.
    healer = Healer(fresh, fresh.optimizer)
    assert healer.healed == ("gate",)
    assert healer.reapply() == ()
    assert moves(fresh) == 1


@pytest.mark.parametrize("restore", RESTORES[:2])
def test_a_restore_and_a_save_without_healing_keep_the_healed_set(tmp_path, restore):
    path = _saved_healed(tmp_path, restore)
    middle = _model()
    _restore(middle, path)                     # nothing attached: held as read
    again = _save(middle, tmp_path / "again", restore)
    last = _model()
    _restore(last, again)
    assert last.get_layer("gate").compute_dtype == "float32"


def test_a_checkpoint_of_an_optimizer_never_healed_holds_no_healed_map(tmp_path):
    tf_mixed.enable("mixed_float16")
    model = _model()
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "plain"))
    assert not [key for key, _ in tf.train.list_variables(path) if "layer_attribution" in key]
    fresh = _model()
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float16"
    assert moves(fresh) == 0


def test_load_model_of_a_keras_file_computes_healed_and_keeps_the_set(tmp_path):
    path = _saved_healed(tmp_path, ".keras")
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("gate").compute_dtype == "float32"    # its config
    assert loaded.get_layer("d2").compute_dtype == "float16"
    assert moves(loaded) == 0                                     # nothing to move
    assert loaded.optimizer.step_state.attribution.pending_healed() == ("gate",)


def test_load_model_moves_a_healed_blocks_half_sublayers_too(tmp_path):
    # The file holds the block's policy, not its sublayer's (made under the
    # global policy); the healed set in the optimizer's state moves both.
    tf_mixed.enable("mixed_float16")
    name = "restore_test_block"  # Keras renames such a block at a second load
    model = keras.Sequential([keras.Input((2,)), _Block(name=name),
                              keras.layers.Dense(2, name="d")], name="blocks")
    model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
    model.optimizer.build(model.trainable_variables)
    Healer(model, model.optimizer)
    tf_mixed.training.heal_layers(model, [name], model.optimizer)
    path = str(tmp_path / "blocks.keras")
    model.save(path)
    block = keras.saving.load_model(path).get_layer(name)
    assert (block.compute_dtype, block.inner.compute_dtype) == ("float32", "float32")


def test_a_healed_name_the_model_lacks_moves_nothing_and_says_so(tmp_path, caplog):
    path = _saved_healed(tmp_path, ".weights.h5")
    other = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4, name="d1"), Gate(name="renamed"),
         keras.layers.Dense(2, name="d2")], name="renamed_model")
    other.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
    other.optimizer.build(other.trainable_variables)
    other.load_weights(path)                       # the weights load; nothing moves
    assert other.get_layer("renamed").compute_dtype == "float16"
    assert ("names healed layers model 'renamed_model' lacks: ['gate']; they are not "
            "moved") in caplog.text
    assert moves(other) == 0


@pytest.mark.slow  # traces the whole step under two replicas: about 8 s of CPU
@pytest.mark.parametrize("restore", RESTORES[:2])
def test_a_restore_heals_at_once_under_two_replicas(tmp_path, mirrored, restore):
    tf_mixed.enable("mixed_float16")
    with mirrored.scope():
        model = _model()
        Healer(model, model.optimizer)
    tf_mixed.training.heal_layers(model, ["gate"], model.optimizer)
    path = _save(model, tmp_path / "healed", restore)
    with mirrored.scope():
        fresh = _model()
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer,
                                             strategy=mirrored)
    batch = mirrored.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(_data()).batch(8))
    batch = next(iter(batch))
    assert not bool(step(*batch)["applied"])                     # traced in float16
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float32"     # at once
    assert bool(step(*batch)["applied"])                          # traced again
