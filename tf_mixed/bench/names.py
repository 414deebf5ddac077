"""The bench's model and data-set names, kept where no TensorFlow is imported."""

# The command line's --help reads them before TensorFlow loads;
# `tf_mixed.bench.models` and `tf_mixed.bench.data` use the same ones.

MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "resnet18", "resnet50", "transformer")
DATA_ACCEPTED = ("shapes, tfds:NAME[:SPLIT] (e.g. tfds:mnist or tfds:cifar10:train), folder:PATH, "
                 "tokens (for --model=transformer)")
