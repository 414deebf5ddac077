"""A healed set matches a layer Keras renamed at the load (docs/healing.md).

A layer a model makes in its ``__init__`` without a name takes its name from
Keras's process-wide counter: ``block`` in one model, ``block_1`` in the next
made in the same process, and a ``.keras`` file's config does not hold it. A
healed set saved under one name must still move that layer, on every restore
path, and nothing else."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling.healed_set import moves
from tf_mixed.scaling.healing import Healer

PACKAGE = "test_healing_renamed"


@keras.saving.register_keras_serializable(package=PACKAGE)
class Block(keras.layers.Layer):
    """Dense, then x^2 / (1 + x^2): NaN in float16 once |x| > 256 (inf / inf)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(4, kernel_initializer="ones")

    def build(self, shape):
        self.inner.build(shape)

    def call(self, x):
        h = self.inner(x)
        return h * h / (1.0 + h * h)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Net(keras.Model):
    """Its layers are made in ``__init__`` without names: renamed at each load."""

    def __init__(self, blocks=1, **kwargs):
        super().__init__(**kwargs)
        self.blocks = blocks
        self.stack = [Block() for _ in range(blocks)]
        self.head = keras.layers.Dense(2)

    def call(self, x):
        for block in self.stack:
            x = block(x)
        return self.head(x)

    def get_config(self):
        return {**super().get_config(), "blocks": self.blocks}


def _net(blocks=1, strategy=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        model = Net(blocks)
        model(np.zeros((1, 4), "float32"))
        model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
        model.optimizer.build(model.trainable_variables)
    return model


def _data():
    x = np.full((8, 4), 0.1, "float32")
    x[0] = 100.0                   # the block's Dense gives 400: float16 overflows
    return x, np.zeros((8, 2), "float32")


def _saved(tmp_path, restore, blocks=1, healed=-1, strategy=None):
    """A ``Net`` whose block ``healed`` was healed, saved; (path, its block names)."""
    tf_mixed.enable("mixed_float16")
    model = _net(blocks, strategy)
    with (strategy or tf.distribute.get_strategy()).scope():
        Healer(model, model.optimizer)
    name = model.stack[healed].name
    tf_mixed.training.heal_layers(model, [name], model.optimizer)
    stem = tmp_path / "net"
    if restore == "checkpoint":
        path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(str(stem))
    elif restore == ".keras":
        path = f"{stem}.keras"
        model.save(path)
    else:
        path = f"{stem}.weights.h5"
        model.save_weights(path)
    return path, [block.name for block in model.stack]


def _restore(model, path):
    if path.endswith((".keras", ".weights.h5")):
        model.load_weights(path)
    else:
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(path).expect_partial()


def _dtypes(model):
    return [(b.compute_dtype, b.inner.compute_dtype) for b in model.stack] + [
        model.head.compute_dtype]


HEALED = [("float32", "float32"), "float16"]


def test_load_model_twice_of_the_same_file_heals_the_renamed_block(tmp_path, caplog):
    path, saved = _saved(tmp_path, ".keras")
    first = keras.saving.load_model(path)
    second = keras.saving.load_model(path)
    names = {saved[0], first.stack[0].name, second.stack[0].name}
    assert len(names) == 3                                    # Keras renamed it each time
    assert _dtypes(first) == _dtypes(second) == HEALED
    assert "lacks" not in caplog.text
    assert moves(second) == 1


@pytest.mark.parametrize("restore", ["checkpoint", ".weights.h5", ".keras"])
def test_every_restore_path_heals_the_renamed_block_and_nothing_else(tmp_path, restore,
                                                                     caplog):
    path, saved = _saved(tmp_path, restore)
    fresh = _net()
    assert fresh.stack[0].name != saved[0]
    _restore(fresh, path)
    assert _dtypes(fresh) == HEALED
    assert "lacks" not in caplog.text
    # Attached later, healing reads the layer as healed and moves nothing again.
    healer = Healer(fresh, fresh.optimizer)
    assert healer.healed == (fresh.stack[0].name,)
    assert healer.reapply() == ()


@pytest.mark.parametrize("restore", ["checkpoint", ".weights.h5"])
def test_an_attached_healer_takes_the_renamed_blocks_state(tmp_path, restore):
    path, _ = _saved(tmp_path, restore)
    fresh = _net()
    healer = Healer(fresh, fresh.optimizer)
    _restore(fresh, path)
    assert _dtypes(fresh) == HEALED
    assert healer.healed == (fresh.stack[0].name,)


def test_two_renamed_blocks_match_by_position_where_the_file_holds_the_order(tmp_path):
    # A .weights.h5 entry holds every attributed name in order: the second block.
    path, saved = _saved(tmp_path, ".weights.h5", blocks=2, healed=1)
    fresh = _net(2)
    _restore(fresh, path)
    assert _dtypes(fresh) == [("float16", "float16"), ("float32", "float32"), "float16"]


def test_two_renamed_blocks_are_never_guessed_between(tmp_path, caplog):
    # A checkpoint's healed map holds the healed names alone: either block
    # could be the one, so neither moves and the warning names both.
    path, saved = _saved(tmp_path, "checkpoint", blocks=2, healed=1)
    fresh = _net(2)
    _restore(fresh, path)
    assert _dtypes(fresh) == [("float16", "float16")] * 2 + ["float16"]
    candidates = [block.name for block in fresh.stack]
    assert f"names healed layer {saved[1]!r}" in caplog.text
    assert f"could hold under any of {candidates}" in caplog.text
    assert moves(fresh) == 0


def test_resolve_matches_by_name_then_position_then_the_unique_renamed_layer():
    from tf_mixed.scaling.healed_set import Resolution, resolve

    tf_mixed.enable("mixed_float16")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="d"),
                              keras.layers.Dense(2, name="e_3"),
                              keras.layers.Dense(2, name="f_1"),
                              keras.layers.Dense(2, name="f_2")])
    assert resolve(model, ["d", "e", "f", "g"]) == Resolution(
        {"d": "d", "e": "e_3"}, ["g"], {"f": ["f_1", "f_2"]})
    # A name the model holds is its own, never another's candidate.
    assert resolve(model, ["f_1", "f_7"]).names == {"f_1": "f_1", "f_7": "f_2"}
    # Two saved names wanting one layer: neither gets it.
    assert resolve(model, ["e_1", "e_2"]).ambiguous == {"e_1": ["e_3"], "e_2": ["e_3"]}
    # The saved order, when it matches part by part, settles it by position.
    assert resolve(model, ["f_9"], order=["d", "e", "f_8", "f_9"]).names == {"f_9": "f_2"}
    # An order of another model is not used.
    assert resolve(model, ["f_9"], order=["d", "f_8", "f_9"]).ambiguous == {
        "f_9": ["f_1", "f_2"]}


def test_resolve_matches_a_nested_models_renamed_layer_part_by_part():
    from tf_mixed.scaling.healed_set import resolve

    inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="block_4")],
                             name="encoder_2")
    model = keras.Sequential([keras.Input((2,)), inner, keras.layers.Dense(2, name="block")])
    assert resolve(model, ["encoder/block_1"]).names == {"encoder/block_1": "encoder_2/block_4"}
    assert resolve(model, ["block_3"]).names == {"block_3": "block"}


@pytest.mark.slow  # traces the whole step twice: about 7 s of CPU
def test_make_train_step_and_a_hand_written_loop_after_a_renamed_load_compute_healed(tmp_path):
    path, _ = _saved(tmp_path, ".keras")
    loaded = keras.saving.load_model(path)
    step = tf_mixed.training.make_train_step(loaded, "mse", loaded.optimizer)
    assert bool(step(*_data())["applied"])

    @tf.function
    def loop_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(loaded(x, training=True), tf.float32) - y))
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, loaded.trainable_variables, loaded.optimizer)

    assert bool(loop_step(*_data()))


@pytest.mark.slow  # traces fit's step: about 5 s of CPU
def test_fit_after_a_renamed_load_applies_every_step(tmp_path):
    path, _ = _saved(tmp_path, ".keras")
    keras.saving.load_model(path)
    loaded = keras.saving.load_model(path)
    loaded.fit(*_data(), batch_size=8, epochs=2, verbose=0)
    assert loaded.optimizer.loss_scale_state().skipped_steps == 0


@pytest.mark.slow  # traces the whole step under two replicas: about 8 s of CPU
def test_a_renamed_block_heals_under_two_replicas(tmp_path, mirrored):
    path, saved = _saved(tmp_path, ".weights.h5", strategy=mirrored)
    fresh = _net(strategy=mirrored)
    assert fresh.stack[0].name != saved[0]
    _restore(fresh, path)
    assert _dtypes(fresh) == HEALED
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer,
                                             strategy=mirrored)
    batch = next(iter(mirrored.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(_data()).batch(8))))
    assert bool(step(*batch)["applied"])
