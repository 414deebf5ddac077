"""A skipped step changes nothing: forward state (BatchNorm) is rolled back.

The repro of issue 9, point 1: Dense(8) -> BatchNormalization -> Dense(1) ->
Float32Output under mixed_float16, SGD, one batch filled with 1e5 so the
float16 forward pass overflows and writes inf/NaN into the moving statistics
before the optimizer skips the step. With ``hysteresis=2`` the one overflow
does not change the scale, so the run must end bit-identical to a run that
never saw the bad batch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.callbacks.monitor import LossScaleMonitor
from tf_mixed.scaling.optimizer import LossScaleOptimizer
from tf_mixed.training import make_train_step


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(8),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(1),
        tf_mixed.Float32Output(),
    ])


def _optimizer():
    return LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0**8,
                              hysteresis=2)


def _data(batch, bad_batch=None, bad_rows=None):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4 * batch, 3)).astype("float32")
    y = rng.standard_normal((4 * batch, 1)).astype("float32")
    if bad_batch is None:
        return x, y
    start = bad_batch * batch
    rows = range(start, start + batch) if bad_rows is None else [
        start + r for r in bad_rows]
    for r in rows:
        x[r] = 1e5
    return x, y


def _without_batch(x, y, batch, index):
    keep = np.r_[0:index * batch, (index + 1) * batch:len(x)]
    return x[keep], y[keep]


def _copies(variable):
    value = variable.value
    parts = (value.values if isinstance(value, tf.distribute.DistributedValues)
             else [value])
    return [np.asarray(p) for p in parts]


def _snapshot(model):
    """Every replica's copy of every weight and inner-optimizer variable,
    keyed by position and the name's last part (two models' paths differ)."""
    variables = list(model.weights) + list(model.optimizer.inner_optimizer.variables)
    return {f"{i}:{v.path.split('/')[-1]}": _copies(v)
            for i, v in enumerate(variables)}


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for key in a:
        for x, y in zip(a[key], b[key], strict=True):
            assert np.isfinite(x).all(), key
            np.testing.assert_array_equal(x, y, err_msg=key)


def _run_steps(step, xs, ys):
    """Batches of 2 through a make_train_step step; whether each was applied."""
    return [bool(step(xs[i:i + 2], ys[i:i + 2])["applied"]) for i in range(0, len(xs), 2)]


def _assert_skip_changed_nothing(results):
    """[(applied, snapshot)] of a run with bad batch 2 and one without it."""
    assert results[0][0] == [True, True, False, True]
    assert results[1][0] == [True, True, True]
    _assert_identical(results[0][1], results[1][1])


@pytest.fixture
def fp16():
    tf_mixed.enable("mixed_float16", quiet=True)


def _fit(model, x, y, batch, strategy=None):
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=[LossScaleMonitor()])


@pytest.mark.slow
def test_fit_bad_batch_leaves_batchnorm_bit_identical(fp16):
    x, y = _data(2, bad_batch=1)
    model = _model()
    model.compile(optimizer=_optimizer(), loss="mse")
    _fit(model, x, y, 2)
    assert model.optimizer.loss_scale_state().skipped_steps == 1

    clean = _model()
    clean.compile(optimizer=_optimizer(), loss="mse")
    _fit(clean, *_without_batch(x, y, 2, 1), 2)
    _assert_identical(_snapshot(model), _snapshot(clean))
    assert np.isfinite(model.predict(x[:2], verbose=0)).all()


@pytest.mark.slow
def test_without_tracking_batchnorm_is_poisoned(fp16):
    """What the rollback is for: the same run without it (the bug)."""
    x, y = _data(2, bad_batch=1)
    model = _model()
    model.compile(optimizer=_optimizer(), loss="mse")
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0,
              callbacks=[LossScaleMonitor(rollback_forward_state=False)])
    stats = model.layers[1].moving_variance.numpy()
    assert not np.isfinite(stats).all()


@pytest.mark.slow
def test_fit_without_the_monitor_refuses_the_first_skip_naming_the_fit_fix(fp16):
    """Issue 27 item 1, for fit: never silent, and the fix for fit is named."""
    x, y = _data(2, bad_batch=1)
    model = _model()
    model.compile(optimizer=_optimizer(), loss="mse")
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    message = str(caught.value)
    assert "moving_mean" in message
    assert "callbacks=[tf_mixed.LossScaleMonitor()]" in message
    assert "model.optimizer.track_forward_state(model)" in message
    assert int(model.optimizer.iterations.numpy()) == 1  # the first batch ran


@pytest.mark.slow
def test_declining_the_rollback_is_not_refused(fp16):
    x, y = _data(2, bad_batch=1)
    model = _model()
    model.compile(optimizer=_optimizer(), loss="mse")
    assert model.optimizer.track_forward_state(model, roll_back=False) == 2
    assert len(model.optimizer.tracked_forward_variables) == 2  # declared
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    assert model.optimizer.loss_scale_state().skipped_steps == 1
    assert not np.isfinite(model.layers[1].moving_variance.numpy()).all()
    with pytest.raises(TypeError, match=r"roll_back=0"):
        model.optimizer.track_forward_state(model, roll_back=0)


@pytest.mark.slow
def test_custom_loop_hands_over_the_model_once(fp16):
    x, y = _data(2, bad_batch=2)
    results = []
    for xs, ys in ((x, y), _without_batch(x, y, 2, 2)):
        model = _model()
        opt = _optimizer()
        opt.build(model.trainable_variables)
        assert opt.track_forward_state(model) == 2  # moving mean, variance
        model.optimizer = opt
        step = make_train_step(model, keras.losses.MeanSquaredError(), opt)
        applied = _run_steps(step, xs, ys)
        results.append((applied, _snapshot(model)))
    _assert_skip_changed_nothing(results)


def test_skipped_step_restores_the_state_before_it(fp16):
    """Right after the skip, every tracked variable equals its value before."""
    model = _model()
    opt = _optimizer()
    opt.build(model.trainable_variables)
    opt.track_forward_state(model)
    model.optimizer = opt
    step = make_train_step(model, keras.losses.MeanSquaredError(), opt)
    x, y = _data(2, bad_batch=1)
    step(x[:2], y[:2])
    before = _snapshot(model)
    assert not bool(step(x[2:4], y[2:4])["applied"])
    _assert_identical(_snapshot(model), before)


@pytest.mark.slow
def test_metric_variables_are_not_tracked(fp16):
    model = _model()
    model.compile(optimizer=_optimizer(), loss="mse", metrics=["mae"])
    model.fit(*_data(2), batch_size=2, epochs=1, verbose=0,
              callbacks=[LossScaleMonitor()])
    tracked = {v.path for v in model.optimizer.tracked_forward_variables}
    assert tracked == {v.path for v in model.layers[1].non_trainable_weights}
    assert not tracked & {v.path for v in model.metrics_variables}


def test_bad_argument_to_track_forward_state():
    with pytest.raises(TypeError, match="track_forward_state"):
        _optimizer().track_forward_state("model")


@pytest.mark.slow
def test_mirrored_fit_every_replica_copy_is_rolled_back(fp16, mirrored):
    # Global batch 4 = 2 per replica; in batch 2 only row 3 (replica 1) is
    # bad, so only replica 1's copy of the statistics would be poisoned.
    x, y = _data(4, bad_batch=1, bad_rows=[3])
    snapshots = []
    for xs, ys in ((x, y), _without_batch(x, y, 4, 1)):
        with mirrored.scope():
            model = _model()
            model.compile(optimizer=_optimizer(), loss="mse")
        model.fit(xs, ys, batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[LossScaleMonitor()])
        snapshots.append(_snapshot(model))
    moving_mean = [k for k in snapshots[0] if k.endswith("moving_mean")]
    assert len(snapshots[0][moving_mean[0]]) == 2  # one copy per replica
    _assert_identical(snapshots[0], snapshots[1])


@pytest.mark.slow
def test_mirrored_without_rollback_only_replica_1_is_poisoned(fp16, mirrored):
    """The bug the test above guards against (issue 9, point 1)."""
    x, y = _data(4, bad_batch=1, bad_rows=[3])
    with mirrored.scope():
        model = _model()
        model.compile(optimizer=_optimizer(), loss="mse")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[LossScaleMonitor(rollback_forward_state=False)])
    replica0, replica1 = _copies(model.layers[1].moving_variance)
    assert np.isfinite(replica0).all() and not np.isfinite(replica1).all()


def test_mirrored_variable_with_aggregation_is_refused_with_its_name(mirrored):
    # Written through merge_call, which cannot run inside the skip decision.
    with mirrored.scope():
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        summed = keras.Variable(0.0, trainable=False, aggregation="mean",
                                name="running_total")
        fine = keras.Variable(0.0, trainable=False, aggregation="none",
                              name="per_replica")
        assert opt.track_forward_state([fine]) == 1
        with pytest.raises(ValueError, match="running_total.*MEAN"):
            opt.track_forward_state([fine, summed])


# --- issue 16, case 5: a model built by its first call -------------------------


def _model_without_input():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.layers.Dense(8),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(1),
        tf_mixed.Float32Output(),
    ])


@pytest.mark.slow
def test_make_train_step_rolls_back_a_model_built_by_its_first_call(fp16):
    """No keras.Input: the model has no variables when the step is made."""
    x, y = _data(2, bad_batch=2)
    results = []
    for build, (xs, ys) in ((_model_without_input, (x, y)),
                            (_model, _without_batch(x, y, 2, 2))):
        model = build()
        opt = _optimizer()
        step = make_train_step(model, keras.losses.MeanSquaredError(), opt)
        applied = _run_steps(step, xs, ys)
        assert len(opt.tracked_forward_variables) == 2  # moving mean, variance
        model.optimizer = opt
        results.append((applied, _snapshot(model)))
    _assert_skip_changed_nothing(results)


def test_tracking_an_unbuilt_model_is_loud_at_the_first_step(fp16):
    model = _model_without_input()
    opt = _optimizer()
    assert opt.track_forward_state(model) == 0
    x, y = _data(2)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(tf.reduce_mean(tf.square(model(x, training=True) - y)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    with pytest.raises(ValueError, match=r"track_forward_state\(\) was given 'sequential"
                       r".*had 0 forward-state variable\(s\); it has 2 now"):
        step(x[:2], y[:2])


# --- issue 16, case 8: the copies hold the state the next step starts from ------


class _Crash(keras.callbacks.Callback):
    """Raises at one batch of one epoch: an interrupted run."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("interrupted")


def _run(tmp_path, order, bad, resume):
    """Two epochs of 4 batches of 2, batch `bad` overflowing (skipped) in
    each; with `resume`, crash before batch 3 of epoch 2 and resume with
    BackupAndRestore, in-process ("fit again") or as a restarted run (a new
    model and optimizer, as a fresh process would build)."""
    x, y = _data(2, bad_batch=bad)

    def fit(model, extra=()):
        monitor = LossScaleMonitor()
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        callbacks = [monitor, backup] if order == "monitor-first" else [backup, monitor]
        model.fit(x, y, batch_size=2, epochs=2, shuffle=False, verbose=0,
                  callbacks=callbacks + list(extra))

    model = _model()
    model.compile(optimizer=_optimizer(), loss="mse")
    if resume is None:
        fit(model)
        return model
    with pytest.raises(RuntimeError, match="interrupted"):
        fit(model, [_Crash(1, 3)])
    if resume == "restarted":
        model = _model()
        model.compile(optimizer=_optimizer(), loss="mse")
    fit(model)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("bad", [0, 1], ids=["first-step-skipped", "second-step-skipped"])
@pytest.mark.parametrize("order", ["monitor-first", "backup-first"])
@pytest.mark.parametrize("resume", ["in-process", "restarted"])
def test_resume_with_backup_and_restore_is_bit_exact(fp16, tmp_path, bad, order, resume):
    whole = _run(tmp_path / "whole", order, bad, None)
    resumed = _run(tmp_path / "resumed", order, bad, resume)
    assert whole.optimizer.loss_scale_state().skipped_steps == 2
    assert resumed.optimizer.loss_scale_state().skipped_steps == 2
    _assert_identical(_snapshot(resumed), _snapshot(whole))


@pytest.mark.slow
def test_refresh_after_an_assignment_in_a_custom_loop(fp16):
    model = _model()
    opt = _optimizer()
    step = make_train_step(model, keras.losses.MeanSquaredError(), opt)
    x, y = _data(2, bad_batch=1)
    step(x[:2], y[:2])
    bn = model.layers[1]
    bn.moving_mean.assign(np.full((8,), 0.5, "float32"))  # outside any step
    tf_mixed.scaling.optimizer.refresh_forward_state(opt)
    assert not bool(step(x[2:4], y[2:4])["applied"])
    np.testing.assert_array_equal(bn.moving_mean.numpy(), np.full((8,), 0.5, "float32"))
