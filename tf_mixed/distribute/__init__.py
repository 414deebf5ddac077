"""Several replicas and workers: a checked `TF_CONFIG`, strategies, `fit` support, local workers."""

from tf_mixed._internal import moved as _moved
from tf_mixed.distribute.cluster import (  # noqa: F401
    current_task,
    fit_support,
    multi_worker_strategy,
)
from tf_mixed.distribute.workers import WorkersFailed, run_local_workers  # noqa: F401

__all__ = [
    "WorkersFailed",
    "current_task",
    "fit_support",
    "multi_worker_strategy",
    "run_local_workers",
]

# Names this face handed on before it kept only the documented ones.
__getattr__ = _moved.face_getattr(__name__, {
    "Task": "tf_mixed.distribute.cluster",
    "WorkerResult": "tf_mixed.distribute.workers",
    "free_ports": "tf_mixed.distribute.workers",
    "parse_tf_config": "tf_mixed.distribute.cluster",
    "remove_fit_support": "tf_mixed.distribute.cluster",
    "tf_config": "tf_mixed.distribute.workers",
})
