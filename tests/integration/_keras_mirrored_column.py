"""Keras's column of the skip matrix under MirroredStrategy (2 logical CPUs).

    python _keras_mirrored_column.py OUT.json

Run by tests/callbacks/test_skip_contract.py in a process of its own. Writes
``{"0": rows, "1": rows, "1_weights_finite": bool}``: the rows with the bad
shard on replica 0 and on replica 1.
"""

import json
import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpu[0], [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import skip_matrix as sm  # noqa: E402

from tf_mixed.training import shared_mirrored_strategy  # noqa: E402


def main(out):
    strategy = shared_mirrored_strategy(["CPU:0", "CPU:1"])
    x, y = sm.data()
    result = {}
    for replica in (0, 1):
        bad = sm.run(sm.spoil(x, sm.BAD_STEP, replica=replica, replicas=2), y,
                     "keras", strategy=strategy, monitor=False)
        keras.backend.clear_session()
        reference = sm.run(*sm.remove(x, y, [sm.BAD_STEP]), "keras",
                           strategy=strategy, monitor=False)
        result[str(replica)] = {k: bool(v) for k, v in sm.compare(bad, reference).items()}
        result[f"{replica}_weights_finite"] = bool(
            all(np.isfinite(w).all() for w in bad["weights"]))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
