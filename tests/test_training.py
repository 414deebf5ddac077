"""tf_mixed.training: GradientTape helpers on one device, and the timer."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from repo_paths import ROOT

import tf_mixed
from tf_mixed import training
from tf_mixed.scaling.optimizer import LossScaleOptimizer

# Many tests here feed the optimizer hand-made gradients or skip steps on purpose;
# the misuse and skipped-step warnings that draws are expected there (the tests of
# those warnings catch them with pytest.warns, which these filters do not touch).
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:.*never went through scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning"),
    pytest.mark.filterwarnings(
        "ignore:A step was skipped:tf_mixed._internal.warning.MixedPrecisionWarning"),
]

INF = float("inf")


def _linear():
    return keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
    ])


@pytest.mark.slow
@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf.function"])
def test_apply_scaled_gradients_applies_then_skips(use_function):
    model = _linear()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.5), initial_scale=2.0**10)

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))  # d loss / d kernel = x
        return training.apply_scaled_gradients(
            tape, loss, model.trainable_variables, opt)

    step = tf.function(step) if use_function else step
    assert bool(step(tf.constant([[1.0, 2.0]])))
    np.testing.assert_array_equal(model.get_weights()[0].ravel(), [0.5, 0.0])
    assert not bool(step(tf.constant([[INF, 2.0]])))
    np.testing.assert_array_equal(model.get_weights()[0].ravel(), [0.5, 0.0])
    assert float(opt.loss_scale.numpy()) == 2.0**9


def test_clip_norm_clips_the_unscaled_gradient():
    model = _linear()
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.constant([[3.0, 4.0]])))  # |grad| = 5
    training.apply_scaled_gradients(tape, loss, model.trainable_variables,
                                    opt, clip_norm=0.5)
    # Clipped to norm 0.5: [0.3, 0.4].
    np.testing.assert_allclose(model.get_weights()[0].ravel(), [0.7, 0.6],
                               rtol=0, atol=1e-7)


def test_clip_norm_keeps_overflow_detectable():
    model = _linear()
    opt = LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=64.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.constant([[INF, 4.0]])))
    applied = training.apply_scaled_gradients(
        tape, loss, model.trainable_variables, opt, clip_norm=1.0)
    assert not bool(applied)
    np.testing.assert_array_equal(model.get_weights()[0].ravel(), [1.0, 1.0])


@pytest.mark.slow
@pytest.mark.parametrize("clip_norm", [0, -1.0, INF, "1", True, np.bool_(True)])
def test_bad_clip_norm_is_refused(clip_norm):
    model = _linear()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones((1, 2))))
    with pytest.raises(ValueError, match="clip_norm"):
        training.apply_scaled_gradients(
            tape, loss, model.trainable_variables,
            LossScaleOptimizer(keras.optimizers.SGD()), clip_norm=clip_norm)


@pytest.mark.slow
@pytest.mark.parametrize("clip_norm", [True, False, np.bool_(True)])
def test_clip_norm_refuses_a_bool_as_a_type_error(clip_norm):
    # Issue 27: clip_norm=True was taken as 1.0.
    with pytest.raises(TypeError, match=r"apply_scaled_gradients\(\) argument `clip_norm` "
                                        r"must be a positive finite number or None\. "
                                        r"Received: clip_norm=(np\.)?(True|False)_? \(of type"):
        training.apply_scaled_gradients(
            tf.GradientTape(), tf.constant(1.0), [], keras.optimizers.SGD(),
            clip_norm=clip_norm)
    with pytest.raises(TypeError, match=r"make_train_step\(\) argument `clip_norm`"):
        training.make_train_step(_linear(), keras.losses.MeanSquaredError(),
                                 keras.optimizers.SGD(), clip_norm=clip_norm)


def test_make_train_step_refuses_the_loss_and_optimizer_swapped_by_name():
    # model.compile's order is (optimizer, loss); make_train_step(model, opt, loss)
    # failed inside the first trace with "'SGD' object is not callable".
    with pytest.raises(TypeError, match=r"make_train_step\(\) argument `optimizer` must be a "
                       r"Keras optimizer and `loss_fn` a loss\. Received: "
                       r"loss_fn=SGD, optimizer=MeanSquaredError\. Fix: pass them in the "
                       r"order \(model, loss_fn, optimizer\)"):
        training.make_train_step(_linear(), keras.optimizers.SGD(),
                                 keras.losses.MeanSquaredError())
    with pytest.raises(TypeError, match=r"Received: loss_fn=str, optimizer=str\. "
                       r"Fix: pass a Keras optimizer"):
        training.make_train_step(_linear(), "mse", "adam")


def test_plain_optimizer_always_applies():
    model = _linear()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.constant([[1.0, 1.0]])))
    applied = training.apply_scaled_gradients(
        tape, loss, model.trainable_variables, keras.optimizers.SGD(0.5))
    assert bool(applied)
    np.testing.assert_array_equal(model.get_weights()[0].ravel(), [0.5, 0.5])


def test_current_scale_reads_every_kind_of_optimizer():
    var = keras.Variable(0.0)
    ours = LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=32.0)
    assert float(training.current_scale(ours)) == 32.0
    ours.build([var])
    ours.loss_scale.assign(16.0)
    assert float(training.current_scale(ours)) == 16.0
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(),
                                                 initial_scale=8.0)
    assert float(training.current_scale(theirs)) == 8.0  # before build
    theirs.build([var])
    theirs.dynamic_scale.assign(4.0)
    assert float(training.current_scale(theirs)) == 4.0
    assert float(training.current_scale(keras.optimizers.SGD())) == 1.0
    assert float(training.current_scale(
        keras.optimizers.SGD(loss_scale_factor=4.0))) == 4.0


def test_loss_scale_state_reads_every_kind_of_optimizer():
    import tf_mixed

    ours = LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=32.0)
    assert tf_mixed.loss_scale_state(ours).scale == 32.0
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(),
                                                 initial_scale=8.0)
    theirs.build([keras.Variable(0.0)])
    theirs.step_counter.assign(3)
    state = tf_mixed.loss_scale_state(theirs)
    assert (state.scale, state.good_steps, state.skipped_steps) == (8.0, 3, None)
    plain = tf_mixed.loss_scale_state(keras.optimizers.SGD(loss_scale_factor=4.0))
    assert (plain.scale, plain.skipped_steps) == (4.0, 0)
    with pytest.raises(TypeError, match="optimizer="):
        tf_mixed.loss_scale_state("adam")


def test_make_train_step_single_device():
    model = _linear()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.25), initial_scale=4.0,
                             growth_interval=1)
    step = training.make_train_step(
        model, lambda y, p: tf.reduce_mean(tf.square(p - y)), opt)
    result = step(tf.constant([[1.0, 1.0]]), tf.constant([[0.0]]))
    # pred 2, loss 4, d/dk = 2 * 2 * x = [4, 4]; lr 1/4.
    assert float(result["loss"]) == 4.0 and bool(result["applied"])
    np.testing.assert_array_equal(model.get_weights()[0].ravel(), [0.0, 0.0])
    assert float(opt.loss_scale.numpy()) == 8.0


# ------------------------------------- mixed_float16 converges like float32

# Stated tolerance: after 48 SGD steps the float16 run's final loss is within
# 4 float16 ulps of float32's. The loss falls from 1.386 (chance) to about
# 0.370, where a float16 ulp is 2**-12 (2.4e-4): mixed_float16 keeps float32
# weights and a float32 head, so the runs differ only by the rounding of
# activations and logits to float16, which must stay at the size of one
# rounding of the loss itself, not grow over the steps (measured difference:
# 6e-5 on TF 2.21 / Keras 3.15.1, in both loops). The float16 run also gets
# one poisoned batch (inputs of 1e5, beyond float16's 65504) that overflows
# and must be skipped: had it been applied, the weights would hold NaN.
LOSS_TOLERANCE = 4 * 2.0**-12
POISON_AT = 10  # the float16 run's poisoned batch comes after this many


def _train_final_loss(policy, loop):
    import tf_mixed

    tf_mixed.enable(policy, quiet=True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((384, 16)).astype("float32")
    y = (x @ rng.standard_normal((16, 4))).argmax(axis=1).astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(4),
        tf_mixed.OutputActivation("softmax"),
    ])
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.2))
    half = policy == "mixed_float16"
    # float32: a pass-through wrapper (scale 1, fixed), same loop.
    assert isinstance(opt, LossScaleOptimizer)
    assert opt.dynamic == half
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    # 8 epochs of 6 batches, in order, as one stream of 48 batches.
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).repeat(8)
    if half:
        poison = tf.data.Dataset.from_tensors(
            (tf.fill((64, 16), 1e5), tf.zeros((64,), tf.int32)))
        batches = (batches.take(POISON_AT).concatenate(poison)
                   .concatenate(batches.skip(POISON_AT)))
    if loop == "fit":
        model.compile(optimizer=opt, loss=loss_fn)
        model.fit(batches, epochs=1, shuffle=False, verbose=0)
    else:
        step = training.make_train_step(model, loss_fn, opt)
        applied = [bool(step(xb, yb)["applied"]) for xb, yb in batches]
        expected = [True] * 48
        if half:
            expected.insert(POISON_AT, False)
        assert applied == expected
    if half:  # the one overflow was skipped and halved the scale
        state = opt.loss_scale_state()
        assert state.skipped_steps == 1
        assert state.scale == opt.initial_scale / 2
    initial_like = float(loss_fn(y, np.full((len(y), 4), 0.25, "float32")))
    final = float(loss_fn(y, model(x)))
    tf_mixed.disable()
    return initial_like, final


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_mixed_float16_reaches_the_float32_loss(loop):
    chance, loss32 = _train_final_loss("float32", loop)
    _, loss16 = _train_final_loss("mixed_float16", loop)
    assert loss32 < 0.5 * chance  # it learned something
    assert abs(loss16 - loss32) < LOSS_TOLERANCE, (loss16, loss32)


# ------------------------------------- shared_mirrored_strategy input


@pytest.mark.slow
@pytest.mark.parametrize("devices", ["CPU:0", ["/cpu:0"], ("CPU:0",)])
def test_shared_mirrored_strategy_takes_one_device_string(devices, monkeypatch):
    # A fake strategy class: a real second MirroredStrategy in this process
    # would collide with the shared one (see shared_mirrored_strategy).
    from tf_mixed.distribute import mirrored

    made = []
    monkeypatch.setattr(mirrored, "_MIRRORED_STRATEGIES", {})
    monkeypatch.setattr(tf.distribute, "MirroredStrategy",
                        lambda devices: made.append(devices) or object())
    first = training.shared_mirrored_strategy("CPU:0")
    assert training.shared_mirrored_strategy(devices) is first
    assert made == [["CPU:0"]]
    assert list(mirrored._MIRRORED_STRATEGIES) == [("CPU:0",)]


# ------------------------------------------- issue 34.6: the README's loop
# Run as written on a BatchNormalization model whose first step overflows: the
# routine first skip never ends the run, and the skipped step leaves the
# moving statistics as they were.

README = ROOT / "README.md"


def _loop_block() -> str:
    text = README.read_text()
    section = text[text.index("## With a `GradientTape` loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_readme_loop_survives_a_first_step_that_overflows():
    tf_mixed.enable("mixed_float16")
    namespace: dict = {}
    exec(compile(_loop_block(), str(README), "exec"), namespace)  # as written: 3 steps
    model, opt, train_step = namespace["model"], namespace["opt"], namespace["train_step"]
    bn = next(layer for layer in model.layers
              if isinstance(layer, keras.layers.BatchNormalization))
    before = [v.numpy().copy() for v in bn.non_trainable_variables]
    skipped_before = opt.loss_scale_state().skipped_steps
    # Targets of 1e4: loss ~1e8, times 2**15 overflows float16 gradients.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    y = np.full((32, 1), 1e4, "float32")
    loss, applied = train_step(tf.constant(x), tf.constant(y))
    assert not bool(applied)
    assert opt.loss_scale_state().skipped_steps == skipped_before + 1
    for kept, now in zip(before, bn.non_trainable_variables):
        np.testing.assert_array_equal(now.numpy(), kept)
    results = [bool(train_step(tf.constant(x), tf.constant(y))[1]) for _ in range(30)]
    assert any(results)  # the scale backed off until a step applied


@pytest.mark.slow
def test_without_the_readme_line_the_first_skip_names_it():
    """The line matters: the same loop without it stops at the first skip with
    an error naming ``track_forward_state`` (never silent)."""
    tf_mixed.enable("mixed_float16")
    block = _loop_block()
    block = "\n".join(line for line in block[:block.index("x, y = ")].splitlines()
                      if "track_forward_state" not in line)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    y = np.full((32, 1), 1e4, "float32")
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    try:
        namespace["train_step"](tf.constant(x), tf.constant(y))
    except Exception as error:  # noqa: BLE001 - TF wraps it in its own type
        assert "track_forward_state" in str(error)
    else:
        raise AssertionError("a skipped step with untracked BatchNorm state passed silently")


@pytest.mark.slow
def test_make_train_step_heals_and_retraces_itself():
    from tf_mixed.scaling.healing import HealingLimit, HealRule

    class Gate(keras.layers.Layer):
        def call(self, x):
            squared = x * x
            return squared / (1.0 + squared)

    tf_mixed.enable("mixed_float16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, kernel_initializer="ones"),
                              Gate(name="gate"), keras.layers.Dense(2)])
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0))
    step = tf_mixed.training.make_train_step(model, "mse", opt, heal=True)
    x = np.full((8, 4), 100.0, "float32")
    applied = [bool(step(x, np.zeros((8, 2), "float32"))["applied"]) for _ in range(7)]
    assert applied == [False] * 5 + [True, True]         # the default: 5 skips
    assert model.get_layer("gate").compute_dtype == "float32"
    out = step(x, np.zeros((8, 2), "float32"))
    assert float(out["healed_layers"]) == 1.0
    with pytest.raises(ValueError, match="heal"):
        tf_mixed.training.make_train_step(model, "mse", opt, heal="yes")
    # Past the limit the step raises, naming the evidence: healing sq1 sends
    # its float32 output into sq2's float16 input, and 1 of 4 layers may move.
    class Square(keras.layers.Layer):
        def call(self, x):
            return x * x

    model2 = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, kernel_initializer="ones"),
                               Square(name="sq1"), Square(name="sq2"), keras.layers.Dense(2)])
    step2 = tf_mixed.training.make_train_step(
        model2, "mse", tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)),
        heal=HealRule(skips=1, max_fraction=0.25))
    step2(x, np.zeros((8, 2), "float32"))
    assert model2.get_layer("sq1").compute_dtype == "float32"
    with pytest.raises(HealingLimit, match="'sq2': 1 skipped steps"):
        step2(x, np.zeros((8, 2), "float32"))


def test_heal_layers_is_the_hand_written_loops_call():
    tf_mixed.enable("mixed_float16")
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d")], name="inner")
    model = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(2, name="out")])
    changed = tf_mixed.training.heal_layers(model, ["inner/d"])
    assert [layer.name for layer in changed] == ["d"]
    assert model.get_layer("out").compute_dtype == "float16"
    with pytest.raises(ValueError, match="Valid names: inner/d, out"):
        tf_mixed.training.heal_layers(model, ["d"])


def test_a_loops_tf_function_does_not_convert_the_optimizers_pipeline(monkeypatch):
    # `LossScaleOptimizer.apply` is marked do_not_convert (its pipeline traced
    # as `fit` traces it): code below it sees no AutoGraph, so a Python `if`
    # on a tensor there raises, where converted code would have made a tf.cond.
    from tf_mixed.scaling import pipeline

    real, seen = pipeline.step, []

    def step(*args, **kwargs):
        try:
            if tf.constant(True):
                seen.append("converted")
        except TypeError:  # OperatorNotAllowedInGraphError: a Tensor as a Python bool
            seen.append("not converted")
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "step", step)
    model = _linear()
    opt = LossScaleOptimizer(keras.optimizers.SGD(0.25), initial_scale=4.0)
    train = training.make_train_step(model, lambda y, p: tf.reduce_mean(tf.square(p - y)), opt)
    assert bool(train(tf.constant([[1.0, 1.0]]), tf.constant([[0.0]]))["applied"])
    assert seen and set(seen) == {"not converted"}
