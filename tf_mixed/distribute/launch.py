"""Gone: ``python -m tf_mixed.distribute.launch`` points to ``python -m tf_mixed launch``.

The pointer and the moved names stay until 0.3.0.
"""

import sys

from tf_mixed._internal import moved as _moved

# The module's names moved to tf_mixed.distribute.workers with the command.
__getattr__ = _moved.face_getattr(__name__, {
    "LOOPBACK": "tf_mixed.distribute.workers",
    "WorkerResult": "tf_mixed.distribute.workers",
    "WorkersFailed": "tf_mixed.distribute.workers",
    "free_ports": "tf_mixed.distribute.workers",
    "run_local_workers": "tf_mixed.distribute.workers",
    "tf_config": "tf_mixed.distribute.workers",
})

if __name__ == "__main__":
    print("python -m tf_mixed.distribute.launch moved: run python -m tf_mixed launch N SCRIPT.py "
          "[ARGS ...] (this pointer goes in tf_mixed 0.3.0)", file=sys.stderr)
    raise SystemExit(2)
