"""Each private Keras/TF access in tf_mixed._internals fails here when Keras changes."""

import inspect

import keras

from tf_mixed import _internals


class _NoInit(keras.layers.Layer):
    def call(self, x):
        return x


class _WithArgs(keras.layers.Layer):
    def __init__(self, width=3, **kwargs):
        super().__init__(**kwargs)
        self.width = width

    def call(self, x):
        return x


def test_layer_init_hook_sees_every_layer_with_its_dtype_argument():
    seen = []

    def hook(layer, dtype):
        seen.append((layer.name, dtype))

    _internals.add_layer_init_hook(hook)
    try:
        keras.layers.Dense(2, name="a")
        keras.layers.Dense(2, name="b", dtype="bfloat16")
        _NoInit(name="c")
        # The hook runs after Layer.__init__ set the name and the policy.
        assert ("a", None) in seen and ("b", "bfloat16") in seen and ("c", None) in seen
    finally:
        _internals._layer_init_hooks.remove(hook)


def test_layer_init_wrapper_keeps_keras_signature_and_auto_config():
    _internals.add_layer_init_hook(lambda layer, dtype: None)
    init = keras.layers.Layer.__init__
    # Keras 3.15.1's Layer.__init__ is keyword-only; Operation.__new__ reads
    # both getfullargspec and signature of cls.__init__ to build get_config.
    assert inspect.getfullargspec(init).args == ["self"]
    assert inspect.getfullargspec(init).varkw == "kwargs"
    assert "dtype" in inspect.signature(init).parameters
    layer = _NoInit(name="n", trainable=False)
    assert layer.get_config()["trainable"] is False
    assert _NoInit.from_config(layer.get_config()).name == "n"
    assert _WithArgs.from_config(_WithArgs(width=5).get_config()).width == 5
