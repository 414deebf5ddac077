"""One worker of tests/integration/test_skip_contract_multi_worker.py.

    python _skip_worker.py CONFIG.json

Started by `tf_mixed.distribute.launch.run_local_workers` (two workers, one
replica each). The config (JSON) holds ``wrapper`` ("tf_mixed" or "keras"),
``bad_worker`` (whose share of the bad batch holds the inf), optionally
``policy`` and ``kind`` (tests/support/skip_matrix.py's `KINDS`), and ``out`` (the
result path; ``{i}`` is replaced by the worker's index). Each worker trains
the skip matrix's run with the bad batch and the reference without it
(tests/support/skip_matrix.py) and writes the rows, its skipped flags, its
History and a digest of its weights, so the test can also compare workers.
"""

import hashlib
import json
import sys

import numpy as np


def main(config):
    import skip_matrix as sm

    import tf_mixed  # noqa: F401  (the #20585 fix for fit)
    from tf_mixed.distribute import cluster as distribute

    task = distribute.current_task()
    index = task.index if task else 0
    strategy = distribute.multi_worker_strategy(timeout_seconds=60)
    workers = strategy.num_replicas_in_sync
    x, y = sm.data()
    kind = config.get("kind", "inf")
    bad_x = sm.spoil(x, sm.BAD_STEP, replica=config["bad_worker"], replicas=workers,
                     value=sm.KINDS[kind]["value"])
    monitor = config["wrapper"] == "tf_mixed"
    build = dict(policy=config.get("policy"), **sm.kind_args(kind))
    bad = sm.run(sm.worker_dataset(strategy, bad_x, y), None, config["wrapper"],
                 strategy=strategy, monitor=monitor, **build)
    reference = sm.run(sm.worker_dataset(strategy, *sm.remove(x, y, [sm.BAD_STEP])),
                       None, config["wrapper"], strategy=strategy, monitor=monitor,
                       **build)
    digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in bad["weights"]))
    result = {
        "worker": index,
        "replicas": int(workers),
        "rows": {k: bool(v) for k, v in sm.compare(bad, reference).items()},
        "skipped": [row.get("skipped") for row in bad["batch_logs"]],
        "skip_reason": [row.get("skip_reason") for row in bad["batch_logs"]],
        "history": bad["history"],
        "weights_digest": digest.hexdigest(),
        "weights_finite": bool(all(np.isfinite(w).all() for w in bad["weights"])),
    }
    with open(config["out"].replace("{i}", str(index)), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
