"""The layer configurations the catalog measures, and the classes it leaves out with why."""

# One `Case` per configuration: a class in a common set-up (small epsilons, large
# units, masks, batch statistics, a large mean with a small spread), its input
# shapes and how it is called. `keras_cases()` covers every class of
# `keras.layers` that computes on floating-point inputs under TensorFlow;
# `LEFT_OUT` names every other class with the reason (docs/catalog.md prints both,
# and tests/tools/catalog/test_registry.py checks that the two together are the
# whole of `keras.layers` on the installed Keras, with `NO_FLOAT_COMPUTE`, the
# classes without arithmetic a policy changes). `hub_cases()` adds KerasHub's
# layers when it is installed; `user_case` measures a user's own class.
#
# Shapes are small on purpose: the error of a layer comes from its arithmetic
# (the length of its sums, its statistics), not from its size, except where
# size is the point ("units=4096", "inputs=4096").

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Case", "LEFT_OUT", "NO_FLOAT_COMPUTE", "hub_cases", "is_selecting", "keras_cases",
           "left_out", "resolve", "user_case"]

DISTRIBUTIONS = ("centered", "positive", "offset", "ids")


def default_call(layer, inputs: list, training):
    """``layer(x)`` for one input, ``layer([x, y])`` for several."""
    x = inputs[0] if len(inputs) == 1 else list(inputs)
    return layer(x, training=training)


@dataclasses.dataclass(frozen=True)
class Case:
    """One layer class in one configuration.

    Attributes:
        layer: the class name (``keras.layers`` spelling; qualified for others).
        config: a short label of the configuration ("units=4096", "mask").
        make: ``policy -> layer`` (``(policy, magnitude) -> layer`` when
            ``per_magnitude``).
        inputs: the shape of each input, without the batch axis.
        batch: examples per magnitude group (one batch: batch statistics
            are a group's own).
        distribution: "centered" (normal), "positive" (its absolute value),
            "offset" (``1 + 0.01 * normal``: a large mean, a small spread) or
            "ids" (whole numbers up to ``ids - 1``).
        training: the ``training`` argument of the call.
        call: ``(layer, inputs, training) -> output``.
        per_magnitude: the layer's statistics are set from the data of each
            magnitude (adapted preprocessing), so one layer per magnitude.
        ids: for "ids": the number of distinct ids.
        covers: other classes this configuration measures (a cell inside
            ``RNN``).
        source: "keras", "keras_hub" or "user".
        seed_offset: varies the weights' draw between configurations.
        selects: the layer routes each output's gradient to what it
            selects by comparing: one of its inputs (max pooling,
            ``Maximum``, ``Minimum``, AutoContrast's per-image min and max)
            or a constant bound (a clip ``min(max(x, lo), hi)``: ReLU with a
            ``max_value`` or a non-zero ``threshold``, relu6). Where inputs
            that differ in float32 tie once rounded to the compute dtype, or
            an input is rounded onto or across a bound, a half copy routes it
            as float32 does at the rounded inputs, a subgradient as correct
            as float32's (`tf_mixed.tools.catalog.measuring` then also
            compares its gradient with float32's at the rounded inputs).
            Set by `is_selecting` unless given.
        integer_ids: the ids ("ids" distribution) reach the layer as
            integers (``call`` casts them), so a half copy takes them
            unrounded, as from an integer ``keras.Input``.
        args: the configuration as values a model's layer is matched
            against (`tf_mixed.tools.catalog.matching`): its constructor
            arguments, ``input_dim`` where the length of a sum is the point,
            and the conditions no layer configuration shows (``mask``, a
            ``distribution`` other than "centered").
    """

    layer: str
    config: str
    make: Callable[..., Any]
    inputs: tuple[tuple[int, ...], ...] = ((16,),)
    batch: int = 4
    distribution: str = "centered"
    training: bool | None = False
    call: Callable[..., Any] = default_call
    per_magnitude: bool = False
    ids: int = 0
    covers: tuple[str, ...] = ()
    source: str = "keras"
    seed_offset: int = 0
    selects: bool = False
    integer_ids: bool = False
    args: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def key(self) -> str:
        """``Layer[config]``, the row's name in tables and files."""
        return f"{self.layer}[{self.config}]"


# Classes of keras.layers with no floating-point arithmetic of their own that a
# policy changes (not counted in the coverage), and why.
NO_FLOAT_COMPUTE = {
    "Layer": "the base class: computes nothing of its own",
    "InputLayer": "a placeholder: computes nothing",
    "Wrapper": "an abstract base (Bidirectional, TimeDistributed are measured)",
    "Pipeline": "a container of other layers, each measured on its own",
    "FlaxLayer": "wraps a Flax module: JAX backend only",
    "JaxLayer": "wraps a JAX function: JAX backend only",
    "TorchModuleWrapper": "wraps a torch module: PyTorch backend only",
    "TFSMLayer": "runs a SavedModel in the dtypes it was saved with: the policy changes nothing",
    "CategoryEncoding": "counts integer ids: no floating-point arithmetic",
    "Hashing": "hashes strings and integers",
    "HashedCrossing": "hashes feature crosses of strings and integers",
    "IntegerLookup": "maps integers to integers",
    "StringLookup": "maps strings to integers",
    "TextVectorization": "maps strings to integers",
    "MaxNumBoundingBoxes": "pads bounding-box dicts: no arithmetic on the image",
}

# Float-computing classes of keras.layers the catalog does not measure, and why
# (counted against the coverage).
LEFT_OUT = {
    "Lambda": "runs the user's function: measure your own layer class by name instead",
}


def _two(layer, inputs, training):
    return layer(inputs[0], inputs[1], training=training)


def _masked(mask: np.ndarray | list[np.ndarray], *, keyword: str = "mask", two: bool = False):
    """A call passing a fixed boolean mask (the same in every copy)."""
    def call(layer, inputs, training):
        import tensorflow as tf

        value = ([tf.constant(m) for m in mask] if isinstance(mask, list)
                 else tf.constant(mask))
        kwargs = {keyword: value, "training": training}
        if two:
            return layer(inputs[0], inputs[1], **kwargs)
        return layer(inputs[0] if len(inputs) == 1 else list(inputs), **kwargs)
    call.masked = True  # type: ignore[attr-defined]
    return call


def _as_integers(layer, inputs, training):
    """``layer(ids)`` with the (whole-number) float ids cast to int32."""
    import tensorflow as tf

    return layer(tf.cast(inputs[0], "int32"), training=training)


def _sequence_mask(batch: int, steps: int) -> np.ndarray:
    """The last quarter of each sequence's steps masked out (at least one kept)."""
    mask = np.ones((batch, steps), dtype=bool)
    mask[:, steps - max(1, steps // 4):] = False
    return mask


SELECTING = ("Maximum", "Minimum", "AutoContrast")
"""keras.layers classes besides the max poolings whose gradient only routes what they select."""

CLIPPING_ACTIVATIONS = ("relu6",)
"""Activation functions that are a clip ``min(max(x, lo), hi)`` of their input."""


def is_selecting(layer: str, args: dict[str, Any]) -> bool:
    """Whether a configuration of a ``keras.layers`` class selects (`Case.selects`).

    Args:
        layer: the class name.
        args: its constructor arguments (as a `Case`'s ``args``).

    Returns:
        True for every max pooling, `SELECTING`, ReLU clipping at a bound an
        input can be rounded onto (a ``max_value``, or a non-zero
        ``threshold``: ReLU's kink at 0 is crossed by no rounding) and an
        Activation of `CLIPPING_ACTIVATIONS`.
    """
    if "MaxPooling" in layer or layer in SELECTING:
        return True
    if layer == "ReLU":
        return args.get("max_value") is not None or bool(args.get("threshold"))
    return layer == "Activation" and args.get("activation") in CLIPPING_ACTIVATIONS


def _defaults(layer: str) -> dict[str, Any]:
    """The class's constructor defaults for the values layers are matched on."""
    import keras

    from tf_mixed.tools.catalog.matching import MATCH_KEYS

    cls = getattr(keras.layers, layer, None)
    if cls is None:
        return {}
    parameters = inspect.signature(cls).parameters
    return {key: parameters[key].default for key in MATCH_KEYS if key in parameters
            and parameters[key].default not in (None, inspect.Parameter.empty)}


def _case(layer: str, config: str, make, *, args: dict | None = None, **kwargs) -> Case:
    """A `Case` whose ``args`` are the class's defaults, ``make``'s arguments (`_kw`),
    ``args`` and its conditions, and whose ``selects`` is `is_selecting`'s."""
    found = {**_defaults(layer), **getattr(make, "args", {}), **(args or {})}
    if kwargs.get("distribution", "centered") not in ("centered", "positive", "ids"):
        found["distribution"] = kwargs["distribution"]
    if getattr(kwargs.get("call"), "masked", False):
        found["mask"] = True
    kwargs.setdefault("selects", is_selecting(layer, found))
    return Case(layer, config, make, seed_offset=len(layer) + len(config), args=found,
                **kwargs)


def _kw(cls_name: str, **kwargs):
    """``policy -> keras.layers.<cls_name>(**kwargs, dtype=policy)`` (``.args``: kwargs)."""
    def make(policy):
        import keras

        return getattr(keras.layers, cls_name)(**kwargs, dtype=policy)
    make.args = dict(kwargs)  # type: ignore[attr-defined]
    return make


def _simple(name: str, config: str = "default", inputs=((16,),), *,
            args: dict | None = None, **kwargs) -> Case:
    call_kwargs = {k: kwargs.pop(k) for k in ("distribution", "training", "batch", "call")
                   if k in kwargs}
    return _case(name, config, _kw(name, **kwargs), inputs=inputs, args=args, **call_kwargs)


def _normalization(policy, magnitude, *, data):
    import keras

    sample = data(magnitude)
    return keras.layers.Normalization(mean=sample.mean(axis=0), variance=sample.var(axis=0),
                                      dtype=policy)


def _discretization(policy, magnitude, *, data):
    import keras

    edges = np.quantile(data(magnitude), np.linspace(0.1, 0.9, 9)).tolist()
    return keras.layers.Discretization(bin_boundaries=edges, output_mode="int", dtype=policy)


def _data_at(shape, seed):
    """What a layer adapted to data of magnitude m would have seen (max |x| == m)."""
    def data(magnitude):
        base = np.random.default_rng(seed).standard_normal((64,) + shape)
        return base / np.abs(base).max() * magnitude
    return data


def _wrapped(outer: str, inner: Callable[[], Any], **outer_kwargs):
    def make(policy):
        import keras

        return getattr(keras.layers, outer)(inner(policy), **outer_kwargs, dtype=policy)
    return make


def _rnn_of(cell: str, **cell_kwargs):
    def make(policy):
        import keras

        return keras.layers.RNN(getattr(keras.layers, cell)(**cell_kwargs, dtype=policy),
                                dtype=policy)
    return make


def _stacked(policy):
    import keras

    cells = [keras.layers.LSTMCell(8, dtype=policy), keras.layers.GRUCell(8, dtype=policy)]
    return keras.layers.RNN(keras.layers.StackedRNNCells(cells, dtype=policy), dtype=policy)


def keras_cases() -> list[Case]:
    """Every configuration of `keras.layers` classes the catalog measures."""
    seq = ((6, 8),)
    img = ((6, 6, 3),)
    vol = ((4, 4, 4, 2),)
    mask = _sequence_mask(4, 6)
    cases: list[Case] = []
    add = cases.append
    # activations (relu6 a clip, selecting; hard_sigmoid and hard_silu clip x + 3
    # rounded inside: compared at the inputs alone, `is_selecting`)
    for name in ("softmax", "log_softmax", "sigmoid", "tanh", "gelu", "silu", "softplus",
                 "exponential", "elu", "relu", "relu6", "hard_sigmoid", "hard_silu"):
        add(_simple("Activation", f"activation={name}", activation=name))
    add(_simple("ELU"))
    add(_simple("LeakyReLU"))
    add(_simple("PReLU"))
    add(_simple("ReLU", "max_value=6", max_value=6.0))
    add(_simple("Softmax"))
    add(_case("Softmax", "mask", _kw("Softmax"), inputs=seq,
              call=_masked(np.broadcast_to(_sequence_mask(6, 8), (4, 6, 8)).copy())))
    # core
    # input_dim: the length of each output's sum, what float16's range meets first.
    add(_simple("Dense", "units=64", units=64, args={"input_dim": 16}))
    add(_simple("Dense", "units=4096", units=4096, args={"input_dim": 16}))
    add(_simple("Dense", "inputs=4096", inputs=((4096,),), units=64, args={"input_dim": 4096}))
    add(_simple("EinsumDense", "ab,bc->ac", equation="ab,bc->ac", output_shape=64,
                bias_axes="c"))
    # Float ids (as a model input hands them on): ids up to 60,000, below
    # float16's largest finite value, so a rounded id is another row, not inf.
    # ``call``: how the layer is called (`tf_mixed.tools.catalog.matching`);
    # integer ids (an integer keras.Input) are looked up exactly.
    for name in ("Embedding", "ReversibleEmbedding"):
        add(_case(name, "float ids", _kw(name, input_dim=60_001, output_dim=4),
                  inputs=((8,),), distribution="ids", ids=60_001, args={"call": "float ids"}))
        add(_case(name, "int ids", _kw(name, input_dim=60_001, output_dim=4),
                  inputs=((8,),), distribution="ids", ids=60_001, integer_ids=True,
                  call=_as_integers, args={"call": "int ids"}))
    add(_case("ReversibleEmbedding", "reverse",
              _kw("ReversibleEmbedding", input_dim=64, output_dim=16), inputs=((16,),),
              call=lambda layer, inputs, training: layer(inputs[0], reverse=True),
              args={"call": "reverse"}))
    add(_simple("Identity"))
    add(_simple("Masking", inputs=seq))
    # attention
    qv = ((5, 8), (6, 8))
    add(_case("Attention", "default", _kw("Attention"), inputs=qv))
    add(_case("Attention", "use_scale", _kw("Attention", use_scale=True, score_mode="concat"),
              inputs=qv))
    add(_case("Attention", "mask", _kw("Attention"), inputs=qv, call=_masked(
        [np.ones((4, 5), bool), _sequence_mask(4, 6)])))
    add(_case("AdditiveAttention", "default", _kw("AdditiveAttention"), inputs=qv))
    add(_case("MultiHeadAttention", "heads=2", _kw("MultiHeadAttention", num_heads=2, key_dim=8),
              inputs=qv, call=_two))
    add(_case("MultiHeadAttention", "attention_mask",
              _kw("MultiHeadAttention", num_heads=2, key_dim=8), inputs=qv,
              call=_masked(np.broadcast_to(_sequence_mask(4, 6)[:, None, :], (4, 5, 6)).copy(),
                           keyword="attention_mask", two=True)))
    add(_case("GroupQueryAttention", "4q/2kv",
              _kw("GroupQueryAttention", head_dim=8, num_query_heads=4, num_key_value_heads=2),
              inputs=qv, call=_two))
    # convolution
    add(_simple("Conv1D", inputs=seq, filters=8, kernel_size=3))
    add(_simple("Conv2D", inputs=img, filters=8, kernel_size=3))
    add(_simple("Conv2D", "filters=256", inputs=img, filters=256, kernel_size=3))
    add(_simple("Conv3D", inputs=vol, filters=4, kernel_size=2))
    add(_simple("Conv1DTranspose", inputs=seq, filters=8, kernel_size=3))
    add(_simple("Conv2DTranspose", inputs=img, filters=8, kernel_size=3))
    add(_simple("Conv3DTranspose", inputs=vol, filters=4, kernel_size=2))
    add(_simple("DepthwiseConv1D", inputs=seq, kernel_size=3))
    add(_simple("DepthwiseConv2D", inputs=img, kernel_size=3))
    add(_simple("SeparableConv1D", inputs=seq, filters=8, kernel_size=3))
    add(_simple("SeparableConv2D", inputs=img, filters=8, kernel_size=3))
    # merging
    pair = ((8,), (8,))
    for name in ("Add", "Average", "Concatenate", "Maximum", "Minimum", "Multiply", "Subtract"):
        add(_simple(name, inputs=pair))
    add(_simple("Dot", "axes=-1", inputs=pair, axes=-1))
    add(_simple("Dot", "normalize", inputs=pair, axes=-1, normalize=True))
    # normalization
    add(_simple("BatchNormalization", "batch statistics", training=True, batch=8))
    add(_simple("BatchNormalization", "batch statistics, epsilon=1e-5", training=True, batch=8,
                epsilon=1e-5))
    add(_simple("BatchNormalization", "batch statistics, offset", training=True, batch=8,
                distribution="offset"))
    add(_simple("BatchNormalization", "inference"))
    add(_simple("LayerNormalization", "epsilon=1e-6", epsilon=1e-6))
    add(_simple("LayerNormalization", "epsilon=1e-3", epsilon=1e-3))  # Keras's default
    add(_simple("LayerNormalization", "offset", epsilon=1e-6, distribution="offset"))
    add(_simple("GroupNormalization", "groups=4, epsilon=1e-5", groups=4, epsilon=1e-5))
    add(_simple("GroupNormalization", "groups=4, epsilon=1e-3", groups=4,
                epsilon=1e-3))  # Keras's default epsilon
    add(_simple("GroupNormalization", "epsilon=1e-12", inputs=((4, 4, 16),), groups=4,
                epsilon=1e-12))  # keras#22586's configuration
    add(_simple("GroupNormalization", "offset", groups=4, epsilon=1e-5, distribution="offset"))
    add(_simple("RMSNormalization", "epsilon=1e-6", epsilon=1e-6))
    add(_simple("UnitNormalization"))
    add(_case("SpectralNormalization", "Dense(16)",
              _wrapped("SpectralNormalization", _kw("Dense", units=16))))
    # pooling
    for dims, shape in (("1D", seq), ("2D", img), ("3D", vol)):
        for kind in ("AveragePooling", "MaxPooling"):
            add(_simple(kind + dims, inputs=shape, pool_size=2))
        for kind in ("GlobalAveragePooling", "GlobalMaxPooling"):
            add(_simple(kind + dims, inputs=shape))
        for kind in ("AdaptiveAveragePooling", "AdaptiveMaxPooling"):
            add(_simple(kind + dims, inputs=shape, output_size=2))
    add(_case("GlobalAveragePooling1D", "mask", _kw("GlobalAveragePooling1D"), inputs=seq,
              call=_masked(mask)))
    # preprocessing (statistics set from data: per magnitude)
    add(Case("Normalization", "adapted", lambda p, m: _normalization(
        p, m, data=_data_at((16,), 7)), per_magnitude=True, seed_offset=7))
    add(Case("Discretization", "adapted", lambda p, m: _discretization(
        p, m, data=_data_at((16,), 8)), per_magnitude=True, seed_offset=8))
    add(_simple("Rescaling", "scale=1/255", inputs=img, scale=1 / 255.0, distribution="positive"))
    add(_simple("Resizing", "bilinear", inputs=img, height=4, width=4, distribution="positive"))
    add(_simple("CenterCrop", inputs=img, height=4, width=4, distribution="positive"))
    add(_simple("MelSpectrogram", inputs=((512,),), fft_length=64, sequence_stride=32,
                num_mel_bins=16, sampling_rate=8000))
    if _has_scipy():
        add(_simple("STFTSpectrogram", inputs=((256, 1),), frame_length=32, frame_step=16,
                    fft_length=32))
    image = ((8, 8, 3),)
    for name, kwargs in _IMAGE_LAYERS:
        seeded = dict[str, Any](
            {"seed": 1} if name.startswith(("Random", "AugMix", "MixUp")) else {})
        add(_simple(name, inputs=image, distribution="positive", training=True, **seeded,
                    **kwargs))
    for name, kwargs in _INFERENCE_ONLY:
        add(_simple(name, "inference", inputs=image, distribution="positive", **kwargs))
    for name, kwargs in _EAGER_ONLY:  # one layer per magnitude, run eagerly
        add(Case(name, "inference, eager", _eager(name, kwargs), inputs=image,
                 distribution="positive", per_magnitude=True, seed_offset=len(name)))
    # regularization: random in training, identity in inference (measured there)
    add(_simple("ActivityRegularization", l1=0.01))
    add(_simple("AlphaDropout", training=True, rate=0.2, seed=1))
    add(_simple("GaussianDropout", training=True, rate=0.2, seed=1))
    add(_simple("GaussianNoise", training=True, stddev=0.5, seed=1))
    add(_simple("Dropout", "inference", rate=0.5))
    add(_simple("SpatialDropout1D", "inference", inputs=seq, rate=0.5))
    add(_simple("SpatialDropout2D", "inference", inputs=img, rate=0.5))
    add(_simple("SpatialDropout3D", "inference", inputs=vol, rate=0.5))
    # reshaping
    add(_simple("Cropping1D", inputs=seq, cropping=1))
    add(_simple("Cropping2D", inputs=img, cropping=1))
    add(_simple("Cropping3D", inputs=vol, cropping=1))
    add(_simple("Flatten", inputs=img))
    add(_simple("Permute", inputs=seq, dims=(2, 1)))
    add(_simple("RepeatVector", n=3))
    add(_simple("Reshape", inputs=seq, target_shape=(48,)))
    add(_simple("UpSampling1D", inputs=seq))
    add(_simple("UpSampling2D", "bilinear", inputs=img, interpolation="bilinear"))
    add(_simple("UpSampling3D", inputs=vol))
    add(_simple("ZeroPadding1D", inputs=seq))
    add(_simple("ZeroPadding2D", inputs=img))
    add(_simple("ZeroPadding3D", inputs=vol))
    # recurrent
    add(_simple("LSTM", "units=16", inputs=seq, units=16))
    add(_case("LSTM", "mask", _kw("LSTM", units=16), inputs=seq, call=_masked(mask)))
    add(_simple("GRU", "units=16", inputs=seq, units=16))
    add(_simple("SimpleRNN", "units=16", inputs=seq, units=16))
    add(_case("SimpleRNN", "mask", _kw("SimpleRNN", units=16), inputs=seq, call=_masked(mask)))
    add(_simple("ConvLSTM1D", inputs=((3, 6, 2),), filters=4, kernel_size=3))
    add(_simple("ConvLSTM2D", inputs=((3, 5, 5, 2),), filters=4, kernel_size=3))
    add(_simple("ConvLSTM3D", inputs=((2, 4, 4, 4, 1),), filters=2, kernel_size=2))
    add(_case("RNN", "LSTMCell", _rnn_of("LSTMCell", units=8), inputs=seq, covers=("LSTMCell",)))
    add(_case("RNN", "GRUCell", _rnn_of("GRUCell", units=8), inputs=seq, covers=("GRUCell",)))
    add(_case("RNN", "SimpleRNNCell", _rnn_of("SimpleRNNCell", units=8), inputs=seq,
              covers=("SimpleRNNCell",)))
    add(_case("RNN", "StackedRNNCells", _stacked, inputs=seq, covers=("StackedRNNCells",)))
    add(_case("Bidirectional", "LSTM", _wrapped("Bidirectional", _kw("LSTM", units=8)),
              inputs=seq))
    add(_case("TimeDistributed", "Dense", _wrapped("TimeDistributed", _kw("Dense", units=8)),
              inputs=seq))
    return cases


# Image layers measured in training (same seed in every copy: the same draws).
_IMAGE_LAYERS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("AutoContrast", {"value_range": (0, 255)}),
    ("ContrastLimitedAdaptiveHistogramEqualization", {"value_range": (0, 255)}),
    ("Equalization", {"value_range": (0, 255)}),
    ("MixUp", {}),
    ("RandomBrightness", {"factor": 0.3, "value_range": (0, 255)}),
    ("RandomColorDegeneration", {"factor": 0.5, "value_range": (0, 255)}),
    ("RandomColorJitter", {"value_range": (0, 255), "brightness_factor": 0.2,
                           "contrast_factor": 0.2, "saturation_factor": 0.5,
                           "hue_factor": 0.2}),
    ("RandomCrop", {"height": 6, "width": 6}),
    ("RandomFlip", {}),
    ("RandomGrayscale", {"factor": 0.5}),
    ("RandomHue", {"factor": 0.5, "value_range": (0, 255)}),
    ("RandomInvert", {"factor": 0.5, "value_range": (0, 255)}),
    ("RandomPosterization", {"factor": 4, "value_range": (0, 255)}),
    ("RandomRotation", {"factor": 0.2}),
    ("RandomSaturation", {"factor": 0.5, "value_range": (0, 255)}),
    ("RandomSharpness", {"factor": 0.5, "value_range": (0, 255)}),
    ("RandomTranslation", {"height_factor": 0.2, "width_factor": 0.2}),
    ("RandomZoom", {"height_factor": 0.2}),
)
# Random image layers whose draws depend on the compute dtype (a float16 and a
# float32 copy with the same seed transform differently): measured in inference,
# where they pass the image through.
_INFERENCE_ONLY: tuple[tuple[str, dict[str, Any]], ...] = (
    ("AugMix", {"value_range": (0, 255)}),
    ("RandAugment", {"value_range": (0, 255)}),
    ("RandomPerspective", {"factor": 0.5}),
    ("RandomContrast", {"factor": 0.5, "value_range": (0, 255)}),
    ("RandomShear", {"x_factor": 0.2, "y_factor": 0.2}),
    ("Solarization", {"addition_factor": 0.2, "value_range": (0, 255)}),
)


def _has_scipy() -> bool:
    return importlib.util.find_spec("scipy") is not None


def left_out() -> dict[str, str]:
    """`LEFT_OUT`, plus the classes this installation cannot build."""
    found = dict(LEFT_OUT)
    if not _has_scipy():
        found["STFTSpectrogram"] = ("needs scipy for its window, and scipy is not installed "
                                    "(pip install scipy measures it)")
    return found


# Random image layers that fail inside a tf.function under every policy in
# Keras 3.15 (float32 too: not a precision effect): measured eagerly, in
# inference, where they pass the image through.
_EAGER_ONLY: tuple[tuple[str, dict[str, Any]], ...] = (
    ("CutMix", {}),
    ("RandomElasticTransform", {"value_range": (0, 255)}),
    ("RandomErasing", {"value_range": (0, 255)}),
    ("RandomGaussianBlur", {"value_range": (0, 255)}),
)


def _eager(name: str, kwargs: dict):
    def make(policy, magnitude):
        del magnitude  # the same layer at every magnitude; eager is the point
        return _kw(name, **kwargs)(policy)
    return make


def hub_cases() -> list[Case]:
    """KerasHub's layers (`keras_hub.layers`) in common configurations; [] without KerasHub.

    A block's ``args`` state what a model's block is matched on
    (`tf_mixed.tools.catalog.matching`): its hidden size (``input_dim``),
    ``intermediate_dim``, activation, ``layer_norm_epsilon`` and
    ``normalize_first``; besides the small default block, the block as BERT
    (post-norm, epsilon 1e-12) and GPT-2 (pre-norm, epsilon 1e-5) build it,
    with KerasHub's tanh-form gelu, at their base size (768 wide, 3072 inside).
    """
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        return []

    def hub(name, **kwargs):
        def make(policy):
            import keras
            import keras_hub

            # BERT's and GPT-2's activation is KerasHub's registered
            # "keras_hub>gelu_approximate" (tanh form), not Keras's "gelu".
            named = {key: keras.saving.get_registered_object(value)
                     if isinstance(value, str) and ">" in value else value
                     for key, value in kwargs.items()}
            return getattr(keras_hub.layers, name)(**named, dtype=policy)
        return make

    def block(name, label, width, **kwargs):
        """A TransformerEncoder/Decoder case, its matched values in ``args``."""
        defaults = {"activation": "relu", "layer_norm_epsilon": 1e-05, "normalize_first": False}
        args = {**defaults, **kwargs, "input_dim": width}
        args["activation"] = args["activation"].rpartition(">")[2]  # the function's name
        return Case(name, label, hub(name, **kwargs), inputs=((6, width),), source="keras_hub",
                    args=args)

    gelu = "keras_hub>gelu_approximate"
    seq = ((6, 16),)
    return [
        block("TransformerEncoder", "heads=2", 16, intermediate_dim=32, num_heads=2),
        block("TransformerEncoder", "BERT: post-norm, epsilon=1e-12, 768", 768,
              intermediate_dim=3072, num_heads=12, activation=gelu, layer_norm_epsilon=1e-12),
        block("TransformerDecoder", "heads=2", 16, intermediate_dim=32, num_heads=2),
        block("TransformerDecoder", "GPT-2: pre-norm, epsilon=1e-5, 768", 768,
              intermediate_dim=3072, num_heads=12, activation=gelu, normalize_first=True),
        Case("PositionEmbedding", "length=6", hub("PositionEmbedding", sequence_length=6),
             inputs=seq, source="keras_hub"),
        Case("SinePositionEncoding", "default", hub("SinePositionEncoding"), inputs=seq,
             source="keras_hub"),
        Case("RotaryEmbedding", "default", hub("RotaryEmbedding"), inputs=((6, 2, 16),),
             source="keras_hub"),
        Case("CachedMultiHeadAttention", "heads=2",
             hub("CachedMultiHeadAttention", num_heads=2, key_dim=8), inputs=seq,
             call=lambda layer, inputs, training: layer(inputs[0], inputs[0],
                                                        training=training),
             source="keras_hub"),
    ]


def user_case(layer: str | type, *, inputs: Sequence[Sequence[int]] = ((16,),),
              config: dict | None = None, label: str = "default", **options) -> Case:
    """A case for a user's own layer class.

    Args:
        layer: the class, or its name: a ``keras.layers`` (or
            ``keras_hub.layers``) name ("Dense") or a dotted path
            ("my_package.layers.MyNorm").
        inputs: the shape of each input, without the batch axis.
        config: constructor arguments (``dtype`` is set by the catalog).
        label: the configuration's label in the table.
        **options: further `Case` fields (``distribution``, ``training``, ...).

    Returns:
        A `Case` with ``source="user"``.

    Raises:
        ValueError: the name resolves to nothing.
        TypeError: ``layer`` is not a ``keras.layers.Layer`` subclass.
    """
    cls = resolve(layer)
    kwargs = dict(config or {})

    def make(policy):
        return cls(**kwargs, dtype=policy)

    options.setdefault("args", dict(kwargs))
    if cls.__module__.startswith("keras"):
        options.setdefault("selects", is_selecting(cls.__name__, kwargs))
    return Case(f"{cls.__module__}.{cls.__qualname__}" if not cls.__module__.startswith(
        "keras") else cls.__name__, label, make,
        inputs=tuple(tuple(int(d) for d in s) for s in inputs), source="user", **options)


def _hub_layers():
    try:
        import keras_hub
    except ImportError:
        return None
    return keras_hub.layers


def resolve(layer: str | type) -> type:
    """A layer class from a class or a name ("Dense", "pkg.module.Class")."""
    import keras

    if isinstance(layer, str):
        name = layer.strip()
        found = getattr(keras.layers, name, None) if "." not in name else None
        if found is None and "." not in name:
            found = getattr(_hub_layers(), name, None)
        if found is None and "." in name:
            module, _, attribute = name.rpartition(".")
            try:
                found = getattr(importlib.import_module(module), attribute, None)
            except ImportError:
                found = None
        if found is None:
            raise ValueError(
                "layers must name a keras.layers class (such as 'Dense') or a class by "
                f"its dotted path (such as 'my_package.layers.MyNorm'). Received: "
                f"layers={layer!r}, which names neither.")
        layer = found
    if not (inspect.isclass(layer) and issubclass(layer, keras.layers.Layer)):
        raise TypeError(
            "layers must hold keras.layers.Layer subclasses or their names, such as "
            f"'Dense' or keras.layers.Dense. Received: {layer!r} (of type "
            f"{type(layer).__name__})")
    return layer
