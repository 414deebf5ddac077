"""Loads `.keras` files with Keras alone and checks their predictions.

Run as ``python _load_without_tf_mixed.py MANIFEST.json`` in a fresh process
(never importing tf_mixed). The manifest lists ``{"path", "x", "expected",
"policies", "safe_mode"}`` records (``x``/``expected``: ``.npz`` files of arrays);
the zoo's custom classes are registered by importing it (Keras only). Prints
one JSON line: the worst absolute difference per file.
"""

import json
import os
import sys

import keras
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
import zoo  # noqa: E402  registers the zoo's own layers; imports no tf_mixed

worst = {}
for record in json.load(open(sys.argv[1])):
    model = keras.models.load_model(
        record["path"], compile=False, safe_mode=record.get("safe_mode", True),
        custom_objects={"zoo_double": zoo.zoo_double})
    x = np.load(record["x"])
    x = [x[k] for k in sorted(x.files)] if len(x.files) > 1 else x[x.files[0]]
    expected = np.load(record["expected"])
    got = keras.tree.flatten(model.predict(x, verbose=0))
    want = [expected[k] for k in sorted(expected.files, key=int)]
    policies = {layer.name: layer.dtype_policy.name for layer in model.layers}
    for name, policy in record["policies"].items():
        assert policies[name] == policy, (record["path"], name, policies[name], policy)
    worst[record["path"]] = max(float(np.max(np.abs(np.asarray(g, np.float64) - w)))
                                for g, w in zip(got, want))
assert "tf_mixed" not in sys.modules, "tf_mixed was imported"
print(json.dumps(worst))
