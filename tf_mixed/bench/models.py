"""The models the bench can train, all ending in a float32 softmax head."""

# Every model is built under Keras's *global* dtype policy (so build it inside
# `tf_mixed.policy_scope` or after `tf_mixed.enable`), takes images with pixel
# values in [0, 255] (a ``Rescaling`` layer comes first) and returns float32
# class probabilities from `tf_mixed.OutputActivation`, so the loss is
# computed in float32 from the logits.
#
#     mlp       Flatten, 3 x Dense(1024, relu)
#     cnn       small conv net: 2 x [Conv 32] pool, 2 x [Conv 64] pool, Conv 128, GAP
#     resnet18  ResNet-18 (basic blocks 2-2-2-2, BN momentum 0.9) built here; a 3x3 stride-1 stem
#               for images under 96 px (CIFAR style), the 7x7/2 + max-pool stem above
#     resnet50  keras.applications.ResNet50(weights=None), no download
#     mobilenetv2, efficientnetb0  keras.applications.MobileNetV2 / EfficientNetB0
#               (weights=None): depthwise convolutions, where half precision on a CPU
#               can be slower than float32 (docs/policies.md)
#     transformer  a small encoder on token sequences: token + position embedding
#               (width 64), 2 x [MultiHeadAttention (4 heads), LayerNorm, Dense 128-64,
#               LayerNorm], mean over the sequence (no Rescaling: its input is token ids)

from __future__ import annotations

from typing import Callable

import keras
from keras import layers

from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.commands import names
from tf_mixed.layers import OutputActivation


def _head(x, num_classes: int):
    logits = layers.Dense(num_classes, name="logits")(x)
    return OutputActivation("softmax", name="probabilities")(logits)


def build_mlp(inputs, num_classes: int):
    """3 hidden Dense(1024) layers on the flattened image."""
    x = layers.Flatten()(inputs)
    for i in range(3):
        x = layers.Dense(1024, activation="relu", name=f"dense_{i}")(x)
    return _head(x, num_classes)


def build_cnn(inputs, num_classes: int):
    """A small VGG-style conv net (about 0.3 M parameters)."""
    x = inputs
    for width in (32, 64):
        for _ in range(2):
            x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(128, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return _head(x, num_classes)


def _bn(name: str):
    # Momentum 0.9 (PyTorch's 0.1): moving statistics settle within the few
    # hundred steps of a bench run; with Keras's 0.99 validation lags far behind.
    return layers.BatchNormalization(momentum=0.9, name=name)


def _basic_block(x, width: int, stride: int, name: str):
    shortcut = x
    y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False,
                      name=f"{name}_conv1")(x)
    y = _bn(name=f"{name}_bn1")(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = _bn(name=f"{name}_bn2")(y)
    if stride != 1 or x.shape[-1] != width:
        shortcut = layers.Conv2D(width, 1, strides=stride, use_bias=False, name=f"{name}_proj")(x)
        shortcut = _bn(name=f"{name}_proj_bn")(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))


def build_resnet18(inputs, num_classes: int):
    """ResNet-18 (He et al. 2016), basic blocks [2, 2, 2, 2], widths 64-512."""
    x = inputs
    if inputs.shape[1] is not None and inputs.shape[1] >= 96:
        x = layers.Conv2D(64, 7, strides=2, padding="same", use_bias=False, name="stem_conv")(x)
        x = _bn(name="stem_bn")(x)
        x = layers.ReLU()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
    else:
        x = layers.Conv2D(64, 3, padding="same", use_bias=False, name="stem_conv")(x)
        x = _bn(name="stem_bn")(x)
        x = layers.ReLU()(x)
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, width, stride, name=f"stage{stage + 1}_block{block + 1}")
    x = layers.GlobalAveragePooling2D()(x)
    return _head(x, num_classes)


def build_resnet50(inputs, num_classes: int):
    """keras.applications.ResNet50 with random weights and our float32 head."""
    backbone = keras.applications.ResNet50(
        include_top=False, weights=None, input_shape=tuple(inputs.shape[1:]), pooling="avg"
    )
    return _head(backbone(inputs), num_classes)


def _application(factory, inputs, num_classes: int):
    backbone = factory(include_top=False, weights=None, input_shape=tuple(inputs.shape[1:]),
                       pooling="avg")
    return _head(backbone(inputs), num_classes)


def build_mobilenetv2(inputs, num_classes: int):
    """keras.applications.MobileNetV2 (alpha 1.0) with random weights and our float32 head."""
    return _application(keras.applications.MobileNetV2, inputs, num_classes)


def build_efficientnetb0(inputs, num_classes: int):
    """keras.applications.EfficientNetB0 with random weights and our float32 head."""
    return _application(keras.applications.EfficientNetB0, inputs, num_classes)


class PositionEmbedding(layers.Layer):
    """Adds a learned vector per sequence position (Keras has no such core layer)."""

    def build(self, input_shape):
        self.positions = self.add_weight(
            shape=(input_shape[-2], input_shape[-1]), initializer="random_normal", name="positions")

    def call(self, x):
        return x + keras.ops.cast(self.positions, x.dtype)


def _encoder_block(x, width: int, heads: int, name: str):
    attended = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attention")(x, x)
    x = layers.LayerNormalization(name=f"{name}_norm1")(layers.Add()([x, attended]))
    y = layers.Dense(2 * width, activation="relu", name=f"{name}_ffn1")(x)
    y = layers.Dense(width, name=f"{name}_ffn2")(y)
    return layers.LayerNormalization(name=f"{name}_norm2")(layers.Add()([x, y]))


def build_transformer(inputs, num_classes: int, *, width: int = 64, blocks: int = 2):
    """Token + position embedding, ``blocks`` encoder blocks, mean pooling."""
    from tf_mixed.commands.data import TOKEN_VOCABULARY

    x = layers.Embedding(TOKEN_VOCABULARY, width, name="tokens")(inputs)
    x = PositionEmbedding(name="positions")(x)
    for index in range(blocks):
        x = _encoder_block(x, width, 4, name=f"block{index + 1}")
    x = layers.GlobalAveragePooling1D()(x)
    return _head(x, num_classes)


_BUILDERS: dict[str, Callable] = {
    "mlp": build_mlp,
    "cnn": build_cnn,
    "resnet18": build_resnet18,
    "resnet50": build_resnet50,
    "mobilenetv2": build_mobilenetv2,
    "efficientnetb0": build_efficientnetb0,
    "transformer": build_transformer,
}
SEQUENCE_MODELS = names.SEQUENCE_MODELS  # take token sequences, not images
MODEL_NAMES: tuple[str, ...] = names.MODEL_NAMES
assert tuple(_BUILDERS) == MODEL_NAMES, "names.MODEL_NAMES names every builder"
_MIN_SIDE = {"resnet50": 32, "mobilenetv2": 32, "efficientnetb0": 32}


def build(name: str, input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """Builds a model under the current global dtype policy.

    Args:
        name: One of `MODEL_NAMES`.
        input_shape: ``(height, width, channels)``; ``(length,)`` for a sequence model.
        num_classes: Number of output classes.

    Returns:
        An uncompiled ``keras.Model`` returning float32 probabilities.

    Raises:
        UsageError: For an unknown name or images too small for the model.
    """
    name = names.check_model(name)
    if name in SEQUENCE_MODELS:
        inputs = keras.Input(shape=tuple(input_shape), name="tokens_in")
        return keras.Model(inputs, _BUILDERS[name](inputs, num_classes), name=name)
    side = min(input_shape[:2])
    if side < _MIN_SIDE.get(name, 8):
        raise UsageError(
            "image_size", side, f"too small for --model={name}",
            f"images of at least {_MIN_SIDE.get(name, 8)} px",
        )
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = layers.Rescaling(1.0 / 255.0, name="rescale")(inputs)
    outputs = _BUILDERS[name](x, num_classes)
    return keras.Model(inputs, outputs, name=name)
