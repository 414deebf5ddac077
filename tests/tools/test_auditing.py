"""tf_mixed.tools.auditing: per-layer rows, findings, memory estimate (command line: test_cli)."""

import json

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.tools.auditing import AuditReport


@pytest.fixture
def fp16():
    tf_mixed.enable("mixed_float16", quiet=True)


def _mlp(units=64, activation="softmax", head=False):
    inputs = keras.Input((16,))
    x = keras.layers.Dense(units, activation="relu", name="hidden")(inputs)
    if head:
        x = keras.layers.Dense(8, name="logits")(x)
        outputs = tf_mixed.layers.OutputActivation(activation, name="probs")(x)
    else:
        outputs = keras.layers.Dense(8, activation=activation, name="probs")(x)
    return keras.Model(inputs, outputs, name="mlp")


def _cnn():
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(16)(x)
    outputs = tf_mixed.layers.OutputActivation("softmax")(x)
    return keras.Model(inputs, outputs, name="cnn")


def _codes(report, layer=None):
    return [f.code for f in report.findings if layer is None or f.layer == layer]


# ---------------------------------------------------------------- rows


def test_rows_give_dtypes_and_params(fp16):
    report = tf_mixed.audit(_mlp(head=True))
    assert isinstance(report, AuditReport)
    rows = {r.name: r for r in report.rows}
    hidden = rows["hidden"]
    assert (hidden.class_name, hidden.compute_dtype, hidden.variable_dtype,
            hidden.output_dtype, hidden.params) == (
        "Dense", "float16", "float32", "float16", 16 * 64 + 64)
    assert rows["probs"].output_dtype == "float32"
    assert (rows["input_layer"].compute_dtype,
            rows["input_layer"].output_dtype) == ("-", "float32")
    assert rows["probs"].class_name == "OutputActivation"
    assert report.params == 16 * 64 + 64 + 64 * 8 + 8
    assert report.policy == "mixed_float16"


# ---------------------------------------------------------------- findings


def test_finds_float16_softmax_output(fp16):
    report = tf_mixed.audit(_mlp())
    [finding] = report.by_code("half_output_activation")
    assert finding.severity == "error"
    assert finding.layer == "probs"
    assert "softmax computed in float16" in finding.message
    assert "OutputActivation('softmax')" in finding.fix


def test_float32_head_has_no_output_finding(fp16):
    report = tf_mixed.audit(_mlp(head=True))
    assert not report.by_code("half_output_activation")
    assert not report.by_code("half_output")
    assert not report.by_code("explicit_float32")  # tf_mixed heads not listed


def test_finds_plain_half_output(fp16):
    report = tf_mixed.audit(_mlp(activation=None))
    assert [f.severity for f in report.by_code("half_output")] == ["warning"]
    assert not report.by_code("half_output_activation")


def test_finds_sigmoid_in_bfloat16():
    tf_mixed.enable("mixed_bfloat16", quiet=True)
    report = tf_mixed.audit(_mlp(activation="sigmoid"))
    [finding] = report.by_code("half_output_activation")
    assert "sigmoid computed in bfloat16" in finding.message


def test_finds_dense_100_not_multiple_of_8(fp16):
    report = tf_mixed.audit(_mlp(units=100, head=True))
    [finding] = report.by_code("not_multiple_of_8")
    assert finding.layer == "hidden"
    assert finding.severity == "warning"
    assert "units=100" in finding.message
    assert finding.fix == "use units=104."
    assert not tf_mixed.audit(_mlp(units=96, head=True)).by_code(
        "not_multiple_of_8")


def test_dimensions_of_conv_embedding_attention(fp16):
    tokens = keras.Input((8,), dtype="int32")
    x = keras.layers.Embedding(1000, 20)(tokens)
    x = keras.layers.MultiHeadAttention(num_heads=2, key_dim=12)(x, x)
    x = keras.layers.Conv1D(filters=10, kernel_size=3)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = tf_mixed.layers.OutputActivation("sigmoid")(x)
    report = tf_mixed.audit(keras.Model(tokens, outputs))
    messages = " ".join(f.message for f in report.by_code("not_multiple_of_8"))
    assert "output_dim=20" in messages
    assert "key_dim=12" in messages
    assert "filters=10" in messages


def test_batch_size_not_multiple_of_8(fp16):
    model = _mlp(head=True)
    [finding] = tf_mixed.audit(model, batch_size=30).by_code(
        "batch_not_multiple_of_8")
    assert "batch_size=32" in finding.fix
    assert not tf_mixed.audit(model, batch_size=32).by_code(
        "batch_not_multiple_of_8")
    assert not tf_mixed.audit(model).by_code("batch_not_multiple_of_8")


def test_unit_normalization_in_float16_overflows(fp16):
    inputs = keras.Input((16,))
    x = keras.layers.UnitNormalization(name="unit")(inputs)
    x = keras.layers.LayerNormalization(name="ln")(x)
    x = keras.layers.BatchNormalization(name="bn")(x)
    outputs = keras.layers.Dense(8, dtype="float32")(x)
    report = tf_mixed.audit(keras.Model(inputs, outputs))
    assert [f.layer for f in report.by_code("norm_overflow")] == ["unit"]
    # And the overflow is real: a norm above 256 gives zeros in float16.
    unit = keras.layers.UnitNormalization()
    y = keras.ops.convert_to_numpy(unit(np.full((1, 16), 300.0, "float32")))
    assert (y == 0).all()


def test_unit_normalization_in_bfloat16_is_fine():
    tf_mixed.enable("mixed_bfloat16", quiet=True)
    inputs = keras.Input((16,))
    outputs = keras.layers.UnitNormalization()(inputs)
    assert not tf_mixed.audit(keras.Model(inputs, outputs)).by_code(
        "norm_overflow")


def test_explicit_float32_layers_listed_in_mixed_model_only(fp16):
    inputs = keras.Input((16,))
    x = keras.layers.Dense(16, name="half")(inputs)
    outputs = keras.layers.Dense(8, dtype="float32", name="full")(x)
    report = tf_mixed.audit(keras.Model(inputs, outputs))
    [finding] = report.by_code("explicit_float32")
    assert (finding.layer, finding.severity) == ("full", "info")
    keras.config.set_dtype_policy("float32")
    assert not tf_mixed.audit(_mlp(head=True)).by_code("explicit_float32")


def test_a_normalization_enable_kept_in_float32_is_not_told_to_drop_a_dtype(fp16):
    """Issue 46: the advice named a dtype argument the user never wrote."""
    inputs = keras.Input((4,))
    norm = keras.layers.Normalization(name="norm")  # no dtype: enable() keeps it float32
    norm.adapt(np.arange(40, dtype="float32").reshape(10, 4))
    outputs = keras.layers.Dense(2, name="out")(norm(inputs))
    report = tf_mixed.audit(keras.Model(inputs, outputs))
    [finding] = report.by_code("explicit_float32")
    assert finding.layer == "norm" and finding.fix == "nothing."
    assert "tf_mixed keeps Normalization and Discretization" in finding.message
    assert "dtype argument" not in finding.fix


def test_model_built_before_enable():
    model = _mlp(head=True)
    assert not tf_mixed.audit(model).by_code("policy_mismatch")
    tf_mixed.enable("mixed_float16", quiet=True)
    [finding] = tf_mixed.audit(model).by_code("policy_mismatch")
    assert "'float32' but the global policy is 'mixed_float16'" in finding.message
    assert "tf_mixed.convert" in finding.fix


def test_layer_before_float32_head_counts_as_output(fp16):
    report = tf_mixed.audit(_mlp(head=True))  # logits: Dense(8) -> head
    assert not report.by_code("not_multiple_of_8")
    inputs = keras.Input((16,))
    x = keras.layers.Dense(10, name="logits")(inputs)
    outputs = tf_mixed.layers.OutputActivation("softmax")(x)
    [finding] = tf_mixed.audit(keras.Model(inputs, outputs)).by_code(
        "not_multiple_of_8")
    assert (finding.layer, finding.severity) == ("logits", "info")


def test_sound_float32_model_has_no_warnings():
    report = tf_mixed.audit(_mlp(head=True), batch_size=64)
    assert [f for f in report.findings if f.severity != "info"] == []


def test_nested_model_softmax_is_found(fp16):
    inner = _mlp()
    inputs = keras.Input((16,))
    outer = keras.Model(inputs, inner(inputs), name="outer")
    report = tf_mixed.audit(outer)
    [finding] = report.by_code("half_output_activation")
    assert finding.layer == "mlp/probs"
    assert "mlp/hidden" in [r.name for r in report.rows]


def test_subclassed_model_gets_rows_without_graph(fp16):
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(8)

        def call(self, x):
            return self.dense(x)

    net = Net()
    net(np.zeros((1, 4), "float32"))
    report = tf_mixed.audit(net)
    assert [r.params for r in report.rows] == [40]
    assert report.by_code("no_graph")
    assert report.memory is None


# ---------------------------------------------------------------- memory


def test_memory_exact_for_float32_mlp():
    report = tf_mixed.audit(_mlp(head=True), batch_size=32)
    # Outputs per sample: hidden 64, logits 8, probs 8 floats of 4 bytes.
    assert report.memory.float32_bytes == 32 * (64 + 8 + 8) * 4
    assert report.memory.policy_bytes == report.memory.float32_bytes
    assert report.memory.exact


def test_memory_float32_twice_mixed_for_cnn(fp16):
    report = tf_mixed.audit(_cnn(), batch_size=16)
    memory = report.memory
    assert memory.batch_size == 16
    assert 1.95 < memory.float32_bytes / memory.policy_bytes < 2.0
    # The float32 head (16 floats per sample) is the only float32 output.
    convs = 16 * (32 * 32 * 16 * 2 + 16 * 16 * 16 + 16 * 16 * 32 + 32 + 16)
    assert memory.policy_bytes == convs * 2 + 16 * 16 * 4
    assert "0.50x" in str(report)


# ---------------------------------------------------------------- output


def test_str_is_an_aligned_table(fp16):
    report = tf_mixed.audit(_mlp(units=100))
    lines = str(report).splitlines()
    header = lines[1]
    assert header.split() == ["layer", "class", "compute", "variables",
                              "output", "params"]
    column = header.index("compute")
    for line in lines[3:3 + len(report.rows)]:
        assert line[column - 2:column] == "  "
        assert line[column:].split()[0] in ("float16", "float32", "-")
    assert "Findings (" in str(report)
    assert "[error] probs:" in str(report)


def test_to_dict_is_json_ready(fp16):
    report = tf_mixed.audit(_mlp(units=100), batch_size=8)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["policy"] == "mixed_float16"
    assert len(data["layers"]) == len(report.rows)
    assert data["layers"][1]["name"] == "hidden"
    assert {f["code"] for f in data["findings"]} >= {
        "half_output_activation", "not_multiple_of_8"}
    assert data["memory"]["batch_size"] == 8


# ---------------------------------------------------------------- bad input


@pytest.mark.slow
@pytest.mark.parametrize("thing", ["model.keras", 3, keras.layers.Dense(2)])
def test_not_a_model(thing):
    with pytest.raises(TypeError, match="needs a keras.Model.*Received: model="):
        tf_mixed.audit(thing)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size, error", [(0, ValueError), (-8, ValueError),
                                               ("64", TypeError), (8.0, TypeError)])
def test_bad_batch_size(batch_size, error):
    with pytest.raises(error, match="batch_size"):
        tf_mixed.audit(_mlp(), batch_size=batch_size)


def test_audit_leaves_model_unchanged(fp16):
    model = _mlp()
    before = [w.copy() for w in model.get_weights()]
    tf_mixed.audit(model, batch_size=16)
    assert model.dtype_policy.name == "mixed_float16"
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- subclassed outputs


class _Classifier(keras.Model):
    """A subclassed classifier: its outputs exist only in its call."""

    def __init__(self, activation="softmax", **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="relu", name="hidden")
        self.out = keras.layers.Dense(8, activation=activation, name="probs")

    def call(self, x):
        return self.out(self.hidden(x))


def test_subclassed_softmax_output_is_read_from_a_traced_call(fp16):
    net = _Classifier(name="net")
    net(np.zeros((2, 4), "float32"))
    report = tf_mixed.audit(net)
    [finding] = report.by_code("half_output_activation")
    assert finding.severity == "error" and finding.layer == "probs"
    assert "softmax computed in float16" in finding.message
    assert "read from a traced call" in report.by_code("no_graph")[0].message
    # Tracing ran nothing: no weight changed and nothing new was created.
    assert len(net.weights) == 4


@pytest.mark.slow
def test_subclassed_float16_logits_with_a_top_k_metric_are_an_error(fp16):
    net = _Classifier(activation=None, name="topk_net")
    net(np.zeros((2, 4), "float32"))
    net.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    [finding] = tf_mixed.audit(net).by_code("half_output")
    assert finding.severity == "error" and finding.layer == "probs"
    assert "SparseTopKCategoricalAccuracy" in finding.message
    assert "InTopKV2" in finding.message
    # And it is true: Keras's fit fails on it.
    with pytest.raises(TypeError, match="InTopKV2"):
        net.fit(np.zeros((4, 4)), np.zeros(4), verbose=0)


def test_an_unbuilt_subclassed_model_says_to_build_it(fp16):
    report = tf_mixed.audit(_Classifier(name="unbuilt"))
    assert not report.by_code("half_output_activation")
    assert "not built" in report.by_code("no_graph")[0].message


def test_a_float32_model_is_told_to_turn_mixed_precision_on():
    # Issue 37: the audit compared float32 with itself ("float32 X, float32 X (1.00x)").
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(4)])
    report = tf_mixed.audit(model)
    (finding,) = report.by_code("not_mixed")
    assert finding.severity == "info"
    assert finding.fix.startswith("turn mixed precision on: tf_mixed.enable()")
    text = str(report)
    assert "in float32 (mixed precision stores most of it in half the bytes)" in text
    assert "(1.00x)" not in text
    # A mixed model has no such finding, and its memory line compares the two.
    tf_mixed.enable("mixed_bfloat16")
    mixed = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(4)])
    mixed_report = tf_mixed.audit(mixed)
    assert mixed_report.by_code("not_mixed") == []
    assert "float32 " in str(mixed_report) and "mixed_bfloat16 " in str(mixed_report)
