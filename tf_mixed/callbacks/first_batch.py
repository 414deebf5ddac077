"""What each layer's inputs reach on ``fit``'s first batch, for the catalog's fit-start check."""

# A Keras callback sees no data: ``fit`` hands each batch to the train step
# only. So `install` wraps ``model.train_step``: on the first step after
# `FirstBatch.arm` (a flag per replica) it runs a functional tap of the inputs
# of the model's top-level layers whose catalog row bounds their safe range
# (`tf_mixed.tools.catalog.model_check.input_tap`) on the batch's x, before
# Keras's step (the weights the first forward pass uses), with
# ``training=False`` (no moving statistics updated, no random draw), and
# writes each layer's max |input| into a variable of its replica. Every later
# step takes the other branch of one ``tf.cond``: the tap's cost is one
# forward pass, once per fit. The wrapper keeps the wrapped step's marks
# (`tf_mixed.callbacks.skip_contract.installed` still sees its own).
#
# `FirstBatch.read` is called on the host after that step: it gathers every
# replica's copy (across workers a collective: the monitor reads at the first
# batch end, the same point of ``fit`` on every worker) and takes the largest
# per layer, so every replica and worker judges the same magnitudes.
#
# Only Sequential and functional models have layer inputs to tap; a
# subclassed model is not wrapped (its check has no magnitudes).

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from tf_mixed._internal import shims as _internals
from tf_mixed.tools.catalog import model_check as catalog_check

__all__ = ["FirstBatch", "install", "installed"]


def _kept(model) -> dict:
    """What `install` keeps on ``model`` (its `FirstBatch`, once installed):
    on the model itself, not in a registry keyed by it."""
    return _internals.rider(model, "first_batch", dict)


class FirstBatch:
    """The first batch's max |input| per tapped layer, one copy per replica.

    Attributes:
        model: the model whose ``train_step`` reads it.
        names: the tapped layers, in order (each once).
    """

    def __init__(self, model: keras.Model, owners: list[str], tap: keras.Model) -> None:
        self.model = model
        self.names = list(dict.fromkeys(owners))
        self._segments = tf.constant([self.names.index(n) for n in owners], tf.int32)
        self._tap = tap
        sync = {"trainable": False, "synchronization": tf.VariableSynchronization.ON_READ,
                "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA}
        with model.distribute_strategy.scope():
            self._seen = tf.Variable(tf.zeros([len(self.names)]), **sync)
            self._pending = tf.Variable(1, dtype=tf.int32, **sync)

    def arm(self) -> None:
        """Reads the next step's batch (every replica's flag is set)."""
        for copy in _local_copies(self._pending):
            copy.assign(1)

    def note(self, data) -> None:
        """In the train step (replica context): the batch's magnitudes, on the armed step."""
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        armed = tf.not_equal(self._pending.read_value(), 0)

        def measure():
            peaks = [tf.reduce_max(tf.abs(tf.reshape(tf.cast(t, tf.float32), [-1])))
                     for t in keras.tree.flatten(self._tap(x, training=False))]
            peaks = tf.where(tf.math.is_nan(tf.stack(peaks)), np.inf, tf.stack(peaks))
            return tf.math.unsorted_segment_max(tf.maximum(peaks, 0.0), self._segments,
                                                len(self.names))

        self._seen.assign(tf.cond(armed, measure, self._seen.read_value))
        self._pending.assign(0)

    def read(self) -> dict[str, float] | None:
        """``{layer: max |input|}`` over every replica; None if no step read a batch yet."""
        strategy = self.model.distribute_strategy
        pending, seen = _gathered(strategy, self._pending), _gathered(strategy, self._seen)
        if pending.any():
            return None
        return dict(zip(self.names, (float(v) for v in seen.max(axis=0))))


def _local_copies(variable) -> list:
    values = getattr(variable, "values", None)
    return list(values) if values is not None else [variable]


def _gathered(strategy, variable) -> np.ndarray:
    """Every replica's copy, stacked ``[replicas, ...]`` (a collective across workers)."""
    if strategy.num_replicas_in_sync == 1:
        return np.stack([np.asarray(c.numpy()) for c in _local_copies(variable)])
    with strategy.scope():
        local = strategy.run(lambda: tf.expand_dims(tf.convert_to_tensor(variable), 0))
        return np.asarray(strategy.gather(local, axis=0))


def install(model: keras.Model) -> FirstBatch | None:
    """Wraps ``model.train_step`` to read its next batch's magnitudes (once per model).

    A second call returns the same `FirstBatch`, armed again. After a first
    call the train function must be made again
    (``model.make_train_function(force=True)``) for a step traced before.

    Args:
        model: a built Sequential or functional `keras.Model`.

    Returns:
        The `FirstBatch`, armed; None when no top-level layer's catalog row
        bounds its safe range (`tf_mixed.tools.catalog.model_check.bounded_layers`)
        or the model has no graph of layers to tap.
    """
    found = _kept(model).get("found")
    if found is not None:
        found.arm()
        return found
    owners, tap = catalog_check.input_tap(model, catalog_check.bounded_layers(model))
    if tap is None:
        return None
    found = _kept(model)["found"] = FirstBatch(model, owners, tap)
    inner = model.train_step

    @functools.wraps(inner)
    def train_step(data):
        found.note(data)
        return inner(data)

    model.train_step = train_step
    return found


def installed(model: keras.Model) -> bool:
    """Whether `install` wrapped this model's ``train_step``."""
    return "found" in _kept(model)
