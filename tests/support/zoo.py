"""The model zoo: the kinds of Keras models users bring, small enough for every test.

Every public API that takes a model runs over `ZOO`::

    from zoo import ZOO, reloaded_model

    @pytest.mark.parametrize("name", ZOO)
    def test_my_api(name):
        spec = ZOO[name]
        model = spec.ready()              # built, weights exist, not compiled
        x, y = spec.data(32)
        model.compile(optimizer="sgd", loss=spec.loss)
        ...

    @pytest.mark.parametrize("name", ZOO)
    def test_my_api_after_reload(name):
        model = reloaded_model(name)      # saved, reloaded in a fresh process, loaded here

Each `ZooSpec` has:

- ``name``: the key in `ZOO`; ``kind``: what sort of model it is (one of
  `KINDS`), for tests whose API refuses a kind and must name it.
- ``build()``: a new model as a user constructs it, in the current dtype
  policy, uncompiled. Every model is built (has weights) except the kind
  ``"sequential"`` without ``keras.Input``, which Keras builds on its first
  call; ``ready()`` returns any of them built, by calling it on two examples.
- ``data(n, seed=0)``: ``(x, y)`` numpy arrays (lists for several inputs or
  outputs) that fit the model and ``loss``.
- ``loss``: a Keras loss name, or a list of names (one per output).
- ``nested``: the name of the inner model (``"nested"`` kind), else None.
- ``custom_objects``: what `keras.saving.load_model` needs besides a
  registered class (the unregistered ``def`` of the Lambda kind).
- ``compiled(optimizer="sgd")``: ``ready()`` compiled with ``loss``.


`REFUSED` holds kinds some APIs refuse by design (a subclassed model, which
`probe` and `convert` cannot clone or trace); a test asserts the refusal
names the kind.

Saved and reloaded: `reloaded_path(name)` is a ``.keras`` file that was saved
here (compiled with ``loss``), loaded in a fresh Python process exactly as a
user would (``import tf_mixed``, ``keras.saving.load_model``), checked to give
the same predictions and saved again; `reloaded_model(name)` loads it in this
process. One subprocess serves the whole zoo, once per test session (the
fixture ``zoo_reloaded`` gives the dict of paths).

Every model computes a few ms per step on a CPU. Weights are seeded, so two
builds give the same predictions. Add kinds; do not rename (other tests
import these names).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

KINDS = (
    "sequential", "functional", "nested", "subclassed_layer", "lambda",
    "multi_input", "multi_output", "embedding", "batchnorm", "dropout",
)

FEATURES = 8  # width of every float input


def _init(seed):
    return keras.initializers.GlorotUniform(seed=seed)


@keras.saving.register_keras_serializable(package="tf_mixed_zoo")
class ZooScale(keras.layers.Layer):
    """A subclassed layer with one trainable per-feature scale: ``x * scale``."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return x * keras.ops.cast(self.scale, x.dtype)


def zoo_double(t):
    """The Lambda kind's module-level ``def`` (unregistered, as users write them)."""
    return t * 2.0


# ---------------------------------------------------------------- builders


def _sequential_input():
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="d1"),
        keras.layers.Dense(1, kernel_initializer=_init(2), name="d2"),
    ], name="sequential_input")


def _sequential_no_input():
    return keras.Sequential([
        keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="d1"),
        keras.layers.Dense(1, kernel_initializer=_init(2), name="d2"),
    ], name="sequential_no_input")


def _functional():
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="d1")(inputs)
    outputs = keras.layers.Dense(1, kernel_initializer=_init(2), name="d2")(h)
    return keras.Model(inputs, outputs, name="functional")


def _nested():
    inner_in = keras.Input((FEATURES,), name="enc_in")
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1),
                           name="enc_d1")(inner_in)
    h = keras.layers.Dense(8, activation="relu", kernel_initializer=_init(2), name="enc_d2")(h)
    encoder = keras.Model(inner_in, h, name="encoder")
    inputs = keras.Input((FEATURES,), name="x")
    outputs = keras.layers.Dense(1, kernel_initializer=_init(3), name="head")(encoder(inputs))
    return keras.Model(inputs, outputs, name="nested")


def _subclassed_layer():
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="d1")(inputs)
    h = ZooScale(name="scale")(h)
    outputs = keras.layers.Dense(1, kernel_initializer=_init(2), name="d2")(h)
    return keras.Model(inputs, outputs, name="subclassed_layer")


def _lambda_model(function, name):
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="d1")(inputs)
    h = keras.layers.Lambda(function, name="double")(h)
    outputs = keras.layers.Dense(1, kernel_initializer=_init(2), name="d2")(h)
    return keras.Model(inputs, outputs, name=name)


def _lambda_lambda():
    return _lambda_model(lambda t: t * 2.0, "lambda_lambda")


def _lambda_def():
    return _lambda_model(zoo_double, "lambda_def")


def _multi_input():
    a = keras.Input((FEATURES,), name="a")
    b = keras.Input((4,), name="b")
    h = keras.layers.Concatenate(name="concat")([
        keras.layers.Dense(8, activation="relu", kernel_initializer=_init(1), name="da")(a), b])
    outputs = keras.layers.Dense(1, kernel_initializer=_init(2), name="head")(h)
    return keras.Model([a, b], outputs, name="multi_input")


def _multi_output():
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="trunk")(inputs)
    reg = keras.layers.Dense(1, kernel_initializer=_init(2), name="reg")(h)
    cls = keras.layers.Dense(3, activation="softmax", kernel_initializer=_init(3), name="cls")(h)
    return keras.Model(inputs, [reg, cls], name="multi_output")


def _embedding():
    inputs = keras.Input((6,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(50, 8, embeddings_initializer=keras.initializers.RandomUniform(
        -0.5, 0.5, seed=1), name="embed")(inputs)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    outputs = keras.layers.Dense(3, activation="softmax", kernel_initializer=_init(2),
                                 name="head")(h)
    return keras.Model(inputs, outputs, name="embedding")


def _batchnorm():
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(16, kernel_initializer=_init(1), name="d1")(inputs)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Activation("relu", name="relu")(h)
    outputs = keras.layers.Dense(1, kernel_initializer=_init(2), name="d2")(h)
    return keras.Model(inputs, outputs, name="batchnorm")


def _dropout():
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="d1")(inputs)
    h = keras.layers.Dropout(0.25, seed=1, name="drop")(h)
    outputs = keras.layers.Dense(1, kernel_initializer=_init(2), name="d2")(h)
    return keras.Model(inputs, outputs, name="dropout")



@keras.saving.register_keras_serializable(package="tf_mixed_zoo")
class ZooSubclassed(keras.Model):
    """A subclassed model: its layers are created and called in Python code."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.d1 = keras.layers.Dense(16, activation="relu", kernel_initializer=_init(1), name="d1")
        self.d2 = keras.layers.Dense(1, kernel_initializer=_init(2), name="d2")

    def call(self, x):
        return self.d2(self.d1(x))


def _subclassed_model():
    model = ZooSubclassed(name="subclassed_model")
    model(np.zeros((1, FEATURES), "float32"))
    return model


# ---------------------------------------------------------------- data


def _regression(n, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, FEATURES)).astype("float32")
    return x, (0.5 * x[:, :1] - 0.25 * x[:, 1:2]).astype("float32")


def _classes(x):
    return (np.abs(x[:, 0] * 3).astype("int64") % 3).astype("int32")


def _multi_input_data(n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, FEATURES)).astype("float32")
    b = rng.normal(size=(n, 4)).astype("float32")
    return [a, b], (0.5 * a[:, :1] + b[:, :1]).astype("float32")


def _multi_output_data(n, seed=0):
    x, y = _regression(n, seed)
    return x, [y, _classes(x)]


def _embedding_data(n, seed=0):
    tokens = np.random.default_rng(seed).integers(0, 50, size=(n, 6)).astype("int32")
    return tokens, (tokens[:, 0] % 3).astype("int32")


# ---------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class ZooSpec:
    """One zoo model: how to build it, its data and its loss (see the module docstring)."""

    name: str
    kind: str
    build: Callable[[], keras.Model]
    data: Callable[..., tuple[Any, Any]]
    loss: str | list[str]
    nested: str | None = None
    custom_objects: dict[str, Any] = dataclasses.field(default_factory=dict)

    def ready(self) -> keras.Model:
        """A new model, built: called once on two examples if it had no weights."""
        model = self.build()
        if not model.built or not model.weights:
            model(self.data(2)[0])
        return model

    def compiled(self, optimizer: Any = "sgd") -> keras.Model:
        """`ready()` compiled with ``loss`` and ``optimizer``."""
        model = self.ready()
        model.compile(optimizer=optimizer, loss=self.loss)
        return model


_SPECS = (
    ZooSpec("sequential_input", "sequential", _sequential_input, _regression, "mse"),
    ZooSpec("sequential_no_input", "sequential", _sequential_no_input, _regression, "mse"),
    ZooSpec("functional", "functional", _functional, _regression, "mse"),
    ZooSpec("nested", "nested", _nested, _regression, "mse", nested="encoder"),
    ZooSpec("subclassed_layer", "subclassed_layer", _subclassed_layer, _regression, "mse"),
    ZooSpec("lambda_lambda", "lambda", _lambda_lambda, _regression, "mse"),
    ZooSpec("lambda_def", "lambda", _lambda_def, _regression, "mse",
            custom_objects={"zoo_double": zoo_double}),
    ZooSpec("multi_input", "multi_input", _multi_input, _multi_input_data, "mse"),
    ZooSpec("multi_output", "multi_output", _multi_output, _multi_output_data,
            ["mse", "sparse_categorical_crossentropy"]),
    ZooSpec("embedding", "embedding", _embedding, _embedding_data,
            "sparse_categorical_crossentropy"),
    ZooSpec("batchnorm", "batchnorm", _batchnorm, _regression, "mse"),
    ZooSpec("dropout", "dropout", _dropout, _regression, "mse"),
)

ZOO: dict[str, ZooSpec] = {spec.name: spec for spec in _SPECS}
assert all(spec.kind in KINDS for spec in _SPECS)


# Kinds some APIs refuse by design (each must say so, naming the kind), kept
# out of ZOO so tests parametrized over ZOO need not special-case them:
# a subclassed model has no graph of layers to clone or trace.
REFUSED: dict[str, ZooSpec] = {
    "subclassed_model": ZooSpec("subclassed_model", "subclassed_model", _subclassed_model,
                                _regression, "mse"),
}


# ---------------------------------------------------------------- real models
#
# `REAL` holds models nobody here wrote, as users bring them: keras.applications
# (weights=None, the smallest input each accepts, 3 classes), the keras-io
# transformer text classifier and ViT (custom layers whose constructor has no
# **kwargs, as keras-io writes them; token ids through a float Input; patching
# with keras.ops), a functional model with Keras ops on tensors, and a
# subclassed model. ``heavy`` members (tens of MB of weights, seconds per
# step on a CPU) run in the slow tier. ``loadable``: keras.saving can load the
# saved file (a custom layer without **kwargs cannot be deserialised by Keras).

REAL_KINDS = ("application", "transformer", "vit", "keras_ops", "subclassed_model")
IMAGE = (32, 32, 3)  # the smallest input every application here accepts
CLASSES = 3


class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras-io's text-classification embedding, as written there (no **kwargs)."""

    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim,
                                                embeddings_initializer=_uniform(11))
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim,
                                              embeddings_initializer=_uniform(12))

    def call(self, x):
        maxlen = keras.ops.shape(x)[-1]
        positions = keras.ops.arange(start=0, stop=maxlen, step=1)
        return self.token_emb(x) + self.pos_emb(positions)


class TransformerBlock(keras.layers.Layer):
    """keras-io's transformer block, as written there (no **kwargs)."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim,
                                                   kernel_initializer=_init(13))
        self.ffn = keras.Sequential([
            keras.layers.Dense(ff_dim, activation="relu", kernel_initializer=_init(14)),
            keras.layers.Dense(embed_dim, kernel_initializer=_init(15))])
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate, seed=1)
        self.dropout2 = keras.layers.Dropout(rate, seed=2)

    def call(self, inputs, training=None):
        attn_output = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1), training=training)
        return self.layernorm2(out1 + ffn_output)


class Patches(keras.layers.Layer):
    """keras-io's ViT patching with keras.ops, as written there (no **kwargs)."""

    def __init__(self, patch_size):
        super().__init__()
        self.patch_size = patch_size

    def call(self, images):
        patches = keras.ops.image.extract_patches(images, size=self.patch_size)
        shape = keras.ops.shape(patches)
        return keras.ops.reshape(patches, (shape[0], shape[1] * shape[2], shape[3]))

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config


class PatchEncoder(keras.layers.Layer):
    """keras-io's ViT patch encoder, as written there (no **kwargs)."""

    def __init__(self, num_patches, projection_dim):
        super().__init__()
        self.num_patches = num_patches
        self.projection = keras.layers.Dense(units=projection_dim, kernel_initializer=_init(16))
        self.position_embedding = keras.layers.Embedding(
            input_dim=num_patches, output_dim=projection_dim,
            embeddings_initializer=_uniform(17))

    def call(self, patch):
        positions = keras.ops.expand_dims(
            keras.ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
        return self.projection(patch) + self.position_embedding(positions)

    def get_config(self):
        config = super().get_config()
        config.update({"num_patches": self.num_patches})
        return config


def _uniform(seed):
    return keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)


def _seeded(build):
    """keras.applications take no initializer seeds: seed Keras's generator."""
    @functools.wraps(build)
    def seeded():
        keras.utils.set_random_seed(7)
        return build()
    return seeded


@_seeded
def _resnet50():
    return keras.applications.ResNet50(weights=None, input_shape=IMAGE, classes=CLASSES)


@_seeded
def _mobilenet_v3_small():
    return keras.applications.MobileNetV3Small(
        weights=None, input_shape=IMAGE, classes=CLASSES, include_preprocessing=True)


@_seeded
def _efficientnet_b0():
    return keras.applications.EfficientNetB0(weights=None, input_shape=IMAGE, classes=CLASSES)


@_seeded
def _convnext_tiny():
    return keras.applications.ConvNeXtTiny(weights=None, input_shape=IMAGE, classes=CLASSES)


MAXLEN, VOCAB = 8, 64


def _transformer():
    inputs = keras.Input(shape=(MAXLEN,), name="tokens")  # float, as keras-io's
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, 16)(inputs)
    x = TransformerBlock(16, 2, 16)(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    x = keras.layers.Dropout(0.1, seed=3, name="drop")(x)
    outputs = keras.layers.Dense(2, activation="softmax", kernel_initializer=_init(18),
                                 name="head")(x)
    return keras.Model(inputs, outputs, name="transformer")


def _vit():
    inputs = keras.Input(shape=(16, 16, 3), name="image")
    patches = Patches(4)(inputs)
    encoded = PatchEncoder(16, 16)(patches)
    x1 = keras.layers.LayerNormalization(epsilon=1e-6, name="ln1")(encoded)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8,
                                                kernel_initializer=_init(19),
                                                name="mha")(x1, x1)
    x2 = attention + encoded  # a Keras op on tensors, not a layer
    x3 = keras.layers.LayerNormalization(epsilon=1e-6, name="ln2")(x2)
    x3 = keras.layers.Dense(16, activation="gelu", kernel_initializer=_init(20), name="mlp")(x3)
    encoded = x3 + x2
    x = keras.layers.Flatten(name="flat")(keras.layers.LayerNormalization(name="ln3")(encoded))
    outputs = keras.layers.Dense(CLASSES, kernel_initializer=_init(21), name="logits")(x)
    return keras.Model(inputs, outputs, name="vit")


def _keras_ops():
    inputs = keras.Input((FEATURES,), name="x")
    reversed_ = inputs[:, ::-1]  # GetItem
    h = keras.layers.Dense(8, activation="relu", kernel_initializer=_init(1), name="d1")(inputs)
    mixed = h * 2.0 + reversed_ - 1.0  # Multiply, Add, Subtract
    joined = keras.ops.concatenate([mixed, inputs[:, :4]], axis=-1)
    shared = keras.layers.Dense(4, kernel_initializer=_init(2), name="shared")
    both = shared(joined[:, :6]) + shared(joined[:, 6:])  # a layer called twice
    outputs = keras.layers.Dense(1, kernel_initializer=_init(3), name="head")(both)
    return keras.Model(inputs, outputs, name="keras_ops")


class RealSubclassed(keras.Model):
    """A subclassed image classifier, as the Keras guides write one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = keras.layers.Conv2D(8, 3, activation="relu", kernel_initializer=_init(22))
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(CLASSES, kernel_initializer=_init(23))

    def call(self, x):
        return self.head(self.pool(self.conv(x / 255.0)))


def _real_subclassed():
    model = RealSubclassed(name="real_subclassed")
    model(np.zeros((1, 16, 16, 3), "float32"))
    return model


def _images(shape):
    def data(n, seed=0):
        rng = np.random.default_rng(seed)
        x = rng.uniform(0, 255, size=(n, *shape)).astype("float32")
        return x, (np.arange(n) % CLASSES).astype("int32")
    return data


def _token_data(n, seed=0):
    ids = np.random.default_rng(seed).integers(0, VOCAB, size=(n, MAXLEN)).astype("float32")
    return ids, (ids[:, 0] % 2).astype("int32")


@dataclasses.dataclass(frozen=True)
class RealSpec(ZooSpec):
    """A `ZooSpec` of the real-model zoo, with ``heavy`` and ``loadable``."""

    heavy: bool = False
    loadable: bool = True


_SCC = "sparse_categorical_crossentropy"
_REAL_SPECS = (
    RealSpec("resnet50", "application", _resnet50, _images(IMAGE), _SCC, heavy=True),
    RealSpec("mobilenet_v3_small", "application", _mobilenet_v3_small, _images(IMAGE), _SCC,
             heavy=True),
    RealSpec("efficientnet_b0", "application", _efficientnet_b0, _images(IMAGE), _SCC,
             heavy=True),
    RealSpec("convnext_tiny", "application", _convnext_tiny, _images(IMAGE), _SCC, heavy=True),
    RealSpec("transformer", "transformer", _transformer, _token_data, _SCC, loadable=False),
    RealSpec("vit", "vit", _vit, _images((16, 16, 3)), _SCC, loadable=False),
    RealSpec("keras_ops", "keras_ops", _keras_ops, _regression, "mse"),
    RealSpec("real_subclassed", "subclassed_model", _real_subclassed, _images((16, 16, 3)), _SCC,
             loadable=False),
)

REAL: dict[str, RealSpec] = {spec.name: spec for spec in _REAL_SPECS}
assert all(spec.kind in REAL_KINDS for spec in _REAL_SPECS)


def load(path: str, name: str) -> keras.Model:
    """Loads a saved zoo model ``name`` from ``path`` in this process.

    ``safe_mode=False`` because the Lambda kind holds a Python lambda;
    ``custom_objects`` supplies the unregistered ``def``.
    """
    import tf_mixed  # noqa: F401  as a user would, before loading

    return keras.saving.load_model(path, custom_objects=ZOO[name].custom_objects, safe_mode=False)


# ---------------------------------------------------------------- saved + reloaded


def _prediction(model, x):
    out = model.predict(x, verbose=0)
    return [np.asarray(o).tolist() for o in (out if isinstance(out, (list, tuple)) else [out])]


def save_and_reload(directory: str, names=None) -> dict[str, str]:
    """Saves zoo models to ``directory``, reloads them in one fresh process.

    Each model is built (`ZooSpec.compiled`), saved as ``NAME.keras`` with
    its predictions on ``data(4)`` beside it; a fresh Python process loads
    each file, checks its predictions match, and saves it again as
    ``NAME.reloaded.keras``.

    Args:
        directory: An existing directory for the files.
        names: Zoo names (default: the whole zoo).

    Returns:
        ``{name: path of NAME.reloaded.keras}``.

    Raises:
        RuntimeError: The fresh process failed (its output is in the message).
    """
    names = list(ZOO if names is None else names)
    for name in names:
        spec = ZOO[name]
        model = spec.compiled()

        model.optimizer.build(model.trainable_variables)  # saved with its variables
        model.save(os.path.join(directory, f"{name}.keras"))
        with open(os.path.join(directory, f"{name}.expected.json"), "w") as f:
            json.dump(_prediction(model, spec.data(4)[0]), f)
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(
        [here, os.path.dirname(os.path.dirname(here))] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run(
        [sys.executable, "-c", "import sys, zoo; zoo._reload_main(sys.argv[1], sys.argv[2:])",
         directory, *names],
        check=False, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"reloading the zoo in a fresh process failed:\n{result.stdout}\n"
                           f"{result.stderr[-4000:]}")
    return {name: os.path.join(directory, f"{name}.reloaded.keras") for name in names}


def _reload_main(directory, names):
    """The fresh process: load each model as a user would, check it, save it again."""
    for name in names:
        model = load(os.path.join(directory, f"{name}.keras"), name)
        with open(os.path.join(directory, f"{name}.expected.json")) as f:
            expected = json.load(f)
        got = _prediction(model, ZOO[name].data(4)[0])
        for e, g in zip(expected, got):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=name)

        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)  # saved with its variables
        model.save(os.path.join(directory, f"{name}.reloaded.keras"))


@functools.cache
def _reloaded_paths() -> dict[str, str]:
    directory = tempfile.mkdtemp(prefix="tf_mixed_zoo_")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")  # the saved models are float32 models
    try:
        return save_and_reload(directory)
    finally:
        keras.config.set_dtype_policy(policy)


def reloaded_path(name: str) -> str:
    """The ``.keras`` file of zoo model ``name`` after a reload in a fresh process.

    The whole zoo is saved and reloaded on the first call (one subprocess per
    test session). The file is shared: copy it before changing it.
    """
    return _reloaded_paths()[name]


def reloaded_model(name: str) -> keras.Model:
    """Zoo model ``name``, saved, reloaded in a fresh process, loaded here (compiled)."""
    return load(reloaded_path(name), name)


try:
    import pytest

    @pytest.fixture(scope="session")
    def zoo_reloaded() -> dict[str, str]:
        """``{name: path}`` of every zoo model saved and reloaded in a fresh process."""
        return _reloaded_paths()
except ImportError:  # the fresh process does not need pytest
    pass


# ---------------------------------------------------------------- adapted preprocessing
#
# `ADAPTED` holds models whose preprocessing layers were adapted to data, as
# every keras-io structured-data example and its ViT do: state Keras's own
# saving carries and a copy from config plus weights does not
# (Normalization's mean and variance are rebuilt by ``finalize_state``, a
# lookup's vocabulary is an asset, Discretization's config after ``adapt``
# holds both ``num_bins`` and ``bin_boundaries``). The Normalization model's
# first feature is ~1e4 wide: its variance (~3e7) exceeds float16's largest
# value, 65504, so a float16 Normalization outputs 0 for it.

ADAPTED_KINDS = ("normalization", "discretization", "string_lookup", "integer_lookup")
WIDE = 3.0e4  # the Normalization model's first feature spans [0, WIDE)
WORDS = ("red", "green", "blue", "cyan")


def _wide(n, seed=0):
    x = np.random.default_rng(seed).uniform(0, 1, size=(n, FEATURES)).astype("float32")
    x[:, 0] *= WIDE
    return x


def _normalization():
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(_wide(256, seed=5))
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(8, activation="relu", kernel_initializer=_init(31), name="d1")(
        norm(inputs))
    outputs = keras.layers.Dense(1, kernel_initializer=_init(32), name="head")(h)
    return keras.Model(inputs, outputs, name="normalization")


def _normalization_data(n, seed=0):
    x = _wide(n, seed)
    return x, (x[:, :1] / WIDE).astype("float32")


def _discretization():
    bins = keras.layers.Discretization(num_bins=4, name="bins")
    bins.adapt(_regression(256, seed=6)[0])
    inputs = keras.Input((FEATURES,), name="x")
    h = keras.layers.Embedding(4, 4, embeddings_initializer=_uniform(33), name="emb")(
        bins(inputs))
    h = keras.layers.Flatten(name="flat")(h)
    outputs = keras.layers.Dense(1, kernel_initializer=_init(34), name="head")(h)
    return keras.Model(inputs, outputs, name="discretization")


def _string_lookup():
    lookup = keras.layers.StringLookup(name="lookup")
    lookup.adapt(np.array([[w] for w in WORDS * 3]))
    inputs = keras.Input((1,), dtype="string", name="word")
    h = keras.layers.Embedding(len(WORDS) + 1, 4, embeddings_initializer=_uniform(35),
                               name="emb")(lookup(inputs))
    outputs = keras.layers.Dense(1, kernel_initializer=_init(36), name="head")(
        keras.layers.Flatten(name="flat")(h))
    return keras.Model(inputs, outputs, name="string_lookup")


def _string_data(n, seed=0):
    picks = np.random.default_rng(seed).integers(0, len(WORDS), size=n)
    return (np.array([[WORDS[i]] for i in picks]),
            (picks / len(WORDS)).astype("float32")[:, None])


def _integer_lookup():
    lookup = keras.layers.IntegerLookup(name="lookup")
    lookup.adapt(np.array([[7], [11], [13], [7], [42]], "int64"))
    inputs = keras.Input((2,), dtype="int64", name="code")
    h = keras.layers.Embedding(5, 4, embeddings_initializer=_uniform(37), name="emb")(
        lookup(inputs))
    outputs = keras.layers.Dense(1, kernel_initializer=_init(38), name="head")(
        keras.layers.Flatten(name="flat")(h))
    return keras.Model(inputs, outputs, name="integer_lookup")


def _integer_data(n, seed=0):
    codes = np.array([7, 11, 13, 42, 99], "int64")  # 99: out of vocabulary
    x = codes[np.random.default_rng(seed).integers(0, len(codes), size=(n, 2))]
    return x, (x[:, :1] % 3).astype("float32")


_ADAPTED_SPECS = (
    ZooSpec("normalization", "normalization", _normalization, _normalization_data, "mse"),
    ZooSpec("discretization", "discretization", _discretization, _regression, "mse"),
    ZooSpec("string_lookup", "string_lookup", _string_lookup, _string_data, "mse"),
    ZooSpec("integer_lookup", "integer_lookup", _integer_lookup, _integer_data, "mse"),
)
ADAPTED: dict[str, ZooSpec] = {spec.name: spec for spec in _ADAPTED_SPECS}
assert all(spec.kind in ADAPTED_KINDS for spec in _ADAPTED_SPECS)


# ---------------------------------------------------------------- KerasHub
#
# `HUB` holds KerasHub 0.32 models built from config (never ``from_preset``:
# nothing is downloaded), tiny: text models take a dict of int32
# ``token_ids`` and ``padding_mask`` shaped (None, None); a
# task model compiles itself at construction. Building one imports keras_hub
# (seconds): tests over `HUB` run in the slow tier but for one or two.
# ``copyable``: tf_mixed can copy it (Llama's and ViT's layers do not survive
# ``from_config(get_config())``, KerasHub defects: tools that copy refuse them).

HUB_KINDS = ("hub_backbone", "hub_causal_lm", "hub_classifier")
HUB_VOCAB, HUB_LEN = 64, 6


def _hub_gemma_backbone(dtype=None):
    import keras_hub

    keras.utils.set_random_seed(7)
    return keras_hub.models.GemmaBackbone(
        vocabulary_size=HUB_VOCAB, num_layers=1, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=16, intermediate_dim=32, head_dim=8, dtype=dtype)


def _hub_gemma_lm(dtype=None):
    import keras_hub

    return keras_hub.models.GemmaCausalLM(backbone=_hub_gemma_backbone(dtype), preprocessor=None)


def _hub_llama():
    import keras_hub

    keras.utils.set_random_seed(7)
    return keras_hub.models.LlamaBackbone(
        vocabulary_size=HUB_VOCAB, num_layers=1, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=16, intermediate_dim=32)


def _hub_bert():
    import keras_hub

    keras.utils.set_random_seed(7)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=HUB_VOCAB, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16)
    return keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2,
                                               preprocessor=None)


def _hub_vit():
    import keras_hub

    keras.utils.set_random_seed(7)
    return keras_hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=1,
                                        num_heads=2, hidden_dim=16, mlp_dim=32)


def _tokens(n, seed=0):
    ids = np.random.default_rng(seed).integers(1, HUB_VOCAB, size=(n, HUB_LEN)).astype("int32")
    return {"token_ids": ids, "padding_mask": np.ones_like(ids)}


def _lm_data(n, seed=0):
    x = _tokens(n, seed)
    return x, np.roll(x["token_ids"], -1, axis=1)


def _backbone_data(n, seed=0):
    return _tokens(n, seed), np.zeros((n, HUB_LEN, 16), "float32")


def _bert_data(n, seed=0):
    x = _tokens(n, seed)
    x["segment_ids"] = np.zeros_like(x["token_ids"])
    return x, (x["token_ids"][:, 0] % 2).astype("int32")


def _hub_images(n, seed=0):
    x = np.random.default_rng(seed).uniform(0, 1, size=(n, 16, 16, 3)).astype("float32")
    return x, np.zeros((n, 17, 16), "float32")  # 16 patches and the class token


@dataclasses.dataclass(frozen=True)
class HubSpec(ZooSpec):
    """A `ZooSpec` of the KerasHub zoo, with ``copyable``."""

    copyable: bool = True


_HUB_SPECS = (
    HubSpec("gemma_backbone", "hub_backbone", _hub_gemma_backbone, _backbone_data, "mse"),
    HubSpec("gemma_causal_lm", "hub_causal_lm", _hub_gemma_lm, _lm_data, _SCC),
    HubSpec("llama_backbone", "hub_backbone", _hub_llama, _backbone_data, "mse",
            copyable=False),
    HubSpec("bert_classifier", "hub_classifier", _hub_bert, _bert_data, _SCC),
    HubSpec("vit_backbone", "hub_backbone", _hub_vit, _hub_images, "mse", copyable=False),
)
HUB: dict[str, HubSpec] = {spec.name: spec for spec in _HUB_SPECS}
assert all(spec.kind in HUB_KINDS for spec in _HUB_SPECS)


def epoch_loss_is_honest(history) -> bool:
    """The last epoch's loss: finite where a step was applied; nan where every
    step was skipped (a float16 run's first loss-scale search on one or two
    steps), not Keras's 0.0 over no batch."""
    loss = history.history["loss"][-1]
    if history.history["skipped_fraction"][-1] == 1.0:
        return math.isnan(loss)
    return math.isfinite(loss)
