"""The README's GradientTape loop, run as written, on a BatchNormalization
model whose first step overflows (issue 34.6): the routine first skip never
ends the run, and the skipped step leaves the moving statistics as they were."""

import pathlib
import re

import keras
import numpy as np
import tensorflow as tf

import tf_mixed

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _loop_block() -> str:
    text = README.read_text()
    section = text[text.index("## With a `GradientTape` loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_loop_survives_a_first_step_that_overflows():
    tf_mixed.enable("mixed_float16")
    namespace: dict = {}
    exec(compile(_loop_block(), str(README), "exec"), namespace)  # as written: 3 steps
    model, opt, train_step = namespace["model"], namespace["opt"], namespace["train_step"]
    bn = next(layer for layer in model.layers
              if isinstance(layer, keras.layers.BatchNormalization))
    before = [v.numpy().copy() for v in bn.non_trainable_variables]
    skipped_before = opt.loss_scale_state().skipped_steps
    # Targets of 1e4: loss ~1e8, times 2**15 overflows float16 gradients.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    y = np.full((32, 1), 1e4, "float32")
    loss, applied = train_step(tf.constant(x), tf.constant(y))
    assert not bool(applied)
    assert opt.loss_scale_state().skipped_steps == skipped_before + 1
    for kept, now in zip(before, bn.non_trainable_variables):
        np.testing.assert_array_equal(now.numpy(), kept)
    results = [bool(train_step(tf.constant(x), tf.constant(y))[1]) for _ in range(30)]
    assert any(results)  # the scale backed off until a step applied


def test_without_the_readme_line_the_first_skip_names_it():
    """The line matters: the same loop without it stops at the first skip with
    an error naming ``track_forward_state`` (never silent)."""
    tf_mixed.enable("mixed_float16")
    block = _loop_block()
    block = "\n".join(line for line in block[:block.index("x, y = ")].splitlines()
                      if "track_forward_state" not in line)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    y = np.full((32, 1), 1e4, "float32")
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    try:
        namespace["train_step"](tf.constant(x), tf.constant(y))
    except Exception as error:  # noqa: BLE001 - TF wraps it in its own type
        assert "track_forward_state" in str(error)
    else:
        raise AssertionError("a skipped step with untracked BatchNorm state passed silently")
