"""LossScaleMonitor: logs, set-up warnings, stopping failed runs, bad input."""

import logging
import math
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_mixed
from tf_mixed.callbacks.monitor import LossScaleFailure, LossScaleMonitor, MixedPrecisionWarning

# Many tests here compile under mixed_float16 with a plain optimizer, which
# Keras wraps in its own LossScaleOptimizer; the monitor warns about that
# (its own test catches the warning with pytest.warns); elsewhere it is expected.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*compiled\ with\ Keras's\ own\ keras\.optimizers\.LossScaleOptimizer"
    ":tf_mixed._internal.warning.MixedPrecisionWarning")


class InfGradOn(keras.layers.Layer):
    """Identity on `x` whose gradient is inf for samples whose `raw` last feature is > 0.

    The loss stays finite; only the backward pass overflows, as with a loss
    scale that is too large, so the loss-scale optimizer skips those steps.
    """

    def call(self, x, raw):
        marker = raw[:, -1:] > 0

        @tf.custom_gradient
        def ident(v):
            def grad(dy):
                inf = tf.cast(float("inf"), dy.dtype)
                return tf.where(marker, dy * inf + inf, dy)

            return tf.identity(v), grad

        return ident(x)


def _model(inf_grad=False, out_dtype="float32"):
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8, activation="relu")(inputs)
    if inf_grad:  # overflows the first Dense layer's gradients
        x = InfGradOn()(x, inputs)
    outputs = keras.layers.Dense(1, dtype=out_dtype)(x)
    return keras.Model(inputs, outputs)


def _data(n, marked=()):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    x[:, -1] = -1.0
    for i in marked:
        x[i, -1] = 1.0
    y = rng.normal(size=(n, 1)).astype("float32")
    return x, y


def _keras_lso(scale=2.0**10):
    return keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.01), initial_scale=scale)


def _tf_mixed_lso(scale=2.0**10):
    return tf_mixed.LossScaleOptimizer(
        keras.optimizers.SGD(0.01), initial_scale=scale, min_scale=1.0)


OPTIMIZERS = {"keras": _keras_lso, "tf_mixed": _tf_mixed_lso}


class StepCounter(keras.callbacks.Callback):
    """Records every train-batch hook's index and logs."""

    def __init__(self):
        super().__init__()
        self.batches = []
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)
        self.logs.append(dict(logs or {}))


@pytest.fixture
def fp16():
    tf_mixed.enable("mixed_float16", quiet=True)


def _no_setup_warnings(record):
    return [w for w in record if issubclass(w.category, MixedPrecisionWarning)]


# ---------------------------------------------------------------- logs


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_history_has_loss_scale_and_skipped_steps(fp16, kind):
    model = _model(inf_grad=True)
    model.compile(optimizer=OPTIMIZERS[kind](), loss="mse")
    x, y = _data(32, marked=[0, 9])  # batch size 8: steps 1 and 2 overflow
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                        callbacks=[LossScaleMonitor()])
    h = history.history
    # Each skipped step halves the scale: 2**10 -> 2**9 -> 2**8, twice.
    assert h["loss_scale"] == [2.0**8, 2.0**6]
    assert h["skipped_steps"] == [2.0, 2.0]
    assert h["skipped_fraction"] == [0.5, 0.5]
    assert all(type(v) is float for v in h["loss_scale"] + h["skipped_steps"])


def test_batch_logging_every_n_batches(fp16):
    model = _model(inf_grad=True)
    model.compile(optimizer=_keras_lso(), loss="mse")
    x, y = _data(48, marked=[0])
    counter = StepCounter()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[LossScaleMonitor(log_every_n_batches=2), counter])
    logged = [i for i, logs in zip(counter.batches, counter.logs)
              if "loss_scale" in logs]
    assert logged == [1, 3, 5]
    assert counter.logs[1]["skipped_steps"] == 1.0
    assert counter.logs[1]["loss_scale"] == 2.0**9


def test_no_batch_logging_by_default(fp16):
    model = _model()
    model.compile(optimizer=_keras_lso(), loss="mse")
    counter = StepCounter()
    model.fit(*_data(16), batch_size=8, verbose=0,
              callbacks=[LossScaleMonitor(), counter])
    assert all("loss_scale" not in logs for logs in counter.logs)


def test_float32_model_logs_scale_one():
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    history = model.fit(*_data(16), batch_size=8, verbose=0,
                        callbacks=[LossScaleMonitor()])
    assert history.history["loss_scale"] == [1.0]
    assert history.history["skipped_steps"] == [0.0]


# ---------------------------------------------------------------- stopping


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_overflow_every_step_stops_within_patience(fp16, caplog, kind,
                                                   steps_per_execution):
    model = _model(inf_grad=True)
    model.compile(optimizer=OPTIMIZERS[kind](scale=4.0), loss="mse",
                  steps_per_execution=steps_per_execution)
    x, y = _data(80, marked=range(80))
    monitor = LossScaleMonitor(patience=3, check_every_n_batches=1)
    counter = StepCounter()
    with caplog.at_level(logging.ERROR):
        history = model.fit(x, y, batch_size=4, epochs=3, shuffle=False,
                            verbose=0, callbacks=[monitor, counter])
    # Steps 1-2 take the scale 4 -> 2 -> 1 (the minimum); steps 3-5 are
    # skipped at it; patience=3 stops after step 5 (step 6 with 2 steps per
    # execution, the end of the execution holding step 5).
    last_step = counter.batches[-1] + 1
    assert last_step == {1: 5, 2: 6}[steps_per_execution]
    assert len(history.history["loss"]) == 1  # stopped in the first epoch
    assert monitor.stop_reason is not None
    assert "minimum" in monitor.stop_reason
    assert "patience=3" in caplog.text
    assert model.stop_training


def _infinite_loss(y_true, y_pred):
    return keras.ops.mean(keras.ops.square(y_true - y_pred)) * float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_infinite_loss_every_step_stops_within_patience(fp16, caplog, kind):
    model = _model()
    model.compile(optimizer=OPTIMIZERS[kind](scale=4.0), loss=_infinite_loss)
    counter = StepCounter()
    monitor = LossScaleMonitor(patience=4, check_every_n_batches=1)
    with caplog.at_level(logging.ERROR):
        model.fit(*_data(80), batch_size=4, epochs=2, shuffle=False, verbose=0,
                  callbacks=[monitor, counter])
    # Every step is skipped (the loss is inf, so are the gradients), so the
    # NaN-loss check stays quiet and the minimum-scale check stops the run:
    # 2 steps down to the minimum, then 4 at it.
    assert counter.batches[-1] + 1 == 6
    assert "patience=4" in caplog.text
    assert "minimum" in monitor.stop_reason


def test_raise_on_failure_raises_with_reason(fp16):
    model = _model(inf_grad=True)
    model.compile(optimizer=_keras_lso(scale=2.0), loss="mse")
    x, y = _data(40, marked=range(40))
    with pytest.raises(LossScaleFailure, match="minimum.*patience=2"):
        model.fit(x, y, batch_size=4, verbose=0, shuffle=False,
                  callbacks=[LossScaleMonitor(patience=2, raise_on_failure=True)])


def test_skip_fraction_above_threshold_stops_at_epoch_end(fp16, caplog):
    model = _model(inf_grad=True)
    model.compile(optimizer=_keras_lso(), loss="mse")
    x, y = _data(10, marked=[0, 2, 4, 6, 8, 9])  # 6 of 10 steps overflow
    monitor = LossScaleMonitor(max_skip_fraction=0.5)
    with caplog.at_level(logging.ERROR):
        history = model.fit(x, y, batch_size=1, epochs=3, shuffle=False,
                            verbose=0, callbacks=[monitor])
    assert history.history["skipped_steps"] == [6.0]
    assert history.history["skipped_fraction"] == [0.6]
    assert history.history["loss_scale"] == [2.0**4]
    assert "6 of 10 steps in epoch 1" in monitor.stop_reason
    assert "max_skip_fraction=0.5" in caplog.text


def test_skip_fraction_at_threshold_does_not_stop(fp16):
    model = _model(inf_grad=True)
    model.compile(optimizer=_keras_lso(), loss="mse")
    x, y = _data(10, marked=[0, 2, 4, 6, 8])  # exactly half
    monitor = LossScaleMonitor(max_skip_fraction=0.5)
    history = model.fit(x, y, batch_size=1, epochs=2, shuffle=False,
                        verbose=0, callbacks=[monitor])
    assert len(history.history["loss"]) == 2
    assert monitor.stop_reason is None


def test_nan_loss_on_applied_step_stops():
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x, y = _data(40)
    y[12] = np.nan  # in step 4 (batch size 4)
    counter = StepCounter()
    monitor = LossScaleMonitor(check_every_n_batches=1)
    model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[monitor, counter])
    assert counter.batches[-1] == 3
    assert "no step was skipped" in monitor.stop_reason


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_nan_loss_on_skipped_step_does_not_stop(fp16, kind):
    model = _model()
    model.compile(optimizer=OPTIMIZERS[kind](), loss="mse")
    x, y = _data(40)
    y[12] = np.nan  # NaN loss -> NaN gradients -> the step is skipped
    monitor = LossScaleMonitor()
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                        verbose=0, callbacks=[monitor])
    assert monitor.stop_reason is None
    assert history.history["skipped_steps"] == [1.0, 1.0]
    # tf_mixed's optimizer: the epoch loss is the mean of the 9 applied
    # steps; Keras's wrapper keeps no per-step losses, so Keras's NaN stays.
    assert math.isnan(history.history["loss"][0]) == (kind == "keras")
    assert np.isfinite(model.get_weights()[0]).all()


class CorruptAfter(keras.callbacks.Callback):
    """Writes inf into the first kernel after batch `batch` (a bad update)."""

    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            kernel = self.model.layers[1].kernel
            kernel.assign(np.full(kernel.shape, np.inf, "float32"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_corrupted_weights_stop_even_though_steps_are_skipped(fp16, kind):
    model = _model()
    model.compile(optimizer=OPTIMIZERS[kind](), loss="mse")
    counter = StepCounter()
    monitor = LossScaleMonitor(check_every_n_batches=1)
    model.fit(*_data(40), batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[CorruptAfter(2), monitor, counter])
    # Step 4 is the first with a NaN loss; it is skipped, but the weights are
    # already inf, so the run stops there rather than 15 + patience steps on.
    assert counter.batches[-1] == 3
    assert "hold NaN/inf" in monitor.stop_reason
    assert "dense/kernel" in monitor.stop_reason


@pytest.mark.slow
def test_mirrored_strategy(fp16, mirrored, caplog):
    # steps_per_execution > 1 is tested without a strategy above: Keras 3.15's
    # fit with MirroredStrategy and steps_per_execution > 1 fails by itself
    # on TF 2.21 ("You must feed a value for placeholder tensor",
    # keras-team/keras#19246), with or without this callback.
    with mirrored.scope():
        model = _model(inf_grad=True)
        model.compile(optimizer=_tf_mixed_lso(scale=4.0), loss="mse")
    x, y = _data(64, marked=range(64))
    counter = StepCounter()
    monitor = LossScaleMonitor(patience=2, check_every_n_batches=1)
    with caplog.at_level(logging.ERROR):
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                  callbacks=[monitor, counter])
    # 4 -> 2 -> 1 in steps 1-2, skipped at the minimum in steps 3-4.
    assert counter.batches[-1] + 1 == 4
    assert "minimum" in monitor.stop_reason
    assert monitor.total_skipped_steps == 4


@pytest.mark.slow
def test_mirrored_history_overflow_on_second_replica(fp16, mirrored):
    # Sample 5 of the first batch of 8 lands on replica 1: tf_mixed's
    # optimizer skips the step on both replicas and the callback counts it.
    # (Only tf_mixed's optimizer is used under MirroredStrategy in this file:
    # running Keras's wrapper and tf_mixed's under two MirroredStrategy
    # objects in one process fails with a collective shape mismatch.)
    with mirrored.scope():
        model = _model(inf_grad=True)
        model.compile(optimizer=_tf_mixed_lso(), loss="mse")
    x, y = _data(32, marked=[5])
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False,
                        verbose=0, callbacks=[LossScaleMonitor()])
    assert history.history["loss_scale"] == [2.0**9, 2.0**8]
    assert history.history["skipped_steps"] == [1.0, 1.0]
    assert np.isfinite(model.get_weights()[0]).all()


# ---------------------------------------------------------------- set-up checks


def _fit_warnings(model, optimizer, **fit_kwargs):
    model.compile(optimizer=optimizer, loss="mse")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model.fit(*_data(8), batch_size=8, verbose=0,
                  callbacks=[LossScaleMonitor(**fit_kwargs)])
    return [str(w.message) for w in _no_setup_warnings(record)]


def test_sound_setup_gives_no_warning(fp16):
    # tf_mixed's wrapper: Keras's own is now said (issue 27 item 4, below).
    assert _fit_warnings(_model(), _tf_mixed_lso()) == []


def test_warns_once_about_keras_own_wrapper(fp16):
    """What compile adds under mixed_float16 when wrap_optimizer is forgotten."""
    messages = _fit_warnings(_model(), _keras_lso())
    assert len(messages) == 1
    assert "Keras's own keras.optimizers.LossScaleOptimizer" in messages[0]
    assert "tf_mixed.wrap_optimizer(optimizer)" in messages[0]


def test_warns_float16_model_without_loss_scaling(fp16):
    # Layers built under mixed_float16, the model object under float32 (so
    # compile does not wrap the optimizer) and the global policy float32.
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8)(inputs)
    outputs = keras.layers.Dense(1, dtype="float32")(x)
    keras.config.set_dtype_policy("float32")
    model = keras.Model(inputs, outputs)
    messages = _fit_warnings(model, keras.optimizers.SGD(0.01))
    assert len(messages) == 1
    assert "does not scale the loss" in messages[0]
    assert "tf_mixed.wrap_optimizer" in messages[0]


def test_warns_float16_output(fp16):
    # tf_mixed's wrapper, so the output is the one finding (Keras's own
    # wrapper is a finding of its own since issue 27).
    messages = _fit_warnings(_model(out_dtype=None), _tf_mixed_lso())
    assert len(messages) == 1
    assert "is float16" in messages[0]
    # audit's finding, in audit's words (a linear output: Float32Output).
    assert "Float32Output()" in messages[0]


def test_warns_model_built_before_enable():
    model = _model()  # built under float32
    tf_mixed.enable("mixed_float16", quiet=True)
    messages = _fit_warnings(model, keras.optimizers.SGD(0.01))
    assert len(messages) == 1
    assert "'float32' but the global policy is 'mixed_float16'" in messages[0]
    assert "tf_mixed.enable() before building" in messages[0]


class _SubclassedSoftmax(keras.Model):
    """Its float16 softmax output exists only in its call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, name="hidden")
        self.probs = keras.layers.Dense(4, activation="softmax", name="probs")

    def call(self, x):
        return self.probs(self.hidden(x))


@pytest.mark.slow
@pytest.mark.parametrize("built_before_fit", [True, False])
def test_warns_a_subclassed_models_float16_softmax(fp16, built_before_fit):
    model = _SubclassedSoftmax(name="sub")
    if built_before_fit:
        model(np.zeros((2, 4), "float32"))
    # Built by fit: checked once the first step has built it.
    messages = _fit_warnings(model, _tf_mixed_lso())
    assert len(messages) == 1, messages
    assert "Model 'sub': [error] probs: the model output is a softmax computed in float16" \
        in messages[0]


def test_check_setup_false_silences(fp16):
    assert _fit_warnings(_model(out_dtype=None), _keras_lso(),
                         check_setup=False) == []


# ---------------------------------------------------------------- TensorBoard


class EpochLogs(keras.callbacks.Callback):
    """Records the epoch logs a later callback (such as TensorBoard) receives."""

    def __init__(self):
        super().__init__()
        self.logs = []

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs or {}))


def test_later_callbacks_see_the_values(fp16):
    model = _model()
    model.compile(optimizer=_keras_lso(), loss="mse")
    recorder = EpochLogs()
    model.fit(*_data(16), batch_size=8, epochs=1, verbose=0,
              callbacks=[LossScaleMonitor(), recorder])
    assert recorder.logs[0]["loss_scale"] == 2.0**10
    assert recorder.logs[0]["skipped_steps"] == 0.0


def test_tensorboard_gets_loss_scale(fp16, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    model = _model()
    model.compile(optimizer=_keras_lso(), loss="mse")
    board = keras.callbacks.TensorBoard(str(tmp_path))
    model.fit(*_data(16), batch_size=8, epochs=1, verbose=0,
              callbacks=[LossScaleMonitor(), board])
    tags = set()
    for root, _, files in os.walk(tmp_path / "train"):
        for name in files:
            for record in tf.data.TFRecordDataset(os.path.join(root, name)):
                event = tf.compat.v1.Event.FromString(record.numpy())
                tags.update(v.tag for v in event.summary.value)
    assert {"epoch_loss_scale", "epoch_skipped_steps"} <= tags


# ---------------------------------------------------------------- bad input


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, error, text", [
    ({"patience": 0}, ValueError, "patience=0"),
    ({"patience": 2.5}, TypeError, "patience=2.5"),
    ({"max_skip_fraction": 0.0}, ValueError, "max_skip_fraction=0.0"),
    ({"max_skip_fraction": 1.5}, ValueError, "max_skip_fraction=1.5"),
    ({"max_skip_fraction": "half"}, TypeError, "max_skip_fraction='half'"),
    ({"min_scale": 0}, ValueError, "min_scale=0"),
    ({"log_every_n_batches": -1}, ValueError, "log_every_n_batches=-1"),
])
def test_bad_arguments_name_the_value(kwargs, error, text):
    with pytest.raises(error, match=text):
        LossScaleMonitor(**kwargs)


def test_get_config_round_trips():
    monitor = LossScaleMonitor(patience=5, max_skip_fraction=0.25,
                               min_scale=2.0, log_every_n_batches=10,
                               raise_on_failure=True, check_setup=False)
    clone = LossScaleMonitor(**monitor.get_config())
    assert clone.get_config() == monitor.get_config()


# ------------------------------------------------------ issue 9: no per-step cost


@pytest.mark.slow
def test_three_steps_per_execution_one_bad_sample_trains_every_epoch(fp16):
    # Issue 9, point 3: the execution of steps 1-3 holds one NaN sample; its
    # step is skipped, the others are applied. The old monitor saw a NaN
    # running loss with "only 1 of 3 steps skipped" and stopped.
    model = _model()
    model.compile(optimizer=_tf_mixed_lso(), loss="mse", steps_per_execution=3)
    x, y = _data(24)
    y[5] = np.nan  # batch size 4: step 2 of 6
    monitor = LossScaleMonitor()
    history = model.fit(x, y, batch_size=4, epochs=3, shuffle=False,
                        verbose=0, callbacks=[monitor])
    assert monitor.stop_reason is None
    assert len(history.history["loss"]) == 3
    assert history.history["skipped_steps"] == [1.0, 1.0, 1.0]
    assert all(math.isfinite(v) for v in history.history["loss"])
    assert np.isfinite(model.get_weights()[0]).all()


@pytest.mark.slow
def test_default_monitor_reads_the_optimizer_every_n_batches(fp16, monkeypatch):
    """Issue 16, case 6: the default reads every DEFAULT_CHECK_EVERY_N_BATCHES
    batches (Keras 3 on TF already syncs every step's logs, so the hook adds
    no synchronisation; between reads it only counts)."""
    from tf_mixed.callbacks import monitor as callbacks_module
    from tf_mixed.scaling import optimizer as loss_scale_module

    monkeypatch.setattr(callbacks_module, "DEFAULT_CHECK_EVERY_N_BATCHES", 4)
    reads = []
    real = loss_scale_module.loss_scale_state
    monkeypatch.setattr(loss_scale_module, "loss_scale_state",
                        lambda opt: reads.append(1) or real(opt))
    model = _model()
    model.compile(optimizer=_tf_mixed_lso(), loss="mse")
    monitor = LossScaleMonitor()
    model.fit(*_data(40), batch_size=4, epochs=3, verbose=0,
              callbacks=[monitor])
    # on_train_begin + per epoch: batches 4 and 8 of 10, and the epoch end.
    assert len(reads) == 1 + 3 * 3
    assert monitor.get_config()["check_every_n_batches"] is None
    # 0 keeps the epoch-end-only behaviour: no batch hook at all.
    assert "on_train_batch_end" not in vars(LossScaleMonitor(check_every_n_batches=0))


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_default_monitor_stops_an_all_skipped_run_within_bounded_steps(fp16, kind):
    """Issue 16, case 6: every step skipped; the default monitor stops within
    patience + halvings + DEFAULT_CHECK_EVERY_N_BATCHES steps, long before
    the end of a 400-step epoch (it used to read once per epoch)."""
    from tf_mixed.callbacks.monitor import DEFAULT_CHECK_EVERY_N_BATCHES

    model = _model()
    model.compile(optimizer=OPTIMIZERS[kind](scale=4.0), loss=_infinite_loss)
    counter = StepCounter()
    monitor = LossScaleMonitor(patience=4)
    model.fit(*_data(1600), batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[monitor, counter])
    # 2 halvings to the minimum, 4 skips at it: due at step 6, checked at 50.
    assert counter.batches[-1] + 1 == DEFAULT_CHECK_EVERY_N_BATCHES == 50
    assert "minimum" in monitor.stop_reason


@pytest.mark.slow
def test_epoch_loss_is_the_mean_of_applied_steps(fp16):
    model = _model()
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.0),
                                      initial_scale=2.0**10)
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(16)
    y[5] = np.nan  # step 2 of 4 (batch size 4): NaN loss, skipped
    history = model.fit(x, y, batch_size=4, epochs=1, shuffle=False,
                        verbose=0, callbacks=[LossScaleMonitor()])
    # lr 0: the weights never move, so each step's loss is evaluate's.
    per_step = [model.evaluate(x[i:i + 4], y[i:i + 4], verbose=0)
                for i in (0, 8, 12)]
    assert history.history["skipped_steps"] == [1.0]
    assert history.history["loss"][0] == pytest.approx(np.mean(per_step),
                                                       rel=1e-6)


class _UndoSkipContract(keras.callbacks.Callback):
    """Put after the monitor: gives the model Keras's own train step back."""

    def on_train_begin(self, logs=None):
        self.model.train_step = type(self.model).train_step.__get__(self.model)
        self.model.make_train_function(force=True)


@pytest.mark.slow
def test_epoch_loss_without_the_skip_contract_comes_from_the_tally(fp16):
    """The one way to the monitor's own epoch-loss correction: a later
    callback replaces the train step the monitor wrapped (then Keras's loss
    takes the skipped window's NaN); with accumulation the monitor's tally
    still gives the mean of the applied windows' micro-batch losses."""
    from tf_mixed.callbacks import skip_contract

    model = _model()
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=2.0**10,
                                      gradient_accumulation_steps=2)
    model.compile(optimizer=opt, loss="mse")
    x, y = _data(16)
    y[5] = np.nan  # micro-batch 2 of 8 (batch size 2): window 1 of 4 discarded
    history = model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0,
                        callbacks=[LossScaleMonitor(), _UndoSkipContract()])
    assert not skip_contract.installed(model)
    # lr 0: the weights never move, so each micro-batch's loss is the prediction's.
    squared = np.square(model.predict(x, verbose=0) - y)
    per_batch = [squared[i:i + 2].mean() for i in (0, 2, 8, 10, 12, 14)]
    assert history.history["skipped_steps"] == [1.0]
    assert history.history["loss"][0] == pytest.approx(np.mean(per_batch), rel=1e-6)


def test_nan_loss_on_applied_step_stops_at_epoch_end_by_default():
    model = _model()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x, y = _data(40)
    y[12] = np.nan
    counter = StepCounter()
    monitor = LossScaleMonitor()
    model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0,
              callbacks=[monitor, counter])
    assert counter.batches[-1] == 9  # the end of epoch 1
    assert "no step was skipped" in monitor.stop_reason


class CorruptReplica1(keras.callbacks.Callback):
    """Writes inf into replica 1's copy of the first kernel only."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 0:
            copies = self.model.layers[1].kernel.value.values
            copies[1].assign(np.full(copies[1].shape, np.inf, "float32"))


@pytest.mark.slow
def test_mirrored_nan_check_reads_every_replica_copy(fp16, mirrored):
    with mirrored.scope():
        model = _model()
        model.compile(optimizer=_tf_mixed_lso(), loss="mse")
    monitor = LossScaleMonitor()
    model.fit(*_data(32), batch_size=8, epochs=3, shuffle=False, verbose=0,
              callbacks=[CorruptReplica1(), monitor])
    # Replica 0's copy (what get_weights() reads) stays finite.
    assert np.isfinite(model.get_weights()[0]).all()
    assert "hold NaN/inf" in monitor.stop_reason
    assert len(model.history.history["loss"]) == 1
