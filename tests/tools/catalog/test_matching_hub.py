"""KerasHub layers matched to the catalog's rows by their configuration (tools/catalog/matching.py).

The backbones are built from config (never ``from_preset``: nothing is
downloaded), tiny, in mixed_bfloat16; each test states exactly which of
their layers a row judges, which are not close to any row, and which
classes the catalog has no row for. Importing keras_hub takes seconds and
changes what ``enable()`` says: these run in the slow tier, and keras_hub is
imported by the tests, not at collection.
"""

import keras
import pytest

from tf_mixed.tools.catalog import matching, model_check, results
from tf_mixed.tools.catalog.reading import SafeRange

pytestmark = pytest.mark.slow

B16 = "mixed_bfloat16"
SAFE = SafeRange(1.0, 2.0, "", "")
GELU = "keras_hub>gelu_approximate"  # BERT's and GPT-2's activation
SMALL = dict(vocabulary_size=64, num_layers=1, hidden_dim=16, intermediate_dim=32)


@pytest.fixture(autouse=True)
def hub():
    """KerasHub, imported when a test runs (skipped without it)."""
    global keras_hub
    keras_hub = pytest.importorskip("keras_hub")


keras_hub = None


@pytest.fixture
def bf16_policy():
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(B16)
    yield
    keras.config.set_dtype_policy(before)


def _coverage(model):
    return [(c.layer, c.status, c.row) for c in model_check.coverage(model)]


def _block(cls, width=16, **kwargs):
    if kwargs.get("activation") == GELU:
        kwargs["activation"] = keras.saving.get_registered_object(GELU)
    layer = getattr(keras_hub.layers, cls)(dtype=B16, **kwargs)
    layer(keras.Input((6, width)))
    return layer


def test_a_bert_backbones_layers_are_matched_by_configuration(bf16_policy):
    keras.utils.set_random_seed(7)
    model = keras_hub.models.BertBackbone(num_heads=2, max_sequence_length=16, **SMALL)
    assert _coverage(model) == [
        ("token_embedding", "matched", "ReversibleEmbedding[int ids]"),
        ("position_embedding", "matched", "PositionEmbedding[length=6]"),
        ("segment_embedding", "matched", "Embedding[int ids]"),
        ("embeddings_add", "matched", "Add[default]"),
        # BERT's epsilon of 1e-12 is 6 decades from the nearest measured (1e-6).
        ("embeddings_layer_norm", "unmatched", "LayerNormalization[epsilon=1e-6]"),
        ("embeddings_dropout", "matched", "Dropout[inference]"),
        # Post-norm, tanh gelu, epsilon 1e-12: BERT's block, measured 768 wide (16 is less).
        ("transformer_layer_0", "matched",
         "TransformerEncoder[BERT: post-norm, epsilon=1e-12, 768]"),
        ("pooled_dense", "matched", "Dense[units=64]"),
    ]
    (unmatched,) = [c for c in model_check.coverage(model) if c.status == "unmatched"]
    assert unmatched.differences == ("epsilon 1e-12 (measured 1e-06)",)


def test_a_gpt2_backbones_decoder_is_matched_to_gpt2s_block(bf16_policy):
    keras.utils.set_random_seed(7)
    model = keras_hub.models.GPT2Backbone(num_heads=2, max_sequence_length=16, **SMALL)
    assert _coverage(model) == [
        ("token_embedding", "matched", "ReversibleEmbedding[int ids]"),
        ("position_embedding", "matched", "PositionEmbedding[length=6]"),
        ("embeddings_add", "matched", "Add[default]"),
        ("embeddings_dropout", "matched", "Dropout[inference]"),
        ("transformer_layer_0", "matched",
         "TransformerDecoder[GPT-2: pre-norm, epsilon=1e-5, 768]"),
        ("layer_norm", "matched", "LayerNormalization[epsilon=1e-6]"),
    ]


def test_a_gemma_backbones_own_classes_have_no_rows(bf16_policy):
    keras.utils.set_random_seed(7)
    model = keras_hub.models.GemmaBackbone(num_query_heads=2, num_key_value_heads=1,
                                           head_dim=8, **SMALL)
    assert _coverage(model) == [
        ("token_embedding", "matched", "ReversibleEmbedding[int ids]"),
        ("decoder_block_0", "no_rows", ""),
        # Gemma's own RMSNormalization (float32 inside), not Keras's of that name.
        ("final_normalization", "no_rows", ""),
    ]
    classes = {c.layer: c.cls for c in model_check.coverage(model)}
    assert classes["final_normalization"] == (
        "keras_hub.src.models.gemma.rms_normalization.RMSNormalization")


def test_a_keras_hub_row_is_matched_only_by_keras_hubs_class():
    hub = results.Row("TransformerEncoder", "heads=2", B16, "keras_hub", (), (), (), SAFE)
    assert matching.row_class(hub) is keras_hub.layers.TransformerEncoder


@pytest.mark.parametrize("kwargs, key, close", [
    (dict(intermediate_dim=32, num_heads=2), "TransformerEncoder[heads=2]", True),
    (dict(intermediate_dim=32, num_heads=2, activation=GELU, layer_norm_epsilon=1e-12),
     "TransformerEncoder[BERT: post-norm, epsilon=1e-12, 768]", True),
    # relu with BERT's epsilon, or Keras's exact gelu: no measured block has either.
    (dict(intermediate_dim=32, num_heads=2, layer_norm_epsilon=1e-12),
     "TransformerEncoder[heads=2]", False),
    (dict(intermediate_dim=32, num_heads=2, activation="gelu", layer_norm_epsilon=1e-12),
     "TransformerEncoder[BERT: post-norm, epsilon=1e-12, 768]", False),
])
def test_a_transformer_block_is_judged_by_its_configuration(kwargs, key, close):
    found = model_check.match_for(results.stored(), _block("TransformerEncoder", **kwargs), B16)
    assert (found.row.key, found.close) == (key, close)


def test_an_unmatched_block_is_told_how_to_measure_its_own_configuration():
    block = _block("TransformerEncoder", width=32, intermediate_dim=4096, num_heads=2)
    inputs = keras.Input((6, 32))
    model = keras.Model(inputs, block(inputs))
    (note,) = [n for n in model_check.check_model(model, has_gpu=False)
               if n.code == "catalog_unmatched"]
    assert "differs in intermediate_dim 4096 (measured 32)" in note.message
    assert ("user_case('TransformerEncoder', config={'intermediate_dim': 4096, "
            "'num_heads': 2, 'input_dim'") not in note.fix  # the width is the input's
    assert ("user_case('TransformerEncoder', config={'intermediate_dim': 4096, 'num_heads': 2, "
            "'activation': 'relu', 'layer_norm_epsilon': 1e-05, 'normalize_first': False}, "
            "inputs=[(6, 32)])") in note.fix
