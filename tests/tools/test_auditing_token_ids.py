"""Token ids fed as floats into an Embedding: reported, and kept exact (issue 26 item 4).

Keras casts a half-precision layer's float inputs to its compute dtype, so
ids from a float ``keras.Input`` lose their low bits on the way into the
Embedding: bfloat16 represents integers exactly only up to 256, float16 up
to 2048 (499 -> 500 in bfloat16).
"""

import warnings

import keras
import ml_dtypes
import numpy as np
import pytest

import tf_mixed
from tf_mixed._internal.facts import largest_exact_integer

VOCAB = 1000
IDS = np.array([[499, 301, 257, 3]], "float32")  # bfloat16: 500, 300, 256, 3


class TokenAndPositionEmbedding(keras.layers.Layer):
    """As the keras-io text classification example writes it (with **kwargs)."""

    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(vocab_size, embed_dim)
        self.pos_emb = keras.layers.Embedding(maxlen, embed_dim)

    def call(self, x):
        positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
        return self.token_emb(x) + self.pos_emb(positions)


def _model(vocab=VOCAB):
    inputs = keras.Input((4,), name="ids")  # float32: ids as the data comes
    h = TokenAndPositionEmbedding(4, vocab, 8, name="tpe")(inputs)
    model = keras.Model(inputs, h, name="text")
    # Row i of the token table holds i, the position table zeros: the output
    # shows which row each id read.
    tpe = model.get_layer("tpe")
    tpe.token_emb.set_weights([np.repeat(np.arange(vocab, dtype="float32")[:, None], 8, 1)])
    tpe.pos_emb.set_weights([np.zeros((4, 8), "float32")])
    return model


def _rows(model):
    return np.asarray(keras.ops.convert_to_numpy(
        keras.ops.cast(model(IDS)[0, :, 0], "float32")))


@pytest.mark.slow
@pytest.mark.parametrize("dtype, limit", [("bfloat16", 256), ("float16", 2048),
                                          ("float32", 2**24)])
def test_exact_integer_limits_come_from_ml_dtypes(dtype, limit):
    assert largest_exact_integer(dtype) == limit
    kind = getattr(ml_dtypes, dtype, None) or np.dtype(dtype)
    exact = np.arange(limit - 3, limit + 1, dtype=np.float64)
    assert (exact.astype(kind).astype(np.float64) == exact).all()
    assert float(np.float64(limit + 1).astype(kind)) != limit + 1


def test_the_defect_a_bfloat16_layer_rounds_float_ids():
    keras.config.set_dtype_policy("mixed_bfloat16")  # plain Keras, no tf_mixed
    assert list(_rows(_model())) == [500.0, 300.0, 256.0, 3.0]


def test_audit_reports_the_rounding_layer():
    keras.config.set_dtype_policy("mixed_bfloat16")
    [finding] = tf_mixed.audit(_model()).by_code("rounded_ids")
    assert (finding.severity, finding.layer) == ("error", "tpe")
    assert "input_dim=1000" in finding.message and "from input 'ids'" in finding.message
    assert "ids above 256 are rounded (257 becomes 256)" in finding.message
    assert "dtype='int32'" in finding.fix and "tf_mixed.convert(model)" in finding.fix


@pytest.mark.slow
def test_audit_is_quiet_where_every_id_is_exact():
    keras.config.set_dtype_policy("mixed_float16")
    assert not tf_mixed.audit(_model()).by_code("rounded_ids")  # 999 <= 2048
    assert tf_mixed.audit(_model(vocab=3000)).by_code("rounded_ids")  # 2999 > 2048
    keras.config.set_dtype_policy("mixed_bfloat16")
    inputs = keras.Input((4,), dtype="int32")  # integer ids are never cast
    model = keras.Model(inputs, keras.layers.Embedding(VOCAB, 8)(inputs))
    assert not tf_mixed.audit(model).by_code("rounded_ids")


@pytest.mark.slow
def test_the_monitor_warns_at_the_first_fit_step():
    keras.config.set_dtype_policy("mixed_bfloat16")
    inputs = keras.Input((4,), name="ids")
    h = TokenAndPositionEmbedding(4, VOCAB, 8, name="tpe")(inputs)
    out = keras.layers.Dense(1, dtype="float32")(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.fit(IDS, np.zeros((1, 1)), verbose=0,
                  callbacks=[tf_mixed.LossScaleMonitor()])
    messages = [str(w.message) for w in record
                if issubclass(w.category, tf_mixed.callbacks.MixedPrecisionWarning)]
    assert len(messages) == 1 and "[error] tpe:" in messages[0], messages


def test_enable_keeps_the_receiving_layer_and_its_embeddings_float32():
    tf_mixed.enable("mixed_bfloat16", quiet=True)
    model = _model()
    tpe = model.get_layer("tpe")
    assert (tpe.compute_dtype, tpe.token_emb.compute_dtype,
            tpe.pos_emb.compute_dtype) == ("float32", "float32", "float32")
    assert list(_rows(model)) == [499.0, 301.0, 257.0, 3.0]
    assert not tf_mixed.audit(model).by_code("rounded_ids")
    # Integer ids, or a vocabulary bfloat16 holds exactly, change nothing.
    inputs = keras.Input((4,), dtype="int32")
    assert TokenAndPositionEmbedding(4, VOCAB, 8)(inputs).dtype == "bfloat16"
    small = TokenAndPositionEmbedding(4, 200, 8)
    small(keras.Input((4,)))
    assert small.compute_dtype == "bfloat16"


def test_convert_keeps_the_receiving_layer_and_its_embeddings_float32():
    model = _model()  # float32-built
    converted = tf_mixed.convert(model, "mixed_bfloat16")
    tpe = converted.get_layer("tpe")
    assert (tpe.compute_dtype, tpe.token_emb.compute_dtype) == ("float32", "float32")
    assert list(_rows(converted)) == [499.0, 301.0, 257.0, 3.0]
    assert not tf_mixed.audit(converted).by_code("rounded_ids")
    # float16 holds every id of a 1000-word vocabulary: converted as usual
    # (given a head, so that tpe is not the output layer convert keeps float32).
    head = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(model.output))
    with_head = keras.Model(model.input, head)
    assert tf_mixed.convert(with_head, "mixed_float16").get_layer("tpe").compute_dtype == "float16"
    assert tf_mixed.convert(with_head, "mixed_bfloat16").get_layer("tpe").compute_dtype == "float32"


@pytest.mark.slow
def test_probe_keeps_the_receiving_layer_float32_as_convert_does():
    model = _model()  # float32-built
    head = keras.layers.Dense(1, name="head")(keras.layers.GlobalAveragePooling1D()(model.output))
    with_head = keras.Model(model.input, head)
    report = tf_mixed.probe(with_head, IDS, np.zeros((1, 1), "float32"), loss="mse",
                            policy="mixed_bfloat16")
    rows = {r.name: r for r in report.layers}
    assert (rows["tpe"].compute_dtype, rows["tpe"].rel_error) == ("float32", 0.0)
    assert "'tpe'" not in report.advice
