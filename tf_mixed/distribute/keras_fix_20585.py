"""WORKAROUND for keras-team/keras#20585: `fit` under MultiWorkerMirroredStrategy."""

# PRIVATE KERAS API. Everything this module touches is private to Keras and is
# listed here and in ``tf_mixed/_internal/shims.py``. Delete this module (and its
# callers in ``tf_mixed/distribute/cluster.py``) once Keras is fixed;
# ``tests/integration/test_multi_worker_fit.py::test_keras_still_has_defect_20585`` fails
# on the first Keras release that no longer has the defects, to say so.
#
# Keras 3 (measured on 3.15.1; keras-team/keras#20585, tensorflow/tensorflow#72388)
# fails in two places of ``keras/src/backend/tensorflow/trainer.py`` when
# ``fit``/``evaluate`` run under a MultiWorkerMirroredStrategy that spans
# several workers:
#
# 1. ``TensorFlowTrainer._maybe_symbolic_build`` takes one distributed batch
#    and reduces it across replicas with ``strategy.reduce("MEAN", batch,
#    axis=None)`` only to learn its shapes. Across workers that reduce cannot
#    convert the PerReplica value ("Attempt to convert a value (PerReplica ...)
#    to a Tensor"). The fix: take the first local replica's batch, which has
#    the right shapes, and let Keras build from that.
# 2. ``reduce_per_replica`` (module function), in its multi-worker branch,
#    reduces every metric value with ``strategy.reduce("MEAN", v, axis=0)``;
#    metric values are 0-d ("Invalid reduction dimension 0 for input with 0
#    dimensions"). The fix: ``axis=None`` for 0-d values (the mean across
#    replicas, which is what the single-worker branch computes); everything
#    else is passed to Keras's own function unchanged.
#
# Both replacements delegate to the original Keras functions for every case
# other than "several workers", so single-process runs and MirroredStrategy
# never see a difference. `apply` installs them only when (a) Keras is 3.x and
# (b) a probe, run on fakes in this process, shows that the installed Keras
# still has the defect; `restore` puts the original functions back.
#
# A strategy built by hand (``tf.distribute.MultiWorkerMirroredStrategy()``,
# as most multi-worker scripts do) never passes through
# `tf_mixed.distribute.multi_worker_strategy`. For it, importing this module
# arms `watch`: ``_maybe_symbolic_build`` (the first thing Keras's ``fit``,
# ``evaluate``, ``train_on_batch`` and ``test_on_batch`` run under a strategy)
# becomes a pass-through that calls `apply` the first time it runs across
# several workers. ``tf_mixed/__init__.py`` imports this module right after
# Keras loads, so ``import tf_mixed`` is enough. The watch needs no TensorFlow
# runtime (the probe runs at that first multi-worker call, not at import).

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import types
from typing import Any

import keras
import tensorflow as tf

KERAS_ISSUE = "https://github.com/keras-team/keras/issues/20585"
# The Keras versions the defects and this fix were measured on.
MEASURED_ON_KERAS = ("3.15.1",)

_lock = threading.Lock()
_originals: dict[str, object] = {}  # Keras's own functions while the fix is installed
_displaced: dict[str, object] = {}  # what `apply` replaced, put back by `restore`


@dataclasses.dataclass(frozen=True)
class Defects:
    """What the installed Keras still gets wrong (True = still broken).

    Attributes:
        build_reduces_batch: defect 1, ``_maybe_symbolic_build`` all-reduces a
            data batch across workers.
        scalar_reduce_axis0: defect 2, ``reduce_per_replica`` reduces 0-d
            metric values with ``axis=0`` across workers.
    """

    build_reduces_batch: bool
    scalar_reduce_axis0: bool

    @property
    def any(self) -> bool:
        return self.build_reduces_batch or self.scalar_reduce_axis0


def _trainer_module():
    # Private: keras.src.backend.tensorflow.trainer (Keras 3.x); holds
    # TensorFlowTrainer and the module function reduce_per_replica.
    from keras.src.backend.tensorflow import trainer

    return trainer


def keras_major() -> int:
    """The installed Keras major version (3 for 3.15.1)."""
    return int(keras.__version__.split(".")[0])


# ------------------------------------------------------------------ probes


class _RecordingStrategy:
    """Answers the questions Keras asks of a multi-worker strategy; records reduces."""

    def __init__(self):
        self.reduces = []  # (value, axis) per strategy.reduce call

    @property
    def extended(self):
        return types.SimpleNamespace(_in_multi_worker_mode=lambda: True)

    def reduce(self, op, value, axis=None):
        self.reduces.append((value, axis))
        return value

    def experimental_local_results(self, value):
        if isinstance(value, tf.distribute.DistributedValues):
            return value.values
        return (value,)

    def scope(self):
        return contextlib.nullcontext()


class _FakePerReplica(tf.distribute.DistributedValues):
    """A per-replica value as Keras sees one (``isinstance`` only)."""

    def __init__(self, values):
        self.values = values


def _fake_multi_worker_strategy():
    # Keras tests `isinstance(strategy, MultiWorkerMirroredStrategy)`; a
    # subclass instance created without __init__ starts no cluster.
    cls = type("_ProbeStrategy", (_RecordingStrategy,
                                   tf.distribute.MultiWorkerMirroredStrategy), {})
    strategy = object.__new__(cls)
    _RecordingStrategy.__init__(strategy)
    return strategy


def probe(trainer=None) -> Defects:
    """Runs Keras's *original* functions on fakes and reports the defects.

    No cluster is started: a fake strategy that says "multi-worker" records
    what Keras asks it to reduce.

    Args:
        trainer: The Keras trainer module to probe (tests pass stand-ins);
            by default the installed one.

    Returns:
        A `Defects` value.
    """
    trainer = trainer or _trainer_module()
    build: Any = _originals.get("_maybe_symbolic_build", _keras_own(
        trainer.TensorFlowTrainer._maybe_symbolic_build))
    reduce_fn: Any = _originals.get("reduce_per_replica", trainer.reduce_per_replica)

    strategy = _fake_multi_worker_strategy()
    batch = _FakePerReplica((tf.zeros((2, 1)), tf.zeros((2, 1))))
    fake_model = types.SimpleNamespace(
        _distribute_strategy=strategy,
        distribute_strategy=strategy,
        _symbolic_build=lambda data_batch=None: None,
    )
    build(fake_model, iterator=[(0, 0, iter([batch]))])
    build_reduces = any(
        isinstance(v, tf.distribute.DistributedValues) for v, _ in strategy.reduces
    )

    strategy = _fake_multi_worker_strategy()
    reduce_fn({"loss": tf.constant(1.0)}, strategy, "auto")
    axis0 = any(axis == 0 for _, axis in strategy.reduces)
    return Defects(build_reduces_batch=build_reduces, scalar_reduce_axis0=axis0)


# ------------------------------------------------------------ replacements


def _in_multi_worker_mode(strategy) -> bool:
    return (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and strategy.extended._in_multi_worker_mode()
    )


def _first_local(strategy, value):
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _fixed_maybe_symbolic_build(self, iterator=None, data_batch=None):
    """Keras's `_maybe_symbolic_build`, fed the first local replica's batch."""
    original = _originals["_maybe_symbolic_build"]
    strategy = self._distribute_strategy
    if iterator is None or strategy is None or not _in_multi_worker_mode(strategy):
        return original(self, iterator=iterator, data_batch=data_batch)
    for _, _, it in iterator:
        batch = next(it)
        data_batch = tf.nest.map_structure(
            lambda v: _first_local(strategy, v), batch)
        break
    return original(self, iterator=None, data_batch=data_batch)


def _fixed_reduce_per_replica(values, strategy, reduction):
    """Keras's `reduce_per_replica`, with ``axis=None`` for 0-d values across workers."""
    original = _originals["reduce_per_replica"]
    if reduction not in ("auto", "mean") or not _in_multi_worker_mode(strategy):
        return original(values, strategy, reduction)

    def reduce_one(v):
        if _first_local(strategy, v).shape.rank == 0:
            return strategy.reduce("MEAN", v, axis=None)
        return original(v, strategy, reduction)

    return tf.nest.map_structure(reduce_one, values)


# ------------------------------------------------------------ apply/restore


def is_applied() -> bool:
    """Whether the replacements are installed right now."""
    return bool(_originals)


def apply() -> bool:
    """Installs the replacements if the installed Keras still needs them.

    Idempotent and thread-safe. Installs nothing on a Keras other than 3.x
    (the functions it replaces may not exist there) or when `probe` finds
    neither defect.

    Returns:
        True if the replacements are installed after the call.
    """
    with _lock:
        if _originals:
            return True
        if keras_major() != 3:
            return False
        try:
            defects = probe()
        except (AttributeError, TypeError):
            # Keras changed the functions this fix replaces: nothing to patch.
            return False
        if not defects.any:
            return False
        trainer = _trainer_module()
        current = trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"]
        _displaced["_maybe_symbolic_build"] = current  # Keras's own, or the watch
        _originals["_maybe_symbolic_build"] = _keras_own(current)
        _originals["reduce_per_replica"] = trainer.reduce_per_replica
        trainer.TensorFlowTrainer._maybe_symbolic_build = _fixed_maybe_symbolic_build
        trainer.reduce_per_replica = _fixed_reduce_per_replica
        return True


def restore() -> None:
    """Puts Keras's own functions back (no-op when nothing is installed)."""
    with _lock:
        if not _originals:
            return
        trainer = _trainer_module()
        _originals.pop("_maybe_symbolic_build")
        trainer.TensorFlowTrainer._maybe_symbolic_build = (
            _displaced.pop("_maybe_symbolic_build"))
        trainer.reduce_per_replica = _originals.pop("reduce_per_replica")


# ------------------------------------------------------------------- watch


def _keras_own(function):
    """Keras's own function behind the watch (itself when not watched)."""
    return getattr(function, "__wrapped__", function)


def is_watching() -> bool:
    """Whether `watch` is armed on Keras's trainer (under the fix, if installed)."""
    try:
        current = _trainer_module().TensorFlowTrainer.__dict__["_maybe_symbolic_build"]
    except (ImportError, AttributeError, KeyError):
        return False
    current = _displaced.get("_maybe_symbolic_build", current)
    return _keras_own(current) is not current


def watch() -> bool:
    """Arms `apply` for the first ``fit``/``evaluate`` across several workers.

    Replaces Keras's ``_maybe_symbolic_build`` by a pass-through that, when
    the model's strategy spans several workers (``_in_multi_worker_mode``),
    calls `apply` and then the fixed function; in every other case it calls
    Keras's own function unchanged. Idempotent; a no-op on a Keras other than
    3.x or one without the function.

    Returns:
        True if the watch is armed (or the fix installed) after the call.
    """
    with _lock:
        if _originals:
            return True
        try:
            if keras_major() != 3:
                return False
            trainer = _trainer_module()
            keras_own = trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"]
        except (ImportError, AttributeError, KeyError):
            return False
        if _keras_own(keras_own) is not keras_own:
            return True

        @functools.wraps(keras_own)
        def watching(self, iterator=None, data_batch=None):
            strategy = self._distribute_strategy
            if strategy is not None and _in_multi_worker_mode(strategy) and apply():
                return _fixed_maybe_symbolic_build(self, iterator=iterator,
                                                   data_batch=data_batch)
            return keras_own(self, iterator=iterator, data_batch=data_batch)

        trainer.TensorFlowTrainer._maybe_symbolic_build = watching
        return True


def unwatch() -> None:
    """Disarms `watch` (and removes the fix if the watch installed it)."""
    restore()
    with _lock:
        try:
            trainer = _trainer_module()
            current = trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"]
        except (ImportError, AttributeError, KeyError):
            return
        trainer.TensorFlowTrainer._maybe_symbolic_build = _keras_own(current)


# Importing this module arms the watch: a hand-built strategy's `fit` works.
watch()
