"""tf_mixed reads its variables without NumPy 2's `copy` DeprecationWarning.

`keras.ops.convert_to_numpy(variable)` calls `np.array(variable)`, and NumPy 2
warns (DeprecationWarning) that a Keras or TF variable's ``__array__`` takes no
``copy`` keyword. A user running with ``-W error::DeprecationWarning`` (pytest's
``filterwarnings = error``) saw tf_mixed's own reads raise; they use
``variable.numpy()``, which asks TensorFlow, not NumPy's protocol.
"""

import warnings

import keras
import numpy as np
import pytest

import tf_mixed
from tf_mixed.scaling import replicas


@pytest.fixture
def deprecation_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        yield


def test_keras_itself_warns_on_a_variable_and_in_its_own_save(tmp_path):
    # Canaries. While the first holds, tf_mixed must not hand a variable to
    # convert_to_numpy. The second is Keras's own defect (Dense.save_own_variables
    # converts its kernel so), for any model: the test below lets it through in
    # `model.save` alone; when this canary fails, drop that allowance.
    variable = keras.Variable(np.ones(2, "float32"))
    with pytest.warns(DeprecationWarning, match="copy"):
        keras.ops.convert_to_numpy(variable)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.warns(DeprecationWarning, match="copy"):
        model.save(tmp_path / "plain.keras")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_fit_save_audit_and_state_under_the_error_filter(policy, tmp_path,
                                                         deprecation_is_an_error):
    tf_mixed.enable(policy)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    optimizer = tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.01), initial_scale=2.0**4)
    model.compile(optimizer=optimizer, loss="mse")
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
                        callbacks=[tf_mixed.LossScaleMonitor(check_setup=False)])
    assert np.isfinite(history.history["loss"][0])
    assert history.history["skipped_steps"] == [0.0]
    assert tf_mixed.loss_scale_state(optimizer).skipped_steps == 0
    assert tf_mixed.serving.save_weights(model, tmp_path / "half.npz", dtype="bfloat16") > 0
    assert [row.name for row in tf_mixed.audit(model, batch_size=8).rows][-1] == "dense_1"
    with warnings.catch_warnings():  # Keras's own save warns for any model (canary above)
        warnings.filterwarnings("ignore", "__array__ implementation", DeprecationWarning)
        model.save(tmp_path / "m.keras")
    reloaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(reloaded.layers[0].kernel.numpy(),
                                  model.layers[0].kernel.numpy())


def test_per_replica_reads_of_a_variable_under_the_error_filter(deprecation_is_an_error):
    variable = keras.Variable(np.array([1.0, 2.0], "float32"))
    (value,) = replicas.local_copies(variable)
    np.testing.assert_array_equal(value, [1.0, 2.0])


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_audit_of_an_adapted_normalization_under_the_error_filter(policy,
                                                                  deprecation_is_an_error):
    # NumPy 2 warns on np.array() of a bfloat16 tensor too, not only of a variable.
    tf_mixed.enable(policy)
    normalization = keras.layers.Normalization(dtype=policy)  # half, on purpose
    normalization.adapt(np.array([[1.0e4], [1.0e4 + 1.0]], "float32"))
    model = keras.Sequential([keras.Input((1,)), normalization, keras.layers.Dense(1)])
    # The measurement reads the adapted statistics (variables); a warning turned
    # error inside it dropped the finding without a word.
    found = tf_mixed.audit(model, batch_size=8).by_code("half_resolution")
    assert [f.layer for f in found] == [normalization.name], found


def test_layer_attribution_reads_under_the_error_filter(deprecation_is_an_error):
    from tf_mixed.scaling.attribution import LayerAttribution

    tf_mixed.enable("mixed_float16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d1"),
                              keras.layers.Dense(2, name="d2")])
    model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
    model.optimizer.build(model.trainable_variables)
    attributed = LayerAttribution.attach(model, model.optimizer)
    attributed.mark_healed(["d2"])
    reading = attributed.read()
    assert (reading.counts, reading.healed, attributed.log_size()) == ({}, ("d2",), 0)


class _SquaredGate(keras.layers.Layer):
    """x^2 / (1 + x^2): NaN in float16 once |x| > 256 (inf / inf)."""

    def call(self, x):
        squared = x * x
        return squared / (1.0 + squared)


def test_healing_reads_the_step_counters_under_the_error_filter(deprecation_is_an_error):
    tf_mixed.enable("mixed_float16")
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(4, name="d1", kernel_initializer="ones"),
                              _SquaredGate(name="gate"), keras.layers.Dense(2, name="d2")])
    model.compile(tf_mixed.wrap_optimizer(keras.optimizers.SGD(0.0)), "mse")
    x = np.full((16, 4), 0.1, "float32")
    x[::8] = 100.0  # one row a batch: d1 gives 400, the gate NaN in float16
    heal = tf_mixed.callbacks.Heal(skips=1)
    model.fit(x, np.zeros((16, 2), "float32"), batch_size=8, epochs=1, verbose=0,
              shuffle=False, callbacks=[heal])
    assert heal.healed_layers == ("gate",)
