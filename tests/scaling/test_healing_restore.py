"""A restored checkpoint applies the healed map it holds, however the model trains:
``fit``, ``make_train_step``, a hand-written loop; before or after its step is built."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.policy import precision_map
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


def _saved_healed(tmp_path) -> str:
    """A checkpoint of a model whose 'gate' was healed."""
    tf_mixed.enable("mixed_float16")
    model = _model()
    Healer(model, model.optimizer)
    tf_mixed.training.heal_layers(model, ["gate"], model.optimizer)
    assert model.get_layer("gate").compute_dtype == "float32"
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
        str(tmp_path / "ckpt"))


def _restore(model, path) -> None:
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(path).expect_partial()


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
def test_a_hand_written_loop_restored_before_its_first_trace_computes_healed(tmp_path):
    path = _saved_healed(tmp_path)
    fresh = _model()
    Healer(fresh, fresh.optimizer)             # attach, as docs/healing.md says
    opt = fresh.optimizer

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            pred = tf.cast(fresh(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.square(pred - y))
        return tf_mixed.training.apply_scaled_gradients(
            tape, loss, fresh.trainable_variables, opt)

    assert fresh.get_layer("gate").compute_dtype == "float16"
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float32"     # at once
    assert fresh.get_layer("d2").compute_dtype == "float16"
    assert opt.step_state.attribution.attached.read().healed == ("gate",)
    assert bool(step(*_data()))                                   # applied: no overflow


@pytest.mark.slow  # 6.8 s of CPU: it traces the whole step twice
def test_make_train_step_built_before_the_restore_retraces_healed(tmp_path):
    path = _saved_healed(tmp_path)
    fresh = _model()
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer, heal=True)
    assert not bool(step(*_data())["applied"])                   # traced in float16
    _restore(fresh, path)
    out = step(*_data())
    assert bool(out["applied"]) and float(out["healed_layers"]) == 1.0


def test_make_train_step_built_after_the_restore_computes_healed(tmp_path):
    path = _saved_healed(tmp_path)
    fresh = _model()
    Healer(fresh, fresh.optimizer)
    _restore(fresh, path)
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer, heal=True)
    assert bool(step(*_data())["applied"])


def test_fit_after_a_restore_runs_healed_though_its_functions_were_traced(tmp_path):
    path = _saved_healed(tmp_path)
    fresh = _model()
    heal_callback = tf_mixed.callbacks.Heal()
    x, y = _data()
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[heal_callback])
    assert np.isnan(fresh.evaluate(x, y, verbose=0))             # traced in float16
    _restore(fresh, path)
    assert fresh.get_layer("gate").compute_dtype == "float32"
    assert np.isfinite(fresh.evaluate(x, y, verbose=0))          # retraced healed
    assert np.isfinite(fresh.predict(x, verbose=0)).all()
    skipped = fresh.optimizer.loss_scale_state().skipped_steps
    fresh.fit(x, y, batch_size=8, epochs=1, verbose=0)            # no Heal callback needed
    assert fresh.optimizer.loss_scale_state().skipped_steps == skipped


def test_a_checkpoint_restored_before_healing_is_attached_applies_when_it_is(tmp_path):
    path = _saved_healed(tmp_path)
    fresh = _model()
    _restore(fresh, path)                       # nothing attached yet: deferred
    assert fresh.get_layer("gate").compute_dtype == "float16"
    step = tf_mixed.training.make_train_step(fresh, "mse", fresh.optimizer, heal=True)
    assert fresh.get_layer("gate").compute_dtype == "float32"
    assert bool(step(*_data())["applied"])
