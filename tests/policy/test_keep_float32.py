"""keep_float32: by name, class or predicate, for later-built and existing models."""

import os
import warnings

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.policy import keep_float32


class SquareSum(keras.layers.Layer):
    """No weights, no build(): Keras marks it built at init (path None)."""

    def call(self, x):
        return keras.ops.sum(x * x, axis=-1, keepdims=True)


def _functional():
    inputs = keras.Input((4,))
    x = keras.layers.Dense(4, name="dense")(inputs)
    x = keras.layers.UnitNormalization(name="unit")(x)
    x = SquareSum(name="sqsum")(x)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(x))


def _compute(model):
    return {layer.name: layer.compute_dtype for layer in model.layers
            if type(layer).__name__ != "InputLayer"}


@pytest.mark.slow
@pytest.mark.parametrize("spec", [
    ["sqsum", "unit"],
    [SquareSum, keras.layers.UnitNormalization],
    lambda layer: layer.name in ("sqsum", "unit"),
    ["sqsum", keras.layers.UnitNormalization],
])
def test_enable_keeps_later_layers_float32_by_name_class_or_predicate(spec):
    tf_mixed.enable("mixed_bfloat16", quiet=True, keep_float32=spec)
    model = _functional()
    assert _compute(model) == {"dense": "bfloat16", "unit": "float32",
                               "sqsum": "float32", "head": "bfloat16"}
    # The symbolic graph and an eager call agree: the kept layer's output is
    # float32, computed from the half input cast up.
    sqsum = model.get_layer("sqsum")
    assert sqsum.output.dtype == "float32"
    probe = keras.Model(model.inputs[0], sqsum.output)
    assert probe(np.ones((2, 4), "float32")).dtype == "float32"


def test_enable_keep_float32_in_sequential_and_saved_model(tmp_path):
    tf_mixed.enable("mixed_bfloat16", quiet=True, keep_float32=["norm"])
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, name="d"),
                              keras.layers.LayerNormalization(name="norm")])
    assert _compute(model) == {"d": "bfloat16", "norm": "float32"}
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    tf_mixed.disable()
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("norm").dtype_policy.name == "float32"
    assert loaded.get_layer("d").dtype_policy.name == "mixed_bfloat16"


def test_explicit_dtype_is_not_overridden():
    tf_mixed.enable("mixed_bfloat16", quiet=True, keep_float32=keras.layers.Dense)
    kept = keras.layers.Dense(2)
    explicit = keras.layers.Dense(2, dtype="mixed_float16")
    assert kept.compute_dtype == "float32"
    assert explicit.compute_dtype == "float16"


@pytest.mark.slow
def test_rules_end_with_disable_a_new_enable_or_clear_session():
    tf_mixed.enable("mixed_bfloat16", quiet=True, keep_float32=["x"])
    assert keras.layers.Dense(1, name="x").compute_dtype == "float32"
    tf_mixed.disable()
    assert keras.layers.Dense(1, name="x").compute_dtype == "float32"  # float32 policy
    keras.config.set_dtype_policy("mixed_bfloat16")  # by hand, not enable
    assert keras.layers.Dense(1, name="x").compute_dtype == "bfloat16"
    tf_mixed.enable("mixed_bfloat16", quiet=True)
    assert keras.layers.Dense(1, name="x").compute_dtype == "bfloat16"
    tf_mixed.enable("mixed_bfloat16", quiet=True, keep_float32="x")
    keras.backend.clear_session()
    assert keras.layers.Dense(1, name="x").compute_dtype == "float32"  # float32 policy
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.slow
@pytest.mark.parametrize("bad, error", [
    ([3], TypeError), (["ok", object], TypeError), ([""], ValueError), (3.5, TypeError),
])
def test_bad_spec_raises_before_anything_changes(bad, error):
    before = keras.config.dtype_policy()
    with pytest.raises(error, match="keep_float32"):
        tf_mixed.enable("mixed_bfloat16", keep_float32=bad)
    assert keras.config.dtype_policy() is before


@pytest.mark.slow
def test_convert_accepts_the_same_spec():
    model = _functional()  # float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_class = tf_mixed.convert(model, "mixed_bfloat16",
                                    keep_float32=[SquareSum, "unit"])
        by_predicate = tf_mixed.convert(
            model, "mixed_bfloat16", keep_float32=lambda l: l.name == "sqsum")
    assert _compute(by_class)["sqsum"] == "float32"
    assert _compute(by_class)["unit"] == "float32"
    assert _compute(by_class)["dense"] == "bfloat16"
    assert _compute(by_predicate)["sqsum"] == "float32"
    assert _compute(by_predicate)["unit"] == "bfloat16"


@pytest.mark.slow
def test_unknown_name_lists_close_matches():
    with pytest.raises(ValueError, match=r"'sqsun' \(did you mean 'sqsum'\?\)"):
        tf_mixed.convert(_functional(), "mixed_bfloat16", keep_float32=["sqsun"])
    with pytest.raises(ValueError, match=r"'zzz'.*Its layers are"):
        tf_mixed.convert(_functional(), "mixed_bfloat16", keep_float32=["zzz"])


def test_argument_text_is_what_enable_accepts():
    text = keep_float32.argument(["l2_norm", "b"])
    assert text == "keep_float32=['l2_norm', 'b']"
    assert keep_float32.parse(eval(text.split("=", 1)[1])).names == ("l2_norm", "b")


@pytest.mark.slow
def test_rules_are_per_thread_and_survive_another_threads_enable():
    import threading

    tf_mixed.enable("mixed_float16", keep_float32=["kept"])
    other = {}

    def in_another_thread():
        tf_mixed.enable("mixed_bfloat16")  # must not clear this thread's rules
        other["dtype"] = keras.layers.Dense(2, name="kept").compute_dtype
        tf_mixed.disable()

    thread = threading.Thread(target=in_another_thread)
    thread.start()
    thread.join(timeout=60)
    assert other == {"dtype": "bfloat16"}  # the rules were never that thread's
    assert keras.layers.Dense(2, name="kept").compute_dtype == "float32"
    assert keras.layers.Dense(2, name="free").compute_dtype == "float16"


def test_a_failed_enable_leaves_the_rules_as_they_were():
    tf_mixed.enable("mixed_float16", keep_float32=["kept"])
    with pytest.raises(TypeError):
        tf_mixed.enable("mixed_bfloat16", measure="yes", keep_float32=["other"])
    assert keras.layers.Dense(2, name="kept").compute_dtype == "float32"


# --- issue 16, case 4 -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "nesting",
    [("float32",), ("mixed_bfloat16",), ("float32", "mixed_bfloat16"),
     ("mixed_float16", "float32", "mixed_bfloat16")],
    ids=lambda n: "-".join(n),
)
def test_rules_survive_any_nesting_of_policy_scope(nesting):
    tf_mixed.enable("mixed_float16", keep_float32=["keepme"], quiet=True)

    def enter(depth):
        if depth == len(nesting):
            return
        with tf_mixed.policy_scope(nesting[depth]):
            # Inside a scope its own policy (and no rules of its own) applies.
            assert keras.layers.Dense(2, name="keepme").dtype_policy.name == nesting[depth]
            enter(depth + 1)

    enter(0)
    assert keras.layers.Dense(2, name="keepme").dtype_policy.name == "float32"
    assert keras.layers.Dense(2, name="other").dtype_policy.name == "mixed_float16"
    tf_mixed.disable()
    assert keras.layers.Dense(2, name="keepme").dtype_policy.name == "float32"  # float32 policy
    tf_mixed.enable("mixed_float16", quiet=True)  # a new enable: the rules are gone
    assert keras.layers.Dense(2, name="keepme").dtype_policy.name == "mixed_float16"


class _Block(keras.layers.Layer):
    """A keras-io style block: its sub-layers are created in __init__, after super()."""

    def __init__(self, width):
        super().__init__()
        self.width = width
        self.inner = keras.layers.Dense(width, name="block_inner")

    def call(self, x):
        return self.inner(x)


def test_predicates_see_complete_built_layers():
    tf_mixed.enable("mixed_float16", quiet=True, keep_float32=[
        lambda layer: isinstance(layer, keras.layers.Dense) and layer.units > 512,
        lambda layer: isinstance(layer, _Block) and layer.width == 8,
        lambda layer: isinstance(layer, keras.layers.MultiHeadAttention)
        and layer.count_params() > 100,  # weights exist: the layer is built
    ])
    inputs = keras.Input((3, 8))
    h = keras.layers.Dense(1024, name="wide")(inputs)
    h = keras.layers.Dense(8, name="narrow")(h)
    h = _Block(8)(h)
    h = keras.layers.MultiHeadAttention(2, 4, name="mha")(h, h)
    model = keras.Model(inputs, h)
    dtypes = {layer.name: layer.compute_dtype for layer in model.layers}
    assert dtypes["wide"] == "float32" and dtypes["narrow"] == "float16"
    block = model.layers[3]
    assert (block.compute_dtype, block.inner.compute_dtype) == ("float32", "float32")
    mha = model.get_layer("mha")
    assert mha.compute_dtype == "float32"
    assert {type(inner).__name__: inner.compute_dtype
            for inner in mha._flatten_layers(include_self=False)} == {
        "EinsumDense": "float32", "Softmax": "float32", "Dropout": "float32"}
    # From the first (symbolic) call on: the graph and an eager call agree.
    assert model.get_layer("wide").output.dtype == "float32"
    assert model.get_layer("narrow").output.dtype == "float16"
    assert keras.Model(inputs, model.get_layer("wide").output)(
        np.ones((1, 3, 8), "float32")).dtype == "float32"


def test_a_predicate_runs_at_an_eager_first_call_before_its_inputs_are_cast():
    tf_mixed.enable("mixed_bfloat16", quiet=True,
                    keep_float32=lambda layer: getattr(layer, "units", 0) > 512)
    wide = keras.layers.Dense(1024, name="wide", kernel_initializer="ones")
    x = np.full((1, 1), 257.0, "float32")  # bfloat16 would round 257 to 256
    y = wide(x)
    assert wide.compute_dtype == "float32" and wide.built
    assert y.dtype == "float32" and float(y[0, 0]) == 257.0


def test_a_predicate_that_raises_is_reported_with_the_layer_name():
    tf_mixed.enable("mixed_float16", keep_float32=lambda layer: layer.units > 512, quiet=True)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(1024, name="wide")(inputs)
    with pytest.raises(ValueError, match=r"A keep_float32 predicate raised AttributeError: .*"
                       r"on layer 'drop' \(class Dropout\).*complete and built.*"
                       r"isinstance\(layer, keras.layers.Dense\) and layer.units > 512"
                       r".*Received: keep_float32 predicate <function"):
        keras.layers.Dropout(0.5, name="drop")(h)


@pytest.mark.slow
def test_an_unknown_name_is_reported_by_the_monitor_set_up_check():
    tf_mixed.enable("mixed_float16", keep_float32=["keep_me"], quiet=True)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="keepme"),
                              tf_mixed.Float32Output()])
    model.compile(optimizer=tf_mixed.wrap_optimizer("sgd"), loss="mse")
    problems = tf_mixed.callbacks.monitor.model_setup_problems(model)
    unknown = [p for p in problems if "keep_float32" in p]
    assert len(unknown) == 1
    assert "'keep_me' (did you mean 'keepme'?)" in unknown[0]
    assert "keep nothing in float32" in unknown[0]
    with pytest.warns(tf_mixed.callbacks.MixedPrecisionWarning, match="'keep_me'"):
        model.fit(np.ones((2, 3)), np.ones((2, 2)), verbose=0,
                  callbacks=[tf_mixed.LossScaleMonitor()])


def test_the_issue_predicate_reads_units_and_never_sees_the_model():
    tf_mixed.enable("mixed_float16", quiet=True, keep_float32=lambda layer: layer.units > 512)
    inputs = keras.Input((4,))
    h = keras.layers.Dense(1024, name="wide")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(16, name="narrow")(h))
    assert _compute(model) == {"wide": "float32", "narrow": "float16"}
    converted = tf_mixed.convert(keras.Model(inputs, h), "mixed_bfloat16",
                                 keep_float32=lambda layer: layer.units > 512)
    assert converted.get_layer("wide").compute_dtype == "float32"
