"""``--suite=comm``: bad input, the report, and the traced-collective count.

The suite itself (two worker processes with a 22M-parameter model) is run by
hand, see BUILD_NOTES.md; here its pieces are checked quickly in process.
"""

import keras
import pytest
import tensorflow as tf

from tf_mixed.__main__ import main
from tf_mixed.bench import comm as bench_comm
from tf_mixed.scaling.optimizer import LossScaleOptimizer


@pytest.mark.slow
@pytest.mark.parametrize("flag,expected", [
    ("--workers=1", "--workers=1: must be at least 2. The comm suite needs 2 workers"),
    ("--batch_size=7", "--batch_size=7: must split evenly over --workers=2"),
])
def test_bad_flags_exit_2_before_any_work(tmp_path, capsys, flag, expected):
    out = tmp_path / "out"
    code = main(["tf_mixed", "bench", "--suite=comm", f"--output_dir={out}",
                 flag])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert not out.exists()


def _fake_worker():
    def path(step_s, wire_bytes):
        return {"round_step_s": [step_s, step_s * 2, step_s],
                "bytes_computed": wire_bytes, "bytes_traced": wire_bytes,
                "collectives": 2, "gradient_collectives": 1,
                "final_loss": 0.5, "skipped_steps": 0}

    return {"workers": 2, "params": 1000, "paths": {
        "keras": path(0.4, 4000), "float32": path(0.4, 4000),
        "float16": path(0.3, 2000), "bfloat16": path(0.2, 2000)}}


def test_rows_give_ratios_to_keras_and_float32():
    rows = {r["path"]: r for r in bench_comm._rows(_fake_worker())}
    assert rows["float16"]["bytes_vs_float32"] == 0.5
    assert rows["float16"]["step_time_vs_keras"] == pytest.approx(0.75)
    assert rows["bfloat16"]["communication_dtype"] == "bfloat16"
    assert rows["float32"]["communication_dtype"] is None
    table = bench_comm._markdown(list(rows.values()), _fake_worker())
    assert "| float16 | float16 | 0.300 | 0.75x | 0.0 | 0.50x | 2 (1) |" in table


# It applies gradients made by hand (ones), not a scaled loss's: the misuse
# warning that draws is expected here (tests/scaling/test_optimizer.py tests it).
@pytest.mark.slow
@pytest.mark.filterwarnings(
    "ignore:.*never went through scale_loss:tf_mixed._internal.warning.MixedPrecisionWarning")
def test_traced_collectives_count_and_bytes(mirrored):
    with mirrored.scope():
        kernel = keras.Variable(tf.ones([3, 2]))
        bias = keras.Variable(tf.ones([2]))
        opt = LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=1.0,
                                 min_scale=1.0, max_scale=1.0,
                                 communication_dtype="float16")
        opt.build([kernel, bias])

    def replica_fn():
        return opt.apply([tf.ones([3, 2]), tf.ones([2])], [kernel, bias])

    step = tf.function(lambda: mirrored.run(replica_fn))
    found = bench_comm._traced_collectives(step.get_concrete_function())
    # Two replicas in this process, each sending 8 float16 values.
    assert found == {"collectives": 2, "gradient_collectives": 2,
                     "bytes_traced": 2 * 8 * 2}
