"""Gradient accumulation: N micro-batches of B == one batch of N*B, exactly.

The model is one linear unit without bias, the loss the batch mean of
``(x . w - y)**2 / 2``, the optimizer SGD with power-of-two learning rates,
and the data small integers: every sum is exact in float32, so the
accumulated update and the one-batch update are compared with ``==``.
A "skipped window" has a NaN (or inf) in one micro-step on one replica: the
whole window must leave no trace and the scale must back off once.
"""

import keras
import mirrored_windows
import numpy as np
import pytest
import tensorflow as tf
from _workers import run_two_workers
from repo_paths import INTEGRATION
from zoo import ZOO

import tf_mixed
from tf_mixed.scaling import formats

# These tests hand the optimizer gradients they made themselves (a window of
# known values), not a scaled loss's: tf_mixed's misuse check warns about that
# (tested in tests/scaling/test_optimizer.py); here it is expected, not news.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*never\ went\ through\ scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")

WINDOWS = 3
STEPS = 4  # micro-steps per window
MICRO = 4  # examples per micro-batch (global)
FEATURES = 3
SKIPPED_WINDOW = 1
WORKER = INTEGRATION / "_accumulation_worker.py"


def data():
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, size=(WINDOWS * STEPS * MICRO, FEATURES)).astype(np.float32)
    y = rng.integers(-2, 3, size=(WINDOWS * STEPS * MICRO,)).astype(np.float32)
    return x, y


def schedule():
    # lr per applied update: 2**-3 for the first, then 2**-4.
    return keras.optimizers.schedules.PiecewiseConstantDecay([0], [2.0**-3, 2.0**-4])


def mean_gradient(w, x, y):
    """d/dw of mean((x.w - y)**2 / 2), in float64 (exact here)."""
    residual = x.astype(np.float64) @ w - y
    return x.T.astype(np.float64) @ residual / len(y)


def reference(skip_window=None):
    """Plain SGD on whole windows (N*B examples), skipping one if asked."""
    x, y = data()
    w = np.zeros(FEATURES)
    applied = 0
    for window in range(WINDOWS):
        if window == skip_window:
            continue
        rows = slice(window * STEPS * MICRO, (window + 1) * STEPS * MICRO)
        lr = 2.0**-3 if applied == 0 else 2.0**-4
        w = w - lr * mean_gradient(w, x[rows], y[rows])
        applied += 1
    return w.astype(np.float32)


def micro_gradient(w, x, y, poison):
    grad = mean_gradient(w.astype(np.float64), x, y).astype(np.float32)
    if poison:
        grad = grad * np.float32(np.nan)
    return grad


def _optimizer(where, **knobs):
    if where == "wrapper":
        return tf_mixed.LossScaleOptimizer(
            keras.optimizers.SGD(schedule()), gradient_accumulation_steps=STEPS,
            initial_scale=16.0, **knobs)
    inner = keras.optimizers.SGD(schedule(), gradient_accumulation_steps=STEPS)
    return tf_mixed.wrap_optimizer(inner, force=True, initial_scale=16.0, **knobs)


@pytest.mark.slow
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("where", ["wrapper", "inner"])
@pytest.mark.parametrize("skip", [None, SKIPPED_WINDOW], ids=["clean", "skipped"])
def test_one_device(where, skip, graph):
    x, y = data()
    w = keras.Variable(np.zeros(FEATURES, np.float32))
    opt = _optimizer(where)
    assert opt.accumulator.steps == STEPS
    opt.build([w])

    def step(grad):
        # Gradients of the loss scaled by the current scale.
        return opt.apply([grad * opt.loss_scale.value], [w])

    fn = tf.function(step) if graph else step
    verdicts = []
    for window in range(WINDOWS):
        start = w.numpy().copy()
        for micro in range(STEPS):
            rows = slice((window * STEPS + micro) * MICRO,
                         (window * STEPS + micro + 1) * MICRO)
            poison = window == skip and micro == 1
            verdicts.append(bool(fn(tf.constant(micro_gradient(start, x[rows], y[rows], poison)))))
            if micro < STEPS - 1:  # nothing moves inside a window
                np.testing.assert_array_equal(w.numpy(), start)
    np.testing.assert_array_equal(w.numpy(), reference(skip))
    state = opt.loss_scale_state()
    skipped = 0 if skip is None else 1
    assert state.skipped_steps == skipped  # windows, not micro-steps
    assert state.scale == (8.0 if skip is not None else 16.0)
    assert int(opt.iterations.numpy()) == WINDOWS - skipped  # LR schedule clock
    expected = [True] * (WINDOWS * STEPS)
    if skip is not None:
        expected[skip * STEPS + STEPS - 1] = False
    assert verdicts == expected
    assert all(np.all(b.numpy() == 0) for b in opt.accumulator.buffers)


def test_scale_never_changes_inside_a_window_and_backs_off_once():
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0,
                                      gradient_accumulation_steps=STEPS)
    scales = []
    # The window's skip is said once (no forward state to roll back): caught here.
    with pytest.warns(tf_mixed.callbacks.MixedPrecisionWarning, match="A step was skipped"):
        for micro in range(STEPS):  # three overflowing micro-steps in one window
            grad = tf.constant([np.inf, 1.0]) if micro else tf.constant([1.0, 1.0])
            opt.apply([grad], [w])
            scales.append(opt.loss_scale_state().scale)
    assert scales == [64.0, 64.0, 64.0, 32.0]
    assert opt.loss_scale_state().skipped_steps == 1
    np.testing.assert_array_equal(w.numpy(), [0.0, 0.0])


def _mirrored_run(mirrored, skip, communication_dtype=None):
    x, y = data()
    with mirrored.scope():
        w = keras.Variable(np.zeros(FEATURES, np.float32))
        opt = _optimizer("wrapper", communication_dtype=communication_dtype)
        opt.build([w])

    @tf.function
    def step(x_rows, y_rows, start, poison_replica):
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            i = ctx.replica_id_in_sync_group
            half = MICRO // 2
            xs, ys = x_rows[i * half:(i + 1) * half], y_rows[i * half:(i + 1) * half]
            residual = tf.linalg.matvec(xs, start) - ys
            # The replica's share of the global mean's gradient, scaled.
            grad = (tf.linalg.matvec(xs, residual, transpose_a=True) / MICRO
                    * opt.loss_scale.value)
            grad = tf.where(tf.equal(i, poison_replica), grad * np.nan, grad)
            return opt.apply([grad], [w])

        return mirrored.run(replica_fn)

    for window in range(WINDOWS):
        start = tf.constant(w.numpy())
        for micro in range(STEPS):
            rows = slice((window * STEPS + micro) * MICRO,
                         (window * STEPS + micro + 1) * MICRO)
            poison = 1 if (window == skip and micro == 2) else -1
            step(tf.constant(x[rows]), tf.constant(y[rows]), start, tf.constant(poison))
    copies = [c.numpy() for c in w.value.values]
    return copies, opt


@pytest.mark.slow
@pytest.mark.parametrize("skip", [None, SKIPPED_WINDOW], ids=["clean", "skipped"])
def test_mirrored_replicas_agree_with_one_device(mirrored, skip):
    copies, opt = _mirrored_run(mirrored, skip)
    np.testing.assert_array_equal(copies[0], copies[1])
    np.testing.assert_array_equal(copies[0], reference(skip))
    assert opt.loss_scale_state().skipped_steps == (0 if skip is None else 1)
    assert int(opt.iterations.numpy()) == WINDOWS - (0 if skip is None else 1)


@pytest.mark.slow
def test_mirrored_with_a_half_precision_wire(mirrored):
    # bfloat16 on the wire rounds: equal across replicas, close to exact.
    copies, _ = _mirrored_run(mirrored, SKIPPED_WINDOW, communication_dtype="bfloat16")
    np.testing.assert_array_equal(copies[0], copies[1])
    np.testing.assert_allclose(copies[0], reference(SKIPPED_WINDOW), rtol=2e-2, atol=2e-3)


@pytest.mark.slow  # 5.9 s CPU (over the fast tier's 5 s), 43 s at load 10
def test_one_collective_per_window(mirrored, monkeypatch):
    """The traced micro-step holds one reduction (in the window-end branch)."""
    calls = {"replica all_reduce": 0, "reduce_to": 0}
    real_all_reduce = tf.distribute.ReplicaContext.all_reduce
    real_reduce_to = type(mirrored.extended).reduce_to

    def all_reduce(self, *args, **kwargs):
        calls["replica all_reduce"] += 1
        return real_all_reduce(self, *args, **kwargs)

    def reduce_to(self, *args, **kwargs):
        calls["reduce_to"] += 1
        return real_reduce_to(self, *args, **kwargs)

    monkeypatch.setattr(tf.distribute.ReplicaContext, "all_reduce", all_reduce)
    monkeypatch.setattr(type(mirrored.extended), "reduce_to", reduce_to)
    with mirrored.scope():
        a, b = keras.Variable(np.zeros(3, np.float32)), keras.Variable(np.zeros(2, np.float32))
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                          gradient_accumulation_steps=2,
                                          communication_dtype="float16",
                                          initial_scale=1.0, dynamic=False)
        opt.build([a, b])

    @tf.function
    def step():
        mirrored.run(lambda: opt.apply([tf.ones(3), tf.ones(2)], [a, b]))

    for _ in range(4):
        step()
    assert calls == {"replica all_reduce": 0, "reduce_to": 1}  # one trace
    # Two windows of two micro-steps of ones on two replicas: the summed
    # gradient is 4, its mean over the window 2, applied twice with lr 1.
    np.testing.assert_array_equal(a.numpy(), [-4.0, -4.0, -4.0])


@pytest.mark.slow
@pytest.mark.parametrize("skip", [None, SKIPPED_WINDOW], ids=["clean", "skipped"])
def test_two_workers_agree_with_one_device(tmp_path, skip):
    results = run_two_workers(WORKER, tmp_path, "none" if skip is None else str(skip))
    for result in results:
        np.testing.assert_array_equal(np.array(result["weights"], np.float32), reference(skip))
        assert result["skipped_windows"] == (0 if skip is None else 1)
        assert result["iterations"] == WINDOWS - (0 if skip is None else 1)


@pytest.mark.slow
def test_fit_with_a_monitor_counts_skipped_windows():
    x, y = data()
    x[1 * STEPS * MICRO + 1] = np.nan  # window 1, micro-step 0
    x[1 * STEPS * MICRO + MICRO + 1] = np.nan  # window 1, micro-step 1
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(2.0**-4),
                                  gradient_accumulation_steps=STEPS)
    model.compile(optimizer=opt, loss="mse")
    monitor = tf_mixed.LossScaleMonitor()
    history = model.fit(x, y, batch_size=MICRO, epochs=1, shuffle=False, verbose=0,
                        callbacks=[monitor])
    assert history.history["skipped_steps"] == [1.0]  # one window, two bad micro-steps
    assert history.history["skipped_fraction"] == [1.0 / WINDOWS]
    # The epoch loss without the skipped window: the mean micro-batch loss
    # of the applied windows (each window's micro-batch losses averaged).
    clean_x, _ = data()
    window = STEPS * MICRO
    losses, w = [], np.zeros(FEATURES)
    for k in (0, 2):
        rows = slice(k * window, (k + 1) * window)
        residual = clean_x[rows] @ w - y[rows]
        losses.append(np.mean(residual**2))
        w = w - 2.0**-4 * 2 * clean_x[rows].T @ residual / window
    np.testing.assert_allclose(history.history["loss"][0], np.mean(losses), rtol=1e-5)
    np.testing.assert_allclose(model.get_weights()[0][:, 0], w, rtol=1e-5)
    assert int(opt.iterations.numpy()) == WINDOWS - 1
    assert np.all(np.isfinite(model.get_weights()[0]))


def test_config_round_trip_and_checkpointed_state():
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.Adam(), gradient_accumulation_steps=3,
                                      compensation="stochastic", state_dtype="bfloat16")
    config = opt.get_config()
    assert config["gradient_accumulation_steps"] == 3
    assert config["compensation"] == {"method": "stochastic", "state_dtype": "bfloat16", "seed": 0}
    again = tf_mixed.LossScaleOptimizer.from_config(config)
    assert again.get_config() == config
    assert again.accumulator.steps == 3
    v = keras.Variable(np.zeros(4, np.float32))
    again.build([v])
    names = [var.name for var in again.variables]
    assert "accumulation_micro_step" in names
    assert any(name.endswith("_accumulated_gradient") for name in names)


def test_bad_arguments_are_named():
    for bad in (0, -2, True, "2", 2.0):
        with pytest.raises(ValueError, match="gradient_accumulation_steps"):
            tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(), gradient_accumulation_steps=bad)
    with pytest.raises(ValueError, match="Received: 2 on the wrapper, 3 on the inner"):
        tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=3),
                                    gradient_accumulation_steps=2)
    built = keras.optimizers.SGD(gradient_accumulation_steps=2)
    built.build([keras.Variable(1.0)])
    with pytest.raises(ValueError, match="built with Keras's gradient accumulation"):
        tf_mixed.wrap_optimizer(built)
    with pytest.raises(ValueError, match="unknown arguments.*gradient_accumulation_steps"):
        tf_mixed.wrap_optimizer(keras.optimizers.SGD(), gradient_accumulation=2)
    assert tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(),
                                       gradient_accumulation_steps=1).accumulator is None


def test_a_run_resumed_inside_a_window_continues_it():
    def fresh():
        w = keras.Variable(np.zeros(2, np.float32))
        opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=1.0,
                                          dynamic=False, gradient_accumulation_steps=4)
        opt.build([w])
        return w, opt

    grads = [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0]),
             tf.constant([5.0, 6.0]), tf.constant([7.0, 8.0])]
    w, opt = fresh()
    for g in grads[:2]:
        opt.apply([g], [w])
    store = {}
    opt.save_own_variables(store)
    w2, resumed = fresh()
    resumed.load_own_variables(store)
    for g in grads[2:]:
        resumed.apply([g], [w2])
    np.testing.assert_array_equal(w2.numpy(), [-4.0, -5.0])  # mean of the four


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_fit_with_accumulation_over_the_zoo(name):
    """Embedding's sparse gradients, BatchNorm, several outputs: one update per window."""
    spec = ZOO[name]
    model = spec.ready()
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01), gradient_accumulation_steps=2)
    model.compile(optimizer=opt, loss=spec.loss)
    x, y = spec.data(16)
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == 2  # four batches, two windows
    after = model.get_weights()
    assert all(np.all(np.isfinite(w)) for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(after, before))


@pytest.mark.slow
def test_fit_under_mirrored_equals_one_device(mirrored):
    """Keras fit, two replicas, micro-batches of 4: the one-device result."""
    x, y = data()
    results = []
    for strategy in (tf.distribute.get_strategy(), mirrored):
        with strategy.scope():
            model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(
                1, use_bias=False, kernel_initializer="zeros")])
            opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(2.0**-4),
                                          gradient_accumulation_steps=STEPS)
            model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, batch_size=MICRO, epochs=1, shuffle=False, verbose=0)
        assert int(opt.iterations.numpy()) == WINDOWS
        results.append(model.get_weights()[0])
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


# ------------------------------------------------ issue 28: per replica, end of fit


@pytest.mark.slow
def test_mirrored_resume_inside_a_window_equals_the_uninterrupted_run(mirrored):
    def carry(first, w1):
        # As a .keras file does: the wrapper's own entry and the inner optimizer's.
        store, inner_store = {}, {}
        first.save_own_variables(store)
        first.inner_optimizer.save_own_variables(inner_store)
        buffer_key = formats._entries(first)[id(first.accumulator.buffers[0])]
        assert store[buffer_key].shape == (2, mirrored_windows.FEATURES)  # one row per replica
        w2, resumed = mirrored_windows.fresh(mirrored)
        w2.assign(w1.numpy())
        resumed.load_own_variables(store)
        resumed.inner_optimizer.load_own_variables(inner_store)
        return w2, resumed

    uninterrupted, resumed = mirrored_windows.resume_inside_a_window(mirrored, carry)
    for copy, expected in zip(resumed, uninterrupted):
        np.testing.assert_array_equal(copy, expected)  # exactly


@pytest.mark.slow
def test_a_window_saved_on_two_replicas_resumes_on_one_with_its_sum(mirrored):
    w1, first = mirrored_windows.fresh(mirrored)
    features = mirrored_windows.FEATURES
    mirrored_windows.micro_steps(mirrored, w1, first, np.ones((2, 2, features), np.float32))
    store = {}
    first.save_own_variables(store)
    _, one = mirrored_windows.fresh(tf.distribute.get_strategy())  # one device
    with pytest.warns(RuntimeWarning, match="saved on 2 replicas and are restored onto 1"):
        one.load_own_variables(store)
    # Two micro-steps of ones on two replicas: the window's sum is 4.
    np.testing.assert_array_equal(one.accumulator.buffers[0].numpy(), [4.0] * features)
    assert int(one.accumulator.micro_step.numpy()) == 2


def test_one_device_files_keep_the_plain_layout():
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), gradient_accumulation_steps=2)
    opt.build([w])
    opt.apply([tf.constant([1.0, 2.0])], [w])
    store = {}
    opt.save_own_variables(store)
    # The wrapper's own layout: the scalar state as one vector, then each
    # buffer in its own shape (no replica axis on one device).
    keys = formats._entries(opt)
    # Nine scalars: iterations, learning rate, the six scale counters, the
    # micro-step (a TensorShape([]) is truthy: the split counts by rank).
    assert np.shape(store["0"]) == (9,)
    assert [np.shape(store[keys[id(b)]]) for b in opt.accumulator.buffers] == [
        tuple(b.shape) for b in opt.accumulator.buffers]


def test_a_file_with_every_variable_listed_still_loads():
    """tf_mixed wrote every own variable as its own entry (entry "0" empty)
    until the scalars were split by rank: such files load unchanged."""
    w = keras.Variable(np.zeros(2, np.float32))
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0,
                                      gradient_accumulation_steps=2)
    opt.build([w])
    opt.apply([tf.constant([4.0, 8.0])], [w])
    old = {"0": np.zeros((0,), np.float64)}
    for i, variable in enumerate(opt._variables, start=1):
        old[str(i)] = variable.numpy()
    again = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0,
                                        gradient_accumulation_steps=2)
    again.build([keras.Variable(np.zeros(2, np.float32))])
    again.load_own_variables(old)
    assert int(again.accumulator.micro_step.numpy()) == 1
    np.testing.assert_array_equal(again.accumulator.buffers[0].numpy(), [1.0, 2.0])


@pytest.mark.slow
def test_the_end_of_fit_drops_an_unfinished_window_with_a_warning():
    """10 batches, windows of 4: 2 windows applied, the last 2 batches dropped."""
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, size=(10 * MICRO, FEATURES)).astype(np.float32)
    y = rng.integers(-2, 3, size=(10 * MICRO,)).astype(np.float32)
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(2.0**-4),
                                  gradient_accumulation_steps=STEPS)
    model.compile(optimizer=opt, loss="mse")
    with pytest.warns(RuntimeWarning,
                      match="fit ended 2 micro-step.*window of 4: they are dropped"):
        model.fit(x, y, batch_size=MICRO, shuffle=False, verbose=0)
    assert int(opt.iterations.numpy()) == 2
    assert int(opt.accumulator.micro_step.numpy()) == 0
    assert all(np.all(b.numpy() == 0) for b in opt.accumulator.buffers)
    after_first = model.get_weights()[0].copy()
    # The next fit starts a fresh window: its first 4 batches make one update
    # from exactly these batches (no carried micro-steps).
    with pytest.warns(RuntimeWarning, match="fit ended 2 micro-step"):
        model.fit(x, y, batch_size=MICRO, shuffle=False, verbose=0)
    w = after_first[:, 0].astype(np.float64)
    for k in range(2):
        rows = slice(k * STEPS * MICRO, (k + 1) * STEPS * MICRO)
        residual = x[rows] @ w - y[rows]
        w = w - 2.0**-4 * 2 * x[rows].T @ residual / (STEPS * MICRO)
    np.testing.assert_allclose(model.get_weights()[0][:, 0], w, rtol=1e-6)
    assert int(opt.iterations.numpy()) == 4


@pytest.mark.slow  # two processes
def test_two_workers_resume_from_the_chiefs_file_inside_a_window(tmp_path):
    """Each worker saves after micro-step 1 of window 1; both restore the
    chief's file (every replica's buffer, gathered) and end as one device."""
    results = run_two_workers(WORKER, tmp_path, "none", "1,1")
    for result in results:
        np.testing.assert_array_equal(np.array(result["weights"], np.float32), reference())
        assert result["iterations"] == WINDOWS


@pytest.mark.slow  # two processes
def test_two_workers_resume_from_the_chiefs_tf_checkpoint_inside_a_window(tmp_path):
    """As above through tf.train.Checkpoint (issue 34.4): every worker writes,
    both read the chief's checkpoint, and end as one device."""
    results = run_two_workers(WORKER, tmp_path, "none", "1,1", "checkpoint")
    for result in results:
        np.testing.assert_array_equal(np.array(result["weights"], np.float32), reference())
        assert result["iterations"] == WINDOWS
