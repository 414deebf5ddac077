"""``--suite=bf16``: do pure-bfloat16 weights learn? Digits, per update rule."""

#     python -m tf_mixed bench --suite=bf16 --epochs=20 --learning_rate=1e-4
#
# Trains the same MLP (64 -> 256 -> 256 -> 10) on handwritten digits from the
# same initial weights and data order, with Adam, under:
#
# * ``mixed_bfloat16``: the reference (float32 weights, bfloat16 compute);
# * ``bfloat16, Keras Adam``: the pure policy with a plain Keras optimizer,
#   what a user gets today (keras-team/keras-hub#2629);
# * ``bfloat16, float32 update math, plain rounding``: tf_mixed's float32
#   update arithmetic without compensation, to separate the two causes;
# * ``bfloat16 <kahan|stochastic>, <float32|bfloat16> state``: tf_mixed's
#   compensated updates (`tf_mixed.scaling.compensated`) through
#   ``tf_mixed.wrap_optimizer``.
#
# Per path: final train loss, validation loss and accuracy, their difference
# to the reference, and how far the weights moved from their initial values
# (relative L2 norm). The data are scikit-learn's 8x8 digits when it is
# installed, else digits drawn in process (a 5x7 font placed at random offsets
# in 8x8 with stroke and pixel noise; `digits`), stated in the report.

from __future__ import annotations

import time
from typing import Any

import numpy as np

from tf_mixed.commands.output_dir import check_output_dir, remove_if_created

# name -> (policy, tf_mixed compensation (None: plain Keras optimizer), state dtype)
PATHS: dict[str, tuple[str, str | None, str | None]] = {
    "mixed_bfloat16 (reference)": ("mixed_bfloat16", None, None),
    "bfloat16, Keras Adam": ("bfloat16", None, None),
    "bfloat16, float32 update math, plain rounding": ("bfloat16", "none", "float32"),
    "bfloat16 kahan, float32 state": ("bfloat16", "kahan", "float32"),
    "bfloat16 kahan, bfloat16 state": ("bfloat16", "kahan", "bfloat16"),
    "bfloat16 stochastic, float32 state": ("bfloat16", "stochastic", "float32"),
    "bfloat16 stochastic, bfloat16 state": ("bfloat16", "stochastic", "bfloat16"),
}
HIDDEN = 256
TRAIN, VAL = 1500, 297

# 5x7 glyphs of the ten digits, one string of 7 rows of 5 pixels each.
_FONT = (
    "01110100011001110101110011000101110", "00100011000010000100001000010001110",
    "01110100010000100010001000100011111", "11111000100010000010000011000101110",
    "00010001100101010010111110001000010", "11111100001111000001000011000101110",
    "00110010001000011110100011000101110", "11111000010001000100010000100001000",
    "01110100011000101110100011000101110", "01110100011000101111000010001001100",
)


def digits(seed: int = 0):
    """Handwritten digits: ``(x_train, y_train, x_val, y_val, source)``.

    scikit-learn's ``load_digits`` (1,797 8x8 images) when installed; else as
    many drawn in process. Pixels are scaled to [0, 1].
    """
    rng = np.random.default_rng(seed)
    try:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x, y = bunch.data.astype(np.float32) / 16.0, bunch.target.astype(np.int64)
        source = "scikit-learn load_digits (1,797 8x8 images)"
    except ImportError:
        x, y = _drawn_digits(rng, TRAIN + VAL)
        source = (f"{TRAIN + VAL} 8x8 digits drawn in process (scikit-learn not "
                  "installed): a 5x7 font at random offsets, stroke and pixel noise")
    order = rng.permutation(len(y))
    x, y = x[order], y[order]
    return x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:], source


def _drawn_digits(rng, count):
    glyphs = np.array([[int(c) for c in g] for g in _FONT], np.float32).reshape(10, 7, 5)
    labels = rng.integers(0, 10, size=count)
    images = np.zeros((count, 8, 8), np.float32)
    for i, label in enumerate(labels):
        top, left = rng.integers(0, 2), rng.integers(0, 4)
        stroke = glyphs[label] * rng.uniform(0.5, 1.0, size=(7, 5))
        stroke *= rng.uniform(size=(7, 5)) > 0.15  # missing pixels
        images[i, top:top + 7, left:left + 5] = stroke
    images += rng.normal(0.0, 0.25, size=images.shape)
    return np.clip(images, 0.0, 1.0).reshape(count, 64), labels.astype(np.int64)


def run_quality(config, command: str) -> dict[str, Any]:
    """Runs the suite in this process; writes results.json/.md; prints the table.

    Args:
        config: A validated ``BenchConfig`` with ``suite="bf16"`` (uses
            ``epochs``, ``batch_size``, ``learning_rate``, ``seed``,
            ``output_dir``).
        command: The command line, for the report.

    Returns:
        The report written to results.json.
    """
    from tf_mixed.bench import report as bench_report

    created = check_output_dir(config.output_dir)
    try:
        data = digits(config.seed)
        print(f"bf16 suite: {data[4]}; MLP 64->{HIDDEN}x2->10, Adam lr "
              f"{config.learning_rate:g}, batch {config.batch_size}, "
              f"{config.epochs} epochs per path.", flush=True)
        rows = []
        for path in PATHS:
            rows.append(_train(path, data, config))
            print(f"  {path}: val accuracy {100 * rows[-1]['val_accuracy']:.1f}%", flush=True)
        reference = rows[0]
        for row in rows:
            row["val_accuracy_diff_points"] = 100 * (
                row["val_accuracy"] - reference["val_accuracy"]
            )
            row["val_loss_ratio"] = row["val_loss"] / reference["val_loss"]
        markdown = _markdown(rows, data[4], config)
        report = {
            **bench_report.suite_header("bf16", config, command),
            "dataset": data[4],
            "results": rows,
            "markdown": markdown,
        }
        written = bench_report.write_outputs(report, config.output_dir, plot=False)
    except BaseException:
        remove_if_created(config.output_dir, created)
        raise
    bench_report.print_written(markdown, written)
    return report


def _train(path: str, data, config) -> dict[str, Any]:
    import keras

    import tf_mixed

    policy, compensation, state_dtype = PATHS[path]
    x_train, y_train, x_val, y_val, _ = data
    with tf_mixed.policy_scope(policy):
        keras.utils.set_random_seed(config.seed)
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(10),
            keras.layers.Activation("linear", dtype="float32"),
        ])
        adam = keras.optimizers.Adam(config.learning_rate)
        if compensation is None and policy == "bfloat16":
            optimizer = adam  # what plain Keras does
        else:
            knobs = dict[str, Any]() if compensation is None else dict[str, Any](
                compensation=compensation, state_dtype=state_dtype)
            optimizer = tf_mixed.wrap_optimizer(adam, **knobs)
        model.compile(optimizer=optimizer, metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        initial = [w.astype(np.float64) for w in _weights(model)]
        start = time.perf_counter()
        history = model.fit(x_train, y_train, batch_size=config.batch_size,
                            epochs=config.epochs, shuffle=True, verbose=0)
        seconds = time.perf_counter() - start
        val_loss, val_accuracy = model.evaluate(x_val, y_val, verbose=0)
        final = [w.astype(np.float64) for w in _weights(model)]
    moved = (sum(np.sum((f - i) ** 2) for f, i in zip(final, initial))
             / sum(np.sum(i**2) for i in initial)) ** 0.5
    return {
        "path": path, "policy": policy, "compensation": compensation,
        "state_dtype": state_dtype,
        "train_loss": float(history.history["loss"][-1]),
        "val_loss": float(val_loss), "val_accuracy": float(val_accuracy),
        "weights_moved": float(moved), "train_seconds": seconds,
    }


def _weights(model):
    return [np.asarray(keras_value, np.float32) for keras_value in
            (v.numpy() for v in model.trainable_weights)]


def _markdown(rows, source, config) -> str:
    lines = [
        f"Digits ({source}); MLP 64->{HIDDEN}x2->10; Adam, learning rate "
        f"{config.learning_rate:g}, batch {config.batch_size}, {config.epochs} epochs.",
        "",
        "| path | train loss | val loss | vs reference | val acc % | diff (pts) "
        "| weights moved | train s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['path']} | {r['train_loss']:.4f} | {r['val_loss']:.4f} | "
            f"{r['val_loss_ratio']:.3f}x | {100 * r['val_accuracy']:.1f} | "
            f"{r['val_accuracy_diff_points']:+.1f} | {r['weights_moved']:.4f} | "
            f"{r['train_seconds']:.1f} |")
    lines += ["", "Weights moved: ||w_final - w_initial|| / ||w_initial|| over "
              "all trainable weights (0: the model never learned)."]
    return "\n".join(lines)
