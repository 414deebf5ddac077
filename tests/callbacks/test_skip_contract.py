"""The skipped-step contract (docs/skipped-step.md), proved against a reference.

Each case trains one epoch with one bad batch (an inf in one sample: NaN
loss, non-finite gradients) and the same epoch with that batch removed from
the data, and compares every row of the contract (tests/support/skip_matrix.py):
weights, the inner optimizer's variables (slots, ``iterations`` and the
schedule it drives, EMA weights), BatchNormalization's statistics, the
compiled metrics, the running loss in the batch logs, the epoch loss and
History. tf_mixed's column must match exactly; Keras's column
(``keras.optimizers.LossScaleOptimizer``, measured by the same matrix) is
asserted as measured, so a Keras release that changes it fails here.
Keras's MirroredStrategy column and the multi-worker columns:
tests/integration/test_skip_contract_processes.py.
"""

import keras
import numpy as np
import pytest
import skip_matrix as sm

import tf_mixed
from tf_mixed.callbacks import skip_contract

ALL_ROWS = sm.ALL_ROWS
KERAS_ONE_DEVICE = sm.KERAS_ONE_DEVICE
KERAS_FLOAT8 = sm.KERAS_FLOAT8


def _pair(wrapper="tf_mixed", strategy=None, replica=0, removed=(sm.BAD_STEP,),
          monitor=None, **build_args):
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    x, y = sm.data()
    bad_x = sm.spoil(x, sm.BAD_STEP, replica=replica, replicas=replicas)
    monitor = wrapper == "tf_mixed" if monitor is None else monitor
    bad = sm.run(bad_x, y, wrapper, strategy=strategy, monitor=monitor, **build_args)
    keras.backend.clear_session()
    reference = sm.run(*sm.remove(x, y, removed), wrapper, strategy=strategy,
                       monitor=monitor, **build_args)
    return bad, reference, sm.compare(bad, reference, skipped_batches=removed)


@pytest.mark.slow
def test_one_device_every_row_matches_the_run_without_the_batch():
    bad, _, rows = _pair()
    assert rows == ALL_ROWS
    assert [r["skipped"] for r in bad["batch_logs"]] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert np.isfinite(bad["history"]["loss"]).all()


@pytest.mark.slow
def test_keras_column_one_device_as_measured():
    bad, _, rows = _pair("keras")
    assert rows == KERAS_ONE_DEVICE
    assert np.isnan(bad["history"]["loss"][0])  # the running loss took the NaN
    assert "skipped" not in bad["batch_logs"][0]


@pytest.mark.slow
def test_without_the_monitor_install_and_track_forward_state_by_hand():
    bad, _, rows = _pair(monitor="by_hand")
    assert rows == ALL_ROWS
    assert bad["batch_logs"][sm.BAD_STEP]["skipped"] == 1.0


@pytest.mark.slow
def test_a_discarded_accumulation_window_leaves_everything_as_if_never_run():
    # Batches 2 and 3 form one window; batch 2 overflows, so the window is
    # discarded at batch 3. The reference trains without batches 2 and 3.
    bad, _, rows = _pair(accumulate=2, removed=(2, 3))
    assert rows == ALL_ROWS
    flags = [r["skipped"] for r in bad["batch_logs"]]
    assert flags == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    # While its window was open, the bad micro-batch's own logs showed it.
    assert np.isnan(bad["batch_logs"][2]["loss"])


@pytest.mark.slow
def test_float8_histories_and_scales_hold_on_a_skip():
    # The inf enters a float8 layer's inputs; the e4m3 cast saturates it, so
    # every gradient is finite: the gathered non-finite amax makes the one
    # verdict non-finite (tf_mixed.scaling.float8_sync; the same verdict on
    # every replica: tests/scaling/test_float8_sync.py). EMA is on (Keras's
    # optimizers alone cannot end this fit). The output-gradient scale is
    # compared without the loss scale, which the skip halved.
    bad, _, rows = _pair(float8=True)
    assert rows == ALL_ROWS
    assert [r["skipped"] for r in bad["batch_logs"]] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.slow
def test_keras_column_float8_as_measured():
    # Keras's wrapper skips the step and writes nothing then (its finite check
    # reads the history "gradients"), but its output-gradient histories hold
    # loss-scaled amaxes: after the halved scale, every later output-gradient
    # scale, quantized gradient, and so the weights, differ.
    _, _, rows = _pair("keras", float8=True)
    assert rows == KERAS_FLOAT8


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["tf_mixed", "keras"])
def test_dropout_random_state_advances_on_a_skip(wrapper):
    # The skipped forward pass drew its dropout mask: every later mask
    # differs from the run without the batch, so the weights differ too
    # (same distribution; not bit-identical). Said in docs/skipped-step.md.
    _, _, rows = _pair(wrapper, dropout=True)
    assert not rows["weights"]


@pytest.mark.slow
def test_epoch_logs_carry_skipped_steps_not_the_last_batch_flag():
    x, y = sm.data()
    model = sm.build()
    history = model.fit(sm.spoil(x, 5), y, batch_size=sm.BATCH, shuffle=False,
                        verbose=0, callbacks=[tf_mixed.LossScaleMonitor()])
    assert "skipped" not in history.history
    assert history.history["skipped_steps"] == [1.0]
    assert skip_contract.installed(model)
    assert not skip_contract.install(model)  # once


def test_install_refuses_a_non_model():
    with pytest.raises(TypeError, match="keras.Model"):
        skip_contract.install(keras.layers.Dense(2))


@pytest.mark.slow
def test_other_optimizers_run_keras_step_unchanged():
    x, y = sm.data(steps=2)
    model = sm.build("keras")
    skip_contract.install(model)
    logs = sm.BatchLogs()
    model.fit(x, y, batch_size=sm.BATCH, verbose=0, callbacks=[logs.callback])
    assert "skipped" not in logs.rows[0]


# ------------------------------------------------------- MirroredStrategy


@pytest.mark.slow
@pytest.mark.parametrize("replica", [0, 1])
def test_mirrored_every_row_matches_with_the_bad_shard_on_either_replica(mirrored, replica):
    bad, _, rows = _pair(strategy=mirrored, replica=replica)
    assert rows == ALL_ROWS
    assert [r["skipped"] for r in bad["batch_logs"]] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


@pytest.mark.slow
def test_mirrored_accumulation_window(mirrored):
    _, _, rows = _pair(strategy=mirrored, replica=1, accumulate=2, removed=(2, 3))
    assert rows == ALL_ROWS


# ------------------------------------------- make_train_step, the README's loop


def _loop(x, y, readme_loop, model=None):
    import tensorflow as tf

    model = sm.build() if model is None else model
    optimizer = model.optimizer
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if readme_loop:
        optimizer.track_forward_state(model)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            applied = tf_mixed.training.apply_scaled_gradients(
                tape, loss, model.trainable_variables, optimizer)
            return {"loss": loss, "applied": applied}
    else:
        step = tf_mixed.training.make_train_step(model, loss_fn, optimizer)
    applied = [bool(step(x[i:i + sm.BATCH], y[i:i + sm.BATCH])["applied"])
               for i in range(0, len(x), sm.BATCH)]
    state = [np.asarray(v) for v in
             [*model.weights, *optimizer.inner_optimizer.variables]]
    return applied, state


@pytest.mark.slow
@pytest.mark.parametrize("readme_loop", [False, True], ids=["make_train_step", "readme_loop"])
def test_custom_loops_end_where_the_run_without_the_batch_ends(readme_loop):
    x, y = sm.data()
    applied, bad = _loop(sm.spoil(x, sm.BAD_STEP), y, readme_loop)
    keras.backend.clear_session()
    _, reference = _loop(*sm.remove(x, y, [sm.BAD_STEP]), readme_loop)
    assert applied == [True, True, False, True, True, True]
    # weights, BatchNormalization statistics, slots, iterations, EMA
    assert len(bad) == len(reference)
    assert all(np.array_equal(a, b) for a, b in zip(bad, reference))


# ------------------------------------------- every policy, every bad batch


def _policy_pair(policy, kind, strategy=None, replica=0, removed=(sm.BAD_STEP,),
                 **build_args):
    """`_pair` under ``policy`` with a bad batch of ``kind`` (`sm.KINDS`)."""
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    x, y = sm.data()
    bad_x = sm.spoil(x, sm.BAD_STEP, replica=replica, replicas=replicas,
                     value=sm.KINDS[kind]["value"])
    if policy == "mixed_float16":
        # A fixed scale: after the skip's backoff, float16 gradients would
        # round differently from the reference's (its scale never halved).
        build_args.setdefault("dynamic", False)
    args = dict(strategy=strategy, policy=policy, **sm.kind_args(kind), **build_args)
    bad = sm.run(bad_x, y, **args)
    keras.backend.clear_session()
    reference = sm.run(*sm.remove(x, y, removed), **args)
    return bad, reference, sm.compare(bad, reference, skipped_batches=removed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(sm.KINDS))
@pytest.mark.parametrize("policy", sm.POLICIES)
def test_every_policy_every_row_matches_with_its_reason(policy, kind):
    # "forward" and "update" were applied on main under float32 and
    # mixed_bfloat16: finite gradients, non-finite moving variance / Adam slot.
    bad, _, rows = _policy_pair(policy, kind)
    assert rows == ALL_ROWS
    flags = [r["skipped"] for r in bad["batch_logs"]]
    assert flags == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    reasons = [r["skip_reason"] for r in bad["batch_logs"]]
    assert reasons == [0.0, 0.0, sm.REASON[kind, policy], 0.0, 0.0, 0.0]
    # Counted per epoch, per reason, in the epoch logs (History).
    code = int(sm.REASON[kind, policy])
    from tf_mixed.scaling.write_guard import REASONS
    assert bad["skip_counts"] == {f"skipped_{r}": [float(i + 1 == code)]
                                  for i, r in enumerate(REASONS)} | {"skipped_steps": [1.0]}
    assert all(np.isfinite(w).all() for w in bad["weights"] + bad["optimizer"])


@pytest.mark.slow
@pytest.mark.parametrize("replica", [0, 1])
@pytest.mark.parametrize("policy", sm.POLICIES)
def test_every_policy_mirrored_forward_state_on_either_replica(mirrored, policy, replica):
    bad, _, rows = _policy_pair(policy, "forward", strategy=mirrored, replica=replica)
    assert rows == ALL_ROWS
    assert bad["batch_logs"][sm.BAD_STEP]["skip_reason"] == sm.REASON["forward", policy]


@pytest.mark.slow
@pytest.mark.parametrize("policy", sm.POLICIES)
def test_every_policy_accumulation_window_with_an_update_overflow(policy):
    _, _, rows = _policy_pair(policy, "update", accumulate=2, removed=(2, 3))
    assert rows == ALL_ROWS


def _policy_loop(x, y, readme_loop, policy, kind):
    return _loop(x, y, readme_loop, sm.build(policy=policy, **sm.kind_args(kind)))


@pytest.mark.slow
@pytest.mark.parametrize("readme_loop", [False, True], ids=["make_train_step", "readme_loop"])
@pytest.mark.parametrize("policy", sm.POLICIES)
def test_every_policy_custom_loops_with_forward_and_update_overflows(policy, readme_loop):
    for kind in ("forward", "update"):
        x, y = sm.data()
        bad_x = sm.spoil(x, sm.BAD_STEP, value=sm.KINDS[kind]["value"])
        applied, bad = _policy_loop(bad_x, y, readme_loop, policy, kind)
        keras.backend.clear_session()
        _, reference = _policy_loop(*sm.remove(x, y, [sm.BAD_STEP]), readme_loop,
                                    policy, kind)
        keras.backend.clear_session()
        assert applied == [True, True, False, True, True, True], kind
        assert all(np.array_equal(a, b) for a, b in zip(bad, reference)), kind


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "float32"])
def test_keras_plain_optimizer_column_as_measured(policy):
    # What `model.compile` gives a bfloat16 or float32 user without tf_mixed:
    # a plain optimizer, no guard (docs/skipped-step.md's Keras columns).
    x, y = sm.data()
    finite = {}
    for kind in sorted(sm.KINDS):
        keras.config.set_dtype_policy(policy)
        keras.utils.set_random_seed(1)
        args = sm.kind_args(kind)
        layers = [keras.Input((sm.FEATURES,)), keras.layers.Dense(8, activation="relu")]
        if args.get("batchnorm", True):
            layers.append(keras.layers.BatchNormalization())
        model = keras.Sequential([*layers, keras.layers.Dense(sm.CLASSES)])
        optimizer = (keras.optimizers.Adam(0.01) if args.get("inner") == "adam"
                     else keras.optimizers.SGD(0.01, momentum=0.5))
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(sm.spoil(x, sm.BAD_STEP, value=sm.KINDS[kind]["value"]), y,
                  batch_size=sm.BATCH, shuffle=False, verbose=0)
        finite[kind] = tuple(
            all(np.isfinite(np.asarray(v, "float32")).all() for v in group)
            for group in (model.trainable_weights, optimizer.variables,
                          model.non_trainable_weights))
        keras.backend.clear_session()
    # (weights, slots, forward state) finite after the epoch
    assert finite == {"inf": (False, False, False), "forward": (True, True, False),
                      "update": (False, False, True)}
