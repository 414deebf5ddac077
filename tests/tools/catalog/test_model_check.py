"""tf_mixed.tools.catalog.model_check: a model's layers against the catalog (audit, monitor)."""

import warnings

import keras
import numpy as np
import pytest
from zoo import ZOO

import tf_mixed
from tf_mixed.callbacks import monitor
from tf_mixed.policy import hardware
from tf_mixed.tools.catalog import model_check, results


def _unit_model(policy="mixed_float16"):
    inputs = keras.Input((3,))
    x = keras.layers.Dense(2, kernel_initializer="ones", use_bias=False, name="d",
                           dtype=policy)(inputs)
    x = keras.layers.UnitNormalization(name="u", dtype=policy)(x)
    return keras.Model(inputs, x)


def test_input_magnitudes_are_each_layers_max_abs_input():
    model = _unit_model("float32")
    found = model_check.input_magnitudes(model, np.array([[1.0, 2.0, -5.0]], "float32"))
    assert found == {"d": 5.0, "u": 2.0}  # d's output is [-2, -2]


def test_a_layer_outside_its_safe_range_is_named_with_the_range_and_the_fix():
    report = tf_mixed.audit(_unit_model(), magnitudes={"u": 1e-3, "d": 1.0})
    (finding,) = report.by_code("catalog_range")
    assert finding.severity == "warning" and finding.layer == "u"
    row = results.stored().find("UnitNormalization", "mixed_float16")[0]
    assert "max |x| = 0.001, outside the range" in finding.message
    assert row.safe.text() in finding.message and "UnitNormalization[default]" in finding.message
    assert "keep_float32=['u']" in finding.fix
    assert not tf_mixed.audit(_unit_model(), magnitudes={"u": 1.0}).by_code("catalog_range")


def test_all_zero_inputs_are_not_outside_a_range():
    # A float16 Normalization adapted near 1e4 (spacing 8) zeroed every input of
    # the Dense after it; the fit-start check told the user to keep that Dense in
    # float32 ("max |x| = 0, outside ... 1e-05 .. 1e+04"), the wrong layer.
    report = tf_mixed.audit(_unit_model(), magnitudes={"u": 0.0, "d": 0.0})
    assert not report.by_code("catalog_range")


def test_a_probe_report_gives_the_magnitudes():
    class Stats:
        def __init__(self, name, value):
            self.name, self.float32_max_abs = name, value

    class Report:
        layers = [Stats("d", 1e-3), Stats("u", 1.0)]

    model = _unit_model()
    assert model_check.magnitudes_from_probe(model, Report()) == {"u": 1e-3}
    assert tf_mixed.audit(model, magnitudes=Report()).by_code("catalog_range")


def test_bad_magnitudes_are_refused_by_name():
    with pytest.raises(TypeError, match="magnitudes must be a tf_mixed.probe report"):
        tf_mixed.audit(_unit_model(), magnitudes=3.0)


def test_without_magnitudes_narrow_ranges_are_listed_as_info():
    notes = model_check.check_model(_unit_model(), has_gpu=False)
    assert [(n.code, n.severity, n.layer) for n in notes] == [("catalog_narrow", "info", "u")]


def _pool3d_model():
    inputs = keras.Input((2, 2, 2, 1))
    outputs = keras.layers.MaxPooling3D(name="pool", dtype="mixed_float16")(inputs)
    return keras.Model(inputs, outputs)


def test_a_layer_without_a_half_kernel_is_an_error_only_without_a_gpu():
    (note,) = model_check.check_model(_pool3d_model(), has_gpu=False)
    assert note.code == "catalog_no_kernel" and note.severity == "error"
    assert "does not run under mixed_float16" in note.message and "NotFoundError" in note.message
    assert not model_check.check_model(_pool3d_model(), has_gpu=True)


def test_the_monitor_warns_at_fit_start(monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: hardware.HardwareInfo())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problems = monitor.model_setup_problems(_pool3d_model())
    assert any("catalog row MaxPooling3D[default]" in p for p in problems)


@pytest.mark.parametrize("name", ZOO)
def test_the_zoo_is_checked_without_error(name):
    with tf_mixed.policy_scope("mixed_bfloat16"):
        model = ZOO[name].ready()
    notes = model_check.check_model(model, has_gpu=False)
    assert all(n.code == "catalog_narrow" for n in notes)
    # Its coverage agrees: no layer unmatched (that would be a catalog_unmatched note).
    covered = model_check.coverage(model)
    assert {c.status for c in covered} <= {"matched", "no_rows"}
    assert {n.layer for n in notes} <= {c.layer for c in covered if c.status == "matched"}


def test_a_bfloat16_densenets_max_pooling_is_in_range_where_ties_route_its_gradient():
    # The stored MaxPooling2D row under bfloat16 once ended at 3.2: at 10,
    # inputs tying after rounding sent the gradient to another (equally
    # correct) position, and every DenseNet and ResNet was told at fit start
    # that "pool1" was outside its range. A softmax over logits of 100 in
    # bfloat16 is genuinely outside its range and still warned about.
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(7)
        base = keras.applications.DenseNet121(weights=None, input_shape=(32, 32, 3),
                                              include_top=False, pooling="avg")
        probs = keras.layers.Activation("softmax", name="probs")(
            keras.layers.Dense(3, name="logits")(base.output))
        model = keras.Model(base.input, probs)
    finally:
        keras.config.set_dtype_policy(before)
    report = tf_mixed.audit(model, magnitudes={"pool1": 10.0, "probs": 100.0})
    assert [f.layer for f in report.by_code("catalog_range")] == ["probs"]
