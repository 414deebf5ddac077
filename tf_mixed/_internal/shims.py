"""Every use of private Keras / TensorFlow API in tf_mixed, each in one shim."""

# Each function reaches one private name, says why no public API does the job,
# and names the version it was checked on (Keras 3.15.1, TensorFlow 2.21.0).
# tests/internal/test_shims.py asserts that each name still exists and behaves as
# relied on here, so a Keras or TF upgrade that moves one fails a named test
# instead of changing tf_mixed's behaviour silently. pyproject.toml bounds the
# Keras version to the range these tests ran on.
#
# One patch is too large for a shim and lives in its own module so it can be
# deleted whole once Keras is fixed: ``tf_mixed/distribute/keras_fix_20585.py`` (``fit``
# under MultiWorkerMirroredStrategy, keras-team/keras#20585) replaces
# ``keras.src.backend.tensorflow.trainer.TensorFlowTrainer._maybe_symbolic_build``
# and ``keras.src.backend.tensorflow.trainer.reduce_per_replica`` (measured on
# Keras 3.15.1) and calls ``strategy.extended._in_multi_worker_mode()``;
# ``tests/integration/test_multi_worker_fit.py::test_keras_still_has_defect_20585`` fails on
# the first Keras without the defect.

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Any, Callable, NamedTuple


class KerasHistory(NamedTuple):
    """Where a symbolic tensor came from (Keras's own record, copied)."""

    operation: Any  # the layer (or nested model) that produced the tensor
    node_index: int  # which call of that operation
    tensor_index: int  # which of that call's outputs


# --------------------------------------------------------------------- Keras


def call_outputs(layer) -> list:
    """The symbolic outputs of every call of `layer` in a functional graph.

    Reaches ``layer._inbound_nodes`` (one ``Node`` per call, each with
    ``output_tensors``). The public ``layer.output`` gives the first call only
    and raises for a shared layer; audit needs every call's dtype and shape.
    Checked on Keras 3.15.1.

    Returns:
      A flat list of KerasTensors; [] for a layer never called symbolically.
    """
    import keras

    return [t for node in layer._inbound_nodes
            for t in keras.tree.flatten(node.output_tensors)]


def call_inputs(layer) -> list:
    """The symbolic inputs of every call of `layer` (``_inbound_nodes``).

    Used to find the layer feeding one of tf_mixed's float32 heads; no public
    accessor gives a shared layer's inputs per call. Keras 3.15.1.
    """
    import keras

    return [t for node in layer._inbound_nodes
            for t in keras.tree.flatten(node.input_tensors)]


def first_call_arguments(layer) -> tuple[tuple, dict]:
    """The positional and keyword arguments of `layer`'s first symbolic call.

    Reaches ``layer._inbound_nodes[0].arguments`` (a ``SymbolicArguments``
    with ``args`` and ``kwargs``, KerasTensors in place of tensors).
    `tf_mixed.plan` calls a copy of each layer as the model calls it (a
    MultiHeadAttention's query and value, a ``mask=`` keyword); no public
    accessor gives a call's structure. Keras 3.15.1.

    Returns:
      ``(args, kwargs)``; ``((), {})`` for a layer never called symbolically.
    """
    nodes = getattr(layer, "_inbound_nodes", None) or []
    if not nodes:
        return (), {}
    arguments = nodes[0].arguments
    return tuple(arguments.args), dict(arguments.kwargs)


def keras_history(tensor) -> KerasHistory | None:
    """The operation that produced a symbolic tensor (``_keras_history``).

    Keras stores it on every KerasTensor a layer outputs; there is no public
    accessor. A nested model appears as the operation, with the index of its
    output. Keras 3.15.1.

    Returns:
      A `KerasHistory`, or None for a tensor no operation produced (a plain
      ``keras.KerasTensor``, an eager tensor).
    """
    history = getattr(tensor, "_keras_history", None)
    if history is None:
        return None
    operation, node_index, tensor_index = history
    return KerasHistory(operation, node_index, tensor_index)


def constructor_arguments(layer) -> dict:
    """The arguments ``layer``'s constructor was called with, as Keras kept them.

    ``Operation.__new__`` records them in ``_auto_config`` (for its default
    ``get_config``) when every value is a str, number, bool or None; else
    ``{}``. A ``Lambda`` (whose function is never recordable) keeps its
    ``output_shape`` as ``_output_shape``: it is given under that name, the
    live value (``get_config`` returns it serialised, as code when it is a
    Python lambda). `tf_mixed.models.cloning.recreate` re-creates a Lambda
    from its live function and output shape, and a custom layer whose
    constructor takes no ``**kwargs`` from these arguments, where the
    layer's own ``get_config`` leaves one out (keras-io's ``PatchEncoder``).
    Keras 3.15.1 (``keras/src/ops/operation.py``, ``keras/src/layers/core/lambda_layer.py``).
    """
    import keras

    auto_config = getattr(layer, "_auto_config", None)
    arguments = dict(auto_config.config) if auto_config is not None else {}
    if isinstance(layer, keras.layers.Lambda):
        arguments["output_shape"] = layer._output_shape
    return arguments


def run_through_graph(model, inputs, call_fn):
    """Calls a functional model's graph on ``inputs``, each node through ``call_fn``.

    Reaches ``Function._run_through_graph(inputs, operation_fn, call_fn)``,
    which ``keras.models.clone_model`` uses: ``call_fn(operation, *args,
    **kwargs)`` returns each node's outputs. No public API walks a functional
    graph node by node with symbolic inputs that are not ``keras.Input``s
    (``clone_model(input_tensors=...)`` then wraps the result in a model);
    `tf_mixed.models.cloning.clone` needs it to inline nested models.
    Keras 3.15.1.

    Returns:
        The outputs, in the structure of ``model.outputs``'s calls.
    """
    return model._run_through_graph(inputs, operation_fn=lambda op: op, call_fn=call_fn)


def sublayers(layer) -> list:
    """`layer` and every layer inside it, at any depth (``_flatten_layers``).

    A layer that builds sub-layers (``MultiHeadAttention`` its ``Dropout``, a
    keras-io ``TransformerBlock`` its ``Dropout`` and ``LayerNormalization``)
    lists them only privately; ``keras.Model.layers`` covers models, not
    layers. The probe needs the random ones among them. Keras 3.15.1.

    Returns:
        A list, `layer` first, each layer once.
    """
    return list(layer._flatten_layers(include_self=True, recursive=True))


def wrap_call(layer, after_call: Callable[[Any], None]) -> None:
    """Calls ``after_call(outputs)`` after every ``layer.call`` (an instance attribute).

    What it reaches: ``Operation.__call__`` and ``Layer.__call__`` run
    ``self.call`` (Keras 3.15.1, ``keras/src/ops/operation.py``,
    ``keras/src/layers/layer.py``), so a ``call`` set on the instance runs
    instead of the class's; it is set with ``object.__setattr__`` past
    Keras's attribute tracking. Config, weights and saving never read it.

    Why: layer attribution (`tf_mixed.scaling.attribution`) notes each
    layer's outputs while a training step is traced; Keras has no forward
    hook. Wrapping twice replaces the first wrapper.
    """
    unwrap_call(layer)
    original = layer.call

    @functools.wraps(original)
    def call(*args, **kwargs):
        outputs = original(*args, **kwargs)
        after_call(outputs)
        return outputs

    call._tf_mixed_wrapped = True  # type: ignore[attr-defined]
    object.__setattr__(layer, "call", call)


def unwrap_call(layer) -> None:
    """Removes a `wrap_call` wrapper (nothing if there is none)."""
    if getattr(layer.__dict__.get("call"), "_tf_mixed_wrapped", False):
        object.__delattr__(layer, "call")


def disable_input_casting(layer) -> None:
    """Stops ``Layer.__call__`` from casting `layer`'s inputs before ``call``.

    Keras casts the floating tensors of a layer's arguments to its compute
    dtype when ``layer._convert_input_args`` is true (the default; Keras 3.15
    casts every argument, earlier 3.x releases the first one only).
    `Float32Output` casts every nested float itself and passes everything
    else through untouched, so Keras's conversion is turned off; there is no
    constructor argument for it. Keras 3.15.1 (``keras/src/layers/layer.py``,
    ``Layer.__call__``).
    """
    layer._convert_input_args = False


def serialize_as_keras_class(cls, keras_name: str) -> None:
    """Saves instances of `cls` under Keras's own public class ``keras_name``.

    ``keras.saving`` names a class in a config by its public Keras name when
    ``keras.src.api_export.REGISTERED_OBJS_TO_NAMES`` holds one for it
    (``serialization_lib.serialize_with_public_class``), and a process loads
    such a config with Keras alone (``serialization_lib._retrieve_class_or_fn``
    imports a module named in a config only for Keras's own packages). tf_mixed's float32 heads
    are Keras layers with ``dtype="float32"`` in all but name
    (`tf_mixed.layers`), so a ``.keras`` file that holds one loads where
    tf_mixed was never imported. Only the class -> name direction is added:
    a name still resolves to Keras's class. Keras 3.15.1
    (``keras/src/api_export.py``).

    Args:
        cls: The class whose instances save as ``keras_name``.
        keras_name: A public Keras class, such as "keras.layers.Activation".
    """
    from keras.src import api_export

    api_export.REGISTERED_OBJS_TO_NAMES[cls] = keras_name


def resolve_keras_name(keras_name: str, obj) -> None:
    """Makes ``keras.saving`` resolve Keras's public class name ``keras_name`` to `obj`.

    A config naming a Keras class (module ``keras.*``, no registered name)
    is resolved through ``keras.src.api_export.REGISTERED_NAMES_TO_OBJS``
    (``serialization_lib._retrieve_class_or_fn``, its only reader), and
    Keras then calls ``obj.from_config(config)``. The public attribute
    (``keras.optimizers.LossScaleOptimizer``) and the class -> name direction
    stay Keras's. For tf_mixed's optimizer, whose files name Keras's wrapper
    (`tf_mixed.scaling.portable`). Keras 3.15.1 (``keras/src/api_export.py``).

    Args:
        keras_name: A public Keras name, such as "keras.optimizers.LossScaleOptimizer".
        obj: What the name resolves to: anything with a ``from_config``.
    """
    from keras.src import api_export

    api_export.REGISTERED_NAMES_TO_OBJS[keras_name] = obj


def loss_function_wrapper() -> type:
    """Keras's ``LossFunctionWrapper``, the loss ``compile`` makes of a loss function.

    Not exported (``keras/src/losses/losses.py``); a config naming its module
    (``keras.src.losses.losses``) loads with Keras alone, which imports a module
    named in a config for Keras's own packages (``serialization_lib.
    _retrieve_class_or_fn``). Every built-in loss class subclasses it without
    overriding ``call``. For `tf_mixed.Float32Loss`'s files. Keras 3.15.1.
    """
    from keras.src.losses.losses import LossFunctionWrapper

    return LossFunctionWrapper


def loss_function_parts(loss) -> tuple[Callable, dict]:
    """A ``LossFunctionWrapper``'s function and the keyword arguments it calls it with.

    ``fn`` is public; the arguments are ``_fn_kwargs`` (what the wrapper's
    ``get_config`` writes at the top of its config). Keras 3.15.1
    (``keras/src/losses/losses.py``).
    """
    return loss.fn, dict(loss._fn_kwargs)


def set_loss_function_arguments(loss, arguments: dict) -> None:
    """Sets the keyword arguments a ``LossFunctionWrapper`` calls its function with.

    Some built-in losses' ``get_config`` drops an argument their constructor
    took (Keras 3.15.1: ``Huber``'s ``delta``, ``CosineSimilarity``'s and
    ``SparseCategoricalCrossentropy``'s ``axis``), so a loss rebuilt from its
    config calls its function with the default; tf_mixed's files also hold the
    arguments themselves (`tf_mixed._internal.portable_loss`). Keras 3.15.1
    (``keras/src/losses/losses.py``, ``_fn_kwargs``).
    """
    loss._fn_kwargs = dict(arguments)


def optimizer_trainable_variables(optimizer) -> list:
    """The variables a built optimizer was built for (``_trainable_variables``).

    Keras keeps them to apply gradients when ``apply`` is called without
    variables; the public ``optimizer.variables`` holds the optimizer's own
    state instead. For `LossScaleOptimizer.apply`. Keras 3.15.1.
    """
    return list(optimizer._trainable_variables)


def optimizer_own_variables(optimizer) -> list:
    """The variables an optimizer created itself, in creation order (``_variables``).

    Keras's ``optimizer.variables`` also lists a wrapper's inner optimizer's
    (``LossScaleOptimizer.variables``); its own ``add_variable`` calls append
    to the private ``_variables`` list, which is what Keras's own
    ``save_own_variables`` writes. For the wrapper's file layouts
    (`tf_mixed.scaling.formats`). Keras 3.15.1.
    """
    return list(optimizer._variables)


def rider(obj, name: str, make: Callable[[], Any]) -> Any:
    """What tf_mixed keeps on a user's Keras object under ``name``, made on first use.

    A fact about an object that several tf_mixed objects share (a user's
    inner optimizer, which several wrappers may drive) belongs to that
    object, not to a module-level registry keyed by it. It is set with
    ``object.__setattr__`` as ``_tf_mixed_<name>``, so neither Keras's
    attribute tracker (``Optimizer.__setattr__`` -> ``_tracker.track``) nor
    TensorFlow's ``AutoTrackable.__setattr__`` sees it: it is in no
    checkpoint, config, ``.keras`` file or SavedModel, and it goes with the
    object. Keras 3.15.1, TensorFlow 2.21.0.

    Args:
        obj: The object (a Keras optimizer).
        name: The rider's name.
        make: Makes the value the first time.

    Returns:
        The value kept on ``obj``.
    """
    attribute = f"_tf_mixed_{name}"
    value = obj.__dict__.get(attribute)
    if value is None:
        value = make()
        object.__setattr__(obj, attribute, value)
    return value


def no_automatic_dependency_tracking(fn: Callable) -> Callable:
    """Decorator: attributes set inside `fn` are not tracked by Keras.

    ``keras.src.utils.tracking.no_automatic_dependency_tracking`` is how
    Keras's own ``LossScaleOptimizer.build`` creates its state, so the state
    variables are tracked once (in ``_variables``) and not also as attributes.
    No public equivalent. Imported when the decorated function is defined, so
    a Keras that moves it fails at import, loudly. Keras 3.15.1.
    """
    from keras.src.utils import tracking

    return tracking.no_automatic_dependency_tracking(fn)


# ------------------------------------------------------------------- TensorFlow

_XLA_PROBE_MISSING = (
    "tf_mixed cannot tell whether this step is compiled with XLA: TensorFlow "
    "{version} no longer has tensorflow.python.ops.control_flow_util."
    "GraphOrParentsInXlaContext ({error}). The clear error for jit_compile=True "
    "under a multi-replica strategy is off; XLA's own error will show instead. "
    "Please report this at tf_mixed with your TensorFlow version."
)


@functools.lru_cache(maxsize=None)
def _xla_probe():
    """TF's own XLA-context check, or the ImportError/AttributeError met."""
    try:
        from tensorflow.python.ops import control_flow_util

        return control_flow_util.GraphOrParentsInXlaContext
    except (ImportError, AttributeError) as error:
        return error


def in_xla_context(graph) -> bool:
    """Whether ops added to `graph` now are compiled with XLA.

    Reaches ``tensorflow.python.ops.control_flow_util.
    GraphOrParentsInXlaContext``, the check TF's own strategies use; a
    ``tf.function(jit_compile=True)`` leaves no public trace in its graph.
    TF 2.21.0. If TF moves it, this warns (``RuntimeWarning``, once) and
    returns False: the check only swaps XLA's resource-device error for a
    clearer one, so training goes on, but not silently.

    Args:
      graph: a ``tf.Graph`` (usually ``tf.compat.v1.get_default_graph()``).

    Returns:
      True inside an XLA-compiled function (or a function it calls).
    """
    probe = _xla_probe()
    if isinstance(probe, Exception):
        import tensorflow as tf

        warnings.warn(_XLA_PROBE_MISSING.format(version=tf.__version__,
                                                error=probe),
                      RuntimeWarning, stacklevel=2)
        return False
    return bool(probe(graph))


def distinct_function(python_function: Callable, **kwargs) -> Any:
    """``tf.function(python_function, **kwargs)``, one of many made on purpose.

    TF counts the traces of every ``tf.function`` made from the same Python
    code as one function's: five traces among ten calls log "N out of the
    last N calls to <function> triggered tf.function retracing", advice
    meant for a function re-created in a loop by mistake. A measurement that
    makes one function per dtype or layer (the "auto" probe, the plan's
    layer timings) is not that mistake. Sets ``Function.
    _omit_frequent_tracing_warning``, the flag TF's own SavedModel loader
    sets on the functions it restores (no public option does this);
    TF 2.21.0.
    """
    import tensorflow as tf

    function = tf.function(python_function, **kwargs)
    function._omit_frequent_tracing_warning = True
    return function


def strategy_supports_no_merge_call() -> bool:
    """Whether the current strategy updates variables without ``merge_call``.

    ``tf.__internal__.distribute.strategy_supports_no_merge_call`` is what
    Keras's optimizers ask before applying gradients in the replica context
    (true for the default strategy and with XLA on GPUs; false for
    MirroredStrategy on CPUs). No public equivalent. TF 2.21.0.
    """
    import tensorflow as tf

    return bool(tf.__internal__.distribute.strategy_supports_no_merge_call())


# ------------------------------------------------ the Layer.__init__ hook (keep_float32)


# Hooks called at the end of every `keras.layers.Layer.__init__`.
_layer_init_hooks: list[Callable] = []


def add_layer_init_hook(hook: Callable[[Any, object], None]) -> None:
    """Calls ``hook(layer, dtype_argument)`` at the end of every ``Layer.__init__``.

    What it reaches: it replaces ``keras.layers.Layer.__init__`` (Keras 3.15.1)
    with a wrapper that runs the original, then each hook. Every layer class
    reaches it through ``super().__init__(...)``, after the layer's name and
    dtype policy are set and before the subclass creates sub-layers or
    weights (e.g. MultiHeadAttention passes its own policy to its sub-layers
    after ``super().__init__``).

    Why: Keras picks a layer's dtype policy in ``Layer.__init__`` from the
    ``dtype`` argument or, when it is None, the global policy, and offers no
    per-layer hook there. A global ``DTypePolicyMap`` was tried first and
    does not do the job (measured, Keras 3.15.1): it is keyed by
    ``layer.path``, which is None for layers without a ``build`` method (they
    are built at init), it is consulted only after the first call's inputs
    were already cast to the default dtype (the symbolic output of a
    functional model says float16 while eager calls compute float32), a
    layer in a Sequential has the path ``sequential/NAME`` so an exact name
    key misses it, and it never sees a layer's class.

    The wrapper keeps what Keras reads of the signature equal to the
    original's: ``getfullargspec``'s ``args`` and ``varkw`` (``self,
    **kwargs``; the original's keyword-only arguments are not repeated) and
    ``inspect.signature``, which follows ``__wrapped__``; so Keras's automatic
    ``get_config`` (``Operation.__new__``) is unchanged.
    Installing twice adds the hook once.

    Args:
        hook: Called as ``hook(layer, dtype)``, ``dtype`` being the ``dtype``
            argument the layer was created with (None: follow the global
            policy).
    """
    import keras

    if hook in _layer_init_hooks:
        return
    _layer_init_hooks.append(hook)
    layer_class = keras.layers.Layer
    if getattr(layer_class.__init__, "_tf_mixed_hooked", False):
        return
    original = layer_class.__init__

    @functools.wraps(original)
    def __init__(self, **kwargs):
        original(self, **kwargs)
        for each in tuple(_layer_init_hooks):
            each(self, kwargs.get("dtype"))

    __init__._tf_mixed_hooked = True  # type: ignore[attr-defined]
    layer_class.__init__ = __init__


# Hooks called at the start of every `keras.layers.Layer.__call__`.
_layer_call_hooks: list[Callable] = []


def add_layer_call_hook(hook: Callable[[Any, tuple, dict], None]) -> None:
    """Calls ``hook(layer, args, kwargs)`` at the start of every ``Layer.__call__``.

    What it reaches: it replaces ``keras.layers.Layer.__call__`` (Keras
    3.15.1) with a wrapper that runs each hook, then the original. A hook
    runs before Keras casts the arguments to the layer's compute dtype
    (step 1 of ``Layer.__call__``), so a policy it sets applies to this
    very call, the first symbolic call of a functional model included.

    Why: a ``keep_float32`` predicate must see the complete layer (the
    attributes a subclass sets after ``super().__init__``, its weights), and
    the last moment its policy can still change everything the layer
    computes is the start of its first call. Keras has no hook there.
    Installing twice adds the hook once.

    Args:
        hook: Called as ``hook(layer, args, kwargs)`` with the call's own
            arguments (not yet converted); it must be cheap for layers it
            has nothing to do with.
    """
    import keras

    if hook in _layer_call_hooks:
        return
    _layer_call_hooks.append(hook)
    layer_class = keras.layers.Layer
    if getattr(layer_class.__call__, "_tf_mixed_hooked", False):
        return
    original = layer_class.__call__

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        for each in tuple(_layer_call_hooks):
            each(self, args, kwargs)
        return original(self, *args, **kwargs)

    __call__._tf_mixed_hooked = True  # type: ignore[attr-defined]
    layer_class.__call__ = __call__


def build_for_call(layer, args: tuple, kwargs: dict) -> None:
    """Builds an unbuilt `layer` for a call with these arguments, as ``__call__`` would.

    What it reaches: the steps of ``Layer.__call__`` up to the build (Keras
    3.15.1, ``keras/src/layers/layer.py``): the arguments converted as
    ``__call__`` converts them (``_convert_input_args``), a ``CallSpec``
    from ``_call_signature`` and ``_call_context_args``,
    ``_assert_input_compatibility``, then ``_maybe_build`` inside
    ``_open_name_scope`` (so the weights get the paths a normal first call
    gives them). ``__call__`` then finds the layer built and goes on.

    Why: the public ``layer.build(input_shape)`` needs the shapes in the
    form each layer's ``build`` takes (one shape, several, or keyword
    shapes); Keras derives them from the call, and so does this.

    Args:
        layer: A `keras.layers.Layer` about to be called.
        args, kwargs: The call's arguments.
    """
    if layer.built:
        return
    import keras
    from keras.src.layers.layer import CallSpec

    if layer._convert_input_args:
        def convert(x):
            return layer.dtype_policy.convert_input(x, layer.autocast, layer.input_dtype)

        args = keras.tree.map_structure(convert, args)
        kwargs = keras.tree.map_structure(convert, kwargs)
    call_spec = CallSpec(layer._call_signature, layer._call_context_args, args, kwargs)
    layer._assert_input_compatibility(call_spec.first_arg)
    with layer._open_name_scope():
        layer._maybe_build(call_spec)


# Hooks called when a model's layers are known (see add_container_hook).
_container_hooks: list[Callable] = []


def add_container_hook(hook: Callable[[Any], None]) -> None:
    """Calls ``hook(model)`` once a functional model is built and after ``Sequential.add``.

    What it reaches: it wraps ``keras.src.models.functional.Functional.__init__``
    (run the original, then each hook) and ``keras.Sequential.add`` (run the
    original with ``rebuild=False``, each hook, then the rebuild the caller
    asked for, so the rebuilt graph sees what the hook set). Keras 3.15.1.

    Why: `add_layer_init_hook` runs at the end of ``Layer.__init__``, when a
    model does not yet know its layers (a functional model's layers were
    created before it; a Sequential's are added after). ``keep_float32``
    naming a nested model must reach the layers inside it, and no public
    Keras hook runs once they are known.
    Installing twice adds the hook once.

    Args:
        hook: Called as ``hook(model)``.
    """
    import keras
    from keras.src.models.functional import Functional

    if hook in _container_hooks:
        return
    _container_hooks.append(hook)
    if getattr(Functional.__init__, "_tf_mixed_hooked", False):
        return
    functional_init = Functional.__init__
    sequential_add = keras.Sequential.add

    @functools.wraps(functional_init)
    def __init__(self, *args, **kwargs):
        functional_init(self, *args, **kwargs)
        for each in tuple(_container_hooks):
            each(self)

    @functools.wraps(sequential_add)
    def add(self, layer, rebuild=True):
        sequential_add(self, layer, rebuild=False)
        for each in tuple(_container_hooks):
            each(self)
        if rebuild:
            self._maybe_rebuild()

    __init__._tf_mixed_hooked = True  # type: ignore[attr-defined]
    Functional.__init__ = __init__
    keras.Sequential.add = add


# ------------------------------------------------------- reduced gradients

_SKIP_LOCK = threading.Lock()
_SKIP_DEPTH = "_tf_mixed_reduced_depth"


def apply_reduced_gradients(optimizer, grads, trainable_variables):
    """Runs ``optimizer.apply`` on gradients that are already all-reduced.

    Reaches: ``TFOptimizer._all_reduce_sum_gradients`` (Keras 3.15.1,
    keras/src/backend/tensorflow/optimizer.py), which ``_backend_update_step``
    calls in the replica context to SUM the gradients before
    ``_distributed_tf_update_step``. Keras 3 has no public switch for it (tf-keras
    had ``apply_gradients(..., experimental_aggregate_gradients=False)``).

    Why: tf_mixed reduces the gradients itself, once, in the communication
    dtype, and takes the skip verdict from the result; a second all-reduce
    inside the inner optimizer would sum the sums (doubling them) and cost a
    second collective.

    How: the instance's method is wrapped once by one that returns the pairs
    unchanged while a call of this function is in progress on that optimizer.
    A depth counter (not a thread-local) is used because under
    MirroredStrategy the replica threads that reach the inner update are not
    the threads that entered this function. Everything else in ``apply``
    (clipping, weight decay, EMA, constraints, ``iterations``) runs as usual.

    Args:
        optimizer: A Keras optimizer on the TensorFlow backend.
        grads: The already-reduced gradients, one per variable.
        trainable_variables: The variables to update.
    """
    _install_skippable_all_reduce(optimizer)
    with _SKIP_LOCK:
        setattr(optimizer, _SKIP_DEPTH, getattr(optimizer, _SKIP_DEPTH) + 1)
    try:
        optimizer.apply(grads, trainable_variables)
    finally:
        with _SKIP_LOCK:
            setattr(optimizer, _SKIP_DEPTH,
                    getattr(optimizer, _SKIP_DEPTH) - 1)


def _install_skippable_all_reduce(optimizer):
    with _SKIP_LOCK:
        if getattr(optimizer, _SKIP_DEPTH, None) is not None:
            return
        try:
            original = optimizer._all_reduce_sum_gradients
        except AttributeError as error:  # pragma: no cover - a Keras change
            raise RuntimeError(
                "tf_mixed needs Keras's TFOptimizer._all_reduce_sum_gradients "
                f"(Keras 3.15.1); {type(optimizer).__name__} has none in this "
                "Keras version. Please report it to tf_mixed."
            ) from error

        def all_reduce_unless_reduced(grads_and_vars):
            if getattr(optimizer, _SKIP_DEPTH) > 0:
                return list(grads_and_vars)
            return original(grads_and_vars)

        optimizer._all_reduce_sum_gradients = all_reduce_unless_reduced
        setattr(optimizer, _SKIP_DEPTH, 0)


# ------------------------------------------------------- which all-reduce


def reduces_with_nccl(strategy) -> bool:
    """Whether ``strategy``'s replica all-reduce runs through NCCL.

    Reaches: ``strategy.extended._cross_device_ops`` (MirroredStrategy and
    MultiWorkerMirroredStrategy, TF 2.21) and, for a ``CollectiveAllReduce``,
    its ``_options.implementation``; also ``_devices`` of the extended object.

    Why: TF's NCCL kernels cannot reduce bfloat16 (see tf_mixed.scaling.allreduce);
    there is no public way to ask a strategy which implementation it uses.
    ``AUTO`` picks NCCL when every device is a GPU.

    Args:
        strategy: A ``tf.distribute.Strategy``.

    Returns:
        True for ``NcclAllReduce``, or collectives with implementation NCCL,
        or AUTO on all-GPU devices; False otherwise (CPUs, RING, one device).
    """
    import tensorflow as tf
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cdo

    extended = strategy.extended
    ops = getattr(extended, "_cross_device_ops", None)
    if isinstance(ops, cdo.NcclAllReduce):
        return True
    if isinstance(ops, cdo.CollectiveAllReduce):
        implementation = ops._options.implementation
        kinds = collective_util.CommunicationImplementation
        if implementation == kinds.NCCL:
            return True
        if implementation == kinds.AUTO:
            kinds_of_device = [
                (tf.DeviceSpec.from_string(d).device_type or "").upper()
                for d in getattr(extended, "_devices", ()) or ()
            ]
            return bool(kinds_of_device) and all(
                kind == "GPU" for kind in kinds_of_device)
    return False


# ------------------------------------------------------- the traced train step (census)


def keras_train_step(model) -> tuple[Callable, bool]:
    """The function Keras's ``fit`` runs for one step, as Keras builds it.

    Reaches ``model._make_function(model.train_step)`` (Keras 3.15.1,
    keras/src/backend/tensorflow/trainer.py): what ``make_train_function``
    stores in ``model.train_function``, a Python function whose closure holds
    ``one_step_on_data``, the ``tf.function`` (with the model's
    ``jit_compile``) that runs ``train_step`` under the model's strategy and
    reduces its outputs. Keras wraps it in ``_autoconvert_optionals``
    (``functools.wraps``, so ``__wrapped__`` is the function). A fresh one is
    made so ``model.train_function`` is not replaced. No public API hands
    out the traced step; ``model.train_function`` takes an iterator and runs
    the step.

    Args:
        model: A compiled Keras model on the TensorFlow backend.

    Returns:
        ``(step, traced)``: the one-step function, taking the data tuple a
        Keras data adapter yields, and whether it is a ``tf.function``
        (False for a model compiled with ``run_eagerly=True``).
    """
    function = model._make_function(model.train_step)
    cells: dict[str, Any] = dict(zip(
        function.__code__.co_freevars,
        (cell.cell_contents for cell in function.__closure__ or ())))
    step = cells["one_step_on_data"]
    step = getattr(step, "__wrapped__", step)
    return step, hasattr(step, "get_concrete_function")


def fit_batch(x, y, batch_size: int | None):
    """The first batch ``fit`` would feed the train step, as Keras converts it.

    Reaches ``keras.src.trainers.data_adapters.get_data_adapter`` (Keras
    3.15.1), the adapter ``fit`` builds: it turns NumPy float64 arrays into
    float32 but leaves a ``tf.data.Dataset``'s dtypes alone, so the dtypes
    the step sees are the adapter's. No public API exposes it.

    Args:
        x, y: What ``fit`` accepts (arrays, tensors, a ``tf.data.Dataset``).
        batch_size: For arrays (None: Keras's default of 32).

    Returns:
        The first batch: a tuple ``(x, y)`` or ``(x, y, sample_weight)``
        of tensors.
    """
    from keras.src.trainers.data_adapters import get_data_adapter

    adapter = get_data_adapter(x, y, batch_size=batch_size, shuffle=False)
    for batch in adapter.get_tf_dataset().take(1):
        return batch
    raise ValueError("the data is empty: fit would run no step on it")


class recording_layer_scopes:
    """Records the graph name scope each layer's ``call`` runs in.

    Sets an instance attribute ``call`` on each layer (bypassing Keras's
    attribute tracking with ``object.__setattr__``) that reads
    ``tf.get_current_name_scope()`` and calls the class's ``call``; removed
    on exit. ``Layer.__call__`` and ``Operation.__call__`` look ``self.call``
    up on every call (Keras 3.15.1), and Keras opens the layer's name scope
    before it. TF makes scope names unique per graph (a layer ``dense`` runs
    in ``dense_1``, a layer ``dense_1`` in ``dense_1_2``), so the scope of
    an op cannot be mapped back to a layer by its name alone.

    Usage: ``with recording_layer_scopes(pairs) as scopes: trace()``;
    ``scopes`` maps a scope (``sequential_1/dense_1``) to the name paired with
    the layer.
    """

    def __init__(self, named_layers):
        self._named_layers = list(named_layers)
        self._wrapped: list = []
        self.scopes: dict[str, str] = {}

    def __enter__(self) -> dict[str, str]:
        import tensorflow as tf

        for name, layer in self._named_layers:
            if "call" in vars(layer):  # wrapped already, or set by its owner
                continue
            original = type(layer).call.__get__(layer)

            def call(*args, _original=original, _name=name, **kwargs):
                self.scopes.setdefault(tf.get_current_name_scope(), _name)
                return _original(*args, **kwargs)

            object.__setattr__(layer, "call", call)
            self._wrapped.append(layer)
        return self.scopes

    def __exit__(self, *exc) -> None:
        for layer in self._wrapped:
            object.__delattr__(layer, "call")
        self._wrapped = []


class recording_layer_outputs:
    """Records which layer's ``call`` returned each tensor, during a trace.

    Sets an instance attribute ``call`` on each layer, as
    `recording_layer_scopes` does (``Layer.__call__`` looks ``self.call`` up
    on every call, Keras 3.15.1), that records the tensors the class's
    ``call`` returns; removed on exit. A subclassed model has no graph that
    says which layer produced its output; a traced call does.

    Usage: ``with recording_layer_outputs(pairs) as produced: trace()``;
    ``produced`` maps ``id(tensor)`` to the ``(name, layer)`` pair (the
    tensors are kept alive until exit, so the ids stay theirs).
    """

    def __init__(self, named_layers):
        self._named_layers = list(named_layers)
        self._wrapped: list = []
        self._alive: list = []
        self.produced: dict[int, tuple] = {}

    def __enter__(self) -> dict[int, tuple]:
        import keras

        for name, layer in self._named_layers:
            if "call" in vars(layer):  # wrapped already, or set by its owner
                continue
            original = type(layer).call.__get__(layer)

            def call(*args, _original=original, _pair=(name, layer), **kwargs):
                outputs = _original(*args, **kwargs)
                for tensor in keras.tree.flatten(outputs):
                    self._alive.append(tensor)
                    self.produced[id(tensor)] = _pair
                return outputs

            object.__setattr__(layer, "call", call)
            self._wrapped.append(layer)
        return self.produced

    def __exit__(self, *exc) -> None:
        for layer in self._wrapped:
            object.__delattr__(layer, "call")
        self._wrapped = []
        self._alive = []


def function_graphs(op) -> list:
    """The graphs of the functions a control-flow or call op runs.

    Reaches ``graph._get_function(name).graph`` (TF 2.21.0): an ``If``'s
    branches, a ``While``'s condition and body, a ``PartitionedCall``'s
    function are stored in the outer graph's function library by name; the
    public ``ConcreteFunction`` gives only the outer graph.

    Args:
        op: A ``tf.Operation`` of a ``FuncGraph``.

    Returns:
        ``(attribute, FuncGraph)`` pairs, [] for an op that calls no function.
    """
    graphs = []
    for attribute in ("then_branch", "else_branch", "cond", "body", "f"):
        try:
            name = op.get_attr(attribute).name
        except (ValueError, AttributeError):
            continue
        function = op.graph._get_function(name)
        if function is not None:
            graphs.append((attribute, function.graph))
    return graphs


# ------------------------------------------------------- Keras float8 layers

# The variables Keras's float8 Dense/EinsumDense create, per quantized tensor
# (``_float8_build`` in keras/src/layers/core/dense.py and einsum_dense.py,
# Keras 3.15.1): ``<kind>_scale`` and ``<kind>_amax_history``.
FLOAT8_KINDS = ("inputs", "kernel", "outputs_grad")


def float8_variables(layer, kind: str) -> tuple:
    """``(scale, amax_history)`` variables of a Keras float8 layer's tensor.

    Reaches the attributes ``_float8_build`` sets (``inputs_scale``,
    ``inputs_amax_history``, ...): no public accessor lists them. Keras 3.15.1.
    """
    return getattr(layer, f"{kind}_scale"), getattr(layer, f"{kind}_amax_history")


def float8_newest_amax(history_gradient):
    """The amax of this step from the "gradient" Keras returns for a history.

    Keras's float8 backward pass returns, as the gradient of an amax-history
    variable, ``keras.quantizers.compute_float8_amax_history(x, history)``:
    the history rolled left by one with this step's ``max(|x|)`` written at
    index 0 (Keras 3.15.1). tf_mixed reads that element to agree it across
    replicas; nothing public returns the step's amax.
    """
    return history_gradient[0]


@contextlib.contextmanager
def recording_quantized_calls(layers, records: dict):
    """Records ``(inputs, outputs)`` of each quantized layer's calls meanwhile.

    Keras runs a quantized layer through ``layer.quantized_call`` (from
    ``Layer.__call__``, Keras 3.15.1) instead of ``call``. An instance
    attribute wrapping it sees the layer's inputs and outputs; it is removed
    on exit, so the class's method applies again. Appends to
    ``records[index]`` for ``layers[index]``.
    """
    for index, layer in enumerate(layers):
        original = layer.quantized_call

        def recorder(inputs, *args, _index=index, _call=original, **kwargs):
            out = _call(inputs, *args, **kwargs)
            records.setdefault(_index, []).append((inputs, out))
            return out

        layer.quantized_call = recorder
    try:
        yield records
    finally:
        for layer in layers:
            layer.__dict__.pop("quantized_call", None)
# ------------------------------------------------ compensated bfloat16 updates


def optimizer_variable_index(optimizer, variable) -> int | None:
    """The index of a trainable variable in a built optimizer, or None.

    Reaches: ``BaseOptimizer._var_key`` (the TF optimizer resolves a
    replica's component to its distributed container there) and
    ``_trainable_variables_indices`` (Keras 3.15.1), which ``update_step``
    uses through ``_get_variable_index`` to find a variable's slots.

    Why: `tf_mixed.scaling.compensated` receives, in ``assign_sub``, the per-replica
    component of a variable (inside ``distribution.extended.update``) and
    needs the same index Keras uses for the slots, to find its buffer.
    """
    return optimizer._trainable_variables_indices.get(
        optimizer._var_key(variable))


def route_weight_decay_through_assign(optimizer) -> None:
    """Makes decoupled weight decay write through ``optimizer.assign_sub``.

    Reaches: ``TFOptimizer._apply_weight_decay`` and ``_use_weight_decay``
    (Keras 3.15.1, keras/src/backend/tensorflow/optimizer.py). Keras's TF
    version writes ``variable.assign_sub(variable * wd * lr)`` directly on the
    variable, bypassing the optimizer's ``assign_sub``.

    Why: on a bfloat16 weight ``lr * wd * w`` is far below the weight's
    spacing, so the decay is rounded away like a small update is; routed
    through ``assign_sub`` it gets the same compensation. The replacement is
    Keras's own code with that one call changed.
    """
    import keras
    import tensorflow as tf

    def apply_weight_decay(variables):
        if optimizer.weight_decay is None:
            return

        def distributed(distribution, variables, **kwargs):
            def decay(variable):
                if optimizer._use_weight_decay(variable):
                    lr = tf.cast(optimizer.learning_rate, tf.float32)
                    wd = tf.cast(optimizer.weight_decay, tf.float32)
                    optimizer.assign_sub(
                        variable, tf.cast(variable, tf.float32) * wd * lr)

            for variable in variables:
                if isinstance(variable, keras.Variable):
                    variable = variable.value
                distribution.extended.update(variable, decay, group=False)

        tf.__internal__.distribute.interim.maybe_merge_call(
            distributed, optimizer._distribution_strategy, variables)

    optimizer._apply_weight_decay = apply_weight_decay


def overwrite_only_averaged_variables(optimizer) -> None:
    """Makes EMA's overwrite skip the variables that have no moving average.

    Reaches: ``TFOptimizer._overwrite_model_variables_with_average_value`` and
    ``BaseOptimizer._model_variables_moving_average`` (Keras 3.15.1,
    keras/src/backend/tensorflow/optimizer.py). ``build`` keeps ``None`` as the
    average of a variable Keras overwrites with its gradient (float8 scales
    and amax histories); the base class's version skips those, the TF
    backend's assigns ``None`` and fails ("Attempt to convert a value (None)")
    at the end of ``fit`` (``finalize_variable_values``) and at every
    ``ema_overwrite_frequency``: with ``use_ema=True`` no float8 model can
    finish ``fit``, with Keras's wrapper or without one.

    Why: the fix is one skip in Keras's own code; nothing public reaches it.
    The replacement is Keras's TF version with that skip added.
    """
    import keras

    def overwrite(trainable_variables):
        for variable, average in zip(trainable_variables,
                                     optimizer._model_variables_moving_average):
            if average is None:
                continue
            if isinstance(variable, keras.Variable):
                variable = variable.value
            optimizer._distribution_strategy.extended.update(
                variable, lambda a, b: a.assign(b), args=(average,))

    optimizer._overwrite_model_variables_with_average_value = overwrite


# ------------------------------------------------------------ ModelCheckpoint


def keras_checkpoint_target(callback, epoch: int, batch: int | None, logs) -> str | None:
    """The file Keras's ModelCheckpoint would write now, or None for no save.

    Reaches: ``keras.callbacks.ModelCheckpoint._get_file_path`` and
    ``_should_save_model`` (Keras 3.15.1), the steps of its private
    ``_save_model`` before the write, which `tf_mixed.ModelCheckpoint`
    overrides to write a half-size file.

    Why: they hold what the name ``ModelCheckpoint`` means in Keras: the
    file name formatted from ``epoch``/``batch``/``logs``, ``mode="auto"``
    from the metric's direction, ``min_delta``-free improvement with
    ``initial_value_threshold``, the warning and the save when the monitored
    value is missing, the ``verbose`` messages. There is no public hook
    between "decide" and "write".
    """
    filepath = callback._get_file_path(epoch, batch, logs)
    if callback._should_save_model(epoch, batch, logs, filepath):
        return filepath
    return None


# ------------------------------------------------------------ weights files


def keras_weight_keys(model) -> dict[int, str]:
    """Where Keras's own ``save_weights`` puts each variable, by ``id``.

    Reaches: ``keras.src.saving.saving_lib._save_state`` and ``NpzIOStore``
    (Keras 3.15.1), the walk behind ``model.save_weights("x.weights.h5")``.
    It names each layer by its place in the model (class-name based names
    made unique within their container, attribute names of a subclassed
    model), never by the process-wide layer name, and each layer stores its
    variables as ``"0"``, ``"1"``, ...; the key returned is the HDF5 dataset
    name Keras writes, e.g. ``"layers/dense_1/vars/0"``.

    Why: no public function gives these names, and a copy of the walk would
    drift from Keras's. The walk runs with a store that records what each
    layer hands it (a dict per path, nothing written) and skips the
    optimizer (its state is not a model variable; Keras skips objects the
    same way with ``objects_to_skip``).

    Args:
      model: A built Keras model.

    Returns:
      ``{id(variable): key}`` for every variable a layer stores as itself.
      A layer that stores a computed value instead (a LoRA-enabled layer's
      merged kernel) leaves its variables out.
    """
    import keras
    from keras.src.saving import saving_lib

    class _Recorder(saving_lib.NpzIOStore):  # the type _save_state accepts
        def __init__(self):  # no file: one dict per path, kept here
            self.contents: dict[str, dict] = {}

        def make(self, path, metadata=None):
            self.contents[path] = {}
            return self.contents[path]

    recorder = _Recorder()
    skip = {id(model.optimizer)} if getattr(model, "optimizer", None) is not None else set()
    saving_lib._save_state(model, weights_store=recorder, assets_store=None,
                           inner_path="", visited_saveables=skip)
    keys: dict[int, str] = {}
    for path, store in recorder.contents.items():
        for name, value in store.items():
            if isinstance(value, keras.Variable):
                keys.setdefault(id(value), "/".join(p for p in (path, "vars", name) if p))
    return keys


def model_being_restored(owns: Callable[[Any], bool]):
    """The model whose saved state Keras or TensorFlow is restoring now, if ``owns`` it.

    Reaches: ``keras.src.saving.saving_lib._load_state`` (Keras 3.15.1), the
    walk behind ``model.load_weights`` (``.weights.h5`` and ``.keras``) and
    ``keras.saving.load_model``: it calls a model's ``load_own_variables``,
    then each child's, the ``optimizer`` among them, handing each only its own
    entries. And the frames of ``tf.train.Checkpoint.read`` / ``restore``
    (TensorFlow 2.21.0), which restore each object's values before they
    return (eagerly); the checkpoint's direct children are looked at.

    Why: no public API tells an optimizer's ``load_own_variables`` or a
    checkpoint child's restore which model the state is being restored
    into, and the healed set the optimizer's state holds moves that model's
    layers at once (docs/healing.md). The restore's own frames say it: the
    innermost ``_load_state`` whose ``saveable`` is a model ``owns`` accepts,
    or the innermost ``tf.train.Checkpoint`` being read that holds one.

    Args:
      owns: ``owns(model) -> bool``: whether ``model`` is the one wanted
        (for an optimizer: ``model.optimizer is optimizer``), so a model
        that does not own the state is never returned.

    Returns:
      The model, or None (no restore under way, or none of its models owned).
    """
    import sys

    import keras
    import tensorflow as tf
    from keras.src.saving import saving_lib

    load_state = saving_lib._load_state.__code__
    frame: Any = sys._getframe(1)
    candidates: list = []
    while frame is not None:
        code = frame.f_code
        candidates = []
        if code is load_state:
            candidates = [frame.f_locals.get("saveable")]
        elif code.co_name in ("read", "restore"):
            reading = frame.f_locals.get("self")
            if isinstance(reading, tf.train.Checkpoint):
                candidates = list(trackable_children(reading).values())
        for candidate in candidates:
            if isinstance(candidate, keras.Model) and owns(candidate):
                return candidate
        frame = frame.f_back
    return None


def checkpoint_being_read() -> bool:
    """Whether a ``tf.train.Checkpoint`` ``read`` / ``restore`` is under way now.

    Reaches: the frames of ``tf.train.Checkpoint.read`` / ``restore``
    (TensorFlow 2.21.0), as `model_being_restored` does. TensorFlow asks each
    object for its checkpoint children (``_trackable_children``) both when it
    saves and when it restores, and hands a value only to a child listed then.

    Why: an optimizer with no healing attached lists a child that takes a
    restored healed set and the attribution's counters during a read only,
    so a save of an optimizer that never held them writes nothing new
    (docs/healing.md). No public API says whether a listing is for a save or
    a restore.

    Returns:
      True inside a ``tf.train.Checkpoint`` read or restore, else False.
    """
    import sys

    import tensorflow as tf

    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("read", "restore") and isinstance(
                frame.f_locals.get("self"), tf.train.Checkpoint):
            return True
        frame = frame.f_back
    return False


def variables_read_so_far():
    """The variables the ``tf.function`` being traced has read so far, or None.

    ``FuncGraph.variables`` is filled only once tracing ends; while a step is
    traced, TensorFlow keeps the variables read so far in
    ``FuncGraph._watched_variables`` (every read, trainable or not; checked on
    TensorFlow 2.21.0). Used to find forward state (BatchNormalization
    statistics) a step wrote and no rollback protects. None when executing
    eagerly (no graph is traced).
    """
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    watched = getattr(graph, "_watched_variables", None)
    if tf.executing_eagerly() or watched is None:
        return None
    return list(watched)


# ------------------------------------------------------------- checkpoints


def set_checkpoint_children(cls, children: Callable[[Any, dict], dict]) -> None:
    """Makes ``children(obj, default)`` list the checkpoint children of ``cls``.

    TensorFlow's ``tf.train.Checkpoint`` asks an object for its children with
    the private ``Trackable._trackable_children(save_type, **kwargs)``, when it
    saves and again when it restores (checked on TensorFlow 2.21.0; Keras's
    ``TFOptimizer`` is an ``AutoTrackable`` that lists its attributes). No
    public hook names an object's checkpoint children; ``setattr`` tracking
    cannot give a wrapper its inner optimizer's children under the same names.
    Only ``save_type="checkpoint"`` changes; a SavedModel sees ``default``.

    Args:
        cls: A Keras optimizer class (a ``Trackable``).
        children: ``(obj, default) -> dict`` of name to trackable, where
            ``default`` is what ``cls``'s base class lists.
    """
    base = cls._trackable_children

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        default = base(self, save_type, **kwargs)
        if save_type != "checkpoint":
            return default
        return children(self, dict(default))

    _trackable_children.__doc__ = children.__doc__
    cls._trackable_children = _trackable_children


def trackable_children(obj) -> dict:
    """``obj``'s checkpoint children (``Trackable._trackable_children``).

    What ``tf.train.Checkpoint`` would save under ``obj`` (see
    `set_checkpoint_children`); checked on TensorFlow 2.21.0.
    """
    return dict(obj._trackable_children("checkpoint"))


def checkpoint_alias(variable):
    """A checkpoint child that saves ``variable`` again and restores into it.

    A checkpoint holds one node per Python object, and a restore writes each
    object from the first node that reaches it, shallowest first
    (``CheckpointPosition._single_restore`` marks the object with the
    restore's ``_update_uid`` and skips it after). So when ``variable`` is a
    child under two names and an older checkpoint holds two *different*
    values there, the shallower one wins. The alias is a second object: it
    saves ``variable``'s value under its own node (written as a variable's,
    so a plain optimizer restores it), and on restore writes ``variable``
    only if no other node of the same restore wrote it. It implements the
    private ``Trackable._serialize_to_tensors`` / ``_restore_from_tensors``
    (TensorFlow's documented way to checkpoint a custom object) and
    ``_copy_trackable_to_cpu`` (asynchronous checkpoints), and reads
    the private ``_update_uid``; checked on TensorFlow 2.21.0.

    Args:
        variable: A Keras or TF variable.

    Returns:
        A ``Trackable`` to list as a checkpoint child.
    """
    import tensorflow as tf

    class CheckpointAlias(tf.__internal__.tracking.Trackable):
        def __init__(self, target):
            self._target = target

        def _serialize_to_tensors(self):
            return self._target._serialize_to_tensors()

        def _restore_from_tensors(self, restored_tensors):
            # Both uids are set when the restore gathers its objects, before
            # any value is written: equal means a deeper node of this same
            # restore holds the variable's own value, which wins.
            if getattr(self._target, "_update_uid", None) == self._update_uid:
                return tf.no_op()
            return self._target._restore_from_tensors(restored_tensors)

        def _copy_trackable_to_cpu(self, object_map):
            # Async checkpoints save a CPU copy: the alias of the copy.
            if self in object_map:
                return
            inner = (self._target if isinstance(self._target, tf.Variable)
                     else self._target.value)
            if inner not in object_map:
                inner._copy_trackable_to_cpu(object_map)
            object_map[self] = CheckpointAlias(object_map[inner])

    return CheckpointAlias(variable)


def restore_deferred(parent, name: str, child) -> None:
    """Restores into ``child`` what a checkpoint read earlier holds for ``parent``'s
    child ``name`` (``Trackable._handle_deferred_dependencies``).

    A ``tf.train.Checkpoint`` read before a child existed keeps that child's
    values queued on the parent; TensorFlow hands them over only to children
    added with ``_track_trackable``, not to those a ``_trackable_children``
    override lists later (the optimizer's attribution state). Checked on
    TensorFlow 2.21.0.
    """
    parent._handle_deferred_dependencies(name, child)


def checkpoint_value(save: Callable[[], dict], restore: Callable[[dict], None]):
    """A checkpoint child whose value ``save()`` makes and ``restore`` takes.

    For state that is not one variable (every replica's copy of a buffer,
    gathered across workers at save time). It implements the private
    ``Trackable._serialize_to_tensors`` / ``_restore_from_tensors``
    (TensorFlow's documented way to checkpoint a custom object); checked on
    TensorFlow 2.21.0, and ``_copy_trackable_to_cpu`` (asynchronous
    checkpoints save the values of the moment). Both run eagerly
    (``tf.train.Checkpoint.write`` and ``restore`` in eager mode).

    Args:
        save: ``() -> {name: tensor}``, called at every save.
        restore: ``({name: tensor}) -> None``, called at restore (or when
            the child is first listed after a deferred restore).

    Returns:
        A ``Trackable`` to list as a checkpoint child.
    """
    import tensorflow as tf

    class CheckpointValue(tf.__internal__.tracking.Trackable):
        def __init__(self, save):
            self._save = save

        def _serialize_to_tensors(self):
            return self._save()

        def _restore_from_tensors(self, restored_tensors):
            restore(restored_tensors)
            return tf.no_op()

        def _copy_trackable_to_cpu(self, object_map):
            # Async checkpoints save a copy: the values as they are now.
            if self not in object_map:
                values = {name: tf.identity(tensor) for name, tensor in self._save().items()}
                object_map[self] = CheckpointValue(lambda: values)

    return CheckpointValue(save)
