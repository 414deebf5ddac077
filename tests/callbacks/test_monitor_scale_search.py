"""The monitor does not stop a run whose short first epochs are the loss scale's search."""

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
    keras.config.set_dtype_policy("mixed_float16")
    spec = ZOO[name]
    model = spec.ready()
    x, y = spec.data(16)
    opt = tf_mixed.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**24)
    monitor = tf_mixed.LossScaleMonitor(check_setup=False)
    model.compile(optimizer=opt, loss=spec.loss)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[monitor])
    assert history.history["skipped_steps"] == [4.0, 4.0]  # per epoch
    assert monitor.stop_reason is None and not model.stop_training
    assert tf_mixed.loss_scale_state(opt).scale == 2.0**16
