"""Loads `.keras` files compiled with ``tf_mixed.float32_loss`` with Keras alone.

Run as ``python _float32_loss_without_tf_mixed.py MANIFEST.json`` in a fresh
process that never imports tf_mixed. Per manifest record: ``load_model(path)``
(``compile=True``); on success, each output's loss (class name, dtype,
reduction, name, or the plain name Keras keeps), ``evaluate`` on the saved data
(``.npz``: ``x``, ``y0``, ``y1``, ...) and the loss of one ``train_on_batch``;
on failure, the error's type and message. Prints one JSON line keyed by path.
"""

import json
import sys
import warnings

import keras
import numpy as np

warnings.simplefilter("ignore")  # Keras says it skips the wrapper's own entries


def describe(loss):
    if isinstance(loss, keras.losses.Loss):
        return [type(loss).__name__, loss.dtype, loss.reduction, loss.name]
    return loss


results = {}
for record in json.load(open(sys.argv[1])):
    try:
        model = keras.models.load_model(record["path"])
    except Exception as error:  # noqa: BLE001 - reported to the parent
        results[record["path"]] = {"error": f"{type(error).__name__}: {error}"}
        continue
    data = np.load(record["data"])
    ys = [data[f"y{i}"] for i in range(len(data.files) - 1)]
    y = ys[0] if len(ys) == 1 else ys
    losses = model.loss if isinstance(model.loss, list) else [model.loss]
    results[record["path"]] = {
        "losses": [describe(loss) for loss in losses],
        "optimizer": type(model.optimizer).__name__,
        "evaluate": model.evaluate(data["x"], y, verbose=0, return_dict=True),
        "step": float(model.train_on_batch(data["x"], y, return_dict=True)["loss"])}
assert "tf_mixed" not in sys.modules, "tf_mixed was imported"
print(json.dumps(results))
