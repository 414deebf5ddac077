"""Data sets for the bench and the commands: a generated shapes task, TFDS, a folder."""

# `load(spec, ...)` understands three kinds of ``--dataset`` value:
#
#     shapes               (default) 10-class images generated in process from the
#                          seed: shapes and textures at random places, sizes and
#                          colours, plus noise. No download, real structure.
#     tfds:NAME[:SPLIT]    any TFDS image-classification set, through
#                          tensorflow-datasets (``--data_dir`` is passed on).
#     folder:PATH          a class-per-subfolder image tree, as
#                          ``keras.utils.image_dataset_from_directory`` reads it.
#     tokens               10-class token sequences generated in process, for
#                          ``--model=transformer`` (see `make_tokens`).
#
# Every loader returns a `BenchData` whose datasets yield unbatched
# ``(image, label)`` pairs with pixel values in [0, 255] (uint8 or float32); the
# models start with a ``Rescaling(1/255)`` layer, so no loader normalises.

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import numpy as np
import tensorflow as tf

from tf_mixed._internal.cli_errors import UsageError, below_minimum
from tf_mixed.commands.names import (  # noqa: F401 (their home is TensorFlow-free)
    DEFAULT_SHAPES_SIZE,
    DEFAULT_SHAPES_TRAIN,
    MIN_SHAPES_SIZE,
    SHAPES,
    TOKENS,
    parse_spec,
)

TOKEN_VOCABULARY = 256
TOKEN_CLASSES = 10
DEFAULT_TOKENS_LENGTH = 64
SHAPE_CLASSES = (
    "disc",
    "square",
    "triangle",
    "ring",
    "plus",
    "x_cross",
    "h_stripes",
    "v_stripes",
    "diag_stripes",
    "checker",
)
DEFAULT_SHAPES_VAL = 2000
DEFAULT_FILE_IMAGE_SIZE = 64  # folder: and variable-size tfds sets
_CACHE_BYTES = 1 << 30
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# The formats `tf.io.decode_image` reads, by their first bytes (whatever the
# file's extension says).
_IMAGE_SIGNATURES = {
    b"\xff\xd8\xff": "JPEG",
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
}


@dataclasses.dataclass(frozen=True)
class BenchData:
    """A train/validation pair ready for batching.

    Attributes:
        name: The ``--dataset`` value it came from, in canonical form.
        train: Unbatched ``(image, label)`` pairs, pixels in [0, 255].
        val: The same for validation.
        num_classes: Number of classes; labels are ints in [0, num_classes).
        image_shape: ``(height, width, channels)`` of every image; ``(length,)``
            for token sequences.
        train_size: Number of training examples.
        val_size: Number of validation examples.
        class_names: One name per class.
    """

    name: str
    train: tf.data.Dataset
    val: tf.data.Dataset
    num_classes: int
    image_shape: tuple[int, ...]
    train_size: int
    val_size: int
    class_names: tuple[str, ...]

    def describe(self) -> dict:
        """The facts about this data that go into results.json."""
        return {
            "name": self.name,
            "num_classes": self.num_classes,
            "image_shape": list(self.image_shape),
            "train_size": self.train_size,
            "val_size": self.val_size,
            "class_names": list(self.class_names),
        }


def load(
    spec: str,
    *,
    seed: int = 0,
    image_size: int = 0,
    train_size: int = 0,
    val_size: int = 0,
    data_dir: str | None = None,
    download: bool = True,
) -> BenchData:
    """Loads the data set that ``--dataset`` names.

    Args:
        spec: See `parse_spec`.
        seed: Seed for generated data and for the folder train/val split.
        image_size: Square side to generate or resize to; 0 picks 32 for
            shapes, the native size for fixed-size TFDS sets and 64 otherwise.
        train_size: Number of training examples (shapes: generated, default
            8000; others: a cap, 0 for all).
        val_size: The same for validation (shapes default 2000).
        data_dir: TFDS data directory (None: TFDS's default).
        download: Whether TFDS may try to download and prepare a missing set.

    Returns:
        A `BenchData`.

    Raises:
        UsageError: For an unknown or unreadable data set.
    """
    kind, name, split = parse_spec(spec)
    if image_size < 0:
        raise below_minimum("image_size", image_size, 0, "0 picks the data set's own size.")
    if kind == SHAPES:
        return load_shapes(
            seed=seed,
            image_size=image_size or DEFAULT_SHAPES_SIZE,
            train_size=train_size or DEFAULT_SHAPES_TRAIN,
            val_size=val_size or DEFAULT_SHAPES_VAL,
        )
    if kind == TOKENS:
        return load_tokens(
            seed=seed, length=image_size or DEFAULT_TOKENS_LENGTH,
            train_size=train_size or DEFAULT_SHAPES_TRAIN,
            val_size=val_size or DEFAULT_SHAPES_VAL,
        )
    if kind == "tfds":
        return load_tfds(
            name, split, data_dir=data_dir, download=download, image_size=image_size,
            train_size=train_size, val_size=val_size,
        )
    return load_folder(
        name, seed=seed, image_size=image_size or DEFAULT_FILE_IMAGE_SIZE,
        train_size=train_size, val_size=val_size,
    )


# --- shapes: the embedded default ------------------------------------------


def make_shapes(
    num_examples: int, *, seed: int, image_size: int = DEFAULT_SHAPES_SIZE
) -> tuple[np.ndarray, np.ndarray]:
    """Generates the shapes task: one shape or texture per image on a plain ground.

    Classes (see `SHAPE_CLASSES`) differ in form only: the position, size,
    colours, stripe period and phase are random, and Gaussian noise
    (sigma 0.12 of the range) is added, so a model must learn shape features.
    The output depends only on the arguments.

    Args:
        num_examples: Number of images.
        seed: Random seed.
        image_size: Side of the square images in pixels (>= 16).

    Returns:
        ``(images, labels)``: uint8 ``[N, size, size, 3]`` and int32 ``[N]``,
        labels balanced and in shuffled order.
    """
    rng = np.random.default_rng(seed)
    n, size = num_examples, image_size
    labels = rng.permutation(np.arange(n) % len(SHAPE_CLASSES)).astype(np.int32)
    # Per-image geometry, relative to the image size.
    radius = rng.uniform(0.2, 0.32, n) * size
    cx = rng.uniform(radius, size - radius)
    cy = rng.uniform(radius, size - radius)
    period = rng.uniform(0.11, 0.19, n) * size
    phase = rng.uniform(0.0, 1.0, n) * period
    light = rng.random(n) < 0.5
    fg = np.where(light[:, None], rng.uniform(0.6, 1.0, (n, 3)), rng.uniform(0.0, 0.4, (n, 3)))
    bg = np.where(light[:, None], rng.uniform(0.0, 0.35, (n, 3)), rng.uniform(0.65, 1.0, (n, 3)))

    grid = np.arange(size, dtype=np.float32) + 0.5
    dx = grid[None, None, :] - cx[:, None, None]
    dy = grid[None, :, None] - cy[:, None, None]
    r = radius[:, None, None]
    p = period[:, None, None]
    ph = phase[:, None, None]
    dist2 = dx**2 + dy**2
    box = (np.abs(dx) <= r) & (np.abs(dy) <= r)
    ax, ay = np.abs(dx), np.abs(dy)
    masks = {
        "disc": dist2 <= r**2,
        "square": (ax <= 0.85 * r) & (ay <= 0.85 * r),
        "triangle": (dy <= 0.8 * r) & (dy >= -r + 1.8 * ax),
        "ring": (dist2 <= r**2) & (dist2 >= (0.55 * r) ** 2),
        "plus": ((ax <= 0.28 * r) & (ay <= r)) | ((ay <= 0.28 * r) & (ax <= r)),
        "x_cross": (np.abs(ax - ay) <= 0.3 * r) & box,
        "h_stripes": box & (np.mod(dy + ph, p) < p / 2),
        "v_stripes": box & (np.mod(dx + ph, p) < p / 2),
        "diag_stripes": box & (np.mod(dx + dy + ph, p) < p / 2),
        "checker": box
        & (np.mod(np.floor((dx + ph) / p) + np.floor((dy + ph) / p), 2) == 0),
    }
    mask = np.zeros((n, size, size), dtype=bool)
    for index, name in enumerate(SHAPE_CLASSES):
        rows = labels == index
        mask[rows] = masks[name][rows]
    m = mask[..., None].astype(np.float32)
    images = bg[:, None, None, :] * (1 - m) + fg[:, None, None, :] * m
    images += rng.normal(0.0, 0.12, images.shape)
    images = np.clip(np.rint(images * 255.0), 0, 255).astype(np.uint8)
    return images, labels


def load_shapes(
    *, seed: int, image_size: int = DEFAULT_SHAPES_SIZE, train_size: int = DEFAULT_SHAPES_TRAIN,
    val_size: int = DEFAULT_SHAPES_VAL,
) -> BenchData:
    """The embedded shapes task (see `make_shapes`) as a `BenchData`.

    Train and validation images come from independent streams of the seed.

    Raises:
        UsageError: If ``image_size`` < 16 or a size < 1.
    """
    if image_size < MIN_SHAPES_SIZE:
        raise UsageError(
            "image_size", image_size, "too small for the shapes data set",
            f"{MIN_SHAPES_SIZE} or more (0 picks {DEFAULT_SHAPES_SIZE})",
        )
    return _generated(SHAPES, lambda n, s: make_shapes(n, seed=s, image_size=image_size),
                      seed=seed, train_size=train_size, val_size=val_size,
                      image_shape=(image_size, image_size, 3), class_names=SHAPE_CLASSES)


def _generated(name: str, make, *, seed: int, train_size: int, val_size: int,
               image_shape: tuple, class_names: tuple) -> BenchData:
    """A data set generated in process: ``make(num_examples, seed)`` per split.

    Raises:
        UsageError: If a size < 1.
    """
    for flag, value in (("train_size", train_size), ("val_size", val_size)):
        if value < 1:
            raise below_minimum(flag, value, 1)
    x_train, y_train = make(train_size, seed * 2 + 1)
    x_val, y_val = make(val_size, seed * 2 + 2)
    return BenchData(
        name=name,
        train=tf.data.Dataset.from_tensor_slices((x_train, y_train)),
        val=tf.data.Dataset.from_tensor_slices((x_val, y_val)),
        num_classes=len(class_names),
        image_shape=image_shape,
        train_size=train_size,
        val_size=val_size,
        class_names=class_names,
    )


# --- tokens: sequences for the transformer ----------------------------------


def make_tokens(num_examples: int, *, seed: int, length: int = DEFAULT_TOKENS_LENGTH
                ) -> tuple[np.ndarray, np.ndarray]:
    """Generates the tokens task: which class token a sequence repeats.

    Token ids 1-10 are the classes' tokens, 11-255 noise. A sequence of class
    c holds token c + 1 at 4 random places, one other class token once, and
    noise elsewhere, so a model must count tokens across the sequence. The
    output depends only on the arguments.

    Args:
        num_examples: Number of sequences.
        seed: Random seed.
        length: Tokens per sequence (>= 8).

    Returns:
        ``(tokens, labels)``: int32 ``[N, length]`` and int32 ``[N]``, labels
        balanced and in shuffled order.
    """
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(num_examples) % TOKEN_CLASSES).astype(np.int32)
    tokens = rng.integers(
        TOKEN_CLASSES + 1, TOKEN_VOCABULARY, (num_examples, length)).astype(np.int32)
    places = np.argsort(rng.random((num_examples, length)), axis=1)[:, :5]
    rows = np.arange(num_examples)[:, None]
    tokens[rows, places[:, :4]] = labels[:, None] + 1
    other = (labels + rng.integers(1, TOKEN_CLASSES, num_examples)) % TOKEN_CLASSES
    tokens[np.arange(num_examples), places[:, 4]] = other + 1
    return tokens, labels


def load_tokens(*, seed: int, length: int = DEFAULT_TOKENS_LENGTH,
                train_size: int = DEFAULT_SHAPES_TRAIN,
                val_size: int = DEFAULT_SHAPES_VAL) -> BenchData:
    """The tokens task (see `make_tokens`) as a `BenchData` (``image_shape`` is ``(length,)``).

    Raises:
        UsageError: If ``length`` < 8 or a size < 1.
    """
    if length < 8:
        raise UsageError("image_size", length,
                         "too short for the tokens data set (the sequence length)",
                         f"8 or more (0 picks {DEFAULT_TOKENS_LENGTH})")
    return _generated(TOKENS, lambda n, s: make_tokens(n, seed=s, length=length),
                      seed=seed, train_size=train_size, val_size=val_size,
                      image_shape=(length,),
                      class_names=tuple(f"token_{i + 1}" for i in range(TOKEN_CLASSES)))


# --- tfds:NAME[:SPLIT] -------------------------------------------------------


def _prepare_hint(name: str, data_dir: str | None) -> str:
    # Not `tfds build`: in tensorflow-datasets 4.9.10 that command imports
    # apache_beam at start-up, which tfds does not install.
    target = data_dir or "~/tensorflow_datasets"
    dir_arg = f", data_dir={data_dir!r}" if data_dir else ""
    return (
        "Prepare it on a machine with network access with `python -c \"import "
        f"tensorflow_datasets as tfds; tfds.builder({name!r}{dir_arg}).download_and_prepare()\"`"
        f", then copy the prepared directory to {target} on this machine"
        + ("" if data_dir else " (or pass --data_dir)")
        + f"; sets that need manual downloads read them from {target}/downloads/manual."
    )


@contextlib.contextmanager
def _quiet_absl():
    """Holds absl's Python logger at ERROR.

    ``builder.is_prepared()`` logs "Variant folder ... has no dataset_info.json"
    for a set that is not prepared; the error raised then says it in one line.
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# TFDS fetches most sets from its Google Cloud Storage mirror first.
DOWNLOAD_HOST = ("storage.googleapis.com", 443)
_REACH_TIMEOUT_S = 3.0


def _download_host_unreachable(timeout: float = _REACH_TIMEOUT_S) -> str | None:
    """Why TFDS's download host cannot be reached within ``timeout`` s (None: it can).

    Through the HTTPS proxy when one is set (``HTTPS_PROXY``/``https_proxy``),
    as TFDS's downloads would go.
    """
    import socket
    import urllib.parse

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if proxy:
        parsed = urllib.parse.urlparse(proxy if "://" in proxy else f"http://{proxy}")
        host, port = parsed.hostname or "", parsed.port or 3128
        what = f"the HTTPS proxy {host}:{port}"
    else:
        host, port = DOWNLOAD_HOST
        what = f"{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return f"{what} is unreachable ({type(error).__name__}: {error}; no network?)"
    return None


def load_tfds(
    name: str,
    split: str = "train",
    *,
    data_dir: str | None = None,
    download: bool = True,
    image_size: int = 0,
    train_size: int = 0,
    val_size: int = 0,
) -> BenchData:
    """Loads a TFDS image-classification set with its ``(image, label)`` keys.

    Validation uses the set's "test" split, else its "validation" split, else
    the last 10% of ``split``.

    Args:
        name: A TFDS name, e.g. "mnist" or "cifar10".
        split: The training split, e.g. "train" or "train[:5000]".
        data_dir: TFDS data directory.
        download: Whether a missing set may be downloaded and prepared.
        image_size: Resize to this square side; 0 keeps a fixed native size
            (variable-size sets get 64).
        train_size, val_size: Caps on the number of examples; 0 for all.

    Raises:
        UsageError: For an unknown name, a set that is not prepared and
            cannot be downloaded, or a set that is not image classification.
    """
    import tensorflow_datasets as tfds

    flag_value = f"tfds:{name}" + (f":{split}" if split != "train" else "")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as error:  # DatasetNotFoundError and friends
        raise UsageError(
            "dataset", flag_value, f"TFDS has no data set {name!r} ({_first_line(error)})",
            "a name from `tfds.list_builders()`, e.g. tfds:mnist, tfds:cifar10",
        ) from None
    with _quiet_absl():
        prepared = builder.is_prepared()
    if not prepared:
        where = str(builder.data_dir)
        if not download:
            raise UsageError(
                "dataset", flag_value,
                # True whoever asked: the bench's --nodownload, or probe,
                # export and doctor, which never download.
                f"TFDS data set {name!r} is not prepared (looked in {where}) and this "
                "command does not download it (bench: --nodownload; probe, export and "
                "doctor never download)",
                fix=_prepare_hint(name, data_dir),
            )
        # Only TFDS's own download goes to the network (tfds.testing.mock_data
        # replaces it with a no-op that needs none).
        own = getattr(tfds.core.DatasetBuilder.download_and_prepare, "__module__", "")
        unreachable = (_download_host_unreachable()
                       if own.startswith("tensorflow_datasets.core") else None)
        if unreachable:
            # TFDS would retry its downloads for minutes before saying so.
            raise UsageError(
                "dataset", flag_value,
                f"TFDS data set {name!r} is not prepared (looked in {where}) and cannot be "
                f"downloaded here: {unreachable}",
                fix=_prepare_hint(name, data_dir),
            )
        try:
            builder.download_and_prepare()
        except Exception as error:
            raise UsageError(
                "dataset", flag_value,
                f"TFDS data set {name!r} is not prepared in "
                f"{data_dir or 'the default TFDS data_dir'} and could not be downloaded "
                f"({_first_line(error)})",
                fix=_prepare_hint(name, data_dir),
            ) from None
    info = builder.info
    keys = info.supervised_keys
    if not keys or len(keys) != 2:
        raise UsageError(
            "dataset", flag_value, "not a supervised data set (no (image, label) keys)",
            "TFDS image-classification sets such as mnist, cifar10, food101",
        )
    image_feature, label_feature = info.features[keys[0]], info.features[keys[1]]
    if not isinstance(image_feature, tfds.features.Image) or not hasattr(
        label_feature, "num_classes"
    ):
        raise UsageError(
            "dataset", flag_value,
            f"not image classification (features {keys[0]!r}: "
            f"{type(image_feature).__name__}, {keys[1]!r}: {type(label_feature).__name__})",
            "TFDS image-classification sets such as mnist, cifar10, food101",
        )
    split_names = set(info.splits.keys()) if info.splits else set()
    base_split = split.split("[")[0]
    val_split = next(
        (s for s in ("test", "validation") if s in split_names and s != base_split), None
    )
    if val_split is None and not split_names:
        val_split = "test"  # splits unknown (e.g. mocked data): TFDS's usual name
    try:
        if val_split is None:
            if "[" in split:
                raise UsageError(
                    "dataset", flag_value,
                    f"{name!r} has no test or validation split to validate on, and "
                    "a sliced split cannot be split again",
                    fix="Give an unsliced split, e.g. tfds:NAME:train.",
                )
            train = builder.as_dataset(split=f"{split}[:90%]", as_supervised=True)
            val = builder.as_dataset(split=f"{split}[90%:]", as_supervised=True)
        else:
            train = builder.as_dataset(split=split, as_supervised=True)
            val = builder.as_dataset(split=val_split, as_supervised=True)
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(
            "dataset", flag_value, f"cannot read split {split!r} ({_first_line(error)})",
            f"the splits of {name}: {', '.join(sorted(split_names)) or 'unknown'}",
        ) from None

    height, width, channels = image_feature.shape
    channels = channels or 3
    if image_size:
        shape = (image_size, image_size, channels)
    elif height and width:
        shape = (height, width, channels)
    else:
        shape = (DEFAULT_FILE_IMAGE_SIZE, DEFAULT_FILE_IMAGE_SIZE, channels)
    resize = (height, width) != shape[:2]

    def prepare(image, label):
        image = tf.ensure_shape(image, [None, None, channels])
        if resize:
            image = tf.image.resize(image, shape[:2])
        return tf.cast(image, tf.float32), tf.cast(label, tf.int32)

    train, n_train = _capped(train.map(prepare), train_size)
    val, n_val = _capped(val.map(prepare), val_size)
    names = tuple(label_feature.names) if getattr(label_feature, "names", None) else tuple(
        str(i) for i in range(label_feature.num_classes)
    )
    return BenchData(
        name=f"tfds:{name}:{split}",
        train=train,
        val=val,
        num_classes=int(label_feature.num_classes),
        image_shape=shape,
        train_size=n_train,
        val_size=n_val,
        class_names=names,
    )


def _capped(dataset: tf.data.Dataset, cap: int) -> tuple[tf.data.Dataset, int]:
    """Takes at most ``cap`` elements (0: all) and counts them."""
    if cap:
        dataset = dataset.take(cap)
    count = int(dataset.cardinality())
    if count < 0:  # unknown or infinite: count once (cheap next to training)
        count = int(dataset.reduce(0, lambda n, _: n + 1))
    return dataset, count


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


# --- folder:PATH --------------------------------------------------------------


def _scan_folder(path: str) -> dict[str, int]:
    """Counts image files per class subfolder; raises UsageError if unusable."""
    value = f"folder:{path}"
    accepted = (
        "a readable directory with one subfolder per class holding image files "
        f"({', '.join(IMAGE_EXTENSIONS)})"
    )
    if not os.path.isdir(path):
        raise UsageError("dataset", value, "no such directory", accepted)
    if not os.access(path, os.R_OK | os.X_OK):
        raise UsageError("dataset", value, "directory is not readable", accepted)
    counts = {}
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
        for entry in entries:
            if entry.is_dir():
                if not os.access(entry.path, os.R_OK | os.X_OK):
                    raise UsageError(
                        "dataset", value, f"class folder {entry.name!r} is not readable", accepted
                    )
                images = sorted(
                    f.path for f in os.scandir(entry.path)
                    if f.is_file() and f.name.lower().endswith(IMAGE_EXTENSIONS)
                )
                for image in images:
                    _check_image_file(image, value, accepted)
                counts[entry.name] = len(images)
    except PermissionError as error:
        raise UsageError("dataset", value, f"cannot read ({error})", accepted) from None
    counts = {k: v for k, v in counts.items() if v}
    if len(counts) < 2:
        raise UsageError(
            "dataset", value,
            f"found {len(counts)} class subfolder(s) with images; need at least 2",
            accepted,
        )
    return counts


def _check_image_file(path: str, value: str, accepted: str) -> None:
    """Raises UsageError naming ``path`` unless it starts like an image TF decodes.

    Reading a few bytes per file here is what lets a bad file fail before
    training, with its name, instead of deep inside a TensorFlow step.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as error:
        raise UsageError(
            "dataset", value, f"cannot read {path} ({error.strerror or error})", accepted
        ) from None
    if not any(head.startswith(signature) for signature in _IMAGE_SIGNATURES):
        kind = "is empty" if not head else (
            f"is not a JPEG, PNG, GIF or BMP image (starts with {head[:8]!r})")
        raise UsageError(
            "dataset", value, f"{path} {kind}", accepted,
            "Remove or re-encode that file.",
        )


def load_folder(
    path: str, *, seed: int = 0, image_size: int = DEFAULT_FILE_IMAGE_SIZE,
    train_size: int = 0, val_size: int = 0,
) -> BenchData:
    """Reads a class-per-subfolder image tree, holding out 10% (at least 1) for validation.

    Args:
        path: The root folder; each subfolder is one class (sorted by name).
        seed: Seed for the train/validation split.
        image_size: Images are resized to this square side.
        train_size, val_size: Caps on the number of examples; 0 for all.

    Raises:
        UsageError: If the folder is missing, unreadable, has < 2 classes or
            holds a file that is not an image, naming that file.
    """
    import keras

    counts = _scan_folder(path)
    total = sum(counts.values())
    if total < 2:
        raise UsageError("dataset", f"folder:{path}", "needs at least 2 images", "")
    split = max(0.1, 1.0 / total + 1e-6)
    train, val = keras.utils.image_dataset_from_directory(
        path,
        labels="inferred",
        label_mode="int",
        class_names=sorted(counts),
        image_size=(image_size, image_size),
        batch_size=None,
        shuffle=True,
        seed=seed,
        validation_split=split,
        subset="both",
        verbose=False,
    )

    def prepare(image, label):
        return tf.cast(image, tf.float32), tf.cast(label, tf.int32)

    train, n_train = _capped(train.map(prepare), train_size)
    val, n_val = _capped(val.map(prepare), val_size)
    # Decode and resize once when it fits in memory, so the timed steps
    # measure training rather than JPEG decoding.
    if (n_train + n_val) * image_size * image_size * 3 * 4 <= _CACHE_BYTES:
        train, val = train.cache(), val.cache()
    return BenchData(
        name=f"folder:{path}",
        train=train,
        val=val,
        num_classes=len(counts),
        image_shape=(image_size, image_size, 3),
        train_size=n_train,
        val_size=n_val,
        class_names=tuple(sorted(counts)),
    )
