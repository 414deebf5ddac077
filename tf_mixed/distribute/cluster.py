"""Several workers: a checked ``TF_CONFIG``, a strategy with a bounded wait, `fit` support."""

# On each machine (or local process, see `tf_mixed.distribute.run_local_workers`) the same script
# runs with its own ``TF_CONFIG``; the first lines are::
#
#     strategy = tf_mixed.distribute.multi_worker_strategy(timeout_seconds=60)
#     with strategy.scope():
#         model = build_model()
#         model.compile(optimizer=tf_mixed.wrap_optimizer(...), loss=...)
#     model.fit(dataset, callbacks=[tf_mixed.LossScaleMonitor()])
#
# Keras 3's own ``fit``/``evaluate`` fail under MultiWorkerMirroredStrategy
# (keras-team/keras#20585). `fit_support` installs tf_mixed's narrow workaround
# (``tf_mixed/distribute/keras_fix_20585.py``) when, and only when, a strategy spans several
# workers and the installed Keras still has the defect. It is called for you by
# `multi_worker_strategy`, where a multi-worker ``fit`` is prepared; if you build the strategy by
# hand, call ``fit_support(strategy)`` yourself before ``fit``. The optimizer never installs it.

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import tensorflow as tf

from tf_mixed._internal import validate as _validate
from tf_mixed.distribute import keras_fix_20585 as _keras_fix_20585

_TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
    '"task": {"type": "worker", "index": 0}}'
)


@dataclasses.dataclass(frozen=True)
class Task:
    """This process's place in the cluster, read from ``TF_CONFIG``.

    TensorFlow's MultiWorkerMirroredStrategy counts a "chief" task as a
    worker: the chief is worker 0 and ``worker`` task ``i`` is worker
    ``i + 1`` (``multi_worker_util.id_in_cluster``); without a chief job,
    ``worker`` task ``i`` is worker ``i`` and worker 0 is the chief.

    Attributes:
        index: This process's worker index in the whole cluster, from 0 to
            ``num_workers - 1``: distinct for every task, chief included
            (use it for per-worker paths).
        workers: Every worker address in index order (the chief first).
        is_chief: Whether this task writes the shared outputs: the "chief"
            task, or worker 0 when the cluster has no "chief" job.
        task_type: ``"chief"`` or ``"worker"``, as in ``TF_CONFIG``.
        task_index: ``task["index"]`` as in ``TF_CONFIG`` (its index within
            its own job).
    """

    index: int
    workers: tuple[str, ...]
    is_chief: bool
    task_type: str = "worker"
    task_index: int | None = None

    @property
    def num_workers(self) -> int:
        """Every worker of the cluster, the chief included (TF's ``worker_count``)."""
        return len(self.workers)


def _bad(message: str, text: Any) -> ValueError:
    return ValueError(
        f"TF_CONFIG {message}. Received: TF_CONFIG={text!r}. It must be JSON "
        f"like {_TF_CONFIG_EXAMPLE}, the same cluster on every worker and each "
        "worker its own index."
    )


def _addresses(cluster, job: str, text) -> list:
    addresses = cluster.get(job, [])
    if (not isinstance(addresses, list)
            or not all(isinstance(w, str) and ":" in w for w in addresses)):
        raise _bad(f'needs cluster["{job}"] to be a list of "host:port" strings; '
                   f"got {addresses!r}", text)
    return addresses


def parse_tf_config(text: str | Mapping[str, Any]) -> Task:
    """Checks a ``TF_CONFIG`` for a cluster of workers and returns this task.

    TensorFlow itself reports a malformed ``TF_CONFIG`` late and obscurely (or
    waits for a worker that cannot exist), so tf_mixed checks it first, with
    TensorFlow's own rules (``multi_worker_util._validate_cluster_spec``):
    jobs "chief" (at most one task) and "worker" only, the task's type must
    be a job of the cluster, its index inside that job.

    Args:
        text: The ``TF_CONFIG`` JSON string, or the decoded dict.

    Returns:
        The `Task`.

    Raises:
        ValueError: if the JSON is malformed; the cluster has a job other
            than "chief" and "worker", no worker at all, more than one
            chief, or an address twice; ``task`` is not a "chief" or
            "worker" task of the cluster; or ``task["index"]`` is out of
            range. The message names the field, the value and the expected
            form.
    """
    if isinstance(text, Mapping):
        config = text
    else:
        try:
            config = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            raise _bad(f"is not valid JSON ({error})", text) from None
    if not isinstance(config, Mapping):
        raise _bad("must be a JSON object", text)
    cluster = config.get("cluster")
    if not isinstance(cluster, Mapping):
        raise _bad('needs cluster, an object like {"worker": ["host:port", ...]}', text)
    other = sorted(set(cluster) - {"chief", "worker"})
    if other:
        raise _bad(f"has jobs {other} in its cluster; MultiWorkerMirroredStrategy "
                   'takes "chief" (at most one) and "worker" only', text)
    chief, workers = _addresses(cluster, "chief", text), _addresses(cluster, "worker", text)
    if len(chief) > 1:
        raise _bad(f'lists {len(chief)} chiefs; there must be at most one (TensorFlow: '
                   "\"There must be at most one 'chief' job.\")", text)
    everyone = chief + workers
    if not everyone:
        raise _bad('needs cluster["worker"], a non-empty list of "host:port" '
                   f"strings; got {cluster.get('worker')!r}", text)
    if len(set(everyone)) != len(everyone):
        raise _bad(f"lists the same address twice in its cluster ({everyone!r})", text)
    task = config.get("task")
    if not isinstance(task, Mapping) or task.get("type") not in ("worker", "chief"):
        raise _bad(f'needs task {{"type": "worker", "index": i}}; got {task!r}', text)
    job = chief if task["type"] == "chief" else workers
    if not job:
        raise _bad(f'has a task of type {task["type"]!r} but no {task["type"]!r} job '
                   f"in its cluster (TensorFlow refuses this too)", text)
    index = task.get("index", 0 if task["type"] == "chief" else None)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(job):
        listed = f"{len(job)} workers" if task["type"] == "worker" else "1 chief"
        raise _bad(f'task["index"] must be an integer from 0 to {len(job) - 1} (the '
                   f"cluster lists {listed}); got {index!r}", text)
    global_index = index if task["type"] == "chief" else index + len(chief)
    return Task(index=global_index, workers=tuple(everyone), is_chief=global_index == 0,
                task_type=task["type"], task_index=index)


def current_task() -> Task | None:
    """The `Task` from this process's ``TF_CONFIG``; None when it is unset.

    Raises:
        ValueError: as `parse_tf_config`.
    """
    text = os.environ.get("TF_CONFIG")
    if not text:
        return None
    return parse_tf_config(text)


def multi_worker_strategy(
    timeout_seconds: float | None = 60.0,
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """A MultiWorkerMirroredStrategy from a checked ``TF_CONFIG``, ready for `fit`.

    Args:
        timeout_seconds: Longest wait of any collective (all-reduce) before it
            fails with an error instead of hanging, e.g. when a peer worker
            died. None waits forever (TensorFlow's default). The first
            collective also waits for the other workers to start, so leave
            room for the slowest start-up.

    Returns:
        The strategy. `fit_support` has been applied for it.

    Raises:
        ValueError: if ``TF_CONFIG`` is unset or invalid (see
            `parse_tf_config`), or ``timeout_seconds`` is not a positive
            number or None.
    """
    if timeout_seconds is not None:
        _validate.number(timeout_seconds, "timeout_seconds", rule=lambda v: v > 0,
                         valid="a positive number of seconds or None (wait forever)")
    if current_task() is None:
        raise ValueError(
            "multi_worker_strategy() needs the TF_CONFIG environment variable, "
            f"e.g. TF_CONFIG='{_TF_CONFIG_EXAMPLE}' on worker 0. Received: "
            "TF_CONFIG unset. Start local workers with "
            "tf_mixed.distribute.run_local_workers(), or set it on each machine."
        )
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=timeout_seconds)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=options)
    fit_support(strategy)
    return strategy


def fit_support(strategy: tf.distribute.Strategy | None = None) -> bool:
    """Makes Keras's ``fit``/``evaluate``/``predict`` work under ``strategy``.

    Installs the workaround for keras-team/keras#20585 (two small
    replacements in Keras's TensorFlow trainer, see
    ``tf_mixed/distribute/keras_fix_20585.py``) if ``strategy`` is a
    MultiWorkerMirroredStrategy over more than one worker and the installed
    Keras still has the defect; otherwise changes nothing. The replacements
    pass every other case (one worker, MirroredStrategy, no strategy) to
    Keras's own code. Idempotent; `remove_fit_support` undoes it.

    Args:
        strategy: The strategy; by default the one whose scope is active.

    Returns:
        True if the workaround is installed after the call.
    """
    strategy = strategy if strategy is not None else tf.distribute.get_strategy()
    if not _keras_fix_20585._in_multi_worker_mode(strategy):
        return _keras_fix_20585.is_applied()
    return _keras_fix_20585.apply()


def remove_fit_support() -> None:
    """Puts Keras's own trainer functions back (undoes `fit_support`)."""
    _keras_fix_20585.restore()
