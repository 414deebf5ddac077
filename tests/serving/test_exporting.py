"""tf_mixed.export: every artifact run through its own runtime and compared.

A small trained model per training policy (module fixtures, trained once);
each test writes its own artifact into its own tmp_path, loads it back with
``tf.saved_model.load`` or ai_edge_litert's builtin interpreter (no Flex
delegate) and compares it with the model in memory here, independently of
the check `export` itself makes.
"""

import os

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter, OpResolverType
from zoo import (
    ZOO,
    zoo_reloaded,  # noqa: F401  (a fixture, used by name)
)

import tf_mixed
from tf_mixed._internal import facts as _facts
from tf_mixed.models import conversion as rebuild
from tf_mixed.serving import exporting

# Mixed policies, and the pure half ones (variables in half precision too).
TRAINING_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16")
COMBINATIONS = [(fmt, p) for fmt, ps in exporting.PRECISIONS.items() for p in ps]
SAMPLE = np.random.RandomState(1).uniform(-2, 2, (8, 6)).astype("float32")


def _build(policy: str) -> keras.Model:
    """Dense + BatchNorm + Lambda + a float32 layer + a float32 head, trained."""
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,), name="features")
        x = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
        x = keras.layers.BatchNormalization(name="norm")(x)
        x = keras.layers.Lambda(lambda t: t * 0.5, name="halve")(x)
        x = keras.layers.Dense(16, dtype="float32", name="kept")(x)  # float32 on purpose
        x = keras.layers.Dense(4, name="logits")(x)
        outputs = tf_mixed.layers.OutputActivation("softmax", name="probs")(x)
        model = keras.Model(inputs, outputs, name=f"net_{policy}")
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile(optimizer=tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.05), force=True),
                  loss="sparse_categorical_crossentropy")
    x = np.random.RandomState(0).uniform(-2, 2, (64, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32") + 2 * (x[:, 1] > 0).astype("int32")
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    return model


@pytest.fixture(scope="module")
def trained():
    return {policy: _build(policy) for policy in TRAINING_POLICIES}


def _model_outputs(model, x):
    return [np.asarray(tf.cast(o, tf.float32))
            for o in keras.tree.flatten(model(x, training=False))]


def _run_litert(path, x):
    interpreter = Interpreter(model_path=path,
                              experimental_op_resolver_type=OpResolverType.BUILTIN)
    runner = interpreter.get_signature_runner()
    (key,) = runner.get_input_details()
    out = runner(**{key: x})
    return [out[k] for k in sorted(out)]


def _run_saved_model(path, x):
    loaded = tf.saved_model.load(path)  # kept alive while its function runs
    return [np.asarray(o) for o in keras.tree.flatten(loaded.serve(x))]


def _rel_error(want, have):
    return float(np.max(np.abs(np.asarray(have, np.float64) - want)) / np.max(np.abs(want)))


# ----------------------------------------------------------------- tolerances


def test_epsilons_are_the_dtypes_own():
    assert _facts.EPSILON["float32"] == np.finfo(np.float32).eps
    assert _facts.EPSILON["float16"] == np.finfo(np.float16).eps
    assert _facts.EPSILON["bfloat16"] == float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)


def test_default_tolerance_is_ulps_of_the_coarser_dtype():
    t = exporting.default_tolerance
    assert t("float32", "float32") == 16 * 2.0**-23
    assert t("float32", "float16") == 16 * 2.0**-10  # the model rounds to float16
    assert t("float16_weights", "float32") == 16 * 2.0**-10
    assert t("bfloat16", "float16") == 16 * 2.0**-7
    assert t("float16", "bfloat16") == 16 * 2.0**-7


# ------------------------------------------------- every policy x precision


@pytest.mark.slow
@pytest.mark.parametrize("policy", TRAINING_POLICIES)
@pytest.mark.parametrize("fmt,precision", COMBINATIONS)
def test_artifact_runs_in_its_own_runtime_and_matches(trained, tmp_path, policy, fmt, precision):
    model = trained[policy]
    path = str(tmp_path / ("model.tflite" if fmt == "litert" else "model"))
    report = tf_mixed.export(model, path, format=fmt, precision=precision, sample=SAMPLE)

    trained_dtype = keras.DTypePolicy(policy).compute_dtype
    assert report.trained_dtype == trained_dtype
    expected = (exporting.as_trained(fmt, trained_dtype) if precision == "as_trained"
                else precision)
    assert report.precision == expected
    assert report.format == fmt and report.path == path
    assert report.input_names == ("features",) and report.input_dtypes == ("float32",)
    assert report.input_shapes == ((None, 6),)
    assert report.output_names == ("probs",) and report.output_dtypes == ("float32",)
    assert report.output_shapes == ((None, 4),)
    assert report.select_ops == ()
    assert report.tolerance == exporting.default_tolerance(expected, trained_dtype)

    want = _model_outputs(model, SAMPLE)
    if fmt == "litert":
        assert report.runtime == "ai_edge_litert"
        assert report.bytes == os.path.getsize(path)
        got = _run_litert(path, SAMPLE)  # builtin ops only: no Flex delegate
    else:
        assert report.runtime == "tf.saved_model"
        got = _run_saved_model(path, tf.constant(SAMPLE))
    assert [g.dtype for g in got] == [np.float32]
    error = _rel_error(want[0], got[0])
    assert error <= report.tolerance
    assert report.max_rel_error == pytest.approx(error, rel=1e-6, abs=1e-12)
    # Nothing but the artifact was left in the directory.
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]


@pytest.mark.slow
def test_half_precision_saved_model_keeps_float32_layers_float32(trained):
    half = rebuild.rebuild(trained["mixed_float16"], "float16")
    policies = {layer.name: layer.dtype_policy.name for layer in half.layers}
    assert policies["hidden"] == policies["logits"] == policies["halve"] == "float16"
    assert policies["kept"] == "float32"  # float32 on purpose in a mixed model
    assert policies["probs"] == "float32"  # tf_mixed's float32 head
    assert half.get_layer("hidden").kernel.dtype == "float16"  # half-size weights
    # A float32-trained model has no marks: only the head stays float32.
    half = rebuild.rebuild(trained["float32"], "bfloat16")
    policies = {layer.name: layer.dtype_policy.name for layer in half.layers}
    assert policies["kept"] == "bfloat16" and policies["probs"] == "float32"


@pytest.mark.slow
def test_keep_float32_rules_survive_every_precision(tmp_path):
    tf_mixed.enable("mixed_float16", quiet=True, keep_float32=["norm"])
    try:
        inputs = keras.Input((6,))
        x = keras.layers.LayerNormalization(name="norm")(keras.layers.Dense(8)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(2)(x))
    finally:
        tf_mixed.disable()
    assert model.get_layer("norm").dtype_policy.name == "float32"
    for target in ("float16", "bfloat16"):
        copy = rebuild.rebuild(model, target)
        assert copy.get_layer("norm").dtype_policy.name == "float32"
        assert copy.layers[1].dtype_policy.name == target
    report = tf_mixed.export(model, str(tmp_path / "m"), precision="float16", sample=SAMPLE)
    assert report.max_rel_error <= report.tolerance


@pytest.mark.slow
def test_rebuild_copies_weights_exactly_to_float32(trained):
    model = trained["mixed_float16"]
    copy = rebuild.rebuild(model, "float32")
    assert all(layer.dtype_policy.name == "float32" for layer in copy.layers)
    for a, b in zip(model.weights, copy.weights):
        np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value))
    assert not copy.compiled  # the LossScaleOptimizer stays behind


@pytest.mark.slow
def test_saved_model_does_not_carry_the_optimizer(trained, tmp_path):
    model = trained["mixed_float16"]
    tf_mixed.export(model, str(tmp_path / "m"), precision="float32")
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    assert len(loaded.variables) == len(model.weights)


@pytest.mark.slow
def test_float16_weights_file_is_smaller_and_runs_without_flex(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                              keras.layers.Dense(8)])
    keras.config.set_dtype_policy("float32")
    full = tf_mixed.export(model, str(tmp_path / "a.tflite"), format="litert")
    half = tf_mixed.export(model, str(tmp_path / "b.tflite"), format="litert",
                           precision="float16_weights")
    assert 0.45 < half.bytes / full.bytes < 0.6
    assert full.max_rel_error is None  # no sample: run on zeros, not compared
    _run_litert(str(tmp_path / "b.tflite"), SAMPLE[:, :1].repeat(64, 1))


@pytest.mark.slow
def test_keras_own_litert_export_of_a_mixed_model_needs_flex(tmp_path):
    """Why export rebuilds in float32: Keras's own LiteRT file of a mixed model
    needs Flex ops. Fails once Keras fixes it."""
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    keras.config.set_dtype_policy("float32")
    path = str(tmp_path / "keras.tflite")
    model.export(path, format="litert", verbose=False)
    with open(path, "rb") as f:
        assert exporting._select_ops(f.read())


# ----------------------------------------------------- structures and kinds


@pytest.mark.slow
def test_multi_input_multi_output_order_is_kept(tmp_path):
    a = keras.Input((3,), name="a")
    b = keras.Input((5,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    big = keras.layers.Dense(2, name="big")(joined)
    small = keras.layers.Dense(7, name="small")(keras.layers.Dense(4)(joined))
    model = keras.Model({"a": a, "b": b}, [big, small])
    rng = np.random.RandomState(0)
    x = {"a": rng.randn(4, 3).astype("float32"), "b": rng.randn(4, 5).astype("float32")}
    for fmt, name in (("litert", "m.tflite"), ("saved_model", "m")):
        report = tf_mixed.export(model, str(tmp_path / name), format=fmt, sample=x)
        # float32 tolerance: a swapped input or output would be far off.
        assert report.max_rel_error <= report.tolerance
        assert report.output_names == ("big", "small")
        assert report.output_shapes == ((None, 2), (None, 7))
        assert set(report.input_names) == {"a", "b"}


@pytest.mark.slow
def test_dict_outputs_are_named_in_flattened_order(tmp_path):
    inputs = keras.Input((6,), name="x")
    model = keras.Model(inputs, {"z_out": keras.layers.Dense(3, name="zeta")(inputs),
                                 "a_out": keras.layers.Dense(1, name="alpha")(inputs)})
    for fmt, name in (("litert", "m.tflite"), ("saved_model", "m")):
        report = tf_mixed.export(model, str(tmp_path / name), format=fmt, sample=SAMPLE)
        assert report.output_names == ("alpha", "zeta")
        assert report.output_shapes == ((None, 1), (None, 3))
        assert report.max_rel_error <= report.tolerance


@pytest.mark.slow
def test_parity_check_feeds_and_reads_litert_by_name(tmp_path):
    # Inputs not in alphabetical order, dict keys that sort as strings
    # (score_10 before score_2): LiteRT's keys sort otherwise than the model.
    zeta = keras.Input((3,), name="zeta")
    alpha = keras.Input((5,), name="alpha")
    joined = keras.layers.Concatenate()([zeta, alpha])
    model = keras.Model([zeta, alpha], {
        "score_10": keras.layers.Dense(2, name="ten")(joined),
        "score_2": keras.layers.Dense(7, name="two")(joined),
        "b": keras.layers.Dense(1, name="bee")(joined)})
    rng = np.random.RandomState(0)
    x = [rng.randn(4, 3).astype("float32"), rng.randn(4, 5).astype("float32")]
    for fmt, name in (("litert", "m.tflite"), ("saved_model", "m")):
        report = tf_mixed.export(model, str(tmp_path / name), format=fmt, sample=x)
        assert report.input_names == ("zeta", "alpha")
        assert report.output_names == ("bee", "ten", "two")  # flattened: b, score_10, score_2
        assert report.output_shapes == ((None, 1), (None, 2), (None, 7))
        assert report.max_rel_error <= report.tolerance
    # The file itself answers by name, independently of export's own check.
    runner = Interpreter(model_path=str(tmp_path / "m.tflite")).get_signature_runner()
    got = runner(zeta=x[0], alpha=x[1])
    want = model(x)
    for key in ("b", "score_10", "score_2"):
        assert _rel_error(np.asarray(want[key]), got[key]) < 1e-5


@pytest.mark.slow
def test_list_of_eleven_outputs_is_read_by_position(tmp_path):
    # output_10 sorts before output_2 as a string; the check reads by key.
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, [keras.layers.Dense(i + 1, name=f"d{i}")(inputs)
                                 for i in range(11)])
    report = tf_mixed.export(model, str(tmp_path / "m.tflite"), format="litert",
                             sample=np.ones((2, 4), "float32"))
    assert report.output_shapes == tuple((None, i + 1) for i in range(11))
    assert report.max_rel_error <= report.tolerance


class _TwoInputs(keras.Model):
    def __init__(self):
        super().__init__(name="two_inputs")
        self.dense = keras.layers.Dense(2, name="d")

    def call(self, inputs):
        return self.dense(keras.ops.concatenate([inputs[1], inputs[0] * 3.0], axis=-1))


@pytest.mark.slow
def test_subclassed_model_inputs_get_one_name_each(tmp_path):
    model = _TwoInputs()
    rng = np.random.RandomState(0)
    x = [rng.randn(4, 3).astype("float32"), rng.randn(4, 3).astype("float32")]
    model(x)
    report = tf_mixed.export(model, str(tmp_path / "m.tflite"), format="litert",
                             precision="as_trained", sample=x)
    assert report.input_names == ("input_0", "input_1")
    assert report.max_rel_error <= report.tolerance
    runner = Interpreter(model_path=str(tmp_path / "m.tflite")).get_signature_runner()
    (key,) = runner.get_output_details()
    np.testing.assert_allclose(runner(input_0=x[0], input_1=x[1])[key], np.asarray(model(x)),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_sequential_with_nested_model(tmp_path):
    keras.config.set_dtype_policy("mixed_bfloat16")
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh")],
                             name="inner")
    model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2)])
    keras.config.set_dtype_policy("float32")
    report = tf_mixed.export(model, str(tmp_path / "m.tflite"), format="litert",
                             sample=SAMPLE[:, :4])
    assert report.max_rel_error <= report.tolerance


class SubNet(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x)


def test_subclassed_model_as_trained_saved_model(tmp_path):
    model = SubNet()
    model(SAMPLE)
    report = tf_mixed.export(model, str(tmp_path / "m"), precision="as_trained", sample=SAMPLE)
    assert report.max_rel_error == 0.0
    assert report.input_shapes == ((None, 6),)


def test_subclassed_model_in_another_precision_names_the_kind(tmp_path):
    keras.config.set_dtype_policy("mixed_float16")
    model = SubNet()
    keras.config.set_dtype_policy("float32")
    model(SAMPLE)
    with pytest.raises(TypeError, match=r"subclassed model .*class SubNet.*as_trained"):
        tf_mixed.export(model, str(tmp_path / "m.tflite"), format="litert", sample=SAMPLE)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------- refusals, atomicity


def _flex_model():
    inputs = keras.Input((4,), name="x")
    outputs = keras.layers.Lambda(lambda t: tf.math.cumprod(t, axis=-1))(
        keras.layers.Dense(4)(inputs))
    return keras.Model(inputs, outputs, name="flexy")


@pytest.mark.slow
def test_select_ops_are_refused_by_name_and_nothing_written(tmp_path):
    path = tmp_path / "m.tflite"
    with pytest.raises(ValueError, match=r"model 'flexy' needs TensorFlow Select ops.*Cumprod"):
        tf_mixed.export(_flex_model(), str(path), format="litert")
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_select_ops_allowed_are_written_and_named(tmp_path):
    path = tmp_path / "m.tflite"
    report = tf_mixed.export(_flex_model(), str(path), format="litert", allow_select_ops=True)
    assert report.select_ops == ("Cumprod",)
    assert report.runtime.startswith("not run") and report.max_rel_error is None
    assert path.is_file()
    with pytest.raises(ValueError, match="cannot check a LiteRT file with Select ops"):
        tf_mixed.export(_flex_model(), str(tmp_path / "n.tflite"), format="litert",
                        allow_select_ops=True, sample=np.ones((2, 4), "float32"))
    assert sorted(os.listdir(tmp_path)) == ["m.tflite"]


@pytest.mark.slow
def test_ops_litert_cannot_convert_are_named(tmp_path):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Lambda(tf.math.erfinv)(inputs))
    with pytest.raises(ValueError, match="LiteRT cannot convert model .*Erfinv"):
        tf_mixed.export(model, str(tmp_path / "m.tflite"), format="litert")
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_error_above_tolerance_names_the_worst_output_and_writes_nothing(trained, tmp_path):
    path = tmp_path / "sub" / "m"
    with pytest.raises(ValueError, match=r"output 'probs' has relative error .*tolerance=1e-09"):
        tf_mixed.export(trained["float32"], str(path), precision="bfloat16",
                        sample=SAMPLE, tolerance=1e-9)
    assert os.listdir(tmp_path) == []  # not even the parent it created


@pytest.mark.slow
def test_existing_artifact_is_replaced_whole(trained, tmp_path):
    path = tmp_path / "m"
    tf_mixed.export(trained["float32"], str(path))
    (path / "variables" / "stale.txt").write_text("old")  # inside a SavedModel
    tf_mixed.export(trained["float32"], str(path))
    assert not (path / "variables" / "stale.txt").exists() and (path / "saved_model.pb").exists()
    assert os.listdir(tmp_path) == ["m"]


@pytest.mark.slow
def test_an_existing_file_or_empty_directory_is_replaced(trained, tmp_path):
    (tmp_path / "m.tflite").write_bytes(b"old file")
    tf_mixed.export(trained["float32"], str(tmp_path / "m.tflite"), format="litert")
    assert (tmp_path / "m.tflite").read_bytes()[4:8] == b"TFL3"
    (tmp_path / "empty").mkdir()
    tf_mixed.export(trained["float32"], str(tmp_path / "empty"))
    assert (tmp_path / "empty" / "saved_model.pb").exists()
    assert sorted(os.listdir(tmp_path)) == ["empty", "m.tflite"]


@pytest.mark.slow
@pytest.mark.parametrize("fmt,target,match", [
    ("saved_model", "dir", r"replaces a directory only when it holds a SavedModel "
                           r"\(saved_model.pb\) or nothing; '.*user' holds notes.txt, "
                           r"photos and is left as it is"),
    ("litert", "dir", r"format='litert'\) writes a file, and '.*user' is a directory; "
                      r"it is left as it is. Pass a file path such as '.*user/model.tflite'"),
    ("saved_model", "file", r"writes a directory, and '.*user' is a file"),
    ("saved_model", "link", r"does not write through the symbolic link"),
])
def test_what_export_did_not_write_is_never_replaced(trained, tmp_path, fmt, target, match):
    path = tmp_path / "user"
    if target == "dir":
        path.mkdir()
        (path / "notes.txt").write_text("mine")
        (path / "photos").mkdir()
    elif target == "file":
        path.write_text("mine")
    else:
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=match):
        tf_mixed.export(trained["float32"], str(path), format=fmt)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


@pytest.mark.slow
@pytest.mark.parametrize("kwargs,match", [
    ({"format": "onnx"}, r"Unknown export format 'onnx'.*saved_model, litert"),
    ({"format": "litert", "precision": "float16"},
     r"cannot write precision='float16' \(it is a saved_model precision\).*float16_weights"),
    ({"precision": "float16_weights"}, r"it is a litert precision"),
    ({"precision": "fp8"}, r"the precisions are .*bfloat16"),
    ({"tolerance": 0}, r"`tolerance` must be a positive finite number.*Received: tolerance=0"),
    ({"tolerance": float("nan")}, r"tolerance=nan"),
    ({"sample": np.ones((2, 5), "float32")}, r"sample has shape \(2, 5\).*'features'"),
    ({"sample": [SAMPLE, SAMPLE]}, r"sample does not have the structure"),
])
def test_bad_arguments_are_named_and_nothing_written(trained, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tf_mixed.export(trained["float32"], str(tmp_path / "m"), **kwargs)
    assert os.listdir(tmp_path) == []


def test_not_a_model():
    with pytest.raises(TypeError, match="needs a keras.Model"):
        tf_mixed.export("model.keras", "out")


@pytest.mark.slow
def test_report_prints_and_serialises(trained, tmp_path):
    report = tf_mixed.export(trained["mixed_float16"], str(tmp_path / "m.tflite"),
                             format="litert", precision="float16_weights", sample=SAMPLE)
    text = str(report)
    assert "float16_weights (trained in float16)" in text and "probs float32[None, 4]" in text
    import json

    data = json.loads(json.dumps(report.to_dict()))
    assert data["precision"] == "float16_weights" and data["select_ops"] == []


# ------------------------------------------------------------------ the zoo



@pytest.mark.slow
@pytest.mark.parametrize("fmt,precision", [("litert", "float16_weights"),
                                           ("saved_model", "as_trained")])
@pytest.mark.parametrize("name", ZOO)
def test_zoo_mixed_model_exports_and_matches(tmp_path, name, fmt, precision):
    spec = ZOO[name]
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = spec.ready()
    finally:
        keras.config.set_dtype_policy("float32")
    x, _ = spec.data(8)
    path = str(tmp_path / ("m.tflite" if fmt == "litert" else "m"))
    report = tf_mixed.export(model, path, format=fmt, precision=precision, sample=x)
    assert report.select_ops == () and report.max_rel_error <= report.tolerance
    assert set(report.output_dtypes) == {"float32"}
    assert len(report.output_names) == len(keras.tree.flatten(spec.loss))


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_zoo_reloaded_model_exports_to_litert(tmp_path, zoo_reloaded, name):  # noqa: F811
    from zoo import load

    model = load(zoo_reloaded[name], name)
    x, _ = ZOO[name].data(8)
    report = tf_mixed.export(model, str(tmp_path / "m.tflite"), format="litert", sample=x)
    assert report.runtime == "ai_edge_litert" and report.max_rel_error <= report.tolerance
