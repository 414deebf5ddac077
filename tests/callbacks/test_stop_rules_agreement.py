"""The loss problem every worker states: each worker's signs, summed, give one sentence."""

import math

import pytest

from tf_mixed.callbacks import stop_rules
from tf_mixed.callbacks.stop_rules import Progress, Snapshot

_START = Snapshot(scale=1.0, applied=0, loss_sum=1.5)
FINE = Progress(_START, Snapshot(scale=1.0, applied=2, loss_sum=2.0))
NAN_TALLY = Progress(_START, Snapshot(scale=1.0, applied=2, loss_sum=math.nan))
INF_TALLY = Progress(_START, Snapshot(scale=1.0, applied=2, loss_sum=math.inf))
SKIPPED = Progress(_START, _START, skipped_in_epoch=1)


@pytest.mark.parametrize("kind, progress, logged, signs", [
    ("tf_mixed", FINE, 0.25, [0.0, 0.0, 0.0]),
    ("tf_mixed", FINE, None, [0.0, 0.0, 0.0]),
    ("tf_mixed", NAN_TALLY, None, [1.0, 0.0, 0.0]),
    ("tf_mixed", INF_TALLY, None, [0.0, 1.0, 0.0]),
    ("tf_mixed", INF_TALLY, -math.inf, [0.0, 0.0, 1.0]),  # the logged loss first
    ("none", FINE, math.inf, [0.0, 1.0, 0.0]),
    ("none", FINE, -math.inf, [0.0, 0.0, 1.0]),
    ("keras", FINE, math.nan, [1.0, 0.0, 0.0]),
    ("keras", SKIPPED, math.nan, [0.0, 0.0, 0.0]),  # a skipped step explains it
    ("none", FINE, 0.25, [0.0, 0.0, 0.0]),
])
def test_loss_signs_mark_the_value_the_problem_rests_on(kind, progress, logged, signs):
    assert stop_rules.loss_signs(kind, progress, logged) == signs


def test_every_worker_states_the_same_sentence_from_the_summed_signs():
    # Worker 0 saw inf, worker 1 NaN: both name NaN (first in NON_FINITE's order).
    summed = [a + b for a, b in zip(stop_rules.loss_signs("none", FINE, math.inf),
                                    stop_rules.loss_signs("none", FINE, math.nan))]
    assert summed == [1.0, 1.0, 0.0]
    assert stop_rules.agreed_loss_problem("none", FINE, summed) == (
        "the loss became nan and no step was skipped: non-finite values are "
        "reaching the weights.")
    assert stop_rules.agreed_loss_problem("none", FINE, [0.0, 2.0, 0.0]).startswith(
        "the loss became inf and")
    # tf_mixed's sentence names no value: a worker whose own tally is finite
    # states its peer's problem in the same words.
    assert stop_rules.agreed_loss_problem("tf_mixed", FINE, [0.0, 0.0, 1.0]) == (
        stop_rules.loss_problem("tf_mixed", NAN_TALLY, None))
    assert stop_rules.agreed_loss_problem("tf_mixed", FINE, [0.0, 0.0, 0.0]) is None
