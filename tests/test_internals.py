"""tf_mixed._internals: each private Keras/TF access still does its job.

A failure here means Keras or TensorFlow changed under tf_mixed: fix the
named function in tf_mixed/_internals.py.
"""

import keras
import tensorflow as tf

from tf_mixed import _internals


def test_no_automatic_dependency_tracking_keeps_variables_out_of_the_list():
    class Holder(keras.optimizers.SGD):
        @_internals.no_automatic_dependency_tracking
        def make(self):
            self.extra = self.add_variable((), name="extra")
            self.untracked = keras.Variable(0.0, name="untracked")

    opt = Holder()
    before = len(opt.variables)
    opt.make()
    names = [v.name for v in opt.variables]
    # add_variable still registers its variable; the plain attribute does not.
    assert len(opt.variables) == before + 1
    assert "extra" in names and "untracked" not in names


def test_in_xla_context_sees_jit_compile():
    seen = {}

    @tf.function(jit_compile=True)
    def compiled():
        seen["jit"] = _internals.in_xla_context(
            tf.compat.v1.get_default_graph())
        return tf.constant(0)

    @tf.function
    def plain():
        seen["plain"] = _internals.in_xla_context(
            tf.compat.v1.get_default_graph())
        return tf.constant(0)

    compiled()
    plain()
    assert seen == {"jit": True, "plain": False}


def test_strategy_supports_no_merge_call_tells_the_update_path(mirrored):
    # No strategy: no merge_call. MirroredStrategy on CPUs: Keras's
    # optimizers update through merge_call, so ours must nest it the same.
    assert _internals.strategy_supports_no_merge_call() is True
    with mirrored.scope():
        assert _internals.strategy_supports_no_merge_call() is False


def test_optimizer_trainable_variables_lists_the_built_variables():
    a, b = keras.Variable(1.0), keras.Variable([1.0, 2.0])
    opt = keras.optimizers.SGD()
    opt.build([a, b])
    assert [id(v) for v in _internals.optimizer_trainable_variables(opt)] == [
        id(a), id(b)]
