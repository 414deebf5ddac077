"""Several replicas and workers: checked `TF_CONFIG`, strategies, `fit` support (the keras-team/keras#20585 workaround) and the local launcher.

This file only hands names on; the code lives in the modules beside it.
"""

from tf_mixed.distribute.cluster import (  # noqa: F401
    Task,
    current_task,
    fit_support,
    multi_worker_strategy,
    parse_tf_config,
    remove_fit_support,
)
from tf_mixed.distribute.launch import (  # noqa: F401
    WorkerResult,
    WorkersFailed,
    free_ports,
    run_local_workers,
    tf_config,
)

__all__ = [
    "Task",
    "WorkerResult",
    "WorkersFailed",
    "current_task",
    "fit_support",
    "free_ports",
    "multi_worker_strategy",
    "parse_tf_config",
    "remove_fit_support",
    "run_local_workers",
    "tf_config",
]
