"""tf_mixed.probe: the layer that breaks, the loss scale, and the command line."""

import json
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.cli import probe as bench_probe
from tf_mixed.training import apply_scaled_gradients

U16 = 2.0**-11  # float16 unit roundoff (10 stored mantissa bits, round to nearest)


@keras.saving.register_keras_serializable(package="tf_mixed_tests")
class L2Norm(keras.layers.Layer):
    """The L2 norm of the activations (/1000): sums squares, which overflow float16."""

    def call(self, x):
        return keras.ops.sqrt(keras.ops.sum(keras.ops.square(x), axis=-1, keepdims=True)) / 1000.0


def _planted():
    """Activations around 300 feed L2Norm: 16 squares of ~300 sum to ~1.5e6 > 65504."""
    init = keras.initializers.GlorotUniform(seed=1)
    inputs = keras.Input((16,))
    h = keras.layers.Dense(16, kernel_initializer="identity", name="proj")(inputs)
    h = L2Norm(name="l2norm")(h)
    h = keras.layers.Dense(1, kernel_initializer=init, name="head")(h)
    return keras.Model(inputs, tf_mixed.Float32Output(name="out")(h), name="planted")


def _planted_batch():
    rng = np.random.default_rng(0)
    return rng.uniform(250, 350, (32, 16)).astype("float32"), np.ones((32, 1), "float32")


def _healthy(hidden=16):
    init = keras.initializers.GlorotUniform
    inputs = keras.Input((8,))
    h = keras.layers.Dense(hidden, activation="relu", kernel_initializer=init(seed=2),
                           name="d1")(inputs)
    h = keras.layers.Dense(1, kernel_initializer=init(seed=3), name="d2")(h)
    return keras.Model(inputs, tf_mixed.Float32Output(name="out")(h), name="healthy")


def _healthy_batch():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 8)).astype("float32")
    return x, (x[:, :1] * 0.5 + 0.1).astype("float32")


def _train_step(model, optimizer, x, y, loss_fn):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return apply_scaled_gradients(tape, loss, model.trainable_variables, optimizer)
    return step


@pytest.mark.slow
def test_planted_overflow_is_named_and_keep_float32_fixes_the_step():
    x, y = _planted_batch()
    model = _planted()  # float32-built: probed as mixed_float16
    report = tf_mixed.probe(model, x, y, loss="mse")
    print(report)
    assert report.policy == "mixed_float16"
    assert (report.first_nonfinite, report.first_nonfinite_in) == ("l2norm", "forward")
    rows = {row.name: row for row in report.layers}
    assert rows["proj"].nonfinite == 0 and rows["l2norm"].nonfinite == 1.0
    assert math.isfinite(rows["l2norm"].float32_max_abs)  # float32 is fine
    assert "keep_float32=['l2norm']" in report.advice
    assert report.advice.count(".") >= 1 and "\n" not in report.advice

    def step_applied(keep):
        tf_mixed.enable("mixed_float16", quiet=True, keep_float32=keep)
        mixed = _planted()
        mixed.set_weights(model.get_weights())
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                          initial_scale=report.recommended_scale)
        applied = bool(_train_step(mixed, opt, x, y, keras.losses.MeanSquaredError())())
        return applied, mixed

    applied, mixed = step_applied(["l2norm"])
    assert mixed.get_layer("l2norm").compute_dtype == "float32"
    assert applied, "with l2norm in float32 the same batch must train"
    assert all(np.isfinite(w).all() for w in mixed.get_weights())
    assert not np.allclose(mixed.get_layer("head").get_weights()[0],
                           model.get_layer("head").get_weights()[0])
    applied, _ = step_applied(())
    assert not applied, "without keep_float32 the step must be skipped"
    # The fixed model probes clean.
    fixed = tf_mixed.probe(mixed, x, y, loss="mse")
    assert fixed.first_nonfinite is None
    assert {r.name: r.compute_dtype for r in fixed.layers}["l2norm"] == "float32"


@pytest.mark.slow
def test_tiny_loss_gets_a_large_recommended_scale():
    x, y = _healthy_batch()
    model = _healthy()
    mse = keras.losses.MeanSquaredError()
    normal = tf_mixed.probe(model, x, y, loss=mse)
    tiny = tf_mixed.probe(model, x, y, loss=lambda t, p: 1e-7 * mse(t, p))
    print(f"recommended: loss {normal.recommended_scale:g}, loss*1e-7 {tiny.recommended_scale:g}")
    assert tiny.recommended_scale >= 2.0**20
    # Gradients are 1e-7 = 2^-23.25 times smaller, so the scale is 2^23 or 2^24 larger.
    assert math.log2(tiny.recommended_scale / normal.recommended_scale) in (23.0, 24.0)
    # At the default 2^15 the tiny gradients underflow; at the recommended scale far fewer.
    lost_now = sum(v.zero_at_current + v.subnormal_at_current for v in tiny.variables)
    lost_rec = sum(v.zero_at_recommended + v.subnormal_at_recommended for v in tiny.variables)
    assert lost_rec < lost_now


@pytest.mark.slow
def test_recommended_scale_matches_dynamic_scaling_after_200_steps():
    x, y = _healthy_batch()
    model = _healthy()
    mse = keras.losses.MeanSquaredError()
    recommended = tf_mixed.probe(model, x, y, loss=mse).recommended_scale

    tf_mixed.enable("mixed_float16", quiet=True)
    mixed = _healthy()
    mixed.set_weights(model.get_weights())
    # growth_interval=5: the scale can double 40 times in 200 steps, far more
    # than the distance from 2^15 to the equilibrium, where it alternates
    # between the largest non-overflowing power of two S* (grows after 5
    # finite steps) and 2 S* (overflows, halves back). A small learning rate
    # keeps the gradients, and so S*, close to those the probe measured (at
    # 1e-3 the loss falls enough in 200 steps to let the scale reach 4 S*).
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1e-4), initial_scale=2.0**15,
                                      growth_interval=5)
    step = _train_step(mixed, opt, x, y, mse)
    for _ in range(200):
        step()
    reached = float(opt.dynamic_scale.numpy())
    print(f"probe recommends 2^{math.log2(recommended):g}; dynamic scaling reached "
          f"2^{math.log2(reached):g} after 200 steps")
    assert recommended / 4 <= reached <= recommended * 4


@pytest.mark.slow
@pytest.mark.parametrize("half_gradients", [True, False])
def test_gradient_overflow_at_the_current_scale_is_named_measured_or_predicted(half_gradients):
    x, y = _healthy_batch()
    mse = keras.losses.MeanSquaredError()
    report = tf_mixed.probe(_healthy(), x, y, loss=lambda t, p: 1e3 * mse(t, p),
                            half_gradients=half_gradients)
    assert report.half_gradients == ("measured" if half_gradients else "predicted")
    assert all(row.nonfinite == 0 for row in report.layers)
    # d(loss)/d(d2 output) ~ 1e3 * 2 * 0.7 / 64 ~ 20; times 2^15 it overflows
    # float16, and d2 is the layer nearest the loss whose output is float16.
    assert (report.first_nonfinite, report.first_nonfinite_in) == ("d2", "backward")
    assert report.recommended_scale < report.current_scale == 2.0**15
    assert f"initial_scale=2**{int(math.log2(report.recommended_scale))}" in report.advice


def test_dense_relative_error_is_within_float16_rounding():
    n = 64
    rng = np.random.default_rng(3)
    x = rng.normal(size=(128, n)).astype("float32")
    inputs = keras.Input((n,))
    out = keras.layers.Dense(32, bias_initializer="random_normal", name="dense")(inputs)
    model = keras.Model(inputs, out)
    report = tf_mixed.probe(model, x, np.zeros((128, 32), "float32"), loss="mse")
    error = {r.name: r for r in report.layers}["dense"].rel_error
    kernel, bias = (w.astype(np.float64) for w in model.get_layer("dense").get_weights())
    exact = x.astype(np.float64) @ kernel + bias
    # float16 y = fl(sum_i fl(x_i) fl(W_ij) + fl(b_j)): x, W and b are rounded
    # (relative error <= u each), the n+1 terms summed with at most n
    # roundings, and the result rounded once: |y^ - y| <= gamma_{n+4}
    # (|x||W| + |b|) entrywise, gamma_k = k u / (1 - k u) (Higham, ch. 3).
    gamma = (n + 4) * U16 / (1 - (n + 4) * U16)
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(kernel) + np.abs(bias)
    bound = gamma * np.linalg.norm(magnitude) / np.linalg.norm(exact)
    # The typical error: the same roundings of x, W, b and y with an exact sum
    # (what a float32 accumulator gives), simulated in float64.
    f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    rounded = f16(f16(x) @ f16(kernel) + f16(bias))
    typical = np.linalg.norm(rounded - exact) / np.linalg.norm(exact)
    print(f"Dense relative error {error:.3g}; float16 rounding: worst case {bound:.3g}, "
          f"typical {typical:.3g}; u = {U16:.3g}")
    assert error <= bound
    assert error >= typical / 2  # it really ran in float16


@pytest.mark.slow
def test_report_value_object_and_model_untouched(tmp_path):
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, name="dense")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    model = keras.Model(inputs, keras.layers.Dense(2, name="logits")(h), name="bn_model")
    before = [w.copy() for w in model.get_weights()]
    x = np.random.default_rng(0).normal(size=(20, 6)).astype("float32")
    report = tf_mixed.probe(model, x, np.zeros(20, "int32"),
                            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            policy="bf16", batches=2)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert model.get_layer("dense").compute_dtype == "float32"
    assert report.policy == "mixed_bfloat16" and report.batches == 2 and report.examples == 20
    assert [r.name for r in report.layers] == ["dense", "bn", "logits"]
    audit_names = {row.name for row in tf_mixed.audit(model).rows}
    assert {r.name for r in report.layers} <= audit_names
    assert {v.name for v in report.variables} == {
        "dense/kernel", "dense/bias", "bn/gamma", "bn/beta", "logits/kernel", "logits/bias"}
    json.dumps(report.to_dict())
    text = str(report)
    # bfloat16 has float32's range: no loss scale is recommended (issue 44).
    assert "bn/gamma" in text and "no loss scaling is needed" in text
    assert "recommended initial" not in text
    png = report.plot(str(tmp_path / "p.png"))
    assert png[:4] == b"\x89PNG" and os.path.getsize(tmp_path / "p.png") == len(png)


@pytest.mark.slow
@pytest.mark.parametrize("call, error, match", [
    (lambda m, x, y: tf_mixed.probe("model.keras", x, y, loss="mse"), TypeError, "keras.Model"),
    (lambda m, x, y: tf_mixed.probe(keras.Sequential([keras.layers.Dense(1)]), x, y, loss="mse"),
     ValueError, "not built"),
    (lambda m, x, y: tf_mixed.probe(m, x[:, :5], y, loss="mse"),
     ValueError, r"does not fit.*\(32, 5\)"),
    (lambda m, x, y: tf_mixed.probe(m, x, None, loss="mse"), ValueError, "y is missing"),
    (lambda m, x, y: tf_mixed.probe(m, x, y), ValueError, "needs a loss"),
    (lambda m, x, y: tf_mixed.probe(m, x, y, loss="mse", batches=0), ValueError, "batches"),
    (lambda m, x, y: tf_mixed.probe(m, x, y, loss="mse", batches=33), ValueError, "33"),
    (lambda m, x, y: tf_mixed.probe(m, x, y, loss="mse", policy="fp32"), ValueError, "fp32"),
])
def test_bad_input(call, error, match):
    x, y = _planted_batch()
    with pytest.raises(error, match=match):
        call(_planted(), x, y)


# ------------------------------------------------------------------ command line


def _saved(tmp_path):
    path = str(tmp_path / "planted.keras")
    _planted().save(path)
    x, y = _planted_batch()
    npz = str(tmp_path / "batch.npz")
    np.savez(npz, x=x, y=y)
    return path, npz


def test_cli_writes_table_json_and_png(tmp_path, capsys):
    path, npz = _saved(tmp_path)
    out = tmp_path / "out"
    code = bench_probe.main(["tf_mixed probe", path, f"--dataset=npz:{npz}", "--loss=mse",
                             "--batch_size=16", "--batches=2", f"--output_dir={out}"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "keep_float32=['l2norm']" in printed
    record = json.loads((out / "probe.json").read_text())
    assert record["report"]["first_nonfinite"] == "l2norm"
    assert record["report"]["examples"] == 32
    assert (out / "probe.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(out)) == ["probe.json", "probe.png"]


@pytest.mark.slow
def test_cli_runs_on_bench_data(tmp_path, capsys):
    from tf_mixed.bench import models

    path = str(tmp_path / "mlp.keras")
    models.build("mlp", (16, 16, 3), 10).save(path)
    out = tmp_path / "out"
    code = bench_probe.main(["tf_mixed probe", path, "--dataset=shapes", "--batch_size=8",
                             f"--output_dir={out}"])
    assert code == 0, capsys.readouterr().err
    assert "dense_0" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("args, match", [
    (["{missing}"], "no such file"),
    (["{not_model}"], "cannot be loaded as a Keras model"),
    (["{model}", "--dataset=nope:1"], "--dataset='nope:1': unknown data set"),
    (["{model}", "--dataset=npz:{bad_npz}"], "no y array"),
    (["{model}", "--dataset=shapes", "--loss=mse"], "(rank 2 expected, got 4). Pass your own data"),
    (["{model}", "--batches=0"], "--batches=0"),
    (["{model}", "--dataset=npz:{npz}", "--policy=fp32", "--loss=mse"], "fp32"),
    ([], "exactly one MODEL"),
])
def test_cli_bad_input_one_line_exit_2_no_files(tmp_path, capsys, args, match):
    path, npz = _saved(tmp_path)
    not_model = tmp_path / "text.keras"
    not_model.write_text("not a model")
    bad_npz = str(tmp_path / "bad.npz")
    np.savez(bad_npz, x=np.zeros((2, 16)))
    names = dict(missing=str(tmp_path / "nope.keras"), not_model=str(not_model), model=path,
                 npz=npz, bad_npz=bad_npz)
    out = tmp_path / "out"
    argv = ["tf_mixed probe"] + [a.format(**names) for a in args] + [f"--output_dir={out}"]
    code = bench_probe.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and match in err, err
    assert "Traceback" not in err
    assert not out.exists()


def test_main_dispatches_probe(capsys):
    from tf_mixed.__main__ import main

    assert main(["tf_mixed", "probe", "--help"]) == 0
    assert "python -m tf_mixed probe MODEL.keras" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("build", ["functional", "sequential"])
def test_the_users_model_is_never_written_to(build, monkeypatch):
    model = _healthy() if build == "functional" else keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4, activation="relu", name="d1"),
         keras.layers.Dense(1, name="d2")])
    model.compile(optimizer="sgd", loss="mse")
    writes = []
    original = type(model).__setattr__

    def spy(self, name, value):
        if self is model:
            writes.append(name)
        original(self, name, value)

    monkeypatch.setattr(type(model), "__setattr__", spy)
    x, y = _healthy_batch()
    report = tf_mixed.probe(model, x, y, policy="mixed_bfloat16")
    assert writes == []
    assert model.compiled and model.dtype_policy.name == "float32"
    assert [r.name for r in report.layers] == (
        ["d1", "d2"] + (["out"] if build == "functional" else []))


# ------------------------------------------------- what the model keeps in float32


def test_a_model_convert_fixed_probes_clean_under_mixed_float16():
    x, y = _planted_batch()
    fixed = tf_mixed.convert(_planted(), "mixed_float16", keep_float32=["l2norm"])
    report = tf_mixed.probe(fixed, x, y, loss="mse", policy="mixed_float16")
    rows = {r.name: r for r in report.layers}
    assert report.first_nonfinite is None
    assert rows["proj"].compute_dtype == "float16"
    assert rows["l2norm"].compute_dtype == "float32"


def test_a_float32_built_model_is_probed_with_the_active_keep_float32_rules():
    # Built in float32, then enable(keep_float32=...): the rules say what a
    # model built now (or converted) keeps, so the probe keeps it too.
    x, y = _planted_batch()
    model = _planted()
    tf_mixed.enable("mixed_float16", quiet=True, keep_float32=["l2norm"])
    report = tf_mixed.probe(model, x, y, loss="mse")
    rows = {r.name: r for r in report.layers}
    assert report.first_nonfinite is None, report.advice
    assert (rows["proj"].compute_dtype, rows["l2norm"].compute_dtype) == ("float16", "float32")
    tf_mixed.disable()  # without the rules, l2norm is probed in float16 again
    assert tf_mixed.probe(model, x, y, loss="mse").first_nonfinite == "l2norm"


def _random_model():
    """Every kind of random layer, one inside a MultiHeadAttention."""
    init = keras.initializers.GlorotUniform
    inputs = keras.Input((4, 8))
    h = keras.layers.Dense(8, kernel_initializer=init(seed=4), name="d1")(inputs)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    h = keras.layers.GaussianNoise(1.0, name="noise")(h)
    h = keras.layers.SpatialDropout1D(0.5, name="spatial")(h)
    h = keras.layers.MultiHeadAttention(2, 4, dropout=0.5, name="mha",
                                        kernel_initializer=init(seed=5))(h, h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    h = keras.layers.Dense(3, kernel_initializer=init(seed=6), name="head")(h)
    return keras.Model(inputs, tf_mixed.Float32Output(name="out")(h), name="random")


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_random_layers_draw_nothing_so_they_are_never_blamed(policy):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 4, 8)).astype("float32")
    y = rng.integers(0, 3, 32)
    model = _random_model()
    report = tf_mixed.probe(model, x, y, loss="sparse_categorical_crossentropy", policy=policy)
    rows = {r.name: r for r in report.layers}
    # A layer's relative error is its half-precision rounding: a few units
    # of the dtype's roundoff, never the ~100% of two different masks.
    bound = 8 * (2.0**-8 if policy == "mixed_bfloat16" else U16)
    for name in ("drop", "noise", "spatial", "mha"):
        assert rows[name].rel_error < bound, (name, rows[name].rel_error)
    # Each random layer passed its input through: its output is d1's.
    assert rows["drop"].rel_error == rows["d1"].rel_error
    assert rows["noise"].rel_error == rows["d1"].rel_error
    assert "differs from float32" not in report.advice
    # The user's model is untouched: its Dropout still drops in training.
    dropped = model.get_layer("drop")(np.ones((4, 64), "float32"), training=True)
    assert np.count_nonzero(keras.ops.convert_to_numpy(dropped) == 0) > 0
