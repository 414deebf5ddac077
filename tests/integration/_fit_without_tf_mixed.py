"""Loads `.keras` files with Keras alone (``compile=True``) and keeps training them.

Run as ``python _fit_without_tf_mixed.py MANIFEST.json`` in a fresh process
that never imports tf_mixed. Each manifest record names a file saved from a
model trained with tf_mixed's optimizer, its data (``.npz``: ``x``, ``y``) and
what the saving process read (``scale``, ``iterations``, ``inner``: the inner
optimizer's variables, ``.npz`` keyed by position). The loaded optimizer must
be Keras's own wrapper, carry the scale and the inner optimizer's state, and
``fit`` one epoch. Prints one JSON line: per file, the loss and whether every
trainable weight changed.
"""

import json
import sys
import warnings

import keras
import numpy as np

warnings.simplefilter("ignore")  # Keras says it skips the wrapper's own entries
results = {}
for record in json.load(open(sys.argv[1])):
    model = keras.models.load_model(record["path"])  # compile=True, as a server would
    optimizer = model.optimizer
    assert type(optimizer) is keras.optimizers.LossScaleOptimizer, type(optimizer)
    assert float(optimizer.dynamic_scale.numpy()) == record["scale"], (
        record["path"], float(optimizer.dynamic_scale.numpy()), record["scale"])
    inner = optimizer.inner_optimizer
    assert int(inner.iterations.numpy()) == record["iterations"]
    saved = np.load(record["inner"])
    assert len(saved.files) == len(inner.variables)
    for i, variable in enumerate(inner.variables):
        np.testing.assert_array_equal(variable.numpy(), saved[str(i)], err_msg=variable.path)
    data = np.load(record["data"])
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit(data["x"], data["y"], batch_size=8, epochs=1, verbose=0)
    changed = [not np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights)]
    results[record["path"]] = {"loss": float(history.history["loss"][-1]),
                               "all_changed": all(changed),
                               "iterations": int(inner.iterations.numpy())}
assert "tf_mixed" not in sys.modules, "tf_mixed was imported"
print(json.dumps(results))
