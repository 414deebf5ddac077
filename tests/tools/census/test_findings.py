"""Census findings that link to the audit (issue 37)."""

import pytest
import keras
import numpy as np

import tf_mixed


@pytest.mark.slow
def test_a_plain_softmax_head_under_bfloat16_is_a_finding():
    # README: keep softmax in float32. A plain Dense(10, activation="softmax")
    # head under bfloat16 computes it in bfloat16: the census says so.
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax", name="head")])
    x, y = np.ones((16, 16), "float32"), np.zeros(16, "int32")
    report = tf_mixed.census(model, x, y, loss="sparse_categorical_crossentropy", batch_size=16)
    (finding,) = report.by_code("half_output_activation")
    assert (finding.layer, finding.severity, finding.audit) == ("head", "warning",
                                                                "half_output_activation")
    assert "tf_mixed.OutputActivation('softmax')" in finding.fix
    # The same head kept in float32 (tf_mixed.OutputActivation): no finding.
    kept = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, name="logits"),
                             tf_mixed.OutputActivation("softmax")])
    report = tf_mixed.census(kept, x, y, loss="sparse_categorical_crossentropy", batch_size=16)
    assert report.by_code("half_output_activation") == []
