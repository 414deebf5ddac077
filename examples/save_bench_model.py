"""Save one of the bench's models as a .keras file, for `python -m tf_mixed doctor`.

    python examples/save_bench_model.py --model=cnn --policy=mixed_bfloat16 --out=cnn.keras
    python -m tf_mixed doctor cnn.keras --batch_size=64

    python examples/save_bench_model.py --model=cnn --planted --out=slow.keras
    python -m tf_mixed doctor slow.keras --batch_size=64 --measure

``--planted`` builds the planted slow variant of the default CNN, with the
causes the doctor looks for: its middle convolution pinned to float32 (a
float32 island) and a hidden Dense layer of width 1001 before the head (a
width off the tiles). The images are the bench's default ``shapes`` data
(32x32x3, the classes of `tf_mixed.commands.data.SHAPE_CLASSES`).
"""

import keras
from absl import app, flags
from keras import layers

import tf_mixed
from tf_mixed.bench import models
from tf_mixed.commands import data

_MODEL = flags.DEFINE_enum("model", "cnn", list(models.MODEL_NAMES), "Bench model.")
_POLICY = flags.DEFINE_string("policy", "mixed_bfloat16", "Policy to build it under.")
_PLANTED = flags.DEFINE_boolean("planted", False, "The planted slow CNN variant.")
_OUT = flags.DEFINE_string("out", "model.keras", "Where to save it.")
_SIDE = 32


def planted_cnn(num_classes: int) -> keras.Model:
    """The bench CNN with a float32 middle convolution and a Dense(1001) before the head."""
    inputs = keras.Input((_SIDE, _SIDE, 3), name="image")
    x = layers.Rescaling(1.0 / 255.0, name="rescale")(inputs)
    for i, width in enumerate((32, 32, 64, 64)):
        pinned = "float32" if i == 2 else None
        x = layers.Conv2D(width, 3, padding="same", activation="relu", dtype=pinned,
                          name=f"conv{i}{'_float32' if pinned else ''}")(x)
        if i % 2:
            x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(128, 3, padding="same", activation="relu", name="conv4")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(1001, activation="relu", name="wide")(x)
    logits = layers.Dense(num_classes, name="logits")(x)
    outputs = tf_mixed.OutputActivation("softmax", name="probabilities")(logits)
    return keras.Model(inputs, outputs, name="planted_cnn")


def main(argv):
    del argv
    classes = len(data.SHAPE_CLASSES)
    with tf_mixed.policy_scope(_POLICY.value):
        keras.utils.set_random_seed(0)
        if _PLANTED.value:
            model = planted_cnn(classes)
        else:
            model = models.build(_MODEL.value, (_SIDE, _SIDE, 3), classes)
    model.save(_OUT.value)
    print(f"Saved {model.name} ({model.count_params():,} parameters, {_POLICY.value}) "
          f"to {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
