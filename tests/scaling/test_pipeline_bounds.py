"""The update bound of a window's sums on a half-precision wire, at its boundary.

With gradient accumulation on several replicas the verdict reads a window's
sums, all-reduced; on a float16/bfloat16 wire they travel multiplied by the
loss scale again (so small ones do not flush to zero). The inner optimizer
applies ``sum / scale / window``, so the verdict must compare the sums with
``update_bound x window x scale`` (tf_mixed/scaling/pipeline.py's
``bound_factor``). Before, the factor was the window alone: with a scale
above 1 a step within bounds was skipped (a float16 Adam step whose mean
gradient was above ``255.875 / scale``), below 1 a step beyond them was
applied and Adam's second moment became inf.

Every value here is exact on the wire (float16 or bfloat16 multiples of a
power of two), so the boundary is tested on both sides to the last bit:
the largest mean the update can take is applied, with the weights and
slots of a plain Adam step of that mean; the next value the wire can
carry is skipped on every replica, reason ``update``, nothing written.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import pipeline, write_guard
from tf_mixed.scaling.write_guard import SkipReasons

pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*never\ went\ through\ scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")

STEPS = 2  # micro-steps per window
LR = 2.0**-4
BF16_UNDER = (2 - 2.0**-7) * 2.0**63  # the largest bfloat16 at or below a float32 bound
# (wire, variable dtype, the largest mean the update takes, the next one the wire carries)
CASES = {
    "float16 wire, float16 weights": ("float16", "float16", 255.875, 256.0),
    "bfloat16 wire, float32 weights": ("bfloat16", "float32", BF16_UNDER, 2.0**64),
    "bfloat16 wire, bfloat16 weights": ("bfloat16", "bfloat16", BF16_UNDER, 2.0**64),
    "float32 wire, float16 weights": (None, "float16", 255.875, 256.0),
}


def _windows(mirrored, opt, v):
    """``window(mean)``: STEPS micro-steps on two replicas whose mean gradient is ``mean``.

    Each replica hands ``mean / 2`` (its share of the global batch),
    scaled by the loss scale, at each micro-step: the window's sum over
    replicas and micro-steps, divided by STEPS, is ``mean``. Returns both
    replicas' verdicts of the window's last micro-step.
    """
    @tf.function
    def micro_step(share):
        return mirrored.run(lambda: opt.apply([share * tf.cast(opt.loss_scale.value,
                                                               v.dtype)], [v]))

    def window(mean):
        share = tf.constant([mean / 2], v.dtype)
        for _ in range(STEPS):
            verdicts = mirrored.experimental_local_results(micro_step(share))
        return [bool(x) for x in verdicts]

    return window


def _plain_adam_step(dtype, mean):
    """The weights and slots one Adam(LR) step of ``mean`` writes, without tf_mixed."""
    v = keras.Variable(np.ones(1, np.float32), dtype=dtype)
    adam = keras.optimizers.Adam(LR)
    adam.apply([tf.constant([mean], dtype)], [v])
    return v.numpy(), [s.numpy() for s in adam.variables[2:]]


@pytest.mark.parametrize("scale", [4.0, 0.25])
@pytest.mark.parametrize("case", list(CASES))
def test_a_windows_sums_are_bounded_by_bound_times_window_times_scale(mirrored, case,
                                                                       scale):
    wire, dtype, under, over = CASES[case]
    with mirrored.scope():
        v = keras.Variable(np.ones(1, np.float32), dtype=dtype)
        opt = tf_mixed.LossScaleOptimizer(
            keras.optimizers.Adam(LR), initial_scale=scale, min_scale=scale, dynamic=False,
            gradient_accumulation_steps=STEPS, communication_dtype=wire)
        opt.build([v])
    bound = write_guard.update_bound(opt.inner_optimizer, v)
    assert under <= bound < over
    slots = opt.inner_optimizer.variables[2:]
    window = _windows(mirrored, opt, v)

    # Just over: skipped on both replicas, nothing written, the reason named.
    # (Before, on a half wire: applied at scale 1/4, Adam's second moment inf.)
    assert window(over) == [False, False]
    for copy in v.value.values:
        np.testing.assert_array_equal(copy.numpy(), np.ones(1, dtype))
    for slot in slots:
        np.testing.assert_array_equal(slot.numpy(), np.zeros(1, dtype))
    assert int(opt.iterations.numpy()) == 0
    state = tf_mixed.loss_scale_state(opt)
    assert state.skip_reasons == SkipReasons(0, 0, 0, 1, 0)
    assert state.skipped_steps == 1

    # Just under: applied on both replicas, exactly one plain Adam step of it.
    # (Before, on a half wire: skipped at scale 4, the sums held to 2 * bound, not 8 * bound.)
    assert window(under) == [True, True]
    weights, expected_slots = _plain_adam_step(dtype, under)
    for copy in v.value.values:
        np.testing.assert_array_equal(copy.numpy(), weights)
    for slot, expected in zip(slots, expected_slots):
        np.testing.assert_array_equal(slot.numpy(), expected)
        assert np.isfinite(slot.numpy().astype(np.float32)).all()
    assert int(opt.iterations.numpy()) == 1
    assert tf_mixed.loss_scale_state(opt).skip_reasons == SkipReasons(0, 0, 0, 1, 0)


def test_the_bound_factor_is_the_window_times_the_scale_carried():
    assert pipeline.bound_factor(1) is None
    assert float(pipeline.bound_factor(4)) == 4.0
    assert float(pipeline.bound_factor(1, tf.constant(8.0))) == 8.0
    assert float(pipeline.bound_factor(4, tf.constant(0.25))) == 1.0
    assert float(pipeline.bound_factor(3, tf.constant(2.0**15))) == 3 * 2.0**15


def test_a_bfloat16_weights_bound_is_bfloat16s_not_float32s():
    adam = keras.optimizers.Adam()
    bf16 = tf.bfloat16.as_numpy_dtype
    bound = write_guard.update_bound(adam, keras.Variable(np.ones(1), dtype="bfloat16"))
    assert bound == BF16_UNDER
    assert np.isfinite(np.float32(bf16(bound) * bf16(bound)))
    # float32's bound is 2**64 in bfloat16, whose square is inf there.
    float32_bound = write_guard.update_bound(adam, keras.Variable(1.0))
    assert float(bf16(float32_bound)) == 2.0**64
    assert not np.isfinite(np.float32(bf16(2.0**64) * bf16(2.0**64)))


def test_a_gradient_that_squares_to_inf_in_a_bfloat16_slot_is_skipped():
    # On main: applied, Adam's bfloat16 second moment became inf (1.843e19 is
    # within float32's bound but is 2**64 once cast to the variable's dtype).
    v = keras.Variable(np.ones(1, np.float32), dtype="bfloat16")
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.Adam(LR), initial_scale=1.0,
                                      dynamic=False)
    assert not bool(opt.apply([tf.constant([1.843e19], tf.float32)], [v]))
    assert float(v.numpy()[0]) == 1.0
    assert all(float(s.numpy()[0]) == 0.0 for s in opt.inner_optimizer.variables[2:])
    assert tf_mixed.loss_scale_state(opt).skip_reasons == SkipReasons(0, 0, 0, 1, 0)
