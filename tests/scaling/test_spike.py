"""The optional spike guard (tf_mixed.scaling.spike): off by default; a step
whose gradient norm leaps above its recent history is skipped with reason
"spike", its history checkpointed and the same on every replica."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.scaling import spike
from tf_mixed.scaling.optimizer import guard_spikes, step_guard
from tf_mixed.scaling.spike import SpikeRule, is_spike
from tf_mixed.scaling.write_guard import SkipReasons


def test_the_rule_on_plain_numbers():
    rule = SpikeRule(window=4, threshold=3.0)
    assert not is_spike(rule, [1.0, 1.0, 1.0], 1e9)  # warming up
    # mean 1, std 0: the floor 0.01 * mean makes the limit 1.03.
    assert not is_spike(rule, [1.0] * 4, 1.03)
    assert is_spike(rule, [1.0] * 4, 1.04)
    assert is_spike(rule, [1.0] * 4, float("nan"))
    # Only the last `window` norms count.
    # mean 3, std 1 (population): the limit is 3 + 3 * 1 = 6.
    assert not is_spike(rule, [100.0] + [2.0, 4.0, 2.0, 4.0], 5.9)
    assert is_spike(rule, [100.0] + [2.0, 4.0, 2.0, 4.0], 6.1)


@pytest.mark.parametrize("window, threshold", [(1, 6.0), (2.5, 6.0), (10, 0.0),
                                               (10, float("inf")), (True, 6.0)])
def test_bad_rules_are_refused_by_name(window, threshold):
    with pytest.raises((TypeError, ValueError), match="window|threshold"):
        SpikeRule(window=window, threshold=threshold)


def test_guard_spikes_needs_a_tf_mixed_optimizer():
    with pytest.raises(TypeError, match="tf_mixed.wrap_optimizer"):
        guard_spikes(keras.optimizers.SGD())
    with pytest.raises(TypeError, match="SpikeRule"):
        guard_spikes(tf_mixed.wrap_optimizer(keras.optimizers.SGD()), rule=3)


def _run(opt, v, norms):
    @tf.function
    def step(g):
        return opt.apply([g], [v])

    return [bool(step(tf.constant([n]))) for n in norms]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_a_spike_is_skipped_and_its_norm_kept_out_of_the_history(policy):
    keras.config.set_dtype_policy(policy)
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5))
    guard_spikes(opt, SpikeRule(window=4, threshold=3.0))
    v = keras.Variable(np.array([0.0], "float32"))
    # Four steps of norm 1 warm up; 50 is a spike, then 1.0 applies again.
    assert _run(opt, v, [1.0, 1.0, 1.0, 1.0, 50.0, 50.0, 1.0]) == [
        True, True, True, True, False, False, True]
    assert float(v.numpy()[0]) == -2.5  # five applied steps of -0.5
    state = tf_mixed.loss_scale_state(opt)
    assert state.skip_reasons == SkipReasons(0, 0, 0, 0, 2)
    assert int(step_guard(opt).spike.seen.numpy()) == 5
    np.testing.assert_array_equal(step_guard(opt).spike.norms.numpy(), [1.0] * 4)


def test_off_by_default():
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5))
    v = keras.Variable(np.array([0.0], "float32"))
    assert all(_run(opt, v, [1.0] * 4 + [1e6]))
    assert step_guard(opt).spike is None


def test_the_history_is_checkpointed_and_saved(tmp_path):
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5))
    guard_spikes(opt, SpikeRule(window=3))
    v = keras.Variable(np.array([0.0], "float32"))
    _run(opt, v, [1.0, 2.0, 3.0, 4.0])
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "ckpt"))
    other = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5))
    other.build([keras.Variable(np.array([0.0], "float32"))])
    guard_spikes(other, SpikeRule(window=3))
    tf.train.Checkpoint(optimizer=other).restore(path)
    assert int(step_guard(other).spike.seen.numpy()) == 4
    np.testing.assert_array_equal(step_guard(other).spike.norms.numpy(), [4.0, 2.0, 3.0])
    # .keras / .weights.h5 entries: taken over by a later guard_spikes().
    store = {}
    opt.save_own_variables(store)
    assert list(store[spike.STORE_KEY]) == [4.0, 4.0, 2.0, 3.0]
    loaded = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5))
    loaded.build([keras.Variable(np.array([0.0], "float32"))])
    loaded.load_own_variables(store)
    with pytest.raises(ValueError, match="window=3"):
        guard_spikes(loaded, SpikeRule(window=5))
    guard_spikes(loaded, SpikeRule(window=3))
    assert int(step_guard(loaded).spike.seen.numpy()) == 4


@pytest.mark.slow
def test_every_replica_agrees(mirrored):
    with mirrored.scope():
        v = keras.Variable(np.array([0.0], "float32"))
        opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.5))
        opt.build([v])
        guard_spikes(opt, SpikeRule(window=2, threshold=3.0))

    def replica_fn(g):
        index = tf.distribute.get_replica_context().replica_id_in_sync_group
        # The spike is on replica 1's shard only.
        return opt.apply([tf.where(tf.equal(index, 1), g, tf.constant([1.0]))], [v])

    step = tf.function(lambda g: mirrored.run(replica_fn, args=(g,)))
    verdicts = [[bool(a) for a in mirrored.experimental_local_results(step(tf.constant([n])))]
                for n in (1.0, 1.0, 99.0)]
    assert verdicts == [[True, True], [True, True], [False, False]]
    assert tf_mixed.loss_scale_state(opt).skip_reasons.spike == 1
    for copy in mirrored.experimental_local_results(step_guard(opt).spike.seen):
        assert int(copy.numpy()) == 2
