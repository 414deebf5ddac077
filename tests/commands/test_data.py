"""Tests for tf_mixed.commands.data: the shapes task, folder: trees and tfds: sets."""

import os
import socket

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

from tf_mixed._internal.cli_errors import UsageError
from tf_mixed.commands import data

# --- parse_spec ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec, expected",
    [
        ("shapes", ("shapes", "", "")),
        ("SHAPES", ("shapes", "", "")),
        ("synthetic", ("shapes", "", "")),
        ("tfds:mnist", ("tfds", "mnist", "train")),
        ("tfds:cifar10:test", ("tfds", "cifar10", "test")),
        ("tfds:mnist:train[:10%]", ("tfds", "mnist", "train[:10%]")),
        ("folder:/data/food", ("folder", "/data/food", "")),
        ("folder:C:/x", ("folder", "C:/x", "")),
    ],
)
def test_parse_spec(spec, expected):
    assert data.parse_spec(spec) == expected


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["imagenet", "tfds:", "folder:", "", "hf:mnist"])
def test_parse_spec_rejects_with_flag_value_and_choices(spec):
    with pytest.raises(UsageError) as info:
        data.parse_spec(spec)
    message = str(info.value)
    assert message.startswith(f"--dataset={spec!r}")
    assert "shapes, tfds:NAME[:SPLIT]" in message
    assert isinstance(info.value, ValueError)


# --- shapes -------------------------------------------------------------------


def test_make_shapes_is_deterministic_balanced_and_in_range():
    x1, y1 = data.make_shapes(200, seed=3, image_size=24)
    x2, y2 = data.make_shapes(200, seed=3, image_size=24)
    x3, _ = data.make_shapes(200, seed=4, image_size=24)
    assert x1.shape == (200, 24, 24, 3) and x1.dtype == np.uint8
    assert y1.shape == (200,) and y1.dtype == np.int32
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(x1, x3)
    assert np.bincount(y1).tolist() == [20] * len(data.SHAPE_CLASSES)
    assert x1.min() == 0 and x1.max() == 255  # noise reaches both ends after clipping


def test_shapes_classes_differ_in_form_not_in_colour():
    """Mean colour carries no label information; the foreground shape does."""
    x, y = data.make_shapes(2000, seed=0)
    means = np.array([x[y == c].mean() for c in range(len(data.SHAPE_CLASSES))])
    assert means.std() < 6.0  # class colour means within a few grey levels
    # Horizontal vs vertical stripes: row-wise vs column-wise variation.
    def axis_energy(images, axis):
        g = images.astype(np.float32).mean(-1)
        return np.abs(np.diff(g, axis=axis)).mean()
    h = x[y == data.SHAPE_CLASSES.index("h_stripes")]
    v = x[y == data.SHAPE_CLASSES.index("v_stripes")]
    assert axis_energy(h, 1) > 1.2 * axis_energy(h, 2)
    assert axis_energy(v, 2) > 1.2 * axis_energy(v, 1)


def test_load_shapes_sizes_and_independent_splits():
    d = data.load("shapes", seed=1, train_size=50, val_size=20, image_size=16)
    assert d.name == "shapes"
    assert (d.train_size, d.val_size, d.num_classes) == (50, 20, 10)
    assert d.image_shape == (16, 16, 3)
    train = np.stack([x.numpy() for x, _ in d.train])
    val = np.stack([x.numpy() for x, _ in d.val])
    assert train.shape == (50, 16, 16, 3) and val.shape == (20, 16, 16, 3)
    assert not np.array_equal(train[:20], val)
    assert d.describe()["class_names"][0] == "disc"


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, flag", [({"image_size": 8}, "image_size"),
                                          ({"train_size": -1}, "train_size"),
                                          ({"image_size": -2}, "image_size")])
def test_load_shapes_rejects_bad_sizes(kwargs, flag):
    with pytest.raises(UsageError) as info:
        data.load("shapes", **kwargs)
    assert info.value.flag == flag


# --- folder: ------------------------------------------------------------------

_COLOURS = {"apple": (220, 20, 20), "kiwi": (20, 200, 20), "plum": (30, 30, 210)}


def _write_tree(root, per_class=6, formats=("png", "jpg")):
    for name, colour in _COLOURS.items():
        os.makedirs(root / name)
        for i in range(per_class):
            image = np.full((20 + i, 24, 3), colour, np.uint8)
            Image.fromarray(image).save(root / name / f"{i}.{formats[i % len(formats)]}")
    (root / "README.txt").write_text("not a class")
    os.makedirs(root / "empty_class")
    return root


def test_folder_reads_classes_labels_and_resizes(tmp_path):
    root = _write_tree(tmp_path / "food")
    d = data.load(f"folder:{root}", image_size=16, seed=0)
    assert d.class_names == ("apple", "kiwi", "plum")  # empty folder ignored
    assert d.num_classes == 3
    assert d.train_size + d.val_size == 18 and d.val_size >= 1
    assert d.image_shape == (16, 16, 3)
    for dataset in (d.train, d.val):
        for image, label in dataset:
            assert image.shape == (16, 16, 3) and image.dtype == tf.float32
            colour = _COLOURS[d.class_names[int(label)]]
            np.testing.assert_allclose(image.numpy().mean((0, 1)), colour, atol=8)


def test_folder_caps_sizes(tmp_path):
    root = _write_tree(tmp_path / "food")
    d = data.load(f"folder:{root}", image_size=16, train_size=4, val_size=1)
    assert (d.train_size, d.val_size) == (4, 1)
    assert len(list(d.train)) == 4


def test_folder_errors_name_the_problem(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="no such directory"):
        data.load(f"folder:{tmp_path / 'missing'}")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="no such directory"):
        data.load(f"folder:{tmp_path / 'file'}")
    one = tmp_path / "one"
    os.makedirs(one / "only")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(one / "only" / "a.png")
    with pytest.raises(UsageError, match="found 1 class subfolder"):
        data.load(f"folder:{one}")
    root = _write_tree(tmp_path / "food")
    # Permissions cannot be taken away from root, so fake an unreadable tree.
    monkeypatch.setattr(data.os, "access", lambda path, mode: False)
    with pytest.raises(UsageError, match="not readable") as info:
        data.load(f"folder:{root}")
    assert info.value.flag == "dataset" and "subfolder per class" in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("content, problem", [
    (b"hello, I am text\n", "is not a JPEG, PNG, GIF or BMP image (starts with b'hello, I')"),
    (b"", "is empty"),
])
def test_folder_names_a_file_that_is_not_an_image(tmp_path, content, problem):
    root = _write_tree(tmp_path / "food")
    bad = root / "kiwi" / "zz_bad.jpg"
    bad.write_bytes(content)
    with pytest.raises(UsageError) as info:
        data.load(f"folder:{root}")
    assert str(info.value).startswith(f"--dataset='folder:{root}': {bad} {problem}.")
    assert info.value.flag == "dataset"


def test_folder_accepts_images_whatever_their_extension(tmp_path):
    root = _write_tree(tmp_path / "food")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "plum" / "png_inside.jpg",
                                                        format="PNG")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "plum" / "x.gif")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "plum" / "x.bmp")
    d = data.load(f"folder:{root}", image_size=16)
    assert d.train_size + d.val_size == 21


# --- tfds: --------------------------------------------------------------------


def test_tfds_through_mock_data():
    with tfds.testing.mock_data(num_examples=12):
        d = data.load("tfds:mnist")
    assert d.name == "tfds:mnist:train"
    assert d.num_classes == 10
    assert d.image_shape == (28, 28, 1)
    assert (d.train_size, d.val_size) == (12, 12)
    images, labels = next(iter(d.train.batch(12)))
    assert images.shape == (12, 28, 28, 1) and images.dtype == tf.float32
    assert float(tf.reduce_max(images)) <= 255.0
    assert set(labels.numpy().tolist()) <= set(range(10))


def test_tfds_resize_and_cap_through_mock_data():
    with tfds.testing.mock_data(num_examples=10):
        d = data.load("tfds:cifar10:train", image_size=16, train_size=6, val_size=3)
    assert d.image_shape == (16, 16, 3)
    assert (d.train_size, d.val_size) == (6, 3)
    image, _ = next(iter(d.train))
    assert image.shape == (16, 16, 3)


def test_tfds_unknown_name():
    with pytest.raises(UsageError) as info:
        data.load("tfds:no_such_dataset_xyz")
    assert "--dataset='tfds:no_such_dataset_xyz'" in str(info.value)
    assert "tfds.list_builders()" in str(info.value)


def _advised_command(message):
    """The shell command between backticks in a prepare hint."""
    command = message.split("`")[1]
    prefix = 'python -c "'
    assert command.startswith(prefix) and command.endswith('"'), command
    return command[len(prefix):-1]


@pytest.mark.parametrize("with_dir", [True, False])
def test_tfds_not_prepared_advice_is_a_command_that_prepares(tmp_path, monkeypatch, with_dir):
    if with_dir:
        with pytest.raises(UsageError) as info:
            data.load("tfds:mnist", data_dir=str(tmp_path), download=False)
        message = str(info.value)
        assert message.startswith("--dataset='tfds:mnist': TFDS data set 'mnist' is not prepared")
        # Not "--nodownload was given": probe, export and doctor never download.
        assert "--nodownload was given" not in message
        assert "this command does not download it (bench: --nodownload; probe, export " in message
    else:  # TFDS's default directory may hold a prepared mnist on this host
        message = data._prepare_hint("mnist", None)
        assert "(or pass --data_dir)" in message
    # Not `tfds build`: in tfds 4.9.10 it needs apache_beam, which tfds does not install.
    assert "tfds build" not in message
    # Run the advised code with the download replaced by a recorder: it must
    # prepare mnist into the directory given (nothing else needs the network).
    prepared = []

    def record(builder, *args, **kwargs):
        prepared.append((builder.name, str(builder.data_dir)))

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", record)
    exec(_advised_command(message), {})
    assert len(prepared) == 1 and prepared[0][0] == "mnist"
    if with_dir:
        assert prepared[0][1].startswith(str(tmp_path))
        assert f"copy the prepared directory to {tmp_path}" in message


def test_tfds_builder_code_path_works_without_network(tmp_path):
    """tfds 4.9.10 imports importlib_resources here on every Python, declared only for < 3.9.

    It declares that dependency only for Python < 3.9, so pyproject.toml does;
    without it no builder can prepare data. Fails in an environment that was
    not installed from pyproject.toml.
    """
    path = tfds.builder("mnist", data_dir=str(tmp_path)).code_path
    assert str(path).endswith("mnist.py")


def test_tfds_failed_download_explains_how(tmp_path, monkeypatch):
    def no_network(self, *args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_network)
    monkeypatch.setattr(data, "_download_host_unreachable", lambda: None)  # host-independent
    with pytest.raises(UsageError) as info:
        data.load("tfds:mnist", data_dir=str(tmp_path))
    message = str(info.value)
    assert "could not be downloaded (OSError: Name or service not known)" in message
    assert "tfds.builder('mnist', data_dir=" in message and "download_and_prepare()" in message


def test_tfds_rejects_non_image_sets():
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(UsageError, match="not image classification"):
            data.load("tfds:imdb_reviews")


def test_tfds_offline_and_not_prepared_fails_at_once_saying_where_and_how(tmp_path, monkeypatch):
    tried = []  # TFDS's own download_and_prepare runs; its network part must not
    monkeypatch.setattr(tfds.core.DatasetBuilder, "_download_and_prepare",
                        lambda *a, **k: tried.append(a))
    monkeypatch.setattr(data, "_download_host_unreachable",
                        lambda: "storage.googleapis.com:443 is unreachable (no network?)")
    with pytest.raises(UsageError) as info:
        data.load("tfds:mnist", data_dir=str(tmp_path))
    message = str(info.value)
    assert tried == []  # TFDS's minutes of download retries never start
    assert "\n" not in message
    assert f"is not prepared (looked in {tmp_path}/mnist/" in message
    assert "cannot be downloaded here: storage.googleapis.com:443 is unreachable" in message
    assert "download_and_prepare()" in message and "--data_dir" not in message.split(";")[0]


def test_download_host_check_is_bounded_and_uses_the_proxy(monkeypatch):
    with socket.socket() as s:  # a port with nothing listening: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    reason = data._download_host_unreachable(timeout=2.0)
    assert reason.startswith(f"the HTTPS proxy 127.0.0.1:{port} is unreachable (")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        monkeypatch.setenv("HTTPS_PROXY", f"127.0.0.1:{listening.getsockname()[1]}")
        assert data._download_host_unreachable(timeout=2.0) is None
