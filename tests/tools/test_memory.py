"""tf_mixed.tools.memory_report: bytes per parameter from the real objects."""

import keras
import numpy as np
import pytest
from zoo import ZOO, reloaded_model

import tf_mixed
from tf_mixed.scaling import compensated

# Adam's scalars: iteration (int64) and learning_rate (float32).
ADAM_SCALARS = 8 + 4


def _dense_model():
    return keras.Sequential([keras.Input((7,)), keras.layers.Dense(5)])  # 40 params


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy, method, state_dtype, expected",
    [
        # (weights, gradients, state without scalars, compensation) per parameter
        ("float32", None, None, (4, 4, 8, 0)),
        ("mixed_bfloat16", None, None, (4, 4, 8, 0)),
        ("bfloat16", None, None, (2, 2, 4, 0)),
        ("bfloat16", "kahan", "float32", (2, 2, 8, 2)),
        ("bfloat16", "kahan", "bfloat16", (2, 2, 4, 2)),
        ("bfloat16", "stochastic", "bfloat16", (2, 2, 4, 0)),
        ("bfloat16", "stochastic", "float32", (2, 2, 8, 0)),
    ],
)
def test_bytes_per_parameter_under_each_policy(policy, method, state_dtype, expected):
    tf_mixed.enable(policy, quiet=True)
    model = _dense_model()
    opt = keras.optimizers.Adam()
    if method is not None:
        compensated.compensate(opt, method, state_dtype=state_dtype)
    opt.build(model.trainable_variables)
    report = tf_mixed.tools.memory_report(model, opt)
    n = 40
    weights, grads, state, comp = expected
    assert report == tf_mixed.tools.memory.MemoryReport(
        parameters=n, weights=weights * n, gradients=grads * n,
        optimizer_state=state * n + ADAM_SCALARS, compensation=comp * n,
        accumulation=0)
    per = report.per_parameter()
    assert per["weights"] == weights and per["compensation"] == comp
    assert per["total"] == report.total / n
    assert "40 parameters" in str(report)


def test_a_loss_scale_wrapper_counts_its_inner_optimizer():
    model = _dense_model()
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(momentum=0.9), force=True)
    opt.build(model.trainable_variables)
    report = tf_mixed.tools.memory_report(model, opt)
    # Momentum (4/param), SGD's and the wrapper's iteration and learning
    # rate, and the wrapper's loss-scale state (five int64s, one float32).
    assert report.optimizer_state == 4 * 40 + 2 * ADAM_SCALARS + 5 * 8 + 4


def test_accumulation_buffers_are_float32_and_counted_apart():
    tf_mixed.enable("bfloat16", quiet=True)
    model = _dense_model()
    opt = tf_mixed.wrap_optimizer(keras.optimizers.SGD(), gradient_accumulation_steps=4,
                                  compensation="stochastic")
    opt.build(model.trainable_variables)
    report = tf_mixed.tools.memory_report(model, opt)
    assert (report.weights, report.accumulation, report.compensation) == (80, 160, 0)
    # SGD's and the wrapper's scalars, the loss-scale state, the micro-step counter.
    assert report.optimizer_state == 2 * ADAM_SCALARS + 5 * 8 + 4 + 8


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_model_in_pure_bfloat16(name):
    spec = ZOO[name]
    tf_mixed.enable("bfloat16", quiet=True)
    model = spec.ready()
    opt = tf_mixed.wrap_optimizer(keras.optimizers.Adam(1e-3))  # Kahan by default
    model.compile(optimizer=opt, loss=spec.loss)
    x, y = spec.data(8)
    assert np.all(np.isfinite(model.train_on_batch(x, y)))
    report = tf_mixed.tools.memory_report(model, opt)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert report.parameters == params
    assert report.weights == report.gradients == 2 * params
    assert report.compensation == 2 * params


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
def test_every_zoo_model_reloaded(name):
    model = reloaded_model(name)
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)
    report = tf_mixed.tools.memory_report(model, opt)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert (report.weights, report.optimizer_state) == (4 * params, 8 * params + ADAM_SCALARS)


def test_bad_input_is_named():
    opt = keras.optimizers.Adam()
    with pytest.raises(ValueError, match="built optimizer"):
        tf_mixed.tools.memory_report(_dense_model(), opt)
    with pytest.raises(ValueError, match="no trainable weights"):
        tf_mixed.tools.memory_report(keras.Sequential([keras.layers.Dense(2)]), opt)
    with pytest.raises(TypeError, match="model='model'"):
        tf_mixed.tools.memory_report("model", opt)
    with pytest.raises(TypeError, match="optimizer='adam'"):
        tf_mixed.tools.memory_report(_dense_model(), "adam")
