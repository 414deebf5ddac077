"""A checkpoint of the optimizer alone (``tf.train.Checkpoint(optimizer=opt)``):
its healed set moves the layers of the model the optimizer trains as soon as
that model is known, a step refuses to run while it is not, and the
attribution's counters restored with nothing attached are kept
(docs/healing.md)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling.healed_set import moves
from tf_mixed.scaling.healing import Healer


@keras.saving.register_keras_serializable(package="test_healing_optimizer_alone")
class Gate(keras.layers.Layer):
    """x^2 / (1 + x^2): bounded, but NaN in float16 once |x| > 256 (inf / inf)."""

    def call(self, x):
        squared = x * x
        return squared / (1.0 + squared)


def _model(compiled=True, strategy=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(4, name="d1", kernel_initializer="ones"),
             Gate(name="gate"), keras.layers.Dense(2, name="d2")], name="alone_model")
        optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0))
        if compiled:
            model.compile(optimizer, "mse")
        optimizer.build(model.trainable_variables)
    return model, optimizer


def _data():
    x = np.full((8, 4), 0.1, "float32")
    x[0] = 100.0                    # d1 gives 400: the gate overflows float16
    return x, np.zeros((8, 2), "float32")


def _saved(tmp_path, counts=(0, 0, 0), strategy=None) -> str:
    """A checkpoint of an optimizer alone whose model healed 'gate'."""
    tf_mixed.enable("mixed_float16")
    model, optimizer = _model(strategy=strategy)
    with (strategy or tf.distribute.get_strategy()).scope():
        healer = Healer(model, optimizer)
    healer.attribution.state.counts.assign(np.array(counts, np.int64))
    tf_mixed.training.heal_layers(model, ["gate"], optimizer)
    return tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "opt"))


def _read(optimizer, path):
    tf.train.Checkpoint(optimizer=optimizer).read(path).expect_partial()


def _gate(model):
    return model.get_layer("gate").compute_dtype


def _loop(model, optimizer):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.cast(model(x, training=True), tf.float32) - y))
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, model.trainable_variables, optimizer)
    return step


def test_a_model_called_before_the_restore_heals_at_once(tmp_path, caplog):
    path = _saved(tmp_path)
    model, optimizer = _model()
    model(_data()[0])                       # the model this optimizer trains, called
    _read(optimizer, path)
    assert (_gate(model), model.get_layer("d2").compute_dtype) == ("float32", "float16")
    assert moves(model) == 1
    assert "moved layers ['gate'] to float32 compute" in caplog.text


def test_a_model_never_called_heals_at_its_first_call(tmp_path, caplog):
    path = _saved(tmp_path)
    model, optimizer = _model()
    _read(optimizer, path)
    assert _gate(model) == "float16"       # no model known yet: it waits, and says so
    assert "holds healed layers ['gate'], and no model was restored with it" in caplog.text
    assert np.isfinite(model(_data()[0]).numpy()).all()    # its first call moved the gate
    assert _gate(model) == "float32" and moves(model) == 1


@pytest.mark.slow  # traces the whole step: about 5 s of CPU
def test_a_hand_written_loop_over_the_compiled_model_steps_healed(tmp_path):
    path = _saved(tmp_path)
    model, optimizer = _model()
    _read(optimizer, path)
    assert bool(_loop(model, optimizer)(*_data()))   # the trace's model call moved it
    assert _gate(model) == "float32"


def _skips(optimizer) -> int:
    return sum(optimizer.loss_scale_state().skip_reasons)


@pytest.mark.slow  # traces fit's step twice: about 6 s of CPU
def test_fit_after_an_optimizer_alone_trains_healed_traced_or_not(tmp_path):
    path = _saved(tmp_path)
    x, y = _data()
    never, optimizer = _model()
    _read(optimizer, path)
    never.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert _skips(optimizer) == 0 and _gate(never) == "float32"
    traced, optimizer = _model()
    traced.fit(x, y, batch_size=8, epochs=1, verbose=0)    # traced in float16: skips
    assert np.isnan(traced.evaluate(x, y, verbose=0))
    skipped = _skips(optimizer)
    assert skipped >= 1
    _read(optimizer, path)
    restored = _skips(optimizer)                            # the checkpoint's own counts
    assert _gate(traced) == "float32"
    assert np.isfinite(traced.evaluate(x, y, verbose=0))    # traced again, healed
    traced.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert _skips(optimizer) == restored                    # no step skipped since


def test_make_train_step_moves_the_set_though_the_model_is_not_compiled(tmp_path):
    path = _saved(tmp_path)
    model, optimizer = _model(compiled=False)
    _read(optimizer, path)
    step = tf_mixed.training.make_train_step(model, "mse", optimizer)
    assert _gate(model) == "float32"
    assert bool(step(*_data())["applied"])


def test_a_hand_written_step_with_no_model_known_refuses(tmp_path):
    path = _saved(tmp_path)
    model, optimizer = _model(compiled=False)
    _read(optimizer, path)
    with pytest.raises(ValueError, match=r"holds healed layers \['gate'\].*no model has "
                       r"taken them.*would train them in half precision"):
        _loop(model, optimizer)(*_data())
    assert int(optimizer.iterations.numpy()) == 0
    Healer(model, optimizer)                 # attaching healing moves it
    assert _gate(model) == "float32"
    assert bool(_loop(model, optimizer)(*_data()))


def test_counters_restored_with_nothing_attached_are_saved_again_and_handed_over(tmp_path):
    path = _saved(tmp_path, counts=(0, 3, 0))
    model, optimizer = _model()
    _read(optimizer, path)                   # nothing attached
    again = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "again"))
    keys = [key for key, _ in tf.train.list_variables(again)]
    assert any("layer_attribution/counts" in key for key in keys), keys
    last, optimizer = _model()
    _read(optimizer, again)
    healer = Healer(last, optimizer)
    assert healer.attribution.read().counts == {"gate": 3}
    assert healer.healed == ("gate",) and _gate(last) == "float32"


def test_counters_with_the_model_in_the_checkpoint_are_kept_too(tmp_path):
    tf_mixed.enable("mixed_float16")
    model, optimizer = _model()
    Healer(model, optimizer).attribution.state.counts.assign(np.array([2, 0, 0], np.int64))
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "m"))
    middle, optimizer = _model()
    tf.train.Checkpoint(model=middle, optimizer=optimizer).read(path).expect_partial()
    again = tf.train.Checkpoint(model=middle, optimizer=optimizer).write(str(tmp_path / "a"))
    last, optimizer = _model()
    tf.train.Checkpoint(model=last, optimizer=optimizer).read(again).expect_partial()
    assert Healer(last, optimizer).attribution.read().counts == {"d1": 2}


def test_counters_of_another_model_are_refused_when_healing_attaches(tmp_path):
    tf_mixed.enable("mixed_float16")
    model, optimizer = _model()
    Healer(model, optimizer).attribution.state.counts.assign(np.array([0, 3, 0], np.int64))
    path = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "counted"))
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="a"),
                              keras.layers.Dense(2, name="b")], name="other")
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0))
    other.compile(optimizer, "mse")
    optimizer.build(other.trainable_variables)
    _read(optimizer, path)
    with pytest.raises(ValueError, match=r"counts 3 layers; model 'other' attributes 2"):
        Healer(other, optimizer)


def test_an_optimizer_never_healed_read_and_saved_writes_nothing_new(tmp_path):
    tf_mixed.enable("mixed_float16")
    model, optimizer = _model()
    path = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "plain"))
    fresh, optimizer = _model()
    tf.train.Checkpoint(optimizer=optimizer).read(path).assert_consumed()
    again = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "again"))
    assert not [key for key, _ in tf.train.list_variables(again) if "layer_attribution" in key]
    assert optimizer.step_state.attribution.unapplied is None
    assert moves(fresh) == 0


@pytest.mark.slow  # traces the whole step under two replicas: about 8 s of CPU
def test_an_optimizer_alone_heals_under_two_replicas(tmp_path, mirrored):
    path = _saved(tmp_path, strategy=mirrored)
    model, optimizer = _model(compiled=False, strategy=mirrored)
    _read(optimizer, path)
    step = tf_mixed.training.make_train_step(model, "mse", optimizer, strategy=mirrored)
    batch = next(iter(mirrored.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(_data()).batch(8))))
    assert _gate(model) == "float32"
    assert bool(step(*batch)["applied"])
