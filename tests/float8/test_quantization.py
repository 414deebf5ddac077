"""tf_mixed.float8.quantization: the choice of layers, scaling knobs, state, monitor,
lowering, audit, probe.

The multi-replica agreement is in test_float8_agreement.py (and the
two-worker run in test_float8_multi_worker.py).
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from repo_paths import DATA
from zoo import ZOO, reloaded_model

import tf_mixed
from tf_mixed.float8 import lowering as float8_lowering
from tf_mixed.float8 import monitor as float8_monitor
from tf_mixed.float8.reading import fractions
from tf_mixed.scaling import float8_sync
from tf_mixed.scaling import optimizer as loss_scale


def _model(units=(32, 32, 32, 16), features=16, names=("a", "b", "c", "d")):
    inputs = keras.Input((features,))
    h = inputs
    for i, (u, name) in enumerate(zip(units, names)):
        h = keras.layers.Dense(u, name=name,
                               kernel_initializer=keras.initializers.GlorotUniform(i))(h)
    return keras.Model(inputs, h)


def _float8_names(model):
    return [layer.name for layer in model.layers
            if getattr(layer.dtype_policy, "quantization_mode", None) == "float8"]


# ------------------------------------------------------------------ quantize


def test_default_keeps_first_last_and_unaligned_layers_out_and_says_why():
    # b's 24 units are b's output and c's contracted dimension.
    model = _model(units=(32, 24, 32, 32, 16), names=("a", "b", "c", "d", "e"))
    plan = tf_mixed.float8.quantize(model)
    assert plan.quantized == ["d"]
    assert plan.kept == ["a", "b", "c", "e"]
    reasons = {c.layer: c.reason for c in plan.choices}
    assert "first float8-capable layer" in reasons["a"]
    assert "not a multiple of 16" in reasons["b"] and "not a multiple of 16" in reasons["c"]
    assert "last float8-capable layer" in reasons["e"]
    assert _float8_names(model) == ["d"]
    text = str(plan)
    assert "1 of 5 Dense/EinsumDense layers in float8" in text
    assert plan.to_dict()["choices"][3] == {
        "layer": "d", "class_name": "Dense", "float8": True,
        "reason": reasons["d"]}


def test_keep_float32_spec_replaces_the_automatic_rule():
    model = _model()
    plan = tf_mixed.float8.quantize(model, keep_float32=["b", keras.layers.Conv2D])
    assert plan.quantized == ["a", "c", "d"]
    assert _float8_names(model) == ["a", "c", "d"]
    other = _model()
    assert tf_mixed.float8.quantize(other, keep_float32=[]).kept == []


def test_history_length_margin_and_algorithm_are_set():
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[], amax_history_length=16,
                             margin=2, amax_compute_algo="most_recent")
    layer = model.get_layer("b")
    assert layer.inputs_amax_history.shape == (16,)
    assert layer.dtype_policy.amax_history_length == 16
    scaling = float8_sync.scaling_of(layer.outputs_grad_amax_history)
    assert scaling == tf_mixed.float8.quantization.Float8Scaling(2, "most_recent")


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, match", [
    ({"margin": -1}, "margin"),
    ({"margin": 1.5}, "margin"),
    ({"amax_compute_algo": "mean"}, "'max', 'most_recent'"),
    ({"amax_history_length": 0}, "amax_history_length"),
    ({"amax_history_length": True}, "amax_history_length"),
    ({"keep_float32": ["nope"]}, "does not have"),
])
def test_bad_arguments_change_nothing(kwargs, match):
    model = _model()
    with pytest.raises(ValueError, match=match):
        tf_mixed.float8.quantize(model, **kwargs)
    assert _float8_names(model) == []


def test_refuses_what_is_not_a_built_model():
    with pytest.raises(TypeError, match="needs a keras.Model"):
        tf_mixed.float8.quantize("model.keras")
    with pytest.raises(TypeError, match="keep_float32"):
        tf_mixed.float8.quantize(_model(), keep_float32=[3])
    unbuilt = keras.Sequential([keras.layers.Dense(16, name="x"), keras.layers.Dense(16)])
    with pytest.raises(ValueError, match="Layer 'x' of model .* is not built"):
        tf_mixed.float8.quantize(unbuilt)


def test_quantizing_again_keeps_variables_and_takes_the_new_scaling():
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    history = model.get_layer("b").inputs_amax_history
    plan = tf_mixed.float8.quantize(model, margin=1, keep_float32=[])
    assert model.get_layer("b").inputs_amax_history is history
    assert all("already float8" in c.reason for c in plan.choices)
    assert float8_sync.scaling_of(history).margin == 1
    with pytest.raises(ValueError, match="already float8 with an amax history of 1024"):
        tf_mixed.float8.quantize(model, amax_history_length=8)


def _run_steps(model, xs, **wrap):
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0), **wrap)
    step = tf_mixed.training.make_train_step(
        model, lambda y, p: tf.reduce_mean(tf.cast(p, tf.float32)), optimizer)
    for x in xs:
        step(tf.constant(x), tf.zeros((x.shape[0], 16)))
    return optimizer


@pytest.mark.slow
@pytest.mark.parametrize("margin, algo, expected_amax", [
    (0, "max", 4.0), (1, "max", 4.0), (0, "most_recent", 1.0)])
def test_scale_follows_margin_and_algorithm_exactly(margin, algo, expected_amax):
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[], margin=margin,
                             amax_compute_algo=algo)
    # Inputs amax 4, 1, 1: the scale written at step 3 comes from the history
    # before step 3 ([1, 4]) as Keras times it.
    xs = [np.full((4, 16), v, np.float32) for v in (4.0, 1.0, 1.0)]
    _run_steps(model, xs)
    scale = float(model.get_layer("a").inputs_scale.numpy())
    expected = keras.quantizers.compute_float8_scale(
        np.float32(expected_amax), np.float32(1.0), np.float32(448.0), margin=margin)
    assert scale == float(expected)
    assert scale == pytest.approx(expected_amax * 2.0**margin / 448.0, rel=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_quantize_state_and_audit_over_the_zoo(name):
    spec = ZOO[name]
    model = spec.ready()
    plan = tf_mixed.float8.quantize(model, keep_float32=[])
    dense = [c.layer for c in plan.choices]
    assert plan.quantized == dense
    if not dense:
        with pytest.raises(ValueError, match="has no float8 layer"):
            tf_mixed.float8.state(model)
        return
    state = tf_mixed.float8.state(model)
    assert {t.layer for t in state.tensors} == set(dense)
    assert all(t.scale == 1.0 and t.replicas_agree for t in state.tensors)
    codes = {f.code for f in tf_mixed.audit(model).findings}
    assert "float8_keep_higher_precision" in codes
    # One float8 training step with the tf_mixed optimizer, then measured.
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)),
                  loss=spec.loss)
    x, y = spec.data(8)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = tf_mixed.float8.state(model, x, y)
    assert after.measured_examples == 8
    assert all(t.amax > 0 for t in after.tensors if t.tensor != "outputs_grad")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["functional", "nested", "sequential_input"])
def test_quantize_after_reload(name):
    model = reloaded_model(name)
    plan = tf_mixed.float8.quantize(model, keep_float32=[], margin=1)
    assert plan.quantized
    assert tf_mixed.float8.state(model).tensors


@pytest.mark.slow
def test_float8_model_saves_and_loads(tmp_path):
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[], amax_history_length=8)
    _run_steps(model, [np.full((4, 16), 3.0, np.float32)] * 2)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.get_layer("a").inputs_amax_history.numpy(),
                                  model.get_layer("a").inputs_amax_history.numpy())
    plan = tf_mixed.float8.quantize(loaded, keep_float32=[], amax_history_length=8, margin=1)
    assert plan.quantized == ["a", "b", "c", "d"]


# ------------------------------------------------------------------ state


def test_fractions_by_hand():
    x = [0.0, 1e-6, 1.0, 500.0, -1000.0, 0.001]
    # e4m3fn: max 448, smallest subnormal 2**-9 (0.00195); 1e-6 rounds to 0,
    # 0.001 rounds up to 2**-9.
    assert fractions(x, 1.0, "float8_e4m3fn") == (2 / 6, 1 / 6)
    # scale 2: 500/2 fits, 1000/2 does not; 0.001/2 now rounds to 0 too.
    assert fractions(x, 2.0, "float8_e4m3fn") == (1 / 6, 2 / 6)
    # e5m2: max 57344, smallest subnormal 2**-16.
    assert fractions([1e-6, 1e-5, 62000.0, -1e5], 1.0, "float8_e5m2") == (2 / 4, 1 / 4)
    # Saturated means clipped: beyond the largest value plus half the spacing
    # below it (464 = 448 + 16, 61440 = 57344 + 4096), which the cast's
    # rounding would bring back to the largest value anyway.
    assert fractions([450.0, 464.0, 465.0, -470.0], 1.0, "float8_e4m3fn") == (2 / 4, 0.0)
    assert fractions([60000.0, 61440.0, 61441.0], 1.0, "float8_e5m2") == (1 / 3, 0.0)
    assert fractions([], 1.0, "float8_e5m2") == (0.0, 0.0)


def test_state_measures_planted_inputs_and_output_gradients():
    inputs = keras.Input((16,))
    outputs = keras.layers.Dense(16, use_bias=False, kernel_initializer="ones", name="d")(inputs)
    model = keras.Model(inputs, outputs)
    tf_mixed.float8.quantize(model, keep_float32=[])
    x = np.ones((4, 16), np.float32)
    x[0, :3] = 1000.0   # 3 of 64 beyond 448 at scale 1: saturated
    x[1, :2] = 1e-6     # 2 of 64 below half of 2**-9: flushed
    def loss(y, p):
        return tf.reduce_mean(p)

    state = tf_mixed.float8.state(model, x, np.zeros((4, 16), np.float32), loss=loss)
    inputs_state = state.get("d", "inputs")
    assert (inputs_state.saturated, inputs_state.flushed) == (3 / 64, 2 / 64)
    assert state.get("d", "kernel").saturated == 0.0
    grad = state.get("d", "outputs_grad")
    assert (grad.saturated, grad.flushed) == (0.0, 0.0)
    # Scale 2**20: the upstream 2**-6 becomes 2**-26, below half of e5m2's
    # smallest subnormal 2**-16: every value flushes.
    model.get_layer("d").outputs_grad_scale.assign(2.0**20)
    state = tf_mixed.float8.state(model, x, np.zeros((4, 16), np.float32), loss=loss)
    assert state.get("d", "outputs_grad").flushed == 1.0
    assert state.max_flushed == 1.0 and state.max_saturated == 3 / 64
    assert "d      inputs" in str(state)
    assert state.to_dict()["tensors"][0]["layer"] == "d"
    # Nothing of the model was changed by measuring.
    assert "quantized_call" not in vars(model.get_layer("d"))
    assert float(model.get_layer("d").inputs_amax_history.numpy().max()) == 0.0


def test_state_errors():
    with pytest.raises(TypeError, match="needs a keras.Model"):
        tf_mixed.float8.state(None)
    with pytest.raises(ValueError, match="has no float8 layer"):
        tf_mixed.float8.state(_model())
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    with pytest.raises(ValueError, match="y=None"):
        tf_mixed.float8.state(model, np.ones((2, 16)))
    with pytest.raises(ValueError, match="needs a loss"):
        tf_mixed.float8.state(model, np.ones((2, 16)), np.ones((2, 16)))
    with pytest.raises(KeyError, match="Float8 layers"):
        tf_mixed.float8.state(model).get("zz", "inputs")


# ------------------------------------------------------------------ monitor


def _reading(**kwargs):
    base = {"saturating_tensors": 0, "max_overflow": 0.5, "saturated_steps": 0,
            "nonfinite_amax": 0, "streak": 0, "longest_streak": 0}
    base.update(kwargs)
    return tf_mixed.float8.quantization.Float8Saturation(**base)


def test_stop_rule_is_a_pure_function_of_the_reading():
    assert float8_monitor.saturation_verdict(_reading(longest_streak=2), 3) is None
    reason = float8_monitor.saturation_verdict(_reading(longest_streak=3), 3)
    assert "3 consecutive steps" in reason and "margin=1" in reason


def _growing_fit(patience, epochs=1, **monitor_args):
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)),
                  loss="mse")
    # Each batch's inputs are twice the last: the delayed scale (from the
    # history two steps back) is always 4x too small, so every step from
    # the third on saturates.
    x = np.concatenate([np.full((4, 16), 2.0**i, np.float32) for i in range(8)])
    y = np.zeros((32, 16), np.float32)
    monitor = tf_mixed.float8.quantization.Float8Monitor(patience=patience, **monitor_args)
    history = model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False,
                        verbose=0, callbacks=[monitor])
    return model, monitor, history


@pytest.mark.slow
def test_monitor_stops_on_sustained_saturation():
    with pytest.warns(RuntimeWarning, match="saturated for 3 consecutive"):
        model, monitor, history = _growing_fit(patience=3, epochs=3,
                                               check_every_n_batches=1)
    assert monitor.stop_reason is not None and "consecutive" in monitor.stop_reason
    assert len(history.history["loss"]) == 1  # stopped in the first epoch
    reading = float8_monitor.read(loss_scale.float8_sync_of(model.optimizer))
    assert reading.longest_streak >= 3 and reading.max_overflow == pytest.approx(4.0)


@pytest.mark.slow
def test_monitor_logs_floats_and_tolerates_short_saturation():
    model, monitor, history = _growing_fit(patience=100)
    assert monitor.stop_reason is None
    logs = history.history
    for key in ("float8_saturating_tensors", "float8_max_overflow",
                "float8_saturated_steps", "float8_nonfinite_amax"):
        assert isinstance(logs[key][0], float)
    # Steps 3..8 saturate the first layer's inputs: 6 steps.
    state = tf_mixed.float8.state(model).get("a", "inputs")
    assert state.saturated_steps == 6


@pytest.mark.slow
def test_monitor_measures_fractions_with_data():
    x = np.full((4, 16), 1000.0, np.float32)
    _, _, history = _growing_fit(patience=100, data=(x, np.zeros((4, 16), np.float32)))
    assert history.history["float8_max_saturated"][0] > 0.0


def test_monitor_refuses_plain_optimizer_and_plain_model():
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="tf_mixed.wrap_optimizer"):
        model.fit(np.ones((4, 16)), np.ones((4, 16)), verbose=0,
                  callbacks=[tf_mixed.float8.quantization.Float8Monitor()])
    plain = _model()
    plain.compile(optimizer=tf_mixed.wrap_optimizer("sgd"), loss="mse")
    with pytest.raises(ValueError, match="has no float8 layer"):
        plain.fit(np.ones((4, 16)), np.ones((4, 16)), verbose=0,
                  callbacks=[tf_mixed.float8.quantization.Float8Monitor()])
    for kwargs in ({"patience": 0}, {"check_every_n_batches": -1}, {"data": [1, 2, 3]}):
        with pytest.raises(ValueError):
            tf_mixed.float8.quantization.Float8Monitor(**kwargs)
    assert tf_mixed.float8.quantization.Float8Monitor(patience=7).get_config()["patience"] == 7


# ------------------------------------------------------------------ lowering


def _first_mid_last():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(32, name="first"),
                              keras.layers.Dense(32, name="mid"),
                              keras.layers.Dense(16, name="last")])
    model.get_layer("mid").quantize("float8")
    return model


def test_parse_recorded_cpu_hlo_all_emulated():
    text = (DATA / "float8_cpu_optimized_hlo.txt").read_text()
    gemms = float8_lowering.parse_gemms(text)
    # 3 per layer, minus the first layer's input gradient nobody needs.
    assert len(gemms) == 8 and not any(g.float8 for g in gemms)
    report = tf_mixed.float8.quantization.lowering_report(_first_mid_last(), hlo_text=text)
    assert report.verdicts() == {"mid": "emulated"}
    assert report.layers[0].gemms == 3  # forward, input and kernel gradient


def test_parse_gpu_rewritten_hlo_counts_float8_gemms():
    text = (DATA / "float8_gpu_rewritten_hlo.txt").read_text()
    gemms = float8_lowering.parse_gemms(text)
    assert [g.float8 for g in gemms].count(True) == 2
    report = tf_mixed.float8.quantization.lowering_report(_first_mid_last(), hlo_text=text)
    mid = report.layers[0]
    assert (mid.verdict, mid.float8_gemms, mid.gemms) == ("partly float8", 2, 3)
    assert "mid    partly float8 (2 of 3 GEMMs float8)" in str(report)


def test_attribute_prefers_exact_scope():
    attribute = float8_lowering.attribute
    assert attribute("gradient_tape/sequential_1/mid_1/MatMul/MatMul", ["mid"]) == "mid"
    assert attribute("model/dense_1/MatMul", ["dense", "dense_1"]) == "dense_1"
    assert attribute("model/other/MatMul", ["dense"]) is None


def test_lowering_without_gpu_says_emulated(monkeypatch):
    monkeypatch.setattr(float8_lowering.tf.config, "list_logical_devices",
                        lambda kind=None: [])
    report = tf_mixed.float8.quantization.lowering_report(_first_mid_last())
    assert report.verdicts() == {"mid": "emulated (no GPU)"}
    with pytest.raises(ValueError, match="has no float8 layer"):
        tf_mixed.float8.quantization.lowering_report(_model())


# ------------------------------------------------------------------ audit, probe


def test_audit_float8_readiness_findings():
    model = _model(units=(32, 24, 32, 16))
    assert not [f for f in tf_mixed.audit(model).findings if f.code.startswith("float8")]
    report = tf_mixed.audit(model, float8=True)
    share = report.by_code("float8_flop_share")
    assert len(share) == 1 and "100%" in share[0].message
    unaligned = report.by_code("float8_not_multiple_of_16")
    assert [f.layer for f in unaligned] == ["b", "c"] and unaligned[0].severity == "info"
    assert "(32, 24)" in unaligned[0].message and "(32, 32)" in unaligned[0].fix
    assert [f.layer for f in report.by_code("float8_keep_higher_precision")] == ["a", "d"]
    # Once quantized against the advice, the same findings are warnings.
    tf_mixed.float8.quantize(model, keep_float32=[])
    report = tf_mixed.audit(model)
    assert {f.severity for f in report.by_code("float8_keep_higher_precision")} == {"warning"}


def test_audit_flop_share_with_a_convolution():
    inputs = keras.Input((8, 8, 4))
    h = keras.layers.Conv2D(16, 3, padding="same", name="conv")(inputs)
    h = keras.layers.Flatten()(h)
    outputs = keras.layers.Dense(16, name="head")(h)
    model = keras.Model(inputs, outputs)
    # conv: 2 * (8*8*16) * (3*3*4) = 73,728; dense: 2 * 16 * 1024 = 32,768
    share = tf_mixed.audit(model, float8=True).by_code("float8_flop_share")[0]
    assert f"{32768 / (32768 + 73728):.0%}" in share.message


def test_probe_reports_float8_layers():
    inputs = keras.Input((16,))
    h = keras.layers.Dense(32, name="a")(inputs)
    outputs = keras.layers.Dense(16, name="b")(h)
    model = keras.Model(inputs, outputs)
    tf_mixed.float8.quantize(model, keep_float32=[])
    x = np.ones((4, 16), np.float32)
    x[0, 0] = 1000.0
    report = tf_mixed.probe(model, x, np.zeros((4, 16), np.float32), loss="mse",
                            policy="bf16")
    rows = {(t.layer, t.tensor): t for t in report.float8}
    assert rows[("a", "inputs")].saturated == 1 / 64
    assert "Float8, per layer and tensor" in str(report)
    # The per-layer tables compare the unquantized layers under bfloat16.
    assert [layer.name for layer in report.layers] == ["a", "b"]


# ------------------------------------------------------------------ custom loops


def _ones_model():
    inputs = keras.Input((16,))
    outputs = keras.layers.Dense(16, use_bias=False, kernel_initializer="ones", name="d")(inputs)
    model = keras.Model(inputs, outputs)
    tf_mixed.float8.quantize(model, keep_float32=[])
    return model


@pytest.mark.slow
@pytest.mark.parametrize("unscale_first", [False, True])
def test_unscaled_apply_records_the_same_amaxes(unscale_first):
    keras.config.set_dtype_policy("mixed_float16")
    model = _ones_model()
    optimizer = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=2.0**10)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.cast(model(x, training=True), tf.float32))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        if unscale_first:
            optimizer.apply(optimizer.unscale_gradients(grads), model.trainable_variables,
                            unscaled=True)
        else:
            optimizer.apply(grads, model.trainable_variables)

    step(tf.fill((4, 16), 0.5))
    layer = model.get_layer("d")
    assert layer.inputs_amax_history.numpy()[0] == 0.5
    assert layer.outputs_grad_amax_history.numpy()[0] == 2.0**-6


@pytest.mark.slow
def test_gradient_clipping_leaves_float8_state_alone():
    def histories(clip_norm):
        model = _ones_model()
        optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0))
        step = tf_mixed.training.make_train_step(
            model, lambda y, p: tf.reduce_mean(p), optimizer, clip_norm=clip_norm)
        for value in (3.0, 5.0):
            step(tf.fill((4, 16), value), tf.zeros((4, 16)))
        layer = model.get_layer("d")
        return [layer.inputs_amax_history.numpy()[:2].tolist(),
                float(layer.inputs_scale.numpy())]

    clipped, plain = histories(1e-3), histories(None)
    assert clipped == plain
    assert clipped[0] == [5.0, 0.0]  # step 2's amax, unclipped
    assert clipped[1] == pytest.approx(3.0 / 448.0, rel=1e-7)  # from step 1's


@pytest.mark.slow
def test_monitor_under_mirrored_strategy_reads_agreed_counters(mirrored):
    with mirrored.scope():
        model = _model()
        tf_mixed.float8.quantize(model, keep_float32=[])
        model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)),
                      loss="mse")
    x = np.concatenate([np.full((8, 16), 2.0**i, np.float32) for i in range(8)])
    monitor = tf_mixed.float8.quantization.Float8Monitor(patience=3, check_every_n_batches=1)
    with pytest.warns(RuntimeWarning, match="consecutive"):
        model.fit(x, np.zeros((64, 16), np.float32), batch_size=8, epochs=2,
                  shuffle=False, verbose=0, callbacks=[monitor])
    sync = loss_scale.float8_sync_of(model.optimizer)
    copies = [c.numpy() for c in sync.saturated_steps.values]
    np.testing.assert_array_equal(copies[0], copies[1])
    assert monitor.stop_reason is not None
    assert all(t.replicas_agree for t in tf_mixed.float8.state(model).tensors)


def test_gradient_accumulation_with_float8_is_refused():
    model = _ones_model()
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.1),
                                        gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="cannot yet accumulate gradients of a model with float8"):
        optimizer.build(model.trainable_variables)


# ------------------------------------- issue 28: knobs on a trained model, saturation


def _trained_on_ones(steps=2):
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), loss="mse")
    _fit_ones(model, steps)
    return model


def _fit_ones(model, steps):
    # Layer a's inputs have amax 1.0 at every step; SGD(0) keeps the weights.
    x, y = np.ones((4 * steps, 16), np.float32), np.zeros((4 * steps, 16), np.float32)
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0)


def _scale_with_margin(margin):
    # keras.quantizers.compute_float8_scale for amax 1.0, in float32.
    return np.float32(1.0) / (np.float32(448.0) / np.float32(2.0**margin))


@pytest.mark.slow  # several fits (> 3 s of CPU)
def test_margin_set_on_a_trained_model_takes_effect_at_the_next_step():
    model = _trained_on_ones()
    layer = model.get_layer("a")
    assert layer.inputs_scale.numpy() == _scale_with_margin(0)
    tf_mixed.float8.quantize(model, margin=2, keep_float32=[])
    _fit_ones(model, 1)
    assert layer.inputs_scale.numpy() == _scale_with_margin(2)
    tf_mixed.float8.quantize(model, keep_float32=[])  # back to margin 0
    _fit_ones(model, 1)
    assert layer.inputs_scale.numpy() == _scale_with_margin(0)


@pytest.mark.slow  # several fits (> 3 s of CPU)
def test_margin_takes_effect_in_a_step_already_traced():
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0))
    step = tf_mixed.training.make_train_step(
        model, lambda y, p: tf.reduce_mean(tf.cast(p, tf.float32)), optimizer)
    x, y = tf.ones((4, 16)), tf.zeros((4, 16))
    step(x, y)
    step(x, y)
    tf_mixed.float8.quantize(model, margin=3, keep_float32=[], optimizer=optimizer)
    step(x, y)
    assert model.get_layer("a").inputs_scale.numpy() == _scale_with_margin(3)


@pytest.mark.slow
def test_margin_set_again_after_loading_takes_effect(tmp_path):
    model = _trained_on_ones()
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert loaded.optimizer.built  # its float8 scaling read at load
    tf_mixed.float8.quantize(loaded, margin=2, keep_float32=[])
    _fit_ones(loaded, 1)
    assert loaded.get_layer("a").inputs_scale.numpy() == _scale_with_margin(2)


@pytest.mark.slow
def test_an_unchanged_kernel_never_saturates():
    """Scales rounded by one ulp and a kernel a little larger are not clipping."""
    model = _trained_on_ones(steps=6)
    sync = loss_scale.float8_sync_of(model.optimizer)
    reading = float8_monitor.read(sync)
    assert reading.saturated_steps == 0 and reading.longest_streak == 0
    assert reading.saturating_tensors == 0 and reading.max_overflow > 1.0  # rounding
    kernel = model.get_layer("d").kernel  # the last layer: no input grows with it
    kernel.assign(kernel * 1.02)  # grew by less than e4m3's rounding at the top
    _fit_ones(model, 3)
    assert float8_monitor.read(sync).saturated_steps == 0
    kernel.assign(kernel * 1.05)  # beyond it: values are clipped
    _fit_ones(model, 1)
    assert tf_mixed.float8.state(model).get("d", "kernel").saturated_steps == 1
    assert float8_sync.clipping_overflow("kernel") == 464.0 / 448.0
    assert float8_sync.clipping_overflow("outputs_grad") == 61440.0 / 57344.0


def _grow(start, steps, factor=1.5):
    """Batches of 4 whose inputs grow by ``factor`` per step, from factor**start."""
    x = np.concatenate([np.full((4, 16), factor**(start + i), np.float32)
                        for i in range(steps)])
    return x, np.zeros((4 * steps, 16), np.float32)


@pytest.mark.slow
def test_a_new_fit_with_a_new_monitor_starts_fresh():
    with pytest.warns(RuntimeWarning, match="saturated for 3 consecutive"):
        model, first, _ = _growing_fit(patience=3, check_every_n_batches=1)
    assert first.stop_reason is not None
    second = tf_mixed.float8.Float8Monitor(patience=3)
    x, y = np.full((16, 16), 0.5, np.float32), np.zeros((16, 16), np.float32)
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[second])
    assert second.stop_reason is None and not model.stop_training


def _fit_growing(model, start, steps):
    monitor = tf_mixed.float8.Float8Monitor(patience=5, check_every_n_batches=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(*_grow(start, steps), batch_size=4, shuffle=False, verbose=0,
                  callbacks=[monitor])
    advice = [str(w.message) for w in caught if w.category is RuntimeWarning]
    return monitor, advice


@pytest.mark.slow
@pytest.mark.parametrize("margin", [None, 3], ids=["advice-ignored", "advice-applied"])
def test_the_monitors_advice_applied_changes_the_run(margin):
    """Inputs grow 1.5x per step; the delayed scale is 2.25x too small."""
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), loss="mse")
    first, advice = _fit_growing(model, 0, 10)
    assert first.stop_reason is not None
    assert "tf_mixed.float8.quantize(model, margin=1)" in advice[0]
    assert "each unit of margin doubles it" in advice[0]
    if margin is not None:  # 2.25x needs 2**2 of headroom; 2**3 settles faster
        tf_mixed.float8.quantize(model, margin=margin, keep_float32=[])
    done = int(model.optimizer.iterations.numpy())
    second, _ = _fit_growing(model, done, 12)  # the growth goes on
    if margin is None:
        assert second.stop_reason is not None  # a new run of 5, not the old one
        assert int(model.optimizer.iterations.numpy()) == done + 5
    else:
        assert second.stop_reason is None
        assert int(model.optimizer.iterations.numpy()) == done + 12
        assert float8_monitor.read(loss_scale.float8_sync_of(model.optimizer)).streak == 0


@pytest.mark.slow  # several fits (> 3 s of CPU)
def test_a_healthy_run_with_every_dense_in_float8_is_never_stopped():
    """500 steps of Adam on a regression, patience 3, checked after every step."""
    rng = np.random.default_rng(0)
    model = _model()
    tf_mixed.float8.quantize(model, keep_float32=[])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.Adam(1e-3)), loss="mse")
    x = rng.normal(size=(4000, 16)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(16, 16)).astype(np.float32))
    monitor = tf_mixed.float8.Float8Monitor(patience=3, check_every_n_batches=1)
    history = model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[monitor])
    assert monitor.stop_reason is None and not model.stop_training
    assert int(model.optimizer.iterations.numpy()) == 500
    assert history.history["loss"][0] < float(np.mean(y**2))
