"""tf_mixed._internal.shims: each private Keras/TF name still exists and behaves as used.

Every test here names the private API it guards; when one fails after a
Keras or TensorFlow upgrade, the shim of that name in tf_mixed/_internal/shims.py
needs a new way (and pyproject.toml's Keras range a new bound).
"""

import functools
import inspect
import re
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from repo_paths import ROOT

from tf_mixed._internal import shims as _internals


def _declared_keras_range() -> SpecifierSet:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.findall(r'^\s*"keras([<>=!~,.\d\s]+)"', text, flags=re.M)
    assert len(found) == 1, "pyproject.toml must declare keras exactly once"
    return SpecifierSet(found[0].replace(" ", ""))


def test_installed_keras_is_inside_the_declared_range():
    declared = _declared_keras_range()
    assert Version(keras.__version__) in declared, (keras.__version__, declared)
    # A bounded range: an upper bound, so an untested Keras is not installed.
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in declared)


# --------------------------------------------------------------------- Keras


def _shared_dense_model():
    inputs = keras.Input((4,), name="x")
    dense = keras.layers.Dense(4, name="shared")
    first = dense(inputs)
    second = dense(first)
    return keras.Model(inputs, [first, second]), dense, inputs, first, second


def test_inbound_nodes_give_every_call():  # Layer._inbound_nodes, Node.*_tensors
    _, dense, inputs, first, second = _shared_dense_model()
    assert _internals.call_outputs(dense) == [first, second]
    assert _internals.call_inputs(dense) == [inputs, first]
    assert _internals.call_outputs(keras.layers.Dense(2)) == []  # never called


def test_first_call_arguments_keep_the_call_structure():  # Node.arguments
    query = keras.Input((3, 4))
    value = keras.Input((5, 4))
    attention = keras.layers.MultiHeadAttention(num_heads=1, key_dim=2)
    attention(query, value, use_causal_mask=False)
    args, kwargs = _internals.first_call_arguments(attention)
    assert args[0] is query and args[1] is value
    assert kwargs == {"use_causal_mask": False}
    assert _internals.first_call_arguments(keras.layers.Dense(2)) == ((), {})


def test_keras_history_names_the_producer():  # KerasTensor._keras_history
    model, dense, inputs, first, second = _shared_dense_model()
    assert _internals.keras_history(second) == (dense, 1, 0)
    assert _internals.keras_history(first).operation is dense
    assert _internals.keras_history(inputs).operation.name == "x"
    assert _internals.keras_history(keras.KerasTensor((2, 3))) is None
    # A nested model is the producer of its outputs, with their index.
    outer_in = keras.Input((4,))
    outs = model(outer_in)
    history = _internals.keras_history(outs[1])
    assert history.operation is model and history.tensor_index == 1


def test_disable_input_casting():  # Layer._convert_input_args
    class Dtypes(keras.layers.Layer):
        def call(self, a, b):
            return tf.constant(f"{a.dtype.name},{b.dtype.name}")

        def compute_output_spec(self, a, b):
            return keras.KerasTensor((), dtype="string")

    half = tf.ones((2,), tf.float16)
    layer = Dtypes(dtype="float32")
    assert layer._convert_input_args is True  # Keras's default, relied on
    # Keras casts the floating arguments to the compute dtype ...
    assert layer(half, half).numpy().decode() == "float32,float32"
    # ... and the shim turns that off: call() sees its inputs as given.
    _internals.disable_input_casting(layer)
    assert layer(half, half).numpy().decode() == "float16,float16"


def test_serialize_as_keras_class():  # api_export.REGISTERED_OBJS_TO_NAMES
    @keras.saving.register_keras_serializable(package="tf_mixed_test")
    class LikeActivation(keras.layers.Activation):
        pass

    assert keras.saving.serialize_keras_object(LikeActivation("relu"))["class_name"] == (
        "LikeActivation")
    _internals.serialize_as_keras_class(LikeActivation, "keras.layers.Activation")
    config = keras.saving.serialize_keras_object(LikeActivation("relu", dtype="float32"))
    assert (config["module"], config["class_name"], config["registered_name"]) == (
        "keras.layers", "Activation", None)
    back = keras.saving.deserialize_keras_object(config)
    assert type(back) is keras.layers.Activation and back.dtype_policy.name == "float32"
    # The name still resolves to Keras's own class.
    assert keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(keras.layers.Activation("relu"))).__class__ is (
        keras.layers.Activation)


def test_resolve_keras_name():  # api_export.REGISTERED_NAMES_TO_OBJS
    from keras.src import api_export

    class Loader:
        @classmethod
        def from_config(cls, config):
            return ("loaded", config)

    config = {"module": "keras.layers", "class_name": "TfMixedShimProbe", "config": {"a": 1},
              "registered_name": None}
    with pytest.raises(ValueError, match="TfMixedShimProbe"):  # Keras alone: unknown
        keras.saving.deserialize_keras_object(dict(config))
    _internals.resolve_keras_name("keras.layers.TfMixedShimProbe", Loader)
    try:
        assert keras.saving.deserialize_keras_object(dict(config)) == ("loaded", {"a": 1})
    finally:
        del api_export.REGISTERED_NAMES_TO_OBJS["keras.layers.TfMixedShimProbe"]
    # What it is for: Keras's wrapper's name, read by tf_mixed's loader; the public
    # attribute and the class -> name direction stay Keras's.
    loader = api_export.REGISTERED_NAMES_TO_OBJS["keras.optimizers.LossScaleOptimizer"]
    assert loader.__name__ == "KerasLossScaleOptimizerName"
    assert keras.optimizers.LossScaleOptimizer.__module__.startswith("keras.")
    assert api_export.get_name_from_symbol(keras.optimizers.LossScaleOptimizer) == (
        "keras.optimizers.LossScaleOptimizer")


def test_optimizer_trainable_variables():  # Optimizer._trainable_variables
    variables = [keras.Variable(np.ones(2)), keras.Variable(np.ones(3))]
    optimizer = keras.optimizers.SGD(0.5)
    optimizer.build(variables)
    assert _internals.optimizer_trainable_variables(optimizer) == variables
    # What it is for: apply() without variables updates these.
    optimizer.apply([tf.ones(2), tf.ones(3)])
    np.testing.assert_array_equal(variables[0].numpy(), [0.5, 0.5])


def test_optimizer_own_variables_are_what_it_added_in_order():  # Optimizer._variables
    inner = keras.optimizers.Adam(0.5)
    wrapper = keras.optimizers.LossScaleOptimizer(inner)
    variables = [keras.Variable(np.ones(2))]
    wrapper.build(variables)
    own = _internals.optimizer_own_variables(wrapper)
    # Keras's wrapper: its own iterations and learning rate, then step_counter, dynamic_scale;
    # `variables` also lists the inner optimizer's slots, which are not its own.
    assert [v.name for v in own][-2:] == ["step_counter", "dynamic_scale"]
    assert len(wrapper.variables) > len(own)
    assert all(any(v is w for w in wrapper.variables) for v in own)
    assert _internals.optimizer_own_variables(wrapper) is not own  # a copy


def test_a_rider_is_kept_on_the_object_and_saved_nowhere(tmp_path):
    optimizer = keras.optimizers.Adam(0.5)
    variables = [keras.Variable(np.ones(2))]
    optimizer.build(variables)
    before = set(_internals.trackable_children(optimizer))
    count = len(optimizer.variables)
    made = []
    said = _internals.rider(optimizer, "said", lambda: made.append(1) or set())
    said.add("x")
    assert _internals.rider(optimizer, "said", set) == {"x"} and made == [1]  # made once
    # Neither Keras's tracker nor TensorFlow's sees it: no checkpoint child, no variable.
    assert set(_internals.trackable_children(optimizer)) == before
    assert len(optimizer.variables) == count
    path = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "ckpt"))
    fresh = keras.optimizers.Adam(0.5)
    fresh.build([keras.Variable(np.ones(2))])
    tf.train.Checkpoint(optimizer=fresh).read(path).assert_consumed()
    assert "_tf_mixed_said" not in fresh.__dict__
    assert keras.optimizers.Adam.from_config(optimizer.get_config()).learning_rate == 0.5


def test_no_automatic_dependency_tracking():  # keras.src.utils.tracking
    from keras.src.utils import tracking  # the import itself is what moves

    assert callable(tracking.no_automatic_dependency_tracking)

    class Holder(keras.layers.Layer):
        def tracked(self):
            self.a = [keras.Variable(1.0)]

        @_internals.no_automatic_dependency_tracking
        def untracked(self):
            self.b = [keras.Variable(2.0)]

    holder = Holder()
    holder.tracked()
    holder.untracked()
    # Keras tracks the variable set normally, not the one set under the shim.
    assert [float(v.numpy()) for v in holder.weights] == [1.0]


# ------------------------------------------------------------------ TensorFlow


def test_in_xla_context():  # control_flow_util.GraphOrParentsInXlaContext
    from tensorflow.python.ops import control_flow_util  # noqa: F401 moved?

    assert not isinstance(_internals._xla_probe(), Exception)

    def probe():
        return tf.constant(
            _internals.in_xla_context(tf.compat.v1.get_default_graph()))

    assert bool(tf.function(probe, jit_compile=True)())
    assert not bool(tf.function(probe)())


def test_in_xla_context_warns_when_tf_moves_it(monkeypatch):
    monkeypatch.setattr(_internals, "_xla_probe",
                        lambda: ImportError("no control_flow_util"))
    with pytest.warns(RuntimeWarning, match="no control_flow_util"):
        assert _internals.in_xla_context(tf.Graph()) is False


def test_strategy_supports_no_merge_call(mirrored):
    # tf.__internal__.distribute.strategy_supports_no_merge_call
    assert _internals.strategy_supports_no_merge_call() is True  # default
    with mirrored.scope():
        assert _internals.strategy_supports_no_merge_call() is False


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


def _locals(strategy, value):
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


# ---------------------------------------------------- apply_reduced_gradients


def _per_replica_step(strategy, *applies):
    """Applies gradient 1 + replica_id with each of ``applies`` in turn."""
    with strategy.scope():
        var = keras.Variable([1.0])
        opt = keras.optimizers.SGD(1.0)
        opt.build([var])

    def replica_fn(apply):
        r = tf.cast(
            tf.distribute.get_replica_context().replica_id_in_sync_group,
            tf.float32)
        apply(opt, [tf.fill([1], 1.0 + r)], [var])

    seen = []
    for apply in applies:
        tf.function(lambda apply=apply: strategy.run(replica_fn, args=(apply,)))()
        seen.append([float(c[0]) for c in _locals(strategy, var.value)])
    return opt, seen


def _keras_apply(opt, grads, variables):
    opt.apply(grads, variables)


def test_keras_sums_gradients_in_all_reduce_sum_gradients(mirrored):
    # Keras 3.15.1: TFOptimizer._backend_update_step -> _all_reduce_sum_gradients.
    assert hasattr(keras.optimizers.SGD(), "_all_reduce_sum_gradients")
    _, [copies] = _per_replica_step(mirrored, _keras_apply)
    assert copies == [-2.0, -2.0]  # 1 - (1 + 2)


@pytest.mark.slow
def test_apply_reduced_gradients_skips_the_inner_all_reduce(mirrored):
    # Each replica applies its own (deliberately different) gradient: proof
    # that no all-reduce ran. If Keras moves its all-reduce out of
    # `_all_reduce_sum_gradients`, the copies are summed again and agree.
    opt, [shim, after] = _per_replica_step(
        mirrored, _internals.apply_reduced_gradients, _keras_apply)
    assert shim == [0.0, -1.0]
    # Outside the call the same optimizer sums again: both copies drop by 3.
    assert after == [-3.0, -4.0]
    assert int(opt.iterations.numpy()) == 2
    assert getattr(opt, _internals._SKIP_DEPTH) == 0


def test_apply_reduced_gradients_resets_its_depth_on_error():
    opt = keras.optimizers.SGD(1.0)
    var = keras.Variable([1.0])
    opt.build([var])
    with pytest.raises(ValueError):
        _internals.apply_reduced_gradients(opt, [None], [var])
    assert getattr(opt, _internals._SKIP_DEPTH) == 0


# ---------------------------------------------------------- reduces_with_nccl


@pytest.mark.slow
def test_cpu_mirrored_strategy_does_not_use_nccl(mirrored):
    from tensorflow.python.distribute import cross_device_ops as cdo

    ops = mirrored.extended._cross_device_ops
    assert isinstance(ops, cdo.CollectiveAllReduce)
    assert ops._options.implementation.name == "RING"
    assert not _internals.reduces_with_nccl(mirrored)


def test_nccl_implementations_are_recognised():
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cdo

    def fake(ops, devices):
        extended = types.SimpleNamespace(_cross_device_ops=ops,
                                         _devices=devices)
        return types.SimpleNamespace(extended=extended)

    kinds = collective_util.CommunicationImplementation

    def collective(kind):
        ops = object.__new__(cdo.CollectiveAllReduce)
        ops._options = collective_util.Options(implementation=kind)
        return ops

    gpus = ("/job:localhost/replica:0/task:0/device:GPU:0",
            "/job:localhost/replica:0/task:0/device:GPU:1")
    cpus = ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert _internals.reduces_with_nccl(fake(cdo.NcclAllReduce(), gpus))
    assert _internals.reduces_with_nccl(fake(collective(kinds.NCCL), gpus))
    assert _internals.reduces_with_nccl(fake(collective(kinds.AUTO), gpus))
    assert not _internals.reduces_with_nccl(fake(collective(kinds.AUTO), cpus))
    assert not _internals.reduces_with_nccl(fake(collective(kinds.RING), gpus))
    assert not _internals.reduces_with_nccl(
        fake(cdo.ReductionToOneDevice(), gpus))


# ------------------------------------------------------- census (the traced step)


def test_keras_train_step_is_keras_own_one_step_tf_function():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    step, traced = _internals.keras_train_step(model)
    assert traced and isinstance(step, tf.types.experimental.PolymorphicFunction)
    assert step.__name__ == "one_step_on_data"
    assert model.train_function is None  # the model's own is not replaced
    logs = step((tf.ones((4, 3)), tf.zeros((4, 2))))
    assert set(logs) == {"loss"}
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    step, traced = _internals.keras_train_step(model)
    assert not traced and callable(step)


def test_fit_batch_converts_like_fit():
    x64 = np.ones((10, 3), "float64")
    batch = _internals.fit_batch(x64, np.zeros((10,), "int32"), 4)
    assert batch[0].dtype == tf.float32 and batch[0].shape == (4, 3)
    dataset = tf.data.Dataset.from_tensor_slices((x64, np.zeros(10))).batch(5)
    assert _internals.fit_batch(dataset, None, None)[0].dtype == tf.float64


def test_recording_layer_scopes_records_and_removes_its_wrapper():
    layer = keras.layers.Dense(2, name="dense")
    other = keras.layers.Dense(2, name="dense_1")
    model = keras.Sequential([keras.Input((3,)), layer, other], name="seq")

    @tf.function
    def f(x):
        return model(x)

    with _internals.recording_layer_scopes([("seq", model), ("dense", layer),
                                            ("dense_1", other)]) as scopes:
        f.get_concrete_function(tf.TensorSpec((1, 3)))
    assert sorted(scopes.values()) == ["dense", "dense_1", "seq"]
    assert "call" not in vars(layer) and "call" not in vars(model)
    assert model(np.ones((1, 3))).shape == (1, 2)


def test_function_graphs_of_a_cond():
    @tf.function
    def f(x):
        return tf.cond(x > 0, lambda: x * 2.0, lambda: x - 1.0)

    graph = f.get_concrete_function(tf.TensorSpec(())).graph
    cond, = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    found = dict(_internals.function_graphs(cond))
    assert set(found) == {"then_branch", "else_branch"}
    assert "Mul" in {op.type for op in found["then_branch"].get_operations()}

# ---------------------------------------------------------- Keras float8


def _float8_dense():
    import keras

    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(4, use_bias=False, name="f8")(inputs)
    model = keras.Model(inputs, outputs)
    model.get_layer("f8").quantize("float8")
    return model, model.get_layer("f8")


def test_float8_layers_keep_a_scale_and_history_per_tensor():
    _, layer = _float8_dense()
    for kind in _internals.FLOAT8_KINDS:
        scale, history = _internals.float8_variables(layer, kind)
        assert scale.path.endswith(f"{kind}_scale") and scale.shape == ()
        assert history.path.endswith(f"{kind}_amax_history")
        assert scale.overwrite_with_gradient and history.overwrite_with_gradient
        assert scale.aggregation == history.aggregation == "none"


def test_float8_history_gradient_holds_the_newest_amax_at_index_0():
    import numpy as np
    import tensorflow as tf

    model, layer = _float8_dense()
    _, history = _internals.float8_variables(layer, "inputs")
    history.assign(np.arange(1.0, 1025.0, dtype=np.float32))
    x = tf.constant([[1.0, -7.0, 2.0, 3.0]])

    @tf.function
    def history_gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x, training=True))
        return tape.gradient(loss, history.value)

    gradient = history_gradient().numpy()
    assert float(_internals.float8_newest_amax(gradient)) == 7.0
    # The rest is the old history rolled left by one (Keras's ring buffer).
    np.testing.assert_array_equal(gradient[1:], np.roll(history.numpy(), -1)[1:])


def test_keras_ema_overwrite_writes_none_over_float8_pairs_until_skipped():
    # TFOptimizer._overwrite_model_variables_with_average_value,
    # BaseOptimizer._model_variables_moving_average. When a Keras release
    # no longer raises here, tf_mixed's workaround can go.
    model, layer = _float8_dense()
    variables = model.trainable_variables
    opt = keras.optimizers.SGD(0.1, use_ema=True)
    opt.build(variables)
    averages = opt._model_variables_moving_average
    assert [a is None for a in averages] == [
        bool(getattr(v, "overwrite_with_gradient", False)) for v in variables]
    with pytest.raises(ValueError, match="None"):
        opt.finalize_variable_values(variables)
    _internals.overwrite_only_averaged_variables(opt)
    for average in averages:
        if average is not None:
            average.assign(np.full(average.shape, 0.5, "float32"))
    scale = float(layer.inputs_scale.numpy())
    opt.finalize_variable_values(variables)
    np.testing.assert_array_equal(layer._kernel.numpy(), 0.5)
    assert float(layer.inputs_scale.numpy()) == scale


def test_quantized_layers_are_called_through_quantized_call():
    import numpy as np

    model, layer = _float8_dense()
    records = {}
    with _internals.recording_quantized_calls([layer], records):
        model(np.ones((2, 4), np.float32))
    assert len(records[0]) == 1
    assert records[0][0][0].shape == (2, 4)
    assert "quantized_call" not in vars(layer)


def test_optimizer_variable_index_finds_a_replica_component(mirrored):
    # BaseOptimizer._var_key, _trainable_variables_indices
    with mirrored.scope():
        a, b = keras.Variable(1.0), keras.Variable(2.0)
        opt = keras.optimizers.SGD()
        opt.build([a, b])
    assert _internals.optimizer_variable_index(opt, b) == 1
    assert _internals.optimizer_variable_index(opt, b.value.values[1]) == 1
    assert _internals.optimizer_variable_index(opt, keras.Variable(3.0)) is None


def test_keras_weight_decay_bypasses_assign_sub_until_routed():
    # TFOptimizer._apply_weight_decay, _use_weight_decay
    calls = []
    opt = keras.optimizers.AdamW(0.5, weight_decay=0.5)
    opt.assign_sub = lambda variable, value: calls.append(float(value))
    v = keras.Variable(1.0)
    opt._apply_weight_decay([v])
    assert calls == [] and float(v.numpy()) == 0.75  # Keras writes directly
    _internals.route_weight_decay_through_assign(opt)
    opt._apply_weight_decay([v])
    assert calls == [0.75 * 0.25] and float(v.numpy()) == 0.75


def test_lambda_output_shape_and_run_through_graph():
    # Lambda._output_shape, Function._run_through_graph (Keras 3.15.1).
    def shape(s):
        return s

    layer = keras.layers.Lambda(lambda t: t, output_shape=shape)
    assert _internals.constructor_arguments(layer) == {"output_shape": shape}
    inputs = keras.Input((2,))
    dense = keras.layers.Dense(3)
    model = keras.Model(inputs, dense(inputs))
    seen = []
    out = _internals.run_through_graph(
        model, keras.Input((2,)), lambda op, *a, **k: seen.append(op) or op(*a, **k))
    assert seen == [dense] and tuple(out.shape) == (None, 3)


def test_container_hook_sees_built_functional_models_and_sequential_adds():
    # Functional.__init__, Sequential.add (Keras 3.15.1).
    seen = []

    def hook(model):
        seen.append((model.name, [layer.name for layer in model.layers]))

    _internals.add_container_hook(hook)
    try:
        inputs = keras.Input((2,), name="hook_in")
        keras.Model(inputs, keras.layers.Dense(1, name="hook_d")(inputs), name="hook_f")
        sequential = keras.Sequential(name="hook_s")
        sequential.add(keras.layers.Dense(1, name="hook_s1"))
    finally:
        _internals._container_hooks.remove(hook)
    assert ("hook_f", ["hook_in", "hook_d"]) in seen
    assert ("hook_s", ["hook_s1"]) in seen

def test_lambda_keeps_its_output_shape_argument():  # Lambda._output_shape
    layer = keras.layers.Lambda(lambda t: t[:, :2], output_shape=(2,))
    assert _internals.constructor_arguments(layer)["output_shape"] == (2,)
    assert _internals.constructor_arguments(
        keras.layers.Lambda(lambda t: t)) == {"output_shape": None}


def test_keras_checkpoint_decides_in_get_file_path_and_should_save_model(recwarn):
    # ModelCheckpoint._get_file_path, _should_save_model, and _save_model as
    # the one hook every save passes through (on_epoch_end, on_train_batch_end).
    calls = []

    class Recording(keras.callbacks.ModelCheckpoint):
        def _save_model(self, epoch, batch, logs):
            calls.append(
                (epoch, batch, _internals.keras_checkpoint_target(self, epoch, batch, logs)))

    callback = Recording("e{epoch}.keras", save_best_only=True, save_freq="epoch")
    callback.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
    callback.on_epoch_end(0, {"val_loss": 2.0})
    callback.on_epoch_end(1, {"val_loss": 3.0})
    callback.on_epoch_end(2, {})  # missing: Keras warns and saves
    assert calls == [(0, None, "e1.keras"), (1, None, None), (2, None, "e3.keras")]
    assert "Can save best model only with val_loss available" in str(recwarn[-1].message)
    batches = Recording("b{batch}.keras", save_freq=1)
    batches.set_model(callback.model)
    batches.on_epoch_begin(0)
    batches.on_train_batch_end(0, {})
    assert calls[-1] == (0, 0, "b1.keras")


def _datasets(h5py, names: list, name: str, obj) -> None:
    if isinstance(obj, h5py.Dataset):
        names.append(name)


def test_keras_weight_keys_are_the_keys_of_keras_weights_files(tmp_path):
    """Guards keras.src.saving.saving_lib._save_state and NpzIOStore (keras_weight_keys)."""
    h5py = pytest.importorskip("h5py")

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder = keras.Sequential([keras.layers.Dense(3),
                                             keras.layers.BatchNormalization()])
            self.blocks = [keras.layers.Dense(3), keras.layers.Dense(3)]
            self.head = keras.layers.Dense(2)

        def call(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(self.encoder(x))

    inputs = keras.Input((4,))
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), keras.layers.Dense(4)])
    x = keras.layers.LayerNormalization()(keras.layers.Dense(5)(inner(inputs)))
    functional = keras.Model(inputs, x)
    functional.compile(optimizer="adam", loss="mse")
    functional.optimizer.build(functional.trainable_variables)  # its state is no model variable
    sequential = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(3)])
    subclassed = Sub()
    subclassed(np.zeros((1, 4), np.float32))
    for model in (sequential, functional, subclassed):
        keys = _internals.keras_weight_keys(model)
        ours = [keys[id(v)] for v in model.weights]  # every variable placed
        model.save_weights(str(tmp_path / "k.weights.h5"))
        theirs: list = []
        with h5py.File(tmp_path / "k.weights.h5", "r") as f:
            f.visititems(functools.partial(_datasets, h5py, theirs))
        assert sorted(ours) == sorted(k for k in theirs if not k.startswith("optimizer/"))
        assert len(set(ours)) == len(ours)
    assert sorted(keys[id(v)] for v in subclassed.weights) == [
        "blocks/dense/vars/0", "blocks/dense/vars/1", "blocks/dense_1/vars/0",
        "blocks/dense_1/vars/1", "encoder/layers/batch_normalization/vars/0",
        "encoder/layers/batch_normalization/vars/1", "encoder/layers/batch_normalization/vars/2",
        "encoder/layers/batch_normalization/vars/3", "encoder/layers/dense/vars/0",
        "encoder/layers/dense/vars/1", "head/vars/0", "head/vars/1"]
    assert [_internals.keras_weight_keys(functional)[id(v)] for v in functional.weights] == [
        "layers/sequential/layers/dense/vars/0", "layers/sequential/layers/dense/vars/1",
        "layers/sequential/layers/dense_1/vars/0", "layers/sequential/layers/dense_1/vars/1",
        "layers/dense/vars/0", "layers/dense/vars/1",
        "layers/layer_normalization/vars/0", "layers/layer_normalization/vars/1"]


def test_model_being_restored_finds_the_model_owning_the_optimizer(tmp_path):
    """Guards keras.src.saving.saving_lib._load_state and the frames of
    tf.train.Checkpoint.read/restore (model_being_restored)."""
    seen, strangers = [], []
    stranger = keras.optimizers.SGD()        # no model owns it

    def note(optimizer):
        seen.append(_internals.model_being_restored(lambda m: m.optimizer is optimizer))
        strangers.append(_internals.model_being_restored(lambda m: m.optimizer is stranger))

    class Recording(keras.optimizers.SGD):
        def load_own_variables(self, store):
            note(self)
            super().load_own_variables(store)

    def model(optimizer):
        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
        m.compile(optimizer=optimizer, loss="mse")
        m.optimizer.build(m.trainable_variables)
        m.optimizer.restored = _internals.checkpoint_value(
            lambda: {"x": tf.constant(1.0)}, lambda tensors, o=m.optimizer: note(o))
        return m

    saved = model(Recording())
    saved.save_weights(str(tmp_path / "m.weights.h5"))
    saved.save(str(tmp_path / "m.keras"))
    checkpoint = tf.train.Checkpoint(model=saved).write(str(tmp_path / "ckpt"))
    loading = model(Recording())
    loading.load_weights(str(tmp_path / "m.weights.h5"))
    loading.load_weights(str(tmp_path / "m.keras"))
    tf.train.Checkpoint(model=loading).read(checkpoint)
    tf.train.Checkpoint(model=loading).restore(checkpoint)
    assert seen == [loading] * 4
    loaded = keras.saving.load_model(str(tmp_path / "m.keras"),
                                     custom_objects={"Recording": Recording})
    assert seen[-1] is loaded
    assert strangers == [None] * 5           # a model owning another optimizer: never
    assert _internals.model_being_restored(lambda m: True) is None   # no restore under way


def test_sublayers_lists_a_layers_inner_layers():  # Layer._flatten_layers
    mha = keras.layers.MultiHeadAttention(2, 4, dropout=0.5, name="mha")
    q = np.ones((1, 3, 4), "float32")
    mha(q, q)
    found = _internals.sublayers(mha)
    assert found[0] is mha
    assert [type(layer).__name__ for layer in found].count("Dropout") == 1
    dense = keras.layers.Dense(2)
    assert _internals.sublayers(dense) == [dense]


def test_layer_call_hook_runs_first_and_build_for_call_builds_as_keras_does():
    # Layer.__call__; CallSpec, _call_signature, _call_context_args,
    # _assert_input_compatibility, _open_name_scope, _maybe_build (Keras 3.15.1).
    seen = []

    def hook(layer, args, kwargs):
        seen.append((layer.name, layer.built, args[0].dtype))
        _internals.build_for_call(layer, args, kwargs)

    _internals.add_layer_call_hook(hook)
    try:
        inputs = keras.Input((3,), dtype="float64", name="call_in")
        dense = keras.layers.Dense(2, name="call_d")
        dense(inputs)
    finally:
        _internals._layer_call_hooks.remove(hook)
    # The hook ran before Keras cast the float64 input, on the unbuilt layer,
    # and built it with the paths a normal first call gives.
    assert seen == [("call_d", False, "float64")]
    assert [w.path for w in dense.weights] == ["call_d/kernel", "call_d/bias"]
    built_by_keras = keras.layers.Dense(2, name="plain_d")
    built_by_keras(keras.Input((3,)))
    assert [w.path for w in built_by_keras.weights] == ["plain_d/kernel", "plain_d/bias"]


def test_recording_layer_outputs_names_the_producer_and_unwraps():
    # Layer.__call__ looks self.call up on every call (Keras 3.15.1).
    dense = keras.layers.Dense(2, name="rec_d")
    dense(np.zeros((1, 3), "float32"))
    with _internals.recording_layer_outputs([("rec_d", dense)]) as produced:
        out = dense(np.zeros((1, 3), "float32"))
        assert produced[id(out)] == ("rec_d", dense)
    assert "call" not in vars(dense)

def test_constructor_arguments_are_those_keras_recorded():  # Operation._auto_config
    class NoKwargs(keras.layers.Layer):
        def __init__(self, width, label="x"):
            super().__init__()
            self.width = width

    assert _internals.constructor_arguments(NoKwargs(3)) == {"width": 3, "label": "x"}

    class Unrecordable(keras.layers.Layer):
        def __init__(self, table):
            super().__init__()

    assert _internals.constructor_arguments(Unrecordable([object()])) == {}

def test_variables_read_so_far():  # FuncGraph._watched_variables
    v = tf.Variable(1.0, trainable=False)
    seen = []

    @tf.function
    def f():
        v.assign(v + 1.0)
        seen.append(_internals.variables_read_so_far())

    f()
    assert any(w is v for w in seen[0])
    assert _internals.variables_read_so_far() is None  # eagerly


# ------------------------------------------------------------- checkpoints


class _Holder(tf.Module):
    pass


def test_checkpoint_children_are_listed_and_a_restore_writes_shallowest_first(tmp_path):
    # Trackable._trackable_children lists what a checkpoint saves and
    # restores; a variable reached by two nodes is written from the shallower
    # one only (CheckpointPosition._single_restore and _update_uid): the
    # reason set_checkpoint_children's users need checkpoint_alias.
    class Listed(tf.Module):
        pass

    _internals.set_checkpoint_children(
        Listed, lambda obj, default: {**default, "renamed": obj.hidden[0]})
    obj = Listed()
    obj.hidden = [tf.Variable(3.0)]
    assert set(_internals.trackable_children(obj)) >= {"renamed", "hidden"}
    shallow, deep = tf.Variable(1.0), tf.Variable(2.0)
    root = _Holder()
    root.x, root.inner = shallow, _Holder()
    root.inner.x = deep
    path = tf.train.Checkpoint(root=root).write(str(tmp_path / "two"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert "x/.ATTRIBUTES/VARIABLE_VALUE" in names  # root= is the root
    one = tf.Variable(0.0)
    again = _Holder()
    again.x, again.inner = one, _Holder()
    again.inner.x = one  # one variable under both names
    tf.train.Checkpoint(root=again).restore(path)
    assert float(one.numpy()) == 1.0  # the shallower node won
    path = tf.train.Checkpoint(root=obj).write(str(tmp_path / "listed"))
    assert "renamed/.ATTRIBUTES/VARIABLE_VALUE" in [
        n for n, _ in tf.train.list_variables(path)]


def test_checkpoint_alias_saves_as_a_variable_and_yields_to_a_deeper_node(tmp_path):
    # The alias implements Trackable._serialize_to_tensors /
    # _restore_from_tensors and reads _update_uid.
    shallow, deep = tf.Variable(1.0), tf.Variable(2.0)
    root = _Holder()
    root.x, root.inner = shallow, _Holder()
    root.inner.x = deep
    both = tf.train.Checkpoint(root=root).write(str(tmp_path / "two"))
    alone = _Holder()
    alone.x = tf.Variable(5.0)
    alone_path = tf.train.Checkpoint(root=alone).write(str(tmp_path / "one"))

    class Aliased(tf.Module):
        pass

    target = tf.Variable(0.0)
    _internals.set_checkpoint_children(
        Aliased, lambda obj, default: {"x": obj.alias, "inner": obj.inner})
    again = Aliased()
    again.alias = _internals.checkpoint_alias(target)
    again.inner = _Holder()
    again.inner.x = target
    tf.train.Checkpoint(root=again).restore(both)
    assert float(target.numpy()) == 2.0  # the deeper node won
    tf.train.Checkpoint(root=again).restore(alone_path)
    assert float(target.numpy()) == 5.0  # only the alias's node: it writes
    # Saved as a variable: a plain variable restores from the alias's node.
    target.assign(7.0)
    path = tf.train.Checkpoint(root=again).write(str(tmp_path / "aliased"))
    plain = _Holder()
    plain.x = tf.Variable(0.0)
    tf.train.Checkpoint(root=plain).restore(path)
    assert float(plain.x.numpy()) == 7.0
    # Asynchronous checkpoints copy it to the CPU (_copy_trackable_to_cpu).
    target.assign(9.0)
    checkpoint = tf.train.Checkpoint(root=again)
    path = checkpoint.write(str(tmp_path / "async"), options=tf.train.CheckpointOptions(
        experimental_enable_async_checkpoint=True))
    checkpoint.sync()
    tf.train.Checkpoint(root=plain).restore(path)
    assert float(plain.x.numpy()) == 9.0


def test_checkpoint_value_saves_what_save_makes_and_restores_through_restore(tmp_path):
    # Implements Trackable._serialize_to_tensors / _restore_from_tensors /
    # _copy_trackable_to_cpu for state that is not one variable.
    state = {"rows": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)}
    got = {}

    def save():
        return {"rows": tf.constant(state["rows"])}

    def restore(tensors):
        got["rows"] = np.asarray(tensors["rows"])

    root = _Holder()
    root.value = _internals.checkpoint_value(save, restore)
    path = tf.train.Checkpoint(root=root).write(str(tmp_path / "value"))
    tf.train.Checkpoint(root=root).read(path).assert_consumed()
    np.testing.assert_array_equal(got["rows"], state["rows"])
    checkpoint = tf.train.Checkpoint(root=root)
    path = checkpoint.write(str(tmp_path / "async"), options=tf.train.CheckpointOptions(
        experimental_enable_async_checkpoint=True))
    checkpoint.sync()
    state["rows"] = state["rows"] * 0  # after the save: not in the file
    # An async write also records the checkpoint's save counter, which `read` leaves alone.
    tf.train.Checkpoint(root=root).read(path).expect_partial()
    np.testing.assert_array_equal(got["rows"], [[1.0, 2.0], [3.0, 4.0]])


def test_restore_deferred_hands_a_later_child_what_an_earlier_read_held(tmp_path):
    # Trackable._handle_deferred_dependencies: a read before the child existed.
    saved = _Holder()
    saved.child = tf.Module()
    saved.child.v = tf.Variable(3.0)
    path = tf.train.Checkpoint(root=saved).write(str(tmp_path / "deferred"))
    fresh = _Holder()
    tf.train.Checkpoint(root=fresh).read(path).expect_partial()
    child = tf.Module()
    child.v = tf.Variable(0.0)
    _internals.restore_deferred(fresh, "child", child)  # not tracked by fresh: listed later
    assert float(child.v) == 3.0


def test_wrap_call_sees_every_output_and_unwraps():  # Operation.__call__ runs self.call
    seen = []
    dense = keras.layers.Dense(2, name="wrapped")
    model = keras.Sequential([keras.Input((3,)), dense])
    _internals.wrap_call(dense, seen.append)
    out = model(np.ones((1, 3), "float32"))
    assert len(seen) == 1 and np.array_equal(np.asarray(seen[0]), np.asarray(out))
    assert "call" not in dense.get_config()
    _internals.unwrap_call(dense)
    model(np.ones((1, 3), "float32"))
    assert len(seen) == 1


def test_distinct_function_omits_the_frequent_retracing_warning():
    # Function._omit_frequent_tracing_warning
    from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf

    # TF reads the flag where it counts a call that traced.
    assert "_omit_frequent_tracing_warning" in inspect.getsource(pf.Function.__call__) + \
        inspect.getsource(pf.Function._call)
    function = _internals.distinct_function(lambda x: x + 1)
    assert function._omit_frequent_tracing_warning is True
    assert float(function(tf.constant(1.0))) == 2.0


def test_checkpoint_being_read_is_true_inside_a_read_or_restore_only(tmp_path):
    """Guards the frames of tf.train.Checkpoint.read/restore (checkpoint_being_read)."""
    seen = []
    module = tf.Module()
    module.value = _internals.checkpoint_value(
        lambda: (seen.append(("save", _internals.checkpoint_being_read()))
                 or {"x": tf.constant(1.0)}),
        lambda tensors: seen.append(("restore", _internals.checkpoint_being_read())))
    path = tf.train.Checkpoint(root=module).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(root=module).read(path)
    tf.train.Checkpoint(root=module).restore(path)
    assert seen[0] == ("save", False)
    assert [read for kind, read in seen[1:] if kind == "restore"] == [True, True]
    assert not _internals.checkpoint_being_read()


def test_loss_function_wrapper_and_its_parts():  # keras.src.losses.losses, _fn_kwargs
    wrapper = _internals.loss_function_wrapper()
    assert wrapper.__module__ == "keras.src.losses.losses" and wrapper.__name__ == (
        "LossFunctionWrapper")
    assert isinstance(keras.losses.Huber(), wrapper)
    fn, kwargs = _internals.loss_function_parts(keras.losses.Huber(delta=2.0))
    assert fn is keras.losses.huber and kwargs == {"delta": 2.0}
    # What compile makes of a loss name, and what Keras alone rebuilds from a config.
    rebuilt = wrapper.from_config({"name": "h", "reduction": "sum", "dtype": "float32",
                                   "fn": keras.saving.serialize_keras_object(fn), "delta": 2.0})
    assert type(rebuilt) is wrapper and rebuilt.dtype == "float32"
    assert _internals.loss_function_parts(rebuilt) == (keras.losses.huber, {"delta": 2.0})
    # Huber's config drops delta (Keras 3.15.1); the shim sets it back.
    reloaded = keras.losses.Huber.from_config(keras.losses.Huber(delta=2.0).get_config())
    assert _internals.loss_function_parts(reloaded)[1] == {"delta": 1.0}
    _internals.set_loss_function_arguments(reloaded, {"delta": 2.0})
    assert _internals.loss_function_parts(reloaded)[1] == {"delta": 2.0}
