"""tf_mixed.tools.catalog.measuring: exact errors where the arithmetic allows."""

import dataclasses

import keras
import numpy as np
import pytest

from tf_mixed.tools.catalog import measuring, registry


def test_inputs_have_max_abs_equal_to_each_magnitude():
    case = registry.Case("Add", "x", lambda p: None, inputs=((3,), (4,)), batch=2)
    xs = measuring.inputs_for(case, [1e-3, 1.0, 1e3], seed=0)
    assert [x.shape for x in xs] == [(3, 2, 3), (3, 2, 4)]
    for x in xs:
        np.testing.assert_allclose(np.abs(x).reshape(3, -1).max(axis=1), [1e-3, 1.0, 1e3],
                                   rtol=1e-6)


def test_ids_are_whole_numbers_below_the_vocabulary():
    case = registry.Case("Embedding", "x", lambda p: None, inputs=((50,),), distribution="ids",
                         ids=100)
    (x,) = measuring.inputs_for(case, [10.0, 1e6], seed=0)
    assert np.all(x == np.round(x)) and x.max() == 99 and x[0].max() == 10


def test_an_identity_layer_costs_one_rounding_of_its_input():
    case = registry.Case("Identity", "x", lambda p: keras.layers.Identity(dtype=p),
                         inputs=((64,),))
    found = measuring.measure(case, ["mixed_float16", "mixed_bfloat16"], [1.0, 2.0 ** 20])
    f16, bf16 = found["mixed_float16"].points, found["mixed_bfloat16"].points
    # Round to nearest: each element off by at most half an epsilon, relatively.
    assert 0 < f16[0].forward <= 2.0 ** -11 and 0 < bf16[0].forward <= 2.0 ** -8
    assert bf16[1].half_finite and bf16[1].forward <= 2.0 ** -8
    assert f16[1].forward == np.inf and not f16[1].half_finite  # 2**20 > 65504
    assert f16[1].reference_finite


def test_float16_flushes_what_bfloat16_keeps():
    case = registry.Case("Dense", "x", lambda p: keras.layers.Dense(4, dtype=p), inputs=((8,),))
    found = measuring.measure(case, ["mixed_float16", "mixed_bfloat16"], [1e-8, 1.0])
    tiny16, one16 = found["mixed_float16"].points
    tiny_bf, one_bf = found["mixed_bfloat16"].points
    assert tiny16.flushed == 1.0 and tiny16.forward == 1.0  # 1e-8 is below float16's subnormals
    assert one16.forward < 2.0 ** -9 and one_bf.forward < 2.0 ** -6
    assert tiny_bf.forward < 2.0 ** -6


def test_a_layer_without_a_half_kernel_is_reported_for_that_policy_only():
    case = registry.Case("MaxPooling3D", "x", lambda p: keras.layers.MaxPooling3D(dtype=p),
                         inputs=((2, 2, 2, 1),))
    found = measuring.measure(case, ["mixed_float16", "mixed_bfloat16"], [1.0, 2.0])
    assert "NotFoundError" in found["mixed_float16"].failure
    assert found["mixed_float16"].points == ()
    assert found["mixed_bfloat16"].failure == "" and len(found["mixed_bfloat16"].points) == 2


def test_integer_outputs_have_no_gradient():
    case = [c for c in registry.keras_cases() if c.key == "Discretization[adapted]"][0]
    found = measuring.measure(case, ["mixed_bfloat16"], [1.0, 2.0])
    assert all(p.gradient is None for p in found["mixed_bfloat16"].points)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_seeded_random_layers_draw_the_same_numbers_in_every_copy(policy):
    case = [c for c in registry.keras_cases() if c.key == "RandomFlip[default]"][0]
    (point,) = measuring.measure(case, [policy], [1.0])[policy].points
    assert point.forward < 2.0 ** -6  # a different flip would be an error of order 1


def _tied_max_pooling(selects):
    """MaxPooling1D over two inputs per window that differ in float32 and tie in bfloat16."""
    return registry.Case("MaxPooling1D", "x", lambda p: keras.layers.MaxPooling1D(dtype=p),
                         inputs=((2, 1),), batch=1, selects=selects)


def test_a_tie_after_rounding_routes_max_poolings_gradient_without_an_error(monkeypatch):
    # 0.999 and 1.0 round to the same bfloat16 (1.0): float32 sends the
    # gradient c to the second input, bfloat16's MaxPool to the first, a
    # subgradient as correct for what it computes. Compared with float32's
    # at the inputs alone that is an error of |(c, -c)| / |(0, c)| = sqrt(2).
    tied = np.array([0.999, 1.0], "float32").reshape(1, 1, 2, 1)  # (groups, batch, steps, 1)
    monkeypatch.setattr(measuring, "inputs_for", lambda case, magnitudes, seed: [tied])
    (plain,) = measuring.measure(_tied_max_pooling(False), ["mixed_bfloat16"], [1.0])[
        "mixed_bfloat16"].points
    (selecting,) = measuring.measure(_tied_max_pooling(True), ["mixed_bfloat16"], [1.0])[
        "mixed_bfloat16"].points
    assert plain.forward == 0.0 and selecting.forward == 0.0  # the max, 1.0, is exact
    assert plain.gradient == pytest.approx(np.sqrt(2.0), rel=2.0 ** -7)
    assert selecting.gradient <= 2.0 ** -9  # the cotangent's rounding to bfloat16 only


def test_selecting_rows_are_max_poolings_merges_autocontrast_and_clips():
    selecting = {c.key for c in registry.keras_cases() if c.selects}
    assert selecting == {f"{kind}{dims}[default]" for dims in ("1D", "2D", "3D")
                         for kind in ("MaxPooling", "GlobalMaxPooling", "AdaptiveMaxPooling")
                         } | {"Maximum[default]", "Minimum[default]", "AutoContrast[default]",
                              "ReLU[max_value=6]", "Activation[activation=relu6]"}


@pytest.mark.parametrize("layer, args, selects", [
    ("ReLU", {"max_value": 6.0}, True),
    ("ReLU", {"max_value": 1.5, "negative_slope": 0.1}, True),
    ("ReLU", {"threshold": 0.5}, True),            # its kink moved off 0: rounding crosses it
    ("ReLU", {}, False),                           # max(x, 0): no rounding crosses 0
    ("ReLU", {"negative_slope": 0.1}, False),
    ("Activation", {"activation": "relu6"}, True),
    ("Activation", {"activation": "relu"}, False),
    ("Activation", {"activation": "hard_sigmoid"}, False),  # its kink is x + 3's, rounded inside
    ("MaxPooling2D", {}, True),
    ("AveragePooling2D", {}, False),
])
def test_is_selecting(layer, args, selects):
    assert registry.is_selecting(layer, args) is selects
    assert registry.user_case(layer, config=args).selects is selects  # one rule for both


def _one_input(case, values, monkeypatch):
    """`case` fed exactly ``values`` (one group of one example)."""
    x = np.array(values, "float32").reshape(1, 1, -1)
    monkeypatch.setattr(measuring, "inputs_for", lambda case, magnitudes, seed: [x])
    return dataclasses.replace(case, inputs=((len(values),),), batch=1)


def test_an_input_rounded_onto_a_clips_bound_is_no_error(monkeypatch):
    # 5.99 rounds to 6.0 in bfloat16 (its spacing there is 2**-5): float32's
    # relu6 passes the gradient c at 5.99, bfloat16's stops it at the bound
    # 6.0, as float32's does at 6.0: error |0 - c| / |c| = 1 at the exact
    # input, 0 / 0 = 0 at the rounded one. The output is judged at the exact
    # input: 6 against 5.99.
    (row,) = [c for c in registry.keras_cases() if c.key == "ReLU[max_value=6]"]
    assert row.selects
    clip = _one_input(row, [5.99], monkeypatch)
    (selecting,) = measuring.measure(clip, ["mixed_bfloat16"], [1.0])["mixed_bfloat16"].points
    (plain,) = measuring.measure(dataclasses.replace(clip, selects=False), ["mixed_bfloat16"],
                                 [1.0])["mixed_bfloat16"].points
    x = float(np.float32(5.99))
    assert plain.gradient == 1.0 and selecting.gradient == 0.0
    assert plain.forward == selecting.forward == pytest.approx((6.0 - x) / x, rel=1e-12)


def test_an_input_rounded_to_inf_is_the_half_copys_overflow(monkeypatch):
    # 1e5 rounds to inf in float16; float32's hard_silu gradient at inf is
    # 1 + inf * 0 = nan. The comparison at the rounded inputs must not turn
    # the half copy's overflow into "float32 is not finite either".
    case = registry.user_case("Activation", config={"activation": "hard_silu"}, inputs=((1,),),
                              selects=True)
    (point,) = measuring.measure(_one_input(case, [1e5], monkeypatch), ["mixed_float16"],
                                 [1e5])["mixed_float16"].points
    assert point.reference_finite and not point.half_finite
    assert point.forward == np.inf and point.gradient == np.inf


def test_a_random_selecting_layer_draws_alike_in_its_extra_float32_copies():
    # AutoContrast selects (each image's min and max); RandomBrightness is
    # random: forced to select, its float32 copy at the rounded inputs draws
    # the same brightness as every other copy, so its row is as without.
    (case,) = [c for c in registry.keras_cases() if c.key == "RandomBrightness[default]"]
    grid = [1.0, 10.0, 100.0]
    plain = measuring.measure(case, ["mixed_bfloat16"], grid)["mixed_bfloat16"].points
    forced = measuring.measure(dataclasses.replace(case, selects=True), ["mixed_bfloat16"],
                               grid)["mixed_bfloat16"].points
    assert [p.forward for p in forced] == [p.forward for p in plain]
    assert all(p.gradient < 2.0 ** -6 for p in forced)
