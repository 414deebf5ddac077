"""Every model-taking API of tf_mixed over the model zoo (tests/support/zoo.py).

Each API runs on every zoo model as built in this process and as saved and
reloaded in a fresh process (`zoo.reloaded_model`: one subprocess for the
whole session). Models are tiny, steps few.
"""

import warnings

import keras
import numpy as np
import pytest
from zoo import KINDS, REFUSED, ZOO, epoch_loss_is_honest, reloaded_model, reloaded_path

import tf_mixed
from tf_mixed import training
from tf_mixed._internal.facts import walk_layers
from tf_mixed.cli import probe as bench_probe
from tf_mixed.cli.main import main as cli_main

NAMES = list(ZOO)
EVERY_MODEL = pytest.mark.parametrize("name", NAMES)
BUILT_AND_RELOADED = pytest.mark.parametrize("reloaded", [False, True], ids=["built", "reloaded"])


def _leaves(model):
    return {name: layer for name, layer in walk_layers(model)
            if not isinstance(layer, keras.Model) and type(layer).__name__ != "InputLayer"}


def _model(name, reloaded):
    return reloaded_model(name) if reloaded else ZOO[name].ready()


def _convert(model, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf_mixed.models.ConversionNote)
        return tf_mixed.convert(model, *args, **kwargs)


def _flat(value):
    return [np.asarray(v) for v in keras.tree.flatten(value)]


# ---------------------------------------------------------------- the zoo itself


def test_zoo_covers_every_kind():
    assert {spec.kind for spec in ZOO.values()} == set(KINDS)


@pytest.mark.slow
@EVERY_MODEL
def test_zoo_model_is_deterministic_and_fits_its_data(name):
    spec = ZOO[name]
    first, second = spec.ready(), spec.ready()
    assert first.get_weights() and len(first.get_weights()) == len(second.get_weights())
    for a, b in zip(first.get_weights(), second.get_weights()):
        np.testing.assert_array_equal(a, b)
    x, y = spec.data(8, seed=1)
    assert [a.shape[0] for a in _flat(x) + _flat(y)] == [8] * len(_flat(x) + _flat(y))
    for pred, target in zip(_flat(first(x)), _flat(y)):  # the loss takes them
        assert pred.shape[0] == target.shape[0] == 8
    # Training is run by the make_train_step and monitor tests below.


@pytest.mark.slow
@EVERY_MODEL
def test_zoo_model_reloaded_in_a_fresh_process_predicts_the_same(name):
    spec = ZOO[name]
    x = spec.data(4)[0]
    model = reloaded_model(name)
    assert model.compiled
    for w, g in zip(_flat(spec.ready().predict(x, verbose=0)), _flat(model.predict(x, verbose=0))):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- probe


@pytest.mark.slow
@BUILT_AND_RELOADED
@EVERY_MODEL
def test_probe_runs_on_every_zoo_model(name, reloaded):
    spec = ZOO[name]
    model = _model(name, reloaded)
    x, y = spec.data(16)
    # A reloaded model is compiled: loss=None takes the compiled loss (lists too).
    report = tf_mixed.probe(model, x, y, loss=None if reloaded else spec.loss, batches=2)
    assert report.policy == "mixed_float16" and report.batches == 2 and report.examples == 16
    # Every leaf layer is a row, inner layers of a nested model by qualified name.
    assert {row.name for row in report.layers} == set(_leaves(model))
    assert report.first_nonfinite is None
    assert all(row.compute_dtype == "float16" for row in report.layers)
    assert {v.layer for v in report.variables} <= set(_leaves(model))


# ---------------------------------------------------------------- convert


@pytest.mark.slow
@BUILT_AND_RELOADED
@EVERY_MODEL
def test_convert_runs_on_every_zoo_model(name, reloaded):
    spec = ZOO[name]
    model = _model(name, reloaded)
    x, _ = spec.data(8)
    new = _convert(model, "mixed_bfloat16")
    old_leaves, new_leaves = _leaves(model), _leaves(new)
    half = [n for n, layer in new_leaves.items() if layer.compute_dtype == "bfloat16"]
    assert half, new_leaves  # converted
    assert all(old_leaves[n].compute_dtype == "float32" for n in old_leaves)  # untouched
    for n, layer in old_leaves.items():  # same weights
        if n in new_leaves:
            for a, b in zip(layer.get_weights(), new_leaves[n].get_weights()):
                np.testing.assert_array_equal(a, b)
    for want, got in zip(_flat(model(x, training=False)), _flat(new(x, training=False))):
        assert got.dtype == np.float32  # float32 outputs
        np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)
    assert new.compiled == model.compiled


# ---------------------------------------------------------------- audit


@pytest.mark.slow
@BUILT_AND_RELOADED
@EVERY_MODEL
def test_audit_runs_on_every_zoo_model(name, reloaded):
    model = _model(name, reloaded)
    report = tf_mixed.audit(model, batch_size=8)
    rows = {row.name: row for row in report.rows}
    assert set(_leaves(model)) <= set(rows)  # inner layers by qualified name
    assert all(rows[n].compute_dtype == "float32" for n in _leaves(model))
    assert str(report).startswith(f"Model '{model.name}': policy float32")


# ---------------------------------------------------------------- keep_float32


def _kept_name(spec, model):
    """A layer to keep float32: the nested model itself for the nested kind."""
    if spec.nested:
        return spec.nested
    return next(n for n, layer in _leaves(model).items() if layer.weights)


@pytest.mark.slow
@EVERY_MODEL
def test_keep_float32_in_enable_on_every_zoo_model(name):
    spec = ZOO[name]
    kept = _kept_name(spec, spec.ready())
    tf_mixed.enable("mixed_bfloat16", quiet=True, keep_float32=[kept])
    model = spec.ready()
    leaves = _leaves(model)
    float32 = {n for n, layer in leaves.items() if layer.compute_dtype == "float32"}
    expected = ({n for n in leaves if n.startswith(kept + "/")} if spec.nested else {kept})
    assert float32 == expected
    x, y = spec.data(4)
    model.compile(optimizer="sgd", loss=spec.loss)
    assert np.all(np.isfinite(model.train_on_batch(x, y)))


@pytest.mark.slow
@EVERY_MODEL
def test_keep_float32_in_convert_on_every_zoo_model(name):
    spec = ZOO[name]
    model = spec.ready()
    kept = _kept_name(spec, model)
    new = _convert(model, "mixed_bfloat16", keep_float32=[kept])
    plain = _convert(model, "mixed_bfloat16")
    float32 = {n for n, layer in _leaves(new).items() if layer.compute_dtype == "float32"}
    before = {n for n, layer in _leaves(plain).items() if layer.compute_dtype == "float32"}
    expected = ({n for n in _leaves(model) if n.startswith(kept + "/")} if spec.nested else {kept})
    assert float32 == before | expected


# ---------------------------------------------------------------- training


@pytest.mark.slow
@EVERY_MODEL
def test_make_train_step_on_every_zoo_model(name):
    spec = ZOO[name]
    tf_mixed.enable("mixed_float16", quiet=True)
    model = spec.ready()
    optimizer = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**8)
    step = training.make_train_step(model, spec.loss, optimizer)
    x, y = spec.data(8)
    before = [w.copy() for w in model.get_weights()]
    result = step(x, y)
    assert bool(result["applied"]) and np.isfinite(float(result["loss"]))
    changed = [not np.array_equal(a, b) for a, b in zip(before, model.get_weights())]
    assert any(changed)


@pytest.mark.slow
@BUILT_AND_RELOADED
@EVERY_MODEL
def test_monitor_fits_every_zoo_model(name, reloaded):
    spec = ZOO[name]
    loaded = reloaded_model(name) if reloaded else None  # loaded as saved: float32
    tf_mixed.enable("mixed_float16", quiet=True)
    if loaded is not None:  # converted, compiled like the original
        model = _convert(loaded)
    else:
        model = spec.ready()
        model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)),
                      loss=spec.loss)
    x, y = spec.data(16)
    monitor = tf_mixed.LossScaleMonitor(check_setup=False)  # zoo heads are plain Dense
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[monitor])
    assert epoch_loss_is_honest(history)
    assert history.history["loss_scale"][-1] > 0


# ---------------------------------------------------------------- the command line


def _zoo_npz(tmp_path, name, n=16):
    x, y = ZOO[name].data(n)
    arrays = {}
    for key, value in (("x", x), ("y", y)):
        if isinstance(value, list):
            arrays.update({f"{key}{i}": v for i, v in enumerate(value)})
        else:
            arrays[key] = value
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.slow
@EVERY_MODEL
def test_cli_probe_and_audit_on_every_reloaded_zoo_model(name, tmp_path, capsys):
    path = reloaded_path(name)
    out = tmp_path / "out"
    loading = ["--custom_modules=zoo", "--safe_mode=false"]
    code = bench_probe.main(["tf_mixed probe", path, f"--dataset=npz:{_zoo_npz(tmp_path, name)}",
                             "--batch_size=8", f"--output_dir={out}", *loading])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert (out / "probe.json").exists()
    assert cli_main(["tf_mixed", "audit", path, *loading]) == 0, capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name, flag, match", [
    ("lambda_lambda", "--custom_modules=zoo", "pass --safe_mode=false if you trust the file"),
    ("lambda_def", "--safe_mode=false", "pass --custom_modules=MODULE"),
])
def test_cli_names_what_a_zoo_kind_needs_to_load(name, flag, match, tmp_path, capsys):
    out = tmp_path / "out"
    for argv in (["tf_mixed", "probe", reloaded_path(name), flag, f"--output_dir={out}"],
                 ["tf_mixed", "audit", reloaded_path(name), flag]):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err
    assert not out.exists()


# ---------------------------------------------------------------- refused kinds


def test_probe_and_convert_refuse_a_subclassed_model_naming_the_kind():
    spec = REFUSED["subclassed_model"]
    model = spec.ready()
    x, y = spec.data(8)
    for call in (lambda: tf_mixed.probe(model, x, y, loss="mse"),
                 lambda: tf_mixed.convert(model, "mixed_bfloat16")):
        with pytest.raises(TypeError, match="subclassed model 'subclassed_model' "
                                            r"\(class ZooSubclassed\)"):
            call()


@pytest.mark.slow
def test_the_other_apis_take_a_subclassed_model():
    spec = REFUSED["subclassed_model"]
    tf_mixed.enable("mixed_float16", quiet=True)
    model = spec.ready()
    x, y = spec.data(8)
    assert tf_mixed.audit(model).model_name == "subclassed_model"
    optimizer = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**8)
    assert bool(training.make_train_step(model, "mse", optimizer)(x, y)["applied"])
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01)), loss="mse")
    history = model.fit(x, y, epochs=1, verbose=0,
                        callbacks=[tf_mixed.LossScaleMonitor(check_setup=False)])
    assert epoch_loss_is_honest(history)
