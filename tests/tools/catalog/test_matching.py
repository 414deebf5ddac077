"""tf_mixed.tools.catalog.matching: a layer is judged by the nearest measured configuration."""

import sys

import keras
import pytest

import tf_mixed
from tf_mixed.tools.catalog import matching, model_check, results
from tf_mixed.tools.catalog.reading import SafeRange

F16 = "mixed_float16"


def _called(layer, shape=(16,)):
    """The layer called symbolically on an input of ``shape`` (its input_dim is known)."""
    layer(keras.Input(shape))
    return layer


def _key(layer, policy=F16):
    found = model_check.match_for(results.stored(), layer, policy)
    return found.row.key, found.close, found.differences


@pytest.mark.parametrize("layer, key", [
    (keras.layers.LayerNormalization(), "LayerNormalization[epsilon=1e-3]"),  # Keras's default
    (keras.layers.LayerNormalization(epsilon=1e-6), "LayerNormalization[epsilon=1e-6]"),
    (keras.layers.LayerNormalization(epsilon=1e-5), "LayerNormalization[epsilon=1e-6]"),
    (keras.layers.GroupNormalization(groups=2, epsilon=1e-12),
     "GroupNormalization[epsilon=1e-12]"),
    (keras.layers.GroupNormalization(), "GroupNormalization[groups=4, epsilon=1e-3]"),
    (keras.layers.BatchNormalization(), "BatchNormalization[batch statistics]"),
    (keras.layers.BatchNormalization(epsilon=1.001e-5),  # keras.applications' ResNet
     "BatchNormalization[batch statistics, epsilon=1e-5]"),
    (keras.layers.Activation("tanh"), "Activation[activation=tanh]"),
    (keras.layers.Activation("softmax"), "Activation[activation=softmax]"),
    (keras.layers.Softmax(), "Softmax[default]"),  # never the [mask] row
    (keras.layers.Dot(axes=-1, normalize=True), "Dot[normalize]"),
])
def test_the_nearest_configuration_is_chosen(layer, key):
    assert _key(layer) == (key, True, ())


@pytest.mark.parametrize("units, inputs, key", [
    (32, 16, "Dense[units=64]"),
    (2, 3, "Dense[units=64]"),         # smaller than measured: covered
    (10, 784, "Dense[inputs=4096]"),   # the length of its sums is the point
    (2048, 16, "Dense[units=4096]"),
])
def test_dense_is_matched_by_units_and_the_length_of_its_sums(units, inputs, key):
    assert _key(_called(keras.layers.Dense(units), (inputs,))) == (key, True, ())


def test_no_close_configuration_is_said_with_the_nearest_and_what_differs():
    key, close, differences = _key(keras.layers.LayerNormalization(epsilon=1e-12))
    assert (key, close) == ("LayerNormalization[epsilon=1e-6]", False)
    assert differences == ("epsilon 1e-12 (measured 1e-06)",)
    assert model_check.row_for(results.stored(), keras.layers.LayerNormalization(epsilon=1e-12),
                               F16) is None


def test_audit_names_a_layer_no_configuration_is_close_to():
    inputs = keras.Input((8,))
    outputs = keras.layers.LayerNormalization(epsilon=0.5, name="wide", dtype=F16)(inputs)
    report = tf_mixed.audit(keras.Model(inputs, outputs), magnitudes={"wide": 1e5})
    (note,) = report.by_code("catalog_unmatched")
    assert note.severity == "info" and note.layer == "wide"
    assert "nearest, LayerNormalization[epsilon=1e-3], differs in epsilon 0.5 (measured 0.001)" \
        in note.message
    assert "user_case('LayerNormalization', config={'epsilon': 0.5}, inputs=[(8,)])" in note.fix
    assert not report.by_code("catalog_range")  # no row to judge 1e5 by


def test_rows_without_configuration_values_match_the_first():
    def row(config):
        return results.Row("LayerNormalization", config, F16, "keras", (), (), (),
                           SafeRange(1.0, 2.0, "", ""))

    first, second = row("a"), row("b")
    found = matching.nearest([first, second], keras.layers.LayerNormalization(epsilon=0.5))
    assert found == matching.Match(first, True, ())
    assert matching.nearest([], keras.layers.Dense(2)) is None


def test_a_row_is_matched_only_by_the_class_it_measured(monkeypatch):
    def row(source):
        return results.Row("RMSNormalization", "epsilon=1e-6", "mixed_bfloat16", source, (),
                           (), (), SafeRange(1.0, 2.0, "", ""))

    assert matching.row_class(row("keras")) is keras.layers.RMSNormalization
    assert matching.row_class(row("user")) is None
    monkeypatch.delitem(sys.modules, "keras_hub", raising=False)  # a model without KerasHub
    assert matching.row_class(row("keras_hub")) is None

    class RMSNormalization(keras.layers.RMSNormalization):  # the name, not the class
        pass

    assert model_check.match_for(results.stored(), RMSNormalization(), "mixed_bfloat16") is None
    found = model_check.match_for(results.stored(), keras.layers.RMSNormalization(),
                                  "mixed_bfloat16")
    assert (found.row.key, found.close) == ("RMSNormalization[epsilon=1e-6]", True)


def test_a_size_beyond_every_measured_one_is_not_close():
    key, close, differences = _key(_called(keras.layers.Dense(64), (1_000_000,)))
    assert (key, close) == ("Dense[inputs=4096]", False)
    assert differences == ("input_dim 1000000 (measured 4096)",)


def test_describe_reads_the_configuration_the_activation_and_the_input_dim():
    dense = _called(keras.layers.Dense(3, activation="relu"), (5,))
    assert matching.describe(dense) == {"units": 3, "input_dim": 5, "activation": "relu"}


def _embedding(cls="Embedding", vocabulary=100, dtype="float32", reverse=False):
    layer = getattr(keras.layers, cls)(vocabulary, 16)
    if reverse:
        layer(keras.Input((8, 16)), reverse=True)
    else:
        layer(keras.Input((8,), dtype=dtype))
    return layer


@pytest.mark.parametrize("cls", ["Embedding", "ReversibleEmbedding"])
def test_an_embeddings_float_ids_are_judged_by_the_float_ids_row(cls):
    assert _key(_embedding(cls)) == (f"{cls}[float ids]", True, ())


@pytest.mark.parametrize("cls", ["Embedding", "ReversibleEmbedding"])
def test_an_embeddings_integer_ids_are_judged_by_the_integer_ids_row(cls):
    # An integer id is looked up exactly; the float ids row measured the
    # rounding of ids above 256 (bfloat16) or 2048 (float16) to another row.
    layer = _embedding(cls, dtype="int32")
    assert _key(layer) == (f"{cls}[int ids]", True, ())
    row = model_check.match_for(results.stored(), layer, "mixed_bfloat16").row
    assert row.key == f"{cls}[int ids]" and row.safe.text() == "<=1e-06 .. >=1e+06"
    # Only a float ids row is left: an integer call is not judged by it.
    float_rows = [r for r in results.stored().find(cls, F16) if r.args["call"] == "float ids"]
    found = matching.nearest(float_rows, layer)
    assert (found.close, found.differences) == (False, ("call int ids (measured float ids)",))


def test_an_embeddings_vocabulary_is_compared_as_the_vocabulary():
    layer = _embedding(vocabulary=5_000_000)
    assert matching.describe(layer) == {"input_dim": 5_000_000, "call": "float ids"}
    # A Dense layer's input_dim is still the length of its sums; it has no call kind.
    assert "call" not in matching.describe(_called(keras.layers.Dense(3), (5,)))
    assert _key(layer) == ("Embedding[float ids]", False,
                           ("input_dim 5000000 (measured 60001)",))


def test_a_reversible_embeddings_reverse_call_is_judged_as_logits():
    assert _key(_embedding("ReversibleEmbedding", vocabulary=64, reverse=True)) == (
        "ReversibleEmbedding[reverse]", True, ())
    # A language model's vocabulary of logits, far beyond the measured 64.
    assert _key(_embedding("ReversibleEmbedding", vocabulary=50_000, reverse=True)) == (
        "ReversibleEmbedding[reverse]", False, ("input_dim 50000 (measured 64)",))


def test_a_surveyed_match_reads_the_first_call_from_the_survey(monkeypatch):
    """The plan's catalog read judges a model's layers from its one survey:
    an embedding's first call (reverse, here) is the survey's, not asked of
    the layer again."""
    from tf_mixed._internal import shims
    from tf_mixed.policy import precision_map

    hidden = keras.Input((8, 16))
    embedding = keras.layers.ReversibleEmbedding(64, 16, name="tied")
    model = keras.Model(hidden, embedding(hidden, reverse=True))
    found = precision_map.survey(model)
    monkeypatch.setattr(shims, "first_call_arguments", lambda layer: pytest.fail(
        "the layer's first call was asked again after the survey"))
    match = model_check.surveyed_match(results.stored(), found, embedding, F16)
    assert (match.row.key, match.close) == ("ReversibleEmbedding[reverse]", True)
