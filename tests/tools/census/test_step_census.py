"""tf_mixed.census: the traced fit step's dtypes, casts, FLOPs and findings.

Every figure here is read from a traced graph (nothing runs, nothing is
timed), so the expected numbers are the arithmetic of the model, worked out
by hand in each test.
"""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from repo_paths import DATA

import tf_mixed
from tf_mixed.tools.census import hlo_ops


def _batch(n=16, width=16, out=3, dtype="float32"):
    return np.ones((n, width), dtype), np.zeros((n, out), "float32")


def _mlp(middle_dtype=None, width=32, name="m"):
    inp = keras.Input((16,), name="x")
    h = keras.layers.Dense(width, activation="relu", name="wide")(inp)
    h = keras.layers.Dense(32, name="d2", dtype=middle_dtype)(h)
    out = keras.layers.Dense(3, name="out")(h)
    return keras.Model(inp, out, name=name)


def _casts(report):
    return {(r.layer, r.source, r.target): r.count for r in report.casts}


@pytest.mark.slow
def test_casts_counted_by_hand():
    # mixed_bfloat16 with a float32 Dense in the middle, loss mse, batch 16.
    # Forward: x f32->bf16 (into wide), wide kernel and bias f32->bf16,
    # wide's output bf16->f32 (into d2), d2's output f32->bf16 (into out),
    # out kernel and bias, the loss's bf16->f32: 8. Backward, each of them
    # reversed except the input's (no gradient for data): 7. A cast Keras
    # puts in front of a layer belongs to that layer, and so does its gradient.
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp(middle_dtype="float32")
    x, y = _batch()
    report = tf_mixed.census(model, x, y, loss="mse", batch_size=16)
    assert _casts(report) == {
        ("wide", "float32", "bfloat16"): 3,   # x, kernel, bias
        ("wide", "bfloat16", "float32"): 2,   # kernel and bias gradients
        ("d2", "bfloat16", "float32"): 1,     # wide's output into d2
        ("d2", "float32", "bfloat16"): 1,     # its gradient
        ("out", "float32", "bfloat16"): 3,    # d2's output, kernel, bias
        ("out", "bfloat16", "float32"): 3,    # their gradients
        ("(loss)", "bfloat16", "float32"): 1,
        ("(loss)", "float32", "bfloat16"): 1,
    }
    assert report.casts_per_step == 15
    rows = {(r.layer, r.source, r.target): r.bytes for r in report.casts}
    # d2's input: 16 x 32 elements, read as bfloat16 (2) and written as float32 (4).
    assert rows[("d2", "bfloat16", "float32")] == 16 * 32 * 6
    # The loss: 16 x 3 each way.
    assert rows[("(loss)", "bfloat16", "float32")] == 16 * 3 * 6
    # wide: x 16x16, kernel 16x32, bias 32.
    assert rows[("wide", "float32", "bfloat16")] == (256 + 512 + 32) * 6
    assert report.cast_bytes_per_step == sum(rows.values())


@pytest.mark.slow
def test_flops_and_half_share_by_hand():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp(middle_dtype="float32")
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    # wide (16->32): forward and kernel gradient, 2*16*16*32 each; out (32->3):
    # forward and two gradients, 2*16*32*3 each; d2 (32->32) in float32: three.
    half = 2 * (2 * 16 * 16 * 32) + 3 * (2 * 16 * 32 * 3)
    single = 3 * (2 * 16 * 32 * 32)
    assert report.flops == {"bfloat16": half, "float32": single}
    assert report.half_flop_share == pytest.approx(half / (half + single))
    assert report.op_counts["MatMul"] == {"bfloat16": 5, "float32": 3}
    assert report.unknown_flops == 0


@pytest.mark.slow
def test_planted_float32_dense_is_an_island_with_its_fix():
    keras.config.set_dtype_policy("mixed_float16")
    model = _mlp(middle_dtype="float32")
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    island, = report.islands
    assert (island.layer, island.reason, island.ops) == ("d2", "explicit_dtype", 3)
    assert island.flops == 3 * 2 * 16 * 32 * 32
    finding, = report.by_code("float32_island")
    assert finding.layer == "d2"
    assert "dtype='float32'" in finding.fix and "tf_mixed.convert" in finding.fix
    assert finding.automatic
    assert finding.audit == "explicit_float32"  # linked, not copied
    assert "explicit_float32" in str(finding)


@pytest.mark.slow
def test_keep_float32_rule_is_named_and_the_probe_is_the_fix():
    tf_mixed.enable("mixed_bfloat16", keep_float32=["d2"])
    model = _mlp()
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    finding, = report.by_code("float32_island")
    assert finding.layer == "d2"
    assert report.islands[0].reason == "keep_float32"
    assert "tf_mixed.probe" in finding.fix and "keep_float32" in finding.fix
    assert not finding.automatic


def test_lambda_doing_float32_math():
    keras.config.set_dtype_policy("mixed_bfloat16")
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, name="d1")(inp)
    h = keras.layers.Lambda(
        lambda t: tf.matmul(tf.cast(t, "float32"), tf.ones((32, 16))), name="lam")(h)
    out = keras.layers.Dense(3, name="out")(h)
    model = keras.Model(inp, out)
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    finding, = report.by_code("lambda_float32")
    assert finding.layer == "lam"
    assert "1 cast(s) of its bfloat16 input up to float32" in finding.message
    assert "Lambda's input dtype" in finding.fix
    assert [i.layer for i in report.islands] == ["lam"]
    assert report.by_code("float32_island") == []  # one finding per cause


@pytest.mark.slow
def test_width_1001_names_the_layer_and_the_padding():
    keras.config.set_dtype_policy("mixed_float16")
    model = _mlp(width=1001)
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    finding, = report.by_code("tile_misfit")
    assert finding.layer == "wide"
    assert finding.fix == "use units=1008."
    assert finding.audit == "not_multiple_of_8"
    misfits = {(m.layer, m.dimension): m.value for m in report.misfits}
    # d2 contracts over 1001 too (k), and out's width 3 is the task's.
    assert misfits == {("wide", "n"): 1001, ("d2", "k"): 1001, ("out", "n"): 3}


def test_bfloat16_tiles_are_16_wide():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp(width=40)  # a multiple of 8, not of 16
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    finding, = report.by_code("tile_misfit")
    assert (finding.layer, finding.fix) == ("wide", "use units=48.")
    assert finding.audit is None  # audit checks multiples of 8 only


def test_float64_input_is_named_with_the_pipeline_fix():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp()
    x, y = _batch(dtype="float64")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    report = tf_mixed.census(model, dataset, loss="mse")
    finding, = report.by_code("float64_input")
    assert finding.layer == "wide"
    assert "tf.cast(x, 'float32')" in finding.fix
    assert _casts(report)[("wide", "float64", "float32")] == 1


def test_float64_arrays_are_converted_by_keras_as_fit_does():
    # Keras's array adapter casts float64 NumPy data to float32 on the host.
    keras.config.set_dtype_policy("mixed_bfloat16")
    report = tf_mixed.census(_mlp(), *_batch(dtype="float64"), loss="mse", batch_size=16)
    assert report.by_code("float64_input") == []


def test_clean_model_has_no_findings():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp()
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    assert report.findings == ()
    assert report.islands == ()
    assert "Findings: none" in str(report)


def test_float32_model_has_no_islands_and_no_half_flops():
    model = _mlp()
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    assert report.half_flop_share == 0.0
    assert report.casts_per_step == 0
    assert report.findings == ()


@pytest.mark.slow
def test_conv_flops_by_hand():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(16, 3, padding="same", name="c1"),
        keras.layers.Conv2D(16, 3, padding="same", name="c2"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(4, name="out"),
    ])
    x = np.ones((2, 8, 8, 3), "float32")
    y = np.zeros((2,), "int32")
    report = tf_mixed.census(model, x, y, loss="sparse_categorical_crossentropy",
                             batch_size=2)
    c1 = 2 * (2 * 8 * 8 * 16) * (3 * 3 * 3)   # forward, and its filter gradient
    c2 = 2 * (2 * 8 * 8 * 16) * (3 * 3 * 16)  # forward, input and filter gradients
    out = 2 * 2 * 16 * 4                      # forward, and two gradients
    assert report.flops == {"bfloat16": 2 * c1 + 3 * c2 + 3 * out}
    assert report.op_counts["Conv2D"] == {"bfloat16": 2}
    assert report.op_counts["Conv2DBackpropFilter"] == {"bfloat16": 2}
    assert report.op_counts["Conv2DBackpropInput"] == {"bfloat16": 1}


def test_census_changes_no_weight_and_reads_a_compiled_model():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp()
    model.compile(optimizer="sgd", loss="mse")
    before = [w.numpy().copy() for w in model.weights]
    report = tf_mixed.census(model, *_batch(), batch_size=16)
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights))
    assert report.batch_size == 16
    assert set(report.to_dict()) >= {"half_flop_share", "casts_per_step", "findings"}


@pytest.mark.slow
def test_nested_model_layers_are_named_with_their_path():
    keras.config.set_dtype_policy("mixed_bfloat16")
    inner = keras.Sequential([keras.Input((32,)), keras.layers.Dense(20, name="odd")],
                             name="inner")
    inp = keras.Input((16,))
    out = keras.layers.Dense(3, name="out")(inner(keras.layers.Dense(32, name="d1")(inp)))
    model = keras.Model(inp, out)
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    finding, = report.by_code("tile_misfit")
    assert finding.layer == "inner/odd"


@pytest.mark.slow
def test_jit_compile_reads_the_optimized_hlo():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp()
    graph = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    xla = tf_mixed.census(model, *_batch(), jit_compile=True, batch_size=16)
    assert graph.source == "graph" and not graph.jit_compile
    if xla.source == "graph":  # TF could not give the HLO: said, not hidden
        assert "unavailable" in xla.note
    else:
        assert xla.source == "optimized_hlo" and xla.jit_compile
        # XLA may change dtypes, not the arithmetic.
        assert sum(xla.flops.values()) == sum(graph.flops.values())


def test_hlo_text_recorded_from_xla():
    # Optimized HLO of a mixed_float16 Dense(8, relu) -> Dense(4) model,
    # batch 8, 12 features, recorded on a CPU (tests/data). XLA's CPU backend
    # computes the five float16 matmuls in float32.
    records = hlo_ops.read_hlo((DATA / "census_optimized_hlo.txt").read_text())
    dots = [r for r in records if r.type == "dot"]
    assert sorted(r.flops for r in dots) == sorted(
        [2 * 8 * 12 * 8, 2 * 8 * 8 * 4, 2 * 8 * 8 * 4, 2 * 8 * 4 * 8, 2 * 12 * 8 * 8])
    assert {r.dtype for r in dots} == {"float32"}
    names = {r.name for r in dots}
    assert "tiny_1/hidden_1/MatMul" in names
    assert "gradient_tape/tiny_1/head_1/MatMul/MatMul_1" in names
    casts = [r for r in records if r.cast_from is not None]
    kernel = [r for r in casts if r.name == "tiny_1/hidden_1/Cast/Cast"]
    # Keras's cast of the 12x8 kernel to float16, and the convert XLA adds
    # (no metadata of its own: named after its operand) back to float32.
    assert [(r.cast_from, r.dtype, r.elements, r.cast_bytes) for r in kernel] == [
        ("float32", "float16", 96, 96 * 6), ("float16", "float32", 96, 96 * 6)]
    hlo_names = [r.name for r in dots + casts if re.fullmatch(r"[\w\-]+\.\d+", r.name)]
    assert hlo_names == []  # every dot and convert traced back to a TF op


def test_hlo_parser_on_a_convolution_line():
    text = "\n".join([
        "  %x = f16[2,8,8,3]{3,2,1,0} parameter(0)",
        "  %w = f16[3,3,3,16]{3,2,1,0} parameter(1)",
        "  %conv = f16[2,8,8,16]{3,2,1,0} convolution(%x, %w), window={size=3x3 pad=1_1x1_1}, "
        'dim_labels=b01f_01io->b01f, metadata={op_type="Conv2D" op_name="m/c1/convolution"}',
    ])
    record, = hlo_ops.read_hlo(text)
    assert (record.name, record.dtype) == ("m/c1/convolution", "float16")
    assert record.flops == 2 * (2 * 8 * 8 * 16) * 9 * 3
    assert dict(record.dims) == {"n": 16, "k": 3}


def test_hlo_parser_refuses_text_without_instructions():
    with pytest.raises(ValueError, match="no HLO instruction"):
        hlo_ops.read_hlo("not hlo")


@pytest.mark.slow
def test_mirrored_step_is_counted_per_replica(mirrored):
    keras.config.set_dtype_policy("mixed_bfloat16")
    # fit splits a global batch of 16 over the two replicas: 8 rows each.
    single = tf_mixed.census(_mlp(middle_dtype="float32"), *_batch(n=8), loss="mse",
                             batch_size=8)
    with mirrored.scope():
        model = _mlp(middle_dtype="float32")
    # Compiled (with Adam, whose slots fit builds before tracing) by census,
    # in the model's strategy scope as fit would.
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    half = 2 * (2 * 8 * 16 * 32) + 3 * (2 * 8 * 32 * 3)
    assert report.flops == single.flops == {"bfloat16": half, "float32": 3 * (2 * 8 * 32 * 32)}
    assert report.op_counts["MatMul"] == single.op_counts["MatMul"]
    assert report.casts == single.casts
    assert [i.layer for i in report.islands] == ["d2"]
    assert (report.batch_size, report.replicas, report.global_batch_size) == (8, 2, 16)
    assert "batch 8 per replica, 2 replicas, global batch 16)" in str(report)
    assert report.to_dict()["replicas"] == 2
    # An odd global batch: the first replica takes the larger share, as TF rebatches.
    odd = tf_mixed.census(model, *_batch(n=15), batch_size=15)
    assert (odd.batch_size, odd.global_batch_size) == (8, 15)
    assert single.replicas == 1 and single.global_batch_size == 8


# ------------------------------------------------------------------ errors


def test_not_a_model():
    with pytest.raises(TypeError, match=r"census\(\) needs a keras.Model "
                                        r".*Received: model='m.keras'.*doctor"):
        tf_mixed.census("m.keras", None)


def test_uncompiled_model_needs_a_loss():
    with pytest.raises(ValueError, match=r"not compiled. Pass loss=.*Received: loss=None"):
        tf_mixed.census(_mlp(), *_batch())


def test_compiled_model_refuses_a_second_loss():
    model = _mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"compiled already.*Received: loss='mae'"):
        tf_mixed.census(model, *_batch(), loss="mae")


def test_jit_compile_must_be_a_bool():
    with pytest.raises(TypeError,
                       match=r"`jit_compile` must be None .*Received: jit_compile='yes'"):
        tf_mixed.census(_mlp(), *_batch(), loss="mse", jit_compile="yes")


@pytest.mark.slow
@pytest.mark.parametrize("bad", [0, 2.5, True])
def test_batch_size_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=rf"`batch_size` must be.*Received: batch_size={bad!r}"):
        tf_mixed.census(_mlp(), *_batch(), loss="mse", batch_size=bad)


def test_data_the_model_cannot_take():
    with pytest.raises(ValueError, match="cannot take the data"):
        tf_mixed.census(_mlp(), "not data", loss="mse")


@pytest.mark.slow
def test_the_layer_behind_a_float32_head_is_an_output_layer():
    keras.config.set_dtype_policy("mixed_bfloat16")
    inp = keras.Input((16,))
    logits = keras.layers.Dense(10, name="logits")(keras.layers.Dense(32)(inp))
    out = tf_mixed.layers.OutputActivation("softmax", name="probabilities")(logits)
    model = keras.Model(inp, out)
    report = tf_mixed.census(model, np.ones((16, 16), "float32"), np.zeros(16, "int32"),
                             loss="sparse_categorical_crossentropy", batch_size=16)
    misfit, = report.misfits
    assert (misfit.layer, misfit.output) == ("logits", True)
    assert report.findings == ()


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="sub")
        self.hidden = keras.layers.Dense(40, name="hidden")
        self.head = keras.layers.Dense(3, name="head")

    def call(self, x):
        return self.head(self.hidden(x))


@pytest.mark.slow
def test_subclassed_model_layers_and_its_output_found_from_the_graph():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _Subclassed()
    model(np.ones((2, 16), "float32"))
    report = tf_mixed.census(model, *_batch(), loss="mse", batch_size=16)
    # No symbolic outputs: 'head' is the output because the loss reads it.
    assert [(f.code, f.layer) for f in report.findings] == [("tile_misfit", "hidden")]
    # The input's cast belongs to the layer reading it, as in a functional model.
    assert _casts(report)[("hidden", "float32", "bfloat16")] == 3


@pytest.mark.slow
def test_run_eagerly_model_is_traced_and_says_so():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = _mlp()
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    report = tf_mixed.census(model, *_batch(), batch_size=16)
    assert "run_eagerly=True" in report.note
    assert report.casts_per_step == tf_mixed.census(
        _mlp(), *_batch(), loss="mse", batch_size=16).casts_per_step
