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


def test_a_bfloat16_mobilenet_v2s_relu6_layers_have_no_finding():
    # The stored ReLU[max_value=6] row under bfloat16 once ended at 3.2: at
    # 10, an input just below 6 rounded onto the clip's bound (bfloat16's
    # spacing there is 2**-5), where float32's gradient is 0, not 1; the
    # producer of that input rounds it anyway. All 35 ReLU(6.) layers of a
    # MobileNetV2 were listed as narrow with a keep_float32 fix.
    with tf_mixed.policy_scope("mixed_bfloat16"):
        model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None,
                                               classes=10, alpha=0.35)
    relus = [layer.name for layer in model.layers if isinstance(layer, keras.layers.ReLU)]
    assert len(relus) == 35
    assert "ReLU[max_value=6]" not in str(tf_mixed.audit(model))
    assert not tf_mixed.audit(model, magnitudes=dict.fromkeys(relus, 1e6)).by_code(
        "catalog_range")


@pytest.mark.parametrize("layer, config", [("ReLU", "max_value=6"),
                                           ("Activation", "activation=relu6")])
def test_a_clip_is_safe_over_the_whole_bfloat16_grid(layer, config):
    # relu6 in bfloat16 selects x (rounded once, by whatever produced it)
    # or a bound: nothing is lost at any magnitude measured.
    (row,) = results.stored().find(layer, "mixed_bfloat16", config)
    assert (row.safe.low, row.safe.high) == (1e-6, 1e6) and row.reason() == \
        "safe over the whole grid"
    assert all(status == "ok" for status in row.status)


@pytest.mark.parametrize("policy, magnitude, warned", [
    ("mixed_bfloat16", 1e6, False), ("mixed_bfloat16", 1e-6, False),
    ("mixed_float16", 1e6, False),  # rounded to inf, clipped to 6: exact
    ("mixed_float16", 1e-6, True),  # subnormal in float16: the output loses resolution
])
def test_a_clip_far_outside_is_warned_about_only_where_its_output_loses_resolution(
        policy, magnitude, warned):
    inputs = keras.Input((16,))
    model = keras.Model(inputs, keras.layers.ReLU(max_value=6.0, name="clip",
                                                  dtype=policy)(inputs))
    found = tf_mixed.audit(model, magnitudes={"clip": magnitude}).by_code("catalog_range")
    assert [f.layer for f in found] == (["clip"] if warned else [])
    if warned:
        assert "catalog row ReLU[max_value=6], mixed_float16; loses resolution below" in \
            found[0].message


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
