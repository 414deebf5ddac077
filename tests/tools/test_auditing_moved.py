"""`tf_mixed.audit` of a model moved in place reports the precisions it has now (issue 47).

A built layer's policy can change in place (``enable("auto", model=...)``,
auto's check on the model's own step), but the model's symbolic tensors keep
the dtypes it was built with; the audit reads each moved layer's output from
its policy now.
"""

import keras
import pytest

import tf_mixed
from tf_mixed.policy import global_policy, model_check, precision_map

HALF = "mixed_bfloat16"


def _model(head=True):
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    x = keras.layers.Dense(8, name="logits")(x)
    if head:
        x = tf_mixed.Float32Output(name="head")(x)
    return keras.Model(inputs, x, name="moved")


def _outputs(report):
    return {row.name: row.output_dtype for row in report.rows}


@pytest.fixture
def auto_is_half(monkeypatch):
    monkeypatch.setattr(global_policy, "resolve_auto",
                        lambda info=None, measure=None: (HALF, "host probe (faked)"))


def test_a_float32_model_moved_to_half_is_audited_in_half(auto_is_half):
    model = _model()
    assert precision_map.built_as(model) == {}
    tf_mixed.enable("auto", model=model)
    try:
        report = tf_mixed.audit(model)
    finally:
        tf_mixed.disable()
    assert precision_map.built_as(model)["hidden"] == "float32"
    assert _outputs(report) == {"input_layer": "float32", "hidden": "bfloat16",
                                "logits": "bfloat16", "head": "float32"}
    # hidden's and logits' 16 + 8 values in 2 bytes, the head's 8 in 4: 80 of 128 bytes.
    assert (report.memory.policy_bytes, report.memory.float32_bytes) == (80 * 32, 128 * 32)


def test_a_half_model_moved_to_float32_is_audited_in_float32():
    with tf_mixed.policy_scope(HALF):
        model = _model(head=False)
    assert _outputs(tf_mixed.audit(model))["logits"] == "bfloat16"
    model_check.set_policies(model, model_check.float32_of(model_check.policies_of(model)))
    report = tf_mixed.audit(model)
    assert _outputs(report) == {"input_layer": "float32", "hidden": "float32",
                                "logits": "float32"}
    assert "half_output" not in {f.code for f in report.findings}  # traced at run time
    assert report.memory.ratio == 1.0


def test_a_moved_model_gets_the_half_output_finding_its_graph_hides(auto_is_half):
    model = _model(head=False)
    tf_mixed.enable("auto", model=model)
    tf_mixed.disable()  # the global policy float32 again; the model stays moved
    findings = {f.code: f.message for f in tf_mixed.audit(model).findings}
    assert "half_output" in findings
    assert "(moved there in place by tf_mixed" in findings["policy_given"]


def test_a_layer_healing_moves_is_audited_in_float32_with_its_build_policy():
    # Healing moves through the same precision_map.move: its moves are noted too.
    with tf_mixed.policy_scope(HALF):
        model = _model(head=False)
    moved = precision_map.move(model, {"logits": "float32"})
    assert [layer.name for layer in moved] == ["logits"]
    precision_map.move(model, {"logits": HALF})      # its first policy is kept
    precision_map.move(model, {"logits": "float32"})
    assert precision_map.built_as(model) == {"logits": HALF}
    assert _outputs(tf_mixed.audit(model))["logits"] == "float32"
