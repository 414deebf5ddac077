"""Facts about mixed precision that several modules need, each kept once."""

# `auditing` (what is wrong), `conversion` (how to fix it), `probing`, the
# policy parser and the set-up checks of `callbacks` read the same tables and
# tests here, so the advice one gives is what the other does.
# tests/internal/test_facts.py fails when a module restates a table (tuple, list, set
# or dict) instead of importing it.
#
# Keras (and NumPy) are imported inside the functions that need them, so
# `tf_mixed.policy.autotune` and the command line read the tables without loading them.

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

if TYPE_CHECKING:
    import keras

# Policy names. Every name `tf_mixed.enable` accepts, mapped to the Keras
# policy it means: canonical names first, then short aliases ("auto" resolves
# per host).
AUTO = "auto"
FLOAT32 = "float32"
MIXED_FLOAT16 = "mixed_float16"
MIXED_BFLOAT16 = "mixed_bfloat16"
# Pure bfloat16: variables too (Keras's name). No short alias: "bf16" stays
# mixed_bfloat16 (CHANGELOG.md, issue 21), so no name means two things.
BFLOAT16 = "bfloat16"
POLICY_ALIASES = {
    AUTO: AUTO,
    MIXED_FLOAT16: MIXED_FLOAT16,
    MIXED_BFLOAT16: MIXED_BFLOAT16,
    FLOAT32: FLOAT32,
    BFLOAT16: BFLOAT16,
    "fp16": MIXED_FLOAT16,
    "bf16": MIXED_BFLOAT16,
    "fp32": FLOAT32,
}
# Every name `tf_mixed.enable` accepts: canonical names first, then short aliases.
POLICY_NAMES: tuple[str, ...] = tuple(POLICY_ALIASES)

# The dtype each concrete policy computes in.
COMPUTE_DTYPES = {FLOAT32: "float32", MIXED_BFLOAT16: "bfloat16",
                  MIXED_FLOAT16: "float16"}

# The reduced-precision float dtypes a layer can compute in.
HALF_DTYPES = ("float16", "bfloat16")

# What to do when training steps keep failing, per dtype the model computes
# in: one table, so the monitor and the probe never tell a bfloat16 or
# float32 run a float16 fix (or a run without a loss scale to change one).
class Fixes(NamedTuple):
    """One dtype's fixes: ``overflow`` (steps keep being skipped) and
    ``no_scale`` (a non-finite loss or weight under an optimizer that does not
    scale the loss)."""

    overflow: str
    no_scale: str


POLICY_FIXES = {
    "float16": Fixes(
        overflow=("look for float16 overflow in the forward pass "
                  "(tf_mixed.audit(model) lists risky layers), keep "
                  "softmax/normalisation in float32, lower the learning rate, "
                  "or train in mixed_bfloat16 (float32's range)"),
        no_scale=("scale the loss with tf_mixed.wrap_optimizer(...) "
                  "(float16), lower the learning rate, and make the model's "
                  "outputs float32 (tf_mixed.audit(model) lists risky layers)"),
    ),
    "bfloat16": Fixes(
        overflow=("bfloat16 has float32's range, so this is no half-precision "
                  "overflow and no loss scale would help: look for NaN/inf or "
                  "huge values in the data (logs['skip_reason'] says why each "
                  "step was skipped), lower the learning rate or clip the "
                  "gradients, and keep softmax/normalisation in float32 "
                  "(tf_mixed.audit(model) lists risky layers)"),
        no_scale=("bfloat16 needs no loss scale: lower the learning rate or "
                  "clip the gradients, look for NaN/inf in the data, and make "
                  "the model's outputs float32 (tf_mixed.audit(model) lists "
                  "risky layers)"),
    ),
    "float32": Fixes(
        overflow=("the model computes in float32, so this is not a precision "
                  "problem: look for NaN/inf or huge values in the data "
                  "(logs['skip_reason'] says why each step was skipped), lower "
                  "the learning rate or clip the gradients"),
        no_scale=("the model computes in float32, so this is not a precision "
                  "problem: lower the learning rate or clip the gradients, and "
                  "look for NaN/inf in the data"),
    ),
}


def policy_fix(compute_dtype: str, problem: str) -> str:
    """The fix `POLICY_FIXES` gives for ``problem`` to a model computing in ``compute_dtype``.

    Args:
        compute_dtype: "float16", "bfloat16" or "float32" (anything else reads
            as float32).
        problem: "overflow" or "no_scale".

    Returns:
        The advice, a sentence fragment starting in lower case.
    """
    return getattr(POLICY_FIXES.get(compute_dtype, POLICY_FIXES["float32"]), problem)


def narrowest_compute_dtype(model) -> str:
    """The narrowest dtype any layer of ``model`` computes in.

    "float16" if any layer computes in float16, else "bfloat16" if any does,
    else "float32": the range that can overflow first.
    """
    dtypes = {getattr(layer, "compute_dtype", None) for _, layer in walk_layers(model)}
    dtypes.add(getattr(model, "compute_dtype", None))
    for dtype in HALF_DTYPES:
        if dtype in dtypes:
            return dtype
    return "float32"


# The multiple a matrix dimension needs to fill the hardware's tiles, per
# half dtype: float16 Tensor Cores take multiples of 8; Intel AMX tiles (and
# float8 Tensor Cores) take multiples of 16 bfloat16 elements. `audit` checks
# layer attributes against 8; `census` checks traced shapes against these.
TILE_MULTIPLES = {"float16": 8, "bfloat16": 16}

# Class names of tf_mixed's float32 heads (tf_mixed.layers): float32 by
# design, so they are neither converted nor reported as explicit float32.
FLOAT32_HEADS = ("OutputActivation", "Float32Output")
# What they save as (`tf_mixed.layers`): a `.keras` file loads them as Keras's
# own Activation / Identity with a float32 policy.
SAVED_FLOAT32_HEADS = ("Activation", "Identity")


def is_float32_head(layer: Any, *, output: bool) -> bool:
    """Whether ``layer`` is a float32 head: one of tf_mixed's (`FLOAT32_HEADS`),
    or, where it produces a model output (``output``), a Keras ``Activation``
    or ``Identity`` computing in float32 (what tf_mixed's heads load as)."""
    cls = type(layer).__name__
    if cls in FLOAT32_HEADS:
        return True
    return (output and cls in SAVED_FLOAT32_HEADS
            and getattr(getattr(layer, "dtype_policy", None), "name", None) == "float32")

# Activations that squash logits into probabilities (or their log). Computed
# in half precision as a model output they saturate and hide the logits from
# Keras's exact cross-entropy, so they belong in a float32 head.
SQUASHING_ACTIVATIONS = ("softmax", "sigmoid", "log_softmax")

# Dtype policies whose layers compute in a float type: the ones `convert`
# may switch to a mixed policy, and `probe` may compare against float32.
FLOAT_POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16")

# Serving artifacts `tf_mixed.export` writes, and format -> the precisions it
# can write (`tf_mixed.serving.exporting`; the command line checks --format and
# --precision against them before TensorFlow loads). A LiteRT file computes in
# float32 (its builtin kernels); "float16_weights" stores the weights in
# float16. A SavedModel computes in the precision written, inputs as the model
# declares them and outputs in float32.
EXPORT_FORMATS = ("saved_model", "litert")
EXPORT_PRECISIONS = {
    "saved_model": ("float32", "float16", "bfloat16", "as_trained"),
    "litert": ("float32", "float16_weights", "as_trained"),
}


def export_precision_problem(format: str, precision: str) -> str:
    """Why ``format`` cannot write ``precision`` ("" when it can).

    Args:
      format: One of `EXPORT_FORMATS`.
      precision: A precision name as given.

    Returns:
      "" when `EXPORT_PRECISIONS` lists ``precision`` for ``format``; else a
      clause: "it is a saved_model precision", or "the precisions are ...".
    """
    if precision in EXPORT_PRECISIONS[format]:
        return ""
    fit = [f for f in EXPORT_FORMATS if precision in EXPORT_PRECISIONS[f]]
    if fit:
        return f"it is a {' or '.join(fit)} precision"
    known = sorted({p for ps in EXPORT_PRECISIONS.values() for p in ps})
    return f"the precisions are {', '.join(known)}"


def half_policy(compute_dtype: str) -> str | None:
    """The mixed policy computing in ``compute_dtype`` ("float16" ->
    "mixed_float16"), or None for a dtype no mixed policy computes in."""
    for name, dtype in COMPUTE_DTYPES.items():
        if dtype == compute_dtype and dtype in HALF_DTYPES:
            return name
    return None


def is_input_layer(layer: Any) -> bool:
    """Whether ``layer`` is a Keras ``InputLayer`` (a placeholder, no compute)."""
    import keras

    return isinstance(layer, keras.layers.InputLayer)


def check_model_kind(model: Any, caller: str, *, traced: bool = True,
                     why_traced: str = "", fix: str = "", hint: str = "") -> None:
    """Refuses what ``caller`` cannot work on, with the one message for it.

    Args:
      model: what the user passed.
      caller: the function named in the message, e.g. "probe()".
      traced: whether ``caller`` needs a Sequential or functional model (a
        graph of layers); False accepts subclassed models too.
      why_traced: why a subclassed model cannot be used (a clause).
      fix: what to do instead, for a subclassed model (a sentence).
      hint: appended to the message for a non-model.

    Raises:
      TypeError: ``model`` is not a ``keras.Model``, or (``traced``) a
        subclassed model.
      ValueError: (``traced``) a Sequential model that is not built.
    """
    import keras

    kinds = "Sequential or functional" if traced else (
        "Sequential, functional or subclassed")
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"{caller} needs a keras.Model ({kinds}). Received: model="
            f"{model!r} (of type {type(model).__name__}).{hint}")
    if not traced or model_inputs_and_outputs(model):
        return
    if isinstance(model, keras.Sequential):
        raise ValueError(
            f"Sequential model '{model.name}' is not built, so {caller} has "
            "no inputs to work from. Build it first (add a keras.Input or "
            "call model.build(input_shape)).")
    # One sentence: what is wrong, why, and the change to make.
    raise TypeError(
        f"{caller} cannot use the subclassed model '{model.name}' (class "
        f"{type(model).__name__}) because {why_traced}: {fix[:1].lower()}{fix[1:]}")


def model_inputs_and_outputs(model: Any) -> bool:
    """Whether ``model`` has symbolic inputs and outputs (a traced graph)."""
    try:
        return bool(model.inputs) and bool(model.outputs)
    except (AttributeError, ValueError):
        return False


def activation_name(layer) -> str | None:
    """The name of the activation a layer applies last, or None.

    Args:
      layer: a Keras layer.

    Returns:
      "softmax" for a ``Softmax`` layer; the function name of its
      ``activation`` attribute (Dense, Conv, Activation, ...); None when the
      layer has no named activation.
    """
    if type(layer).__name__ == "Softmax":
        return "softmax"
    name = getattr(getattr(layer, "activation", None), "__name__", None)
    return name if isinstance(name, str) else None


def walk_layers(model, prefix: str = "") -> Iterator[tuple[str, keras.Layer]]:
    """Every layer of a model, depth first, entering nested models.

    Semantics, which every caller relies on:

    * pre-order: a nested model is yielded itself, then its own layers;
    * names are qualified by the enclosing models, ``outer/inner`` (the
      top-level layers keep their plain name);
    * only models are entered (``keras.Model``); other layers that hold
      layers (wrappers such as ``Bidirectional``) are yielded as one layer;
    * a layer shared by several models is yielded once per place it appears.

    Callers that want leaf layers only filter out ``keras.Model``.

    Args:
      model: a `keras.Model`.
      prefix: prepended to every name (used for the recursion).

    Yields:
      (qualified name, layer) pairs.
    """
    import keras

    for layer in model.layers:
        name = prefix + layer.name
        yield name, layer
        if isinstance(layer, keras.Model):
            yield from walk_layers(layer, name + "/")


# The names keras.applications gives its models (the function's architecture,
# lower-cased; MobileNet adds its width and input size: "mobilenetv2_1.00_224").
_APPLICATION_NAME = re.compile(
    r"^(resnet\d+(v2)?|resnet_rs_\d+|mobilenet(v2|v3small|v3large)?(_[\d.]+_\d+)?|"
    r"efficientnet(b\d|v2-?[bsml]\d?)|densenet\d+|vgg1[69]|inception_v3|"
    r"inception_resnet_v2|xception|nasnet(mobile|large)?|convnext_\w+|regnet\w+)$")


def published_origin(layer) -> str:
    """"keras.applications" or "KerasHub" for a model or layer of a published
    architecture (its widths fixed by the design and its pretrained weights), else "".

    A KerasHub object is known by its class's module (``keras_hub``); a
    keras.applications model, a functional model of plain Keras layers, by the
    name the application function gives it (reloaded models keep it).
    """
    import keras

    if type(layer).__module__.split(".")[0] == "keras_hub":
        return "KerasHub"
    if (isinstance(layer, keras.Model) and type(layer).__module__.startswith("keras")
            and _APPLICATION_NAME.match(layer.name.lower())):
        return "keras.applications"
    return ""


def published_layers(model) -> dict[str, str]:
    """Qualified layer name (`walk_layers`) -> its published origin (`published_origin`),
    for every layer of ``model`` inside a published architecture (the model itself,
    a nested model, or a KerasHub layer), else not listed."""
    origin = published_origin(model)
    found: dict[str, str] = {}
    inside: list[tuple[str, str]] = []  # (qualified prefix, origin) of published sub-models
    for name, layer in walk_layers(model):
        here = origin or next((o for p, o in inside if name.startswith(p)), "")
        here = here or published_origin(layer)
        if here:
            found[name] = here
            inside.append((name + "/", here))
    return found


def layer_outputs(layer) -> list:
    """Symbolic outputs of every call of `layer` in a graph ([] if none).

    Args:
      layer: a layer of a Sequential/functional model.

    Returns:
      A list of KerasTensors (anything without shape and dtype dropped).
    """
    import keras

    from tf_mixed._internal import shims as _internals

    outputs = _internals.call_outputs(layer)
    if not outputs:
        try:
            outputs = keras.tree.flatten(layer.output)
        except (AttributeError, ValueError, RuntimeError):
            outputs = []
    return [t for t in outputs if hasattr(t, "shape") and hasattr(t, "dtype")]


def model_outputs(model) -> list:
    """The symbolic outputs of a Sequential/functional model, flat.

    Args:
      model: a `keras.Model`.

    Returns:
      A list of KerasTensors; [] for a subclassed or unbuilt model.
    """
    import keras

    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return []
    return list(keras.tree.flatten(outputs)) if outputs else []

class DtypeLimits(NamedTuple):
    """A float format's limits, read from ml_dtypes' `finfo` (never written by hand).

    Attributes:
        max: the largest finite value (65504 for float16).
        smallest_normal: the smallest positive normal value.
        smallest_subnormal: the smallest positive value at all; below half of
            it a value flushes to zero.
        eps: the gap between 1 and the next value.
        largest_exact_integer: every integer up to this is exact (2**(mantissa
            bits + 1)): 256 for bfloat16, 2048 for float16.
    """

    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    largest_exact_integer: int


def dtype_limits(dtype: str) -> DtypeLimits:
    """The limits of a float format by name ("float16", "bfloat16", "float8_e4m3fn", ...).

    Args:
        dtype: a float dtype name NumPy or ml_dtypes knows.

    Returns:
        Its `DtypeLimits`, from ``ml_dtypes.finfo``.

    Raises:
        ValueError: ``dtype`` names no float format.
    """
    import ml_dtypes  # declared in pyproject; TensorFlow and Keras depend on it too
    import numpy as np

    name = str(dtype)
    try:
        info = ml_dtypes.finfo(getattr(ml_dtypes, name, None) or np.dtype(name))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"dtype must name a float format, such as 'float16' or 'bfloat16'. "
            f"Received: dtype={dtype!r}") from error
    return DtypeLimits(
        max=float(info.max), smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_subnormal), eps=float(info.eps),
        largest_exact_integer=2 ** (int(info.nmant) + 1))


# Machine epsilon (the gap between 1 and the next float) of each float dtype.
# `tf_mixed.export` derives its default parity tolerances from these. Made on
# first use (`__getattr__`): reading it imports NumPy and ml_dtypes, which the
# command line's --help and argument checks (they read this module) do without.
EPSILON: dict[str, float]


def __getattr__(name: str) -> Any:
    if name == "EPSILON":
        table = {dtype: dtype_limits(dtype).eps for dtype in ("float32", "float16", "bfloat16")}
        globals()["EPSILON"] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def largest_exact_integer(dtype: str) -> int:
    """The largest N such that every integer from 0 to N is exact in ``dtype``.

    ``2 ** (stored mantissa bits + 1)``, read from ``ml_dtypes.finfo``:
    bfloat16 256, float16 2048, float32 16,777,216. Token ids above it, fed
    as floats, are rounded when a layer casts them to ``dtype``.
    """
    return dtype_limits(dtype).largest_exact_integer


def index_layers(layer) -> list:
    """The ``Embedding`` layers `layer` is or holds: layers that read their input as indices."""
    import keras

    from tf_mixed._internal import shims as _internals

    return [inner for inner in _internals.sublayers(layer)
            if isinstance(inner, keras.layers.Embedding)]


def rounded_ids(layer, tensor, compute_dtype: str | None = None) -> tuple[int, int] | None:
    """Whether `layer` rounds the token ids `tensor` carries on their way in.

    True when `tensor` is float data straight from a model input (a
    ``keras.Input``), `layer` computes in half precision (so Keras casts the
    tensor to that dtype before its ``call``), and `layer` is or holds an
    ``Embedding`` whose largest id (``input_dim - 1``) that dtype cannot
    represent exactly (`largest_exact_integer`).

    Args:
      layer: a layer called on `tensor`.
      tensor: a symbolic tensor (a KerasTensor of a functional graph).
      compute_dtype: the dtype `layer` would compute in (None: its own).

    Returns:
      ``(input_dim, largest exact integer)`` when the ids are rounded, else None.
    """
    import keras

    from tf_mixed._internal import shims as _internals

    compute = keras.backend.standardize_dtype(compute_dtype or layer.compute_dtype)
    if compute not in HALF_DTYPES or "float" not in keras.backend.standardize_dtype(
            getattr(tensor, "dtype", "int32")):
        return None
    history = _internals.keras_history(tensor)
    if history is None or not is_input_layer(history.operation):
        return None
    dims = [inner.input_dim for inner in index_layers(layer)]
    limit = largest_exact_integer(compute)
    if not dims or max(dims) - 1 <= limit:
        return None
    return max(dims), limit


# Keras 3 normalization layers that compute their statistics in float32
# whatever their compute dtype (measured: inputs of +-300 normalise correctly
# in float16): their variables never meet the half dtype's range.
FLOAT32_STATISTICS_NORMS = ("BatchNormalization", "LayerNormalization", "GroupNormalization",
                            "RMSNormalization")


class Evidence(NamedTuple):
    """A numerics-catalog claim behind one of `tf_mixed.enable`'s float32 defaults.

    Attributes:
        default: what enable() does ("Normalization: kept float32").
        row: the catalog row (``Layer[config]``, docs/catalog.md).
        policy: the half policy the claim is about.
        magnitudes: max |input| values the layer meets in practice.
        safe: whether the row is safe at every one of them.
    """

    default: str
    row: str
    policy: str
    magnitudes: tuple[float, ...]
    safe: bool


# enable()'s float32 defaults and the catalog rows that justify them (and the
# normalizations it leaves in half precision, with theirs). Checked on the stored
# catalog and, measured afresh, on the installed Keras by
# tests/policy/test_keep_float32_catalog.py, so a Keras release that fixes or
# breaks one of these shows up as a failing test, not as a stale rule.
CATALOG_EVIDENCE: tuple[Evidence, ...] = (
    # Adapted statistics: a raw feature ~1e4 wide has a variance above 65504.
    Evidence("Normalization: kept float32", "Normalization[adapted]", MIXED_FLOAT16,
             (1e4,), False),
    # Bin boundaries rounded to float16 move small values into other bins.
    Evidence("Discretization: kept float32", "Discretization[adapted]", MIXED_FLOAT16,
             (1e-2,), False),
    # Float ids above 2048 (float16) / 256 (bfloat16) become other ids.
    Evidence("float token ids into an Embedding: kept float32", "Embedding[float ids]",
             MIXED_FLOAT16, (1e4,), False),
    Evidence("float token ids into an Embedding: kept float32", "Embedding[float ids]",
             MIXED_BFLOAT16, (1e3,), False),
    # Squashing outputs saturate: the float32 head (and fact 3, the loss's logits shortcut).
    Evidence("softmax output: a float32 head", "Activation[activation=softmax]", MIXED_FLOAT16,
             (1e2,), False),
    Evidence("softmax output: a float32 head", "Activation[activation=softmax]",
             MIXED_BFLOAT16, (1e2,), False),
    Evidence("sigmoid output: a float32 head", "Activation[activation=sigmoid]", MIXED_FLOAT16,
             (1e3,), False),
    Evidence("sigmoid output: a float32 head", "Activation[activation=sigmoid]",
             MIXED_BFLOAT16, (1e4,), False),
    # log_softmax is safe as a layer; its head is for the loss's logits shortcut (fact 3).
    Evidence("log_softmax output: a float32 head", "Activation[activation=log_softmax]",
             MIXED_FLOAT16, (1e-3, 1e2), True),
    # FLOAT32_STATISTICS_NORMS stay in half precision: their statistics are float32 inside.
    *(Evidence(f"{name}: left in half precision", row, policy, (1e-3, 1e3), True)
      for name, row in (("BatchNormalization", "BatchNormalization[batch statistics]"),
                        ("LayerNormalization", "LayerNormalization[epsilon=1e-6]"),
                        ("GroupNormalization", "GroupNormalization[groups=4, epsilon=1e-5]"),
                        ("RMSNormalization", "RMSNormalization[epsilon=1e-6]"))
      for policy in (MIXED_FLOAT16, MIXED_BFLOAT16)),
)


def keeps_float32_statistics(layer) -> bool:
    """Whether `layer` computes with statistics adapted to data: stays float32.

    Keras's ``Normalization`` (mean and variance: a feature ~1e4 wide has a
    variance above float16's 65504, which becomes inf, and the feature's
    output 0) and ``Discretization`` (bin boundaries, rounded in half
    precision, move values into other bins). `tf_mixed.enable` (for layers
    created with ``dtype=None``) and `tf_mixed.convert` keep them in float32;
    their variables are float32 under a mixed policy either way. The
    lookups (``StringLookup``, ``IntegerLookup``) compute on strings and
    integers: the policy does not touch them.
    """
    import keras

    return isinstance(layer, (keras.layers.Normalization, keras.layers.Discretization))


def out_of_range(layer, compute_dtype: str | None = None) -> tuple[str, float, float] | None:
    """A value `layer` computes with that its half compute dtype cannot hold.

    Reads the layer's own float variables (not those of the normalization
    layers that compute in float32 anyway, `FLOAT32_STATISTICS_NORMS`) and,
    for a ``Normalization``, the
    ``mean`` and ``variance`` it computes with (rebuilt from the adapted
    statistics, or given to its constructor). Keras casts them to the
    compute dtype at each call: a value above that dtype's largest finite
    value becomes inf there (an adapted Normalization then outputs 0 for
    that feature, silently).

    Args:
        layer: a built layer.
        compute_dtype: the dtype it computes in (or would); None: its own.

    Returns:
        ``(what, largest magnitude, the dtype's largest value)`` for the
        first value out of range (``what`` names the variable or attribute),
        or None when all fit or the dtype is not a half dtype.
    """
    import keras

    dtype = keras.backend.standardize_dtype(compute_dtype or layer.compute_dtype)
    if dtype not in HALF_DTYPES or type(layer).__name__ in FLOAT32_STATISTICS_NORMS:
        return None
    limit = dtype_limits(dtype).max
    values = [(w.path.rsplit("/", 1)[-1], w) for w in layer.weights
              if "float" in keras.backend.standardize_dtype(w.dtype)]
    if isinstance(layer, keras.layers.Normalization):
        # Given to the constructor: read as given (``layer.mean`` is already
        # cast to the compute dtype, where a value out of range is inf).
        given = layer.input_mean is not None
        values += [(name, getattr(layer, f"input_{name}" if given else name, None))
                   for name in ("mean", "variance")]
    for what, value in values:
        if value is None:
            continue
        largest = _largest_finite(value)
        if largest > limit:
            return what, largest, limit
    return None


def _largest_finite(value) -> float:
    """The largest finite magnitude in ``value`` (0.0 for none), reduced where it lives.

    One scalar comes to the host: `LossScaleMonitor` runs this check over
    every weight at each ``fit``'s start, and a host copy of every weight
    (in float64) cost ~60 ms and ~75 MB of allocations per ``fit`` on the
    overhead suite's mlp.
    """
    import keras

    x = keras.ops.convert_to_tensor(value)
    if not keras.backend.is_float_dtype(x.dtype):
        x = keras.ops.cast(x, "float64")
    if not keras.ops.size(x):
        return 0.0
    x = keras.ops.abs(x)
    return float(keras.ops.max(keras.ops.where(keras.ops.isfinite(x), x,
                                               keras.ops.zeros_like(x))))
