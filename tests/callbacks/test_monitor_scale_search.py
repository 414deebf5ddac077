"""The monitor does not stop a run whose short first epochs are the loss scale's search."""

import math

import keras
import pytest
from zoo import ZOO

import tf_mixed


@pytest.fixture(autouse=True)
def _float32_policy():
    yield
    keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("name", ["sequential_input", "batchnorm"])
def test_epochs_of_the_scales_first_search_are_not_a_stop(name):
    # 2**24 (the largest allowed) overflows float16 gradients: the scale halves
    # once per skipped step toward a level they fit (2**14 or 2**15 here), so
    # both epochs (4 steps each) are the scale's first search: nothing applied.
    # shuffle=False: the batches must be fixed. fit's unseeded shuffle drew other
    # 4-sample batches each run, and 81 of the 1820 possible ones (sequential_input)
    # fit at 2**17, so the eighth step was applied in ~5% of runs (the seen flake).
    keras.config.set_dtype_policy("mixed_float16")
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(16)
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**24)
    monitor = tf_mixed.LossScaleMonitor(check_setup=False)
    model.compile(optimizer=opt, loss=spec.loss)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False,
                        callbacks=[monitor])
    assert history.history["skipped_steps"] == [4.0, 4.0]  # per epoch
    # No step applied: no training loss (it read 0.0, a perfect loss where nothing trained).
    assert all(math.isnan(v) for v in history.history["loss"]), history.history["loss"]
    assert monitor.stop_reason is None and not model.stop_training
    assert tf_mixed.loss_scale_state(opt).scale == 2.0**16


def test_an_epoch_with_no_applied_step_has_nan_training_metrics_and_real_validation():
    keras.config.set_dtype_policy("mixed_float16")
    spec = ZOO["sequential_input"]
    model = spec.ready()
    x, y = spec.data(16)
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**24)
    model.compile(optimizer=opt, loss=spec.loss, metrics=["mae"])
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0, validation_data=(x, y),
                        callbacks=[tf_mixed.LossScaleMonitor(check_setup=False)])
    logs = {k: v[0] for k, v in history.history.items()}
    assert math.isnan(logs["loss"]) and math.isnan(logs["mae"]), logs
    assert math.isfinite(logs["val_loss"]) and math.isfinite(logs["val_mae"]), logs
    assert logs["skipped_steps"] == 4.0 and logs["loss_scale"] == 2.0**20
