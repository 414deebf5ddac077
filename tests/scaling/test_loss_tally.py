"""Issue 16, case 9: the loss tally keeps its precision on long runs."""

import numpy as np
import pytest
import tensorflow as tf

from tf_mixed.scaling.loss_tally import LossTally

LOSS = float(np.float32(0.0495))  # the loss of every step, as float32 holds it


def _epoch_mean(tally, step, steps):
    before = tally.totals()
    for _ in range(steps):
        step()
    after = tally.totals()
    return (after.loss_sum - before.loss_sum) / (after.applied_steps - before.applied_steps)


@pytest.mark.slow
@pytest.mark.parametrize("total", [1e6, 2.0**24], ids=["1e6", "2^24"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_epoch_mean_is_exact_after_a_long_run(total, graph):
    """A plain float32 total read 0.0607 at 1e6 and 0.0 at 2**24."""
    tally = LossTally()
    tally.build()
    tally._sum.assign(total)  # as after a run whose losses summed to `total`
    loss = tf.constant(LOSS)

    def step():
        tally.observe(loss)
        tally.settle(tf.constant(True))

    mean = _epoch_mean(tally, tf.function(step) if graph else step, 200)
    assert mean == pytest.approx(LOSS, rel=1e-6)
    assert tally.totals().applied_steps == 200


def test_skipped_steps_add_nothing_at_a_large_total():
    tally = LossTally()
    tally.build()
    tally._sum.assign(2.0**24)
    verdicts = iter([True, False] * 50)

    @tf.function
    def step(loss, finite):
        tally.observe(loss)
        tally.settle(finite)

    def one():
        finite = next(verdicts)
        step(tf.constant(LOSS if finite else float("nan")), tf.constant(finite))

    mean = _epoch_mean(tally, one, 100)
    assert mean == pytest.approx(LOSS, rel=1e-6)
