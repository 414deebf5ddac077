"""Layer attribution inside the step (tf_mixed.scaling.attribution)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import attribution
from tf_mixed.scaling.attribution import FORWARD, GRADIENT, LayerAttribution


class Square(keras.layers.Layer):
    """A user's layer whose output overflows float16 once |x| > 256."""

    def call(self, x):
        return x * x


def _model(name="m"):
    return keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(4, name="d1", kernel_initializer="ones"),
        Square(name="sq"), keras.layers.Dense(2, name="d2")], name=name)


def _compiled(model, **knobs):
    model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0), **knobs), "mse")
    model.optimizer.build(model.trainable_variables)
    return LayerAttribution.attach(model, model.optimizer)


def test_a_forward_overflow_names_the_layer_that_made_it():
    tf_mixed.enable("mixed_float16")
    model = _model()
    att = _compiled(model)
    x = np.ones((8, 4), "float32")
    x[3] = 100.0                    # d1 gives 400 (fine), sq gives 160000: inf
    model.fit(x, np.zeros((8, 2)), batch_size=8, epochs=1, verbose=0)
    model.fit(np.full((8, 4), 0.1, "float32"), np.zeros((8, 2)), batch_size=8, verbose=0)
    reading = att.read()                       # the applied step added nothing
    assert reading.counts == {"sq": 1}
    assert reading.skips == (attribution.AttributedSkip(1, "sq", FORWARD),)
    assert att.names == ["d1", "sq", "d2"]


def test_a_gradient_overflow_names_the_layer_nearest_the_output():
    tf_mixed.enable("mixed_float16")
    model = _model()
    att = _compiled(model, initial_scale=2.0**24, max_scale=2.0**24)
    # Forward finite (sq ~ 2.5e3), loss ~ 1e7: its scaled gradient overflows
    # float16 at d2's output first, so d2 is named, not a forward output.
    x = np.full((8, 4), 12.5, "float32")
    model.fit(x, np.zeros((8, 2)), batch_size=8, verbose=0)
    reading = att.read()
    assert [(s.layer, s.kind) for s in reading.skips] == [("d2", GRADIENT)]


def test_applied_steps_record_nothing_and_attach_twice_is_the_same():
    tf_mixed.enable("mixed_float16")
    model = _model()
    att = _compiled(model)
    model.fit(np.full((16, 4), 0.1, "float32"), np.zeros((16, 2)), batch_size=8, verbose=0)
    assert att.read() == attribution.AttributionReading({}, (), ())
    assert LayerAttribution.attach(model, model.optimizer) is att
    with pytest.raises(ValueError, match="already attributes"):
        LayerAttribution.attach(_model("other"), model.optimizer)


def test_attach_refuses_what_it_cannot_attribute():
    from tf_mixed.scaling.healing import Healer

    model = _model()
    with pytest.raises(TypeError, match="tf_mixed.LossScaleOptimizer"):
        Healer(model, keras.optimizers.SGD())
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2"):
        LayerAttribution.attach(model, opt)


def test_state_round_trips_through_a_checkpoint_and_a_weights_file(tmp_path):
    tf_mixed.enable("mixed_float16")
    model = _model()
    att = _compiled(model)
    att.assign_saved({"counts": {"sq": 3}, "skips": [[5, "sq", 0]], "healed": ["sq"]})
    path = str(tmp_path / "ckpt")
    saved = tf.train.Checkpoint(optimizer=model.optimizer).save(path)
    model.save_weights(str(tmp_path / "w.weights.h5"))
    for restore in ("checkpoint", "weights"):
        fresh = _model()
        fresh_att = _compiled(fresh)
        if restore == "checkpoint":
            tf.train.Checkpoint(optimizer=fresh.optimizer).restore(saved).expect_partial()
        else:
            fresh.load_weights(str(tmp_path / "w.weights.h5"))
        assert fresh_att.read() == attribution.AttributionReading(
            {"sq": 3}, (attribution.AttributedSkip(5, "sq", 0),), ("sq",)), restore


def test_a_weights_file_read_before_attaching_is_applied_at_attach(tmp_path):
    tf_mixed.enable("mixed_float16")
    model = _model()
    _compiled(model).assign_saved({"healed": ["sq"]})
    model.save_weights(str(tmp_path / "w.weights.h5"))
    fresh = _model()
    fresh.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
    fresh.optimizer.build(fresh.trainable_variables)
    fresh.load_weights(str(tmp_path / "w.weights.h5"))
    assert fresh.optimizer.step_state.attribution.pending_healed() == ("sq",)
    assert LayerAttribution.attach(fresh, fresh.optimizer).read().healed == ("sq",)


@pytest.mark.slow
def test_under_two_replicas_an_overflow_on_the_second_is_named_on_both(mirrored):
    tf_mixed.enable("mixed_float16")
    with mirrored.scope():
        model = _model("mirrored_attribution")
        att = _compiled(model)
    x = np.ones((8, 4), "float32")
    x[6] = 100.0                    # in replica 1's half of the batch only
    model.fit(x, np.zeros((8, 2)), batch_size=8, epochs=1, verbose=0, shuffle=False)
    copies = [np.asarray(v) for v in mirrored.experimental_local_results(att.state.counts.value)]
    assert [c.tolist() for c in copies] == [[0, 1, 0], [0, 1, 0]]
    assert att.read().skips == (attribution.AttributedSkip(1, "sq", FORWARD),)
